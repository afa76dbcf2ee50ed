"""`Schedule.pack()`: nests run one after another (a fused group's layers) share their rows;
the order of every two instances is unchanged, and the program compiles bit-exact."""

from __future__ import annotations

from pathlib import Path

import islpy as isl
import numpy as np

from tensorgen.codegen.scheduled import compile_scheduled
from tensorgen.driver import Job, random_inputs, run_and_compare
from tensorgen.ir.verify import verify_program
from tensorgen.schedule.api import Schedule
from tensorgen.spec.loader import load_program
from tensorgen.target import load_target

HERE = Path(__file__).parent


def _order(s: Schedule) -> isl.UnionMap:
    """{ A[i] -> B[j] : A[i] runs before B[j] }: what pack must keep exactly."""
    umap = s.union_map()
    n = umap.get_map_list().get_at(0).dim(isl.dim_type.out)
    lt = isl.Map.lex_lt(isl.Space.set_alloc(isl.DEFAULT_CONTEXT, 0, n))
    return umap.apply_range(isl.UnionMap.from_map(lt)).apply_range(umap.reverse())


def test_pack_shares_the_rows_of_nests_one_after_another_and_keeps_the_order() -> None:
    program = verify_program(load_program(HERE / "conv1x1_pair.yaml", None))
    target = load_target(program.target)
    s = Schedule(program, target)
    # each split makes a row for every statement: the nests' rows pile up
    for stmt, k in (("S0", "k"), ("S1", "k"), ("S2", "k"), ("S3", "j"), ("S4", "j")):
        s.split(s.loop(f"{stmt}.{k}"), 8)
    s.split(s.loop("c"), 4)
    s.split(s.loop("S3.k"), 4)
    before, rows = _order(s), len(s.state.dims)
    s.pack()
    assert len(s.state.dims) < rows - 4, (rows, len(s.state.dims))
    assert _order(s).is_equal(before)
    assert s.trace[-1].primitive == "pack"
    s.check()
    job = Job(program, target, compile_scheduled(program, target, s))
    for seed in (0, 1):
        inputs = random_inputs(program, seed)
        inputs["B1"] = np.random.default_rng(seed).integers(-3000, 3000, 32).astype(np.int32)
        cmp, result = run_and_compare(job, inputs)
        assert cmp.exact, cmp.message
    assert len(np.unique(result.outputs["Y"])) > 10, "the outputs saturate: a weak check"


def test_pack_of_a_schedule_with_no_row_to_drop_changes_nothing() -> None:
    program = verify_program(load_program(HERE / "conv1x1_pair.yaml", None))
    s = Schedule(program)
    state = s.state
    s.pack()  # program order: every row is some statement's loop
    assert s.state is state
    assert _order(s).is_equal(_order(Schedule(program)))
