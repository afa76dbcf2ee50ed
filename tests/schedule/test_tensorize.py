"""tensorize beyond one loop per role: operands either way round, and several reduction indices
folded into the MAC array's K (staged layouts, a run of K loops), as the automatic scheduler
folds a 7x7/2 stem (channels x kernel columns, and with one output column per block, the
kernel rows too)."""

from __future__ import annotations

import pytest

from tensorgen.autosched.layer import recognise
from tensorgen.autosched.search import Space
from tensorgen.codegen.scheduled import compile_scheduled
from tensorgen.driver import Job, random_inputs, run_and_compare
from tensorgen.errors import CodegenError, ScheduleError
from tensorgen.spec.loader import parse_program
from tensorgen.target import load_target

TG1 = load_target("tg1")


def stem(size: int, cout: int = 16, out: int | None = None) -> str:
    out = out or size // 2
    return f"""tensorgen: 1
tensors:
  X: {{shape: [1, 3, {size}, {size}], dtype: int8, role: input}}
  W: {{shape: [{cout}, 3, 7, 7], dtype: int8, role: input}}
  Y: {{shape: [1, {cout}, {out}, {out}], dtype: int32, role: output}}
statements:
  - Y[n, k, h, w] += X[n, c, 2*h + r - 3, 2*w + s - 3] * W[k, c, r, s]
"""


def _exact(program, schedule, target=TG1):
    compiled = compile_scheduled(program, target, schedule)
    cmp, sim = run_and_compare(Job(program, target, compiled), random_inputs(program, 3))
    assert cmp.exact, cmp.message
    return compiled, sim


def _matmul_rows(compiled) -> list[int]:
    return [i.arg("a").shape[-1] for i in compiled.binary.code if i.mnemonic == "MATMUL"]


def test_tensorize_holds_either_operand_in_the_array() -> None:
    from tensorgen.schedule.api import Schedule

    program = parse_program("""tensorgen: 1
tensors:
  A: {shape: [20, 40], dtype: int8, role: input}
  B: {shape: [40, 70], dtype: int8, role: input}
  C: {shape: [20, 70], dtype: int32, role: output}
statements:
  - C[i, j] += (A[i, k] - 3) * (B[k, j] - 5)
""")
    s = Schedule(program, TG1)
    io, ii = s.split(s.loop("i"), 16)
    ko, ki = s.split(s.loop("k"), 16)
    s.reorder(io, ko, s.loop("j"), ii, ki)
    s.tensorize(s.loop("j"), ii, ki)  # N = i: A is held in the array, B's 70 columns stream as M
    compiled, _ = _exact(program, s)
    mm = [i for i in compiled.binary.code if i.mnemonic == "MATMUL"]
    assert {i.arg("a").shape[0] for i in mm} == {70} and {i.arg("b").shape[1] for i in mm} == {
        16,
        4,
    }
    assert {(i.arg("a_zp"), i.arg("b_zp")) for i in mm} == {
        (5, 3)
    }  # the zero points swap with the roles


def test_channels_innermost_fold_kernel_columns_and_channels_into_k() -> None:
    from tensorgen.schedule.api import Schedule

    program = parse_program(stem(20))
    s = Schedule(program, TG1)
    loop = s.loop
    s.reorder(loop("n"), loop("r"), loop("h"), loop("w"), loop("k"), loop("s"), loop("c"))
    s.stage("X", None, "spad", layout=(0, 2, 3, 1))
    s.stage("W", None, "spad", layout=(0, 2, 3, 1))
    s.tensorize((loop("h"), loop("w")), loop("k"), (loop("s"), loop("c")))
    assert "layout=(0, 2, 3, 1)" in str(s) and "(s.loop('s'), s.loop('c')))" in str(s)
    compiled, _ = _exact(program, s)
    # 7 columns x 3 channels = 21 rows of K, cut into 16 + 5, inside the loop over the 7 kernel
    # rows; kernel row r = 0 is a piece of its own whose first MATMUL overwrites the accumulator
    # (no zero fill), the other rows accumulate
    code = compiled.binary.code
    assert _matmul_rows(compiled) == [16, 5, 16, 5]
    assert [i.arg("accumulate") for i in code if i.mnemonic == "MATMUL"] == [0, 1, 1, 1]
    assert "VFILL" not in [i.mnemonic for i in code]


def test_k_loops_that_are_not_one_run_of_addresses_are_refused() -> None:
    from tensorgen.schedule.api import Schedule

    program = parse_program(stem(20))
    s = Schedule(program, TG1)
    loop = s.loop
    s.reorder(loop("n"), loop("r"), loop("h"), loop("w"), loop("k"), loop("s"), loop("c"))
    s.tensorize(
        (loop("h"), loop("w")), loop("k"), (loop("s"), loop("c"))
    )  # NCHW: c is not innermost
    with pytest.raises(
        CodegenError, match=r"tensorize: the K loops of S0 are not one run of addresses"
    ):
        compile_scheduled(program, TG1, s)


def test_a_layout_must_be_a_permutation() -> None:
    from tensorgen.schedule.api import Schedule

    s = Schedule(parse_program(stem(20)), TG1)
    with pytest.raises(
        ScheduleError, match=r"^stage\(X, the program, spad\): layout must order the 4 dimensions"
    ):
        s.stage("X", None, "spad", layout=(0, 1, 1, 3))
    assert s.stages == []


def _best_schedule(program, target, want_window: bool):
    space = Space.of(program, target, recognise(program))
    best = None
    for shape, order in space.nests():
        fold = space.fold(shape[3])
        if fold is None or (fold.column is not None) != want_window:
            continue
        for cand in space.costed(shape, order):
            if best is None or cand.cycles < best[0].cycles:
                best = (cand, shape)
    assert best is not None
    return space, best


@pytest.mark.parametrize("window", [False, True])
def test_both_folds_of_a_stem_are_exact_and_costed(window: bool) -> None:
    program = parse_program(stem(36, cout=32))
    space, (cand, shape) = _best_schedule(program, TG1, window)
    fold = space.fold(shape[3])
    assert sorted(fold.indices) == (["c", "r", "s"] if window else ["c", "s"])
    schedule, _ = space.schedule(cand, shape)
    compiled, sim = _exact(program, schedule)
    rows = _matmul_rows(compiled)
    # each run of K is cut into MATMULs of 16 rows and one of the rest (isl may peel some sites):
    # 7 x 3 = 21 rows as 16 + 5; the window fold's 7 x 7 x 3 = 147 as 9 x 16 + 3
    last = 3 if window else 5
    code = compiled.binary.code
    overwrites = [i for i in code if i.mnemonic == "MATMUL" and not i.arg("accumulate")]
    # the first MATMUL of each element's first run overwrites the accumulator tile, which needs no
    # zeros: every run when the run does the whole reduction (window), else the runs of kernel row 0
    assert "VFILL" not in [i.mnemonic for i in code] and overwrites
    assert set(rows) == {16, last} and rows.count(16) == (9 if window else 1) * rows.count(last)
    assert abs(cand.cycles - sim.stats.cycles) <= 0.1 * sim.stats.cycles, (
        cand.cycles,
        sim.stats.cycles,
    )


def test_the_peak_of_a_folded_stem_counts_its_folded_rows() -> None:
    space = Space.of(
        parse_program(stem(36, cout=32)), TG1, recognise(parse_program(stem(36, cout=32)))
    )
    # 147 rows of K in 160 (10 MATMULs of 16 rows), 32 of 32 columns
    assert space.peak_macs_per_cycle() == pytest.approx(256 * 147 / 160)
