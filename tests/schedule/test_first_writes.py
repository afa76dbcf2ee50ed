"""A `+=` into a fresh buffer (an int32 output with no init statement) overwrites on the first
write of each element (isl's lexmin of the writes: VMUL for VMAC, a MATMUL with accumulate=0 for
its first K block) instead of zeroing the buffer first: the zero fill ran on the vector unit,
which bounds depthwise layers and shares the compute queue with the MAC array."""

from __future__ import annotations

import pytest

from tensorgen.codegen.scheduled import compile_scheduled
from tensorgen.driver import Job, compile_auto, random_inputs, run_and_compare
from tensorgen.schedule.api import Schedule
from tensorgen.spec.loader import parse_program
from tensorgen.target import load_target

DEPTHWISE = """\
tensorgen: 1
name: dw_small
tensors:
  X: {shape: [1, 6, 10, 12], dtype: int8, role: input}
  W: {shape: [6, 1, 3, 3], dtype: int8, role: input}
  Y: {shape: [1, 6, 10, 12], dtype: int32, role: output}
statements:
  - Y[n, c, h, w] += X[n, c, h + r - 1, w + s - 1] * W[c, 0, r, s]
"""


CONV = """\
tensorgen: 1
name: conv_small
tensors:
  X: {shape: [1, 20, 9, 11], dtype: int8, role: input}
  W: {shape: [24, 20, 3, 3], dtype: int8, role: input}
  Y: {shape: [1, 24, 5, 6], dtype: int32, role: output}
statements:
  - Y[n, k, h, w] += X[n, c, 2*h + r - 1, 2*w + s - 1] * W[k, c, r, s]
"""


def _mnemonics(binary) -> list[str]:
    return [ins.mnemonic for ins in binary.code]


def _exact(program, target, compiled) -> None:
    cmp, _ = run_and_compare(Job(program, target, compiled), random_inputs(program, 3))
    assert cmp.exact, cmp.message


@pytest.mark.parametrize("target_name", ["tg1", "tiny"])
def test_automatic_depthwise_overwrites_on_the_first_tap(target_name: str) -> None:
    program = parse_program(DEPTHWISE)
    target = load_target(target_name)
    result = compile_auto(program, target)
    assert result.plan.schedule is not None, result.plan.reason
    ops = _mnemonics(result.compiled.binary)
    assert "VFILL" not in ops and "VMUL" in ops and "VMAC" in ops
    cmp, sim = run_and_compare(Job(program, target, result.compiled), random_inputs(program, 3))
    assert cmp.exact, cmp.message
    model = result.plan.chosen.cycles
    assert abs(model - sim.stats.cycles) <= 0.1 * sim.stats.cycles, (model, sim.stats.cycles)


def _staged_at_c_ragged(s: Schedule) -> None:
    # Y staged per channel, double-buffered, over a ragged split of h (4, 4, then 2 peeled rows)
    s.split(s.loop("h"), 4)
    s.reorder(*(s.loop(x) for x in ("n", "c", "h_o", "r", "s", "h_i", "w")))
    for t in ("Y", "X", "W"):
        s.stage(t, s.loop("c"), "spad")
        s.double_buffer(t)
    s.vectorize(s.loop("h_i"), s.loop("w"))


def _element_by_element(s: Schedule) -> None:
    s.stage("Y", None, "spad")


def _taps_outermost(s: Schedule) -> None:
    # every channel's first tap comes before any second tap: the first writes are r = s = 0
    s.reorder(*(s.loop(x) for x in ("n", "r", "s", "c", "h", "w")))
    s.vectorize(s.loop("w"))


@pytest.mark.parametrize("build", [_staged_at_c_ragged, _element_by_element, _taps_outermost])
def test_hand_schedules_overwrite_on_the_first_write(build) -> None:
    program = parse_program(DEPTHWISE)
    target = load_target("tg1")
    s = Schedule(program, target)
    build(s)
    compiled = compile_scheduled(program, target, s)
    ops = _mnemonics(compiled.binary)
    assert "VFILL" not in ops and "VMUL" in ops
    _exact(program, target, compiled)


def test_an_accumulator_read_by_another_statement_is_still_zeroed() -> None:
    # Z reads Y: Y's first write cannot be told apart by Y's statement alone, so Y is zeroed
    program = parse_program(
        DEPTHWISE.replace(
            "  Y: {shape: [1, 6, 10, 12], dtype: int32, role: output}",
            "  Y: {shape: [1, 6, 10, 12], dtype: int32, role: none}\n"
            "  Z: {shape: [1, 6, 10, 12], dtype: int32, role: output}",
        )
        + "  - Z[n, c, h, w] = Y[n, c, h, w] + 1\n"
    )
    target = load_target("tg1")
    s = Schedule(program, target)
    assert not s.overwrites_first("Y")
    compiled = compile_scheduled(program, target, s)
    assert "VFILL" in _mnemonics(compiled.binary)
    _exact(program, target, compiled)


@pytest.mark.parametrize("target_name", ["tg1", "tiny"])
def test_automatic_conv_starts_each_accumulator_with_a_matmul_that_overwrites(
    target_name: str,
) -> None:
    # K = 20 channels x 9 taps. On tg1, the first block of each output tile (c_o = r = s = 0)
    # overwrites the accumulator and the others accumulate. On tiny, X and W are staged at c_o,
    # inside which only c_o = 0 holds first writes: isl would peel that iteration out of the
    # pipelined loop, so the accumulator is zeroed instead (and the cost model knows it)
    program = parse_program(CONV)
    target = load_target(target_name)
    result = compile_auto(program, target)
    assert result.plan.schedule is not None, result.plan.reason
    code = result.compiled.binary.code
    accumulate = {ins.arg("accumulate") for ins in code if ins.mnemonic == "MATMUL"}
    if target_name == "tg1":
        assert "VFILL" not in _mnemonics(result.compiled.binary) and accumulate == {0, 1}
    else:
        assert dict(result.plan.chosen.stages)["X"] == "c_o"
        assert "VFILL" in _mnemonics(result.compiled.binary) and accumulate == {1}
    cmp, sim = run_and_compare(Job(program, target, result.compiled), random_inputs(program, 3))
    assert cmp.exact, cmp.message
    model = result.plan.chosen.cycles
    assert abs(model - sim.stats.cycles) <= 0.1 * sim.stats.cycles, (model, sim.stats.cycles)
