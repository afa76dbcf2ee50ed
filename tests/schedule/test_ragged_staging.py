"""A miscompile benchmarks/exhaustive.py found: an accumulator staged at a loop outside a ragged
split (one whose last iteration isl peels off), where that loop's iteration is emitted as
siblings (the split's full iterations, then its peeled one): each sibling was staged on its
own, zeroed and stored, so only the peeled rows came out right."""

from __future__ import annotations

from tensorgen.codegen.scheduled import compile_scheduled
from tensorgen.driver import compare, random_inputs
from tensorgen.reference.torch_ref import evaluate
from tensorgen.schedule.api import Schedule
from tensorgen.sim.machine import simulate
from tensorgen.spec.loader import parse_program
from tensorgen.target import load_target

CONV1X1 = """\
tensorgen: 1
name: conv1x1
tensors:
  X: {shape: [1, 32, 28, 28], dtype: int8, role: input}
  W: {shape: [32, 32, 1, 1], dtype: int8, role: input}
  Y: {shape: [1, 32, 28, 28], dtype: int32, role: output}
statements:
  - Y[n, k, h, w] += X[n, c, h, w] * W[k, c, 0, 0]
"""


def _run(h_block: int) -> str:
    target = load_target("tg1")
    program = parse_program(CONV1X1, "<conv1x1>", "tg1")
    s = Schedule(program, target)
    s.split(s.loop("k"), 16)
    s.split(s.loop("c"), 16)
    s.split(s.loop("h"), h_block)
    s.reorder(*(s.loop(x) for x in ("k_o", "n", "h_o", "c_o", "h_i", "w", "k_i", "c_i")))
    s.stage("Y", s.loop("n"), "acc")  # n has one iteration: Y's 16 channels of the whole image
    s.stage("X", None, "spad")
    s.stage("W", s.loop("h_o"), "spad")
    s.tensorize((s.loop("h_i"), s.loop("w")), s.loop("k_i"), s.loop("c_i"))
    inputs = random_inputs(program, 0)
    result = simulate(compile_scheduled(program, target, s).binary, inputs, target)
    return compare(evaluate(program, inputs), result.outputs).message


def test_accumulator_staged_outside_an_even_split_is_exact():
    assert _run(7) == "BIT-EXACT"


def test_accumulator_staged_outside_a_ragged_split_is_exact():
    assert _run(9) == "BIT-EXACT"
