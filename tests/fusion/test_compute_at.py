"""Hand fusion of two convolutions through `compute_at`: the producer runs per consumer tile,
the activation between them is a temporary that never goes to DRAM (the simulator's DRAM
counters hold exactly the inputs, weights and output once each), bit-exact against PyTorch;
an illegal fusion is refused with a counterexample."""

from __future__ import annotations

from pathlib import Path

import islpy as isl
import numpy as np
import pytest

from tensorgen.codegen.scheduled import compile_scheduled
from tensorgen.driver import Job, random_inputs, run_and_compare
from tensorgen.errors import ScheduleError
from tensorgen.ir.verify import verify_program
from tensorgen.schedule import steps
from tensorgen.schedule.api import Schedule
from tensorgen.spec.loader import load_program
from tensorgen.target import load_target

HERE = Path(__file__).parent


def _load(name: str):
    program = verify_program(load_program(HERE / name, None))
    return program, load_target(program.target)


def _compulsory(program) -> int:
    """DRAM bytes of the inputs and outputs, once each: what a fused program must move."""
    return sum(t.nbytes for t in program.tensors if t.role != "none")


def _pointwise_pair(s: Schedule) -> None:
    """1x1 -> 1x1: per consumer image row, the producer's row (init, MATMULs over 16-channel
    blocks, requantization), then the consumer's MATMULs over it."""
    loop = s.loop
    for stmt, k in (("S0", "k"), ("S1", "k"), ("S2", "k"), ("S3", "j"), ("S4", "j")):
        s.reorder(loop(f"{stmt}.h"), loop(f"{stmt}.{k}"))
    s.fuse(s.fuse(loop("S0.n"), loop("S1.n")), loop("S2.n"))
    s.fuse(s.fuse(loop("S0.h"), loop("S1.h")), loop("S2.h"))
    k = s.fuse(s.fuse(loop("S0.k"), loop("S1.k")), loop("S2.k"))
    _, ki = s.split(k, 16)
    k1 = s.distribute(ki, "S1", "S2")
    s.distribute(k1, "S2")
    s.reorder(loop("S1.w"), k1)
    s.fuse(loop("S3.n"), loop("S4.n"))
    h = s.fuse(loop("S3.h"), loop("S4.h"))
    s.fuse(loop("S3.j"), loop("S4.j"))
    k3o, k3i = s.split(loop("S3.k"), 16)
    s.distribute(loop("S3.j"), "S4")
    s.reorder(k3o, loop("S3.w"), loop("S3.j"))
    s.compute_at(h, "S0", "S1", "S2")
    for t in ("X", "W1", "B1", "W2", "Y"):
        s.stage(t, None, "spad")
    s.stage("H", h, "spad")
    s.stage("ACC1", h, "acc")
    s.stage("ACC2", h, "acc")
    s.vectorize(loop("S0.w"))
    s.tensorize(loop("S1.w"), k1, loop("c"))
    s.vectorize(loop("S2.w"))
    s.tensorize(loop("S3.w"), loop("S3.j"), k3i)
    s.vectorize(loop("S4.w"))


def _consumer_3x3(s: Schedule):
    """1x1 -> 3x3: the consumer's rows as the tile loop, its MATMULs over the taps; returns h."""
    loop = s.loop
    for stmt, k in (("S0", "k"), ("S1", "k"), ("S2", "j"), ("S3", "j")):
        s.reorder(loop(f"{stmt}.h"), loop(f"{stmt}.{k}"))
    s.fuse(loop("S0.n"), loop("S1.n"))
    s.fuse(loop("S0.h"), loop("S1.h"))
    s.fuse(loop("S0.k"), loop("S1.k"))
    s.distribute(loop("S0.k"), "S1")
    s.reorder(loop("S0.w"), loop("S0.k"))
    s.fuse(loop("S2.n"), loop("S3.n"))
    h = s.fuse(loop("S2.h"), loop("S3.h"))
    s.fuse(loop("S2.j"), loop("S3.j"))
    s.distribute(loop("S2.j"), "S3")
    s.reorder(loop("r"), loop("s"), loop("S2.w"), loop("S2.j"), loop("S2.k"))
    return h


def _halo_pair(s: Schedule) -> None:
    loop = s.loop
    h = _consumer_3x3(s)
    s.compute_at(h, "S0", "S1")
    for t in ("X", "W1", "W2", "Y"):
        s.stage(t, None, "spad")
    s.stage("ACC2", h, "acc")
    s.tensorize(loop("S0.w"), loop("S0.k"), loop("c"))
    s.vectorize(loop("S1.w"))
    s.tensorize(loop("S2.w"), loop("S2.j"), loop("S2.k"))
    s.vectorize(loop("S3.w"))


def _run(name: str, build) -> tuple[Schedule, list]:
    program, target = _load(name)
    s = Schedule(program, target)
    build(s)
    job = Job(program, target, compile_scheduled(program, target, s))
    results = []
    for seed in (0, 1):
        inputs = random_inputs(program, seed)
        for name in ("B1", "B2"):  # biases of a real layer's size: the activations do not saturate
            if name in inputs:
                inputs[name] = np.random.default_rng(seed).integers(-3000, 3000, inputs[name].shape)
                inputs[name] = inputs[name].astype(np.int32)
        cmp, result = run_and_compare(job, inputs)
        assert cmp.exact, cmp.message
        results.append(result)
    assert len(np.unique(result.outputs["Y"])) > 10, "the outputs saturate: a weak check"
    return s, results


def test_pointwise_pair_fused_per_row_never_stores_the_intermediate() -> None:
    s, results = _run("conv1x1_pair.yaml", _pointwise_pair)
    program = s.program
    # the producer now runs inside the consumer's row loop
    assert s.loops("S1")[:2] == s.loops("S3")[:2]
    # one row of H (32 channels x 8 pixels) is on chip at a time, not the whole 2 KiB tensor
    stage = next(st for st in s.stages if st.tensor == "H")
    assert s.footprint_bytes(stage) == 32 * 8
    # every DRAM byte is an input, a weight, a bias or the output, once each: none is H's
    for result in results:
        assert result.stats.dram_bytes == _compulsory(program) == 3200


def test_halo_is_computed_by_the_first_tile_that_reads_it() -> None:
    s, results = _run("conv1x1_conv3x3.yaml", _halo_pair)
    # producer row r runs in consumer row max(r - 1, 0): row 0's tile computes rows 0 and 1
    tiles = s.statement_map("S1")
    h_pos = s.position(s.loop("S2.h"))
    for r, tile in ((0, 0), (1, 0), (2, 1), (7, 6)):
        point = tiles.intersect_domain(isl.Set(f"{{ S1[n, k, h, w] : h = {r} }}"))
        assert point.range().dim_max_val(h_pos).to_python() == tile
    for result in results:
        assert result.stats.dram_bytes == _compulsory(s.program) == 4608


def test_fusing_the_rows_without_the_halo_is_refused_with_a_counterexample() -> None:
    program, target = _load("conv1x1_conv3x3.yaml")
    s = Schedule(program, target)
    h = _consumer_3x3(s)
    s.fuse(s.loop("S0.n"), s.loop("S2.n"))  # one image loop: legal
    with pytest.raises(ScheduleError) as err:
        s.fuse(s.loop("S0.h"), h)  # producer row h with consumer row h: h + 1 is not there yet
    message = str(err.value)
    assert message.startswith("fuse(S0.h, S2.h): ")
    assert "would run before" in message and "H[" in message


def test_compute_at_replays_from_its_trace() -> None:
    program, target = _load("conv1x1_pair.yaml")
    s = Schedule(program, target)
    _pointwise_pair(s)
    assert "s.compute_at(s.loop('S3.h'), 'S0', 'S1', 'S2')" in str(s)
    again = steps.replay(program, steps.loads(steps.dumps(s.trace)), target)
    assert again.union_map().is_equal(s.union_map())


def test_compute_at_refuses_a_statement_the_loop_does_not_read() -> None:
    program, target = _load("conv1x1_pair.yaml")
    s = Schedule(program, target)
    with pytest.raises(ScheduleError, match=r"compute_at\(S4.h, S0\): .* writes nothing"):
        s.compute_at(s.loop("S4.h"), "S0")
