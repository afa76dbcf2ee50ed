"""An accumulator whose partial sums go to DRAM and come back: the reduction split into chunks
outside the column blocks, so that a chunk of A is staged once for every column block (BERT's
FFN down-projection, whose A does not fit the scratchpad). The accumulator tile of a column
block is loaded back for every chunk but the first (whose MATMULs overwrite it instead of
adding to zeros), stored after every chunk, and double-buffered so that its DMAs overlap the
MATMULs. Its DRAM traffic is exact: A and B once, C stored once per chunk and loaded once per
chunk but the first."""

from __future__ import annotations

import pytest

from tensorgen.codegen.scheduled import compile_scheduled
from tensorgen.driver import Job, compile_auto, random_inputs, run_and_compare
from tensorgen.schedule.api import Schedule
from tensorgen.spec.loader import parse_program
from tensorgen.target import load_target


def _matmul(m: int, k: int, n: int) -> str:
    return f"""tensorgen: 1
name: matmul_{m}x{k}x{n}
tensors:
  A: {{shape: [{m}, {k}], dtype: int8, role: input}}
  B: {{shape: [{k}, {n}], dtype: int8, role: input}}
  C: {{shape: [{m}, {n}], dtype: int32, role: output}}
statements:
  - C[i, j] += A[i, k] * B[k, j]
"""


def _chunked(program, target, chunk: int, double: bool) -> Schedule:
    """K in chunks of `chunk` outside the column blocks: C's tile of a column block and B's
    block at the column loop, A's chunk at the chunk loop."""
    s = Schedule(program, target)
    s.split(s.loop("j"), target.cols)
    s.split(s.loop("k"), chunk)
    s.split(s.loop("k_i"), target.rows)
    s.reorder(*(s.loop(x) for x in ("k_o", "j_o", "k_i_o", "i", "j_i", "k_i_i")))
    s.stage("C", s.loop("j_o"), "acc")
    s.stage("A", s.loop("k_o"), "spad")
    s.stage("B", s.loop("j_o"), "spad")
    if double:
        s.double_buffer("C")
        s.double_buffer("B")
    s.tensorize(s.loop("i"), s.loop("j_i"), s.loop("k_i_i"))
    return s


def _run(program, target, schedule):
    compiled = compile_scheduled(program, target, schedule)
    cmp, sim = run_and_compare(Job(program, target, compiled), random_inputs(program, 3))
    assert cmp.exact, cmp.message
    return compiled, sim


def _traffic(m: int, k: int, n: int, chunks: int) -> int:
    """A and B once; C (int32) stored after each chunk and loaded before each but the first."""
    return m * k + k * n + (2 * chunks - 1) * 4 * m * n


@pytest.mark.parametrize(
    "target_name, shape, chunk", [("tg1", (64, 256, 64), 128), ("tiny", (16, 64, 16), 32)]
)
@pytest.mark.parametrize("double", [True, False], ids=["double-buffered", "single-buffered"])
def test_k_chunked_accumulator_is_exact_and_moves_c_once_per_chunk(
    target_name, shape, chunk, double
) -> None:
    target = load_target(target_name)
    program = parse_program(_matmul(*shape), "<matmul>", target_name)
    compiled, sim = _run(program, target, _chunked(program, target, chunk, double))
    assert sim.stats.dram_bytes == _traffic(*shape, shape[1] // chunk)
    code = compiled.binary.code
    # the first chunk's first MATMULs overwrite the tile: it is neither loaded nor zeroed
    assert any(ins.mnemonic == "MATMUL" and not ins.arg("accumulate") for ins in code)
    assert not any(ins.mnemonic == "VFILL" for ins in code)


@pytest.mark.parametrize("shape, chunk", [((12, 40, 12), 24), ((16, 64, 20), 16)])
def test_k_chunked_accumulator_with_partial_chunks_and_blocks_is_exact(shape, chunk) -> None:
    target = load_target("tiny")
    program = parse_program(_matmul(*shape), "<matmul>", "tiny")
    _run(program, target, _chunked(program, target, chunk, True))


def test_a_double_buffered_accumulator_whose_boxes_meet_in_the_loop_is_exact() -> None:
    """C staged inside the reduction: consecutive iterations of its loop update the same tile,
    so its loads and stores cannot overlap; the loop runs its DMAs in order instead."""
    target = load_target("tiny")
    program = parse_program(_matmul(8, 32, 8), "<matmul>", "tiny")
    s = Schedule(program, target)
    s.split(s.loop("j"), 4)
    s.split(s.loop("k"), 4)
    s.reorder(*(s.loop(x) for x in ("j_o", "k_o", "i", "j_i", "k_i")))
    s.stage("C", s.loop("k_o"), "acc")
    s.stage("B", s.loop("k_o"), "spad")
    s.double_buffer("C")
    s.double_buffer("B")
    s.tensorize(s.loop("i"), s.loop("j_i"), s.loop("k_i"))
    _, sim = _run(program, target, s)
    # C's tile of a column block: zeroed by its first MATMUL, then loaded and stored at every k_o
    assert sim.stats.dram_bytes == 8 * 32 + 32 * 8 + 2 * (2 * 8 - 1) * 4 * 8 * 4


def _auto(program, target_name: str):
    target = load_target(target_name)
    result = compile_auto(program, target)
    plan = result.plan
    assert plan.schedule is not None, plan.reason
    cmp, sim = run_and_compare(Job(program, target, result.compiled), random_inputs(program, 5))
    assert cmp.exact, cmp.message
    assert abs(plan.chosen.cycles - sim.stats.cycles) <= 0.1 * sim.stats.cycles
    return plan, sim


def test_auto_scheduler_chunks_k_when_a_does_not_fit_the_scratchpad() -> None:
    # A (16 x 160 B) does not fit tiny's 2 KiB scratchpad: two chunks of 80 columns of it do
    plan, sim = _auto(parse_program(_matmul(16, 160, 24), "<matmul>", "tiny"), "tiny")
    assert plan.chosen.order[0] == "k_o" and dict(plan.chosen.stages)["A"] == "k_o"
    assert sim.stats.dram_bytes == plan.chosen.dram_bytes == _traffic(16, 160, 24, 2)


@pytest.mark.slow
def test_bert_ffn_down_moves_at_most_1_3x_its_compulsory_traffic() -> None:
    m, k, n = 128, 3072, 768
    plan, sim = _auto(parse_program(_matmul(m, k, n), "<matmul>", "tg1"), "tg1")
    assert sim.stats.dram_bytes == _traffic(m, k, n, 2) <= 1.3 * (m * k + k * n + 4 * m * n)
