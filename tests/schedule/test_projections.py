"""Lowering for the 1x1 projections and other array layers: the first MATMULs into a fresh
accumulator tile overwrite it (`accumulate=0`) instead of adding to a zeroed buffer (no VFILL);
a strided input is loaded one DMA per accessed row into a compact buffer. Bit-exact through the
simulator."""

from __future__ import annotations

from tensorgen.codegen.scheduled import compile_scheduled
from tensorgen.driver import Job, random_inputs, run_and_compare
from tensorgen.schedule.api import Schedule
from tensorgen.spec.loader import parse_program
from tensorgen.target import load_target

TG1 = load_target("tg1")
# c = 20: a full and a partial block of the array's rows; r, s: reduction loops outside the band
CONV = """tensorgen: 1
tensors:
  X: {shape: [1, 20, 9, 11], dtype: int8, role: input}
  W: {shape: [24, 20, 3, 3], dtype: int8, role: input}
  Y: {shape: [1, 24, 5, 6], dtype: int32, role: output}
statements:
  - Y[n, k, h, w] += X[n, c, 2*h + r - 1, 2*w + s - 1] * W[k, c, r, s]
"""


def _conv_schedule(double: str | None) -> Schedule:
    s = Schedule(parse_program(CONV), TG1)
    s.split(s.loop("k"), 16)
    s.split(s.loop("c"), 16)
    s.reorder(
        s.loop("n"),
        s.loop("k_o"),
        s.loop("c_o"),
        s.loop("r"),
        s.loop("s"),
        s.loop("h"),
        s.loop("w"),
        s.loop("k_i"),
        s.loop("c_i"),
    )
    s.stage("Y", s.loop("k_o"), "acc")
    s.stage("X", None, "spad")
    s.stage("W", s.loop(double) if double else None, "spad")
    s.double_buffer("Y")
    if double:
        s.double_buffer("W")
    s.tensorize((s.loop("h"), s.loop("w")), s.loop("k_i"), s.loop("c_i"))
    return s


def _run(s: Schedule):
    job = Job(s.program, TG1, compile_scheduled(s.program, TG1, s))
    cmp, result = run_and_compare(job, random_inputs(s.program, 3))
    assert cmp.exact, cmp.message
    return job.compiled.binary.code


def test_first_matmuls_overwrite_the_accumulator_tile() -> None:
    code = _run(_conv_schedule(None))
    mnemonics = [i.mnemonic for i in code]
    assert "VFILL" not in mnemonics
    # one overwriting MATMUL per kind of tile (16 and 8 columns): c_o, r and s in their first iterations
    assert sum(1 for i in code if i.mnemonic == "MATMUL" and not i.arg("accumulate")) == 2


PROJ = """tensorgen: 1
tensors:
  X: {shape: [1, 24, 14, 128], dtype: int8, role: input}
  W: {shape: [40, 24, 1, 1], dtype: int8, role: input}
  Y: {shape: [1, 40, 7, 64], dtype: int32, role: output}
statements:
  - Y[n, k, h, w] += X[n, c, 2*h, 2*w] * W[k, c, 0, 0]
"""


def test_strided_input_rows_are_loaded_one_dma_each_into_a_compact_buffer() -> None:
    s = Schedule(parse_program(PROJ), TG1)
    s.split(s.loop("k"), 16)
    s.split(s.loop("c"), 16)
    s.split(s.loop("h"), 2)  # ragged: 7 rows in blocks of 2
    s.reorder(
        s.loop("n"),
        s.loop("h_o"),
        s.loop("k_o"),
        s.loop("c_o"),
        s.loop("h_i"),
        s.loop("w"),
        s.loop("k_i"),
        s.loop("c_i"),
    )
    s.stage("Y", s.loop("h_o"), "acc")
    s.stage("X", s.loop("h_o"), "spad")
    s.stage("W", None, "spad")
    s.double_buffer("Y")
    s.double_buffer("X")
    s.tensorize((s.loop("h_i"), s.loop("w")), s.loop("k_i"), s.loop("c_i"))
    code = _run(s)
    x = [t.name for t in s.program.tensors].index("X")
    rows = [i for i in code if i.mnemonic == "LOAD" and i.arg("src").tensor == x]
    # two DMAs per block of output rows (X rows 4h_o and 4h_o + 2, not the row between), each one row
    assert rows and all(i.arg("src").shape[2] == 1 for i in rows)
    assert all(i.arg("dst").shape == (1, 24, 1, 127) for i in rows)


def test_auto_schedule_of_a_strided_projection_is_exact_and_costed() -> None:
    from tensorgen.driver import compile_auto

    program = parse_program(PROJ)
    result = compile_auto(program, TG1)
    assert result.plan.schedule is not None, result.plan.reason
    cmp, sim = run_and_compare(Job(program, TG1, result.compiled), random_inputs(program, 1))
    assert cmp.exact, cmp.message
    assert abs(result.plan.chosen.cycles - sim.stats.cycles) <= 0.1 * sim.stats.cycles
