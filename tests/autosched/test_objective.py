"""The schedule objective (autosched/objective.py): `energy` trades a few cycles for DRAM bytes
where the fastest schedule reads an input again, both choices bit-exact, the default unchanged,
and an unknown objective refused in one line."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tensorgen.analysis.sweep import make_points
from tensorgen.autosched.objective import variable_pj
from tensorgen.driver import Job, compile_auto, random_inputs, run_and_compare
from tensorgen.mc.binary import encode
from tensorgen.spec.loader import parse_program
from tensorgen.target import load_target

# ResNet-18's layer1 3x3 conv at 56x56: the fastest schedule keeps 16 of its 64 output channels
# in the accumulator per block of rows and reads its input once per channel block
CONV = """tensorgen: 1
name: conv3x3_64
tensors:
  X: {shape: [1, 64, 56, 56], dtype: uint8, role: input}
  W: {shape: [64, 64, 3, 3], dtype: int8, role: input}
  B: {shape: [64], dtype: int32, role: input}
  ACC: {shape: [1, 64, 56, 56], dtype: int32}
  Y: {shape: [1, 64, 56, 56], dtype: uint8, role: output}
statements:
  - "ACC[n, k, h, w] = B[k]"
  - "ACC[n, k, h, w] += X[n, c, h + r - 1, w + s - 1] * W[k, c, r, s]"
  - "Y[n, k, h, w] = requant(ACC[n, k, h, w], 0.0010828988160938025, 0)"
"""


@pytest.fixture(scope="module")
def both():
    target = load_target("tg1")
    program = parse_program(CONV, "<conv3x3_64>", "tg1")
    inputs = random_inputs(program, 3)
    out = {}
    for objective in ("cycles", "energy"):
        result = compile_auto(program, target, objective)
        assert result.plan.objective == objective and result.plan.chosen is not None
        cmp, sim = run_and_compare(Job(program, target, result.compiled), inputs)
        assert cmp.exact, (objective, cmp.message)
        out[objective] = (result, sim.stats)
    return target, program, out


def test_energy_trades_cycles_for_dram(both):
    target, _, out = both
    (fast, fast_stats), (frugal, frugal_stats) = out["cycles"], out["energy"]
    # the cost model: each objective's choice is the best of its own measure
    assert fast.plan.chosen.cycles <= frugal.plan.chosen.cycles
    assert variable_pj(frugal.plan.chosen, target) < variable_pj(fast.plan.chosen, target)
    # the simulator agrees: much less DRAM and energy for a few percent more cycles
    assert frugal_stats.dram_bytes < 0.5 * fast_stats.dram_bytes
    assert frugal_stats.energy_pj < 0.7 * fast_stats.energy_pj
    assert fast_stats.cycles <= frugal_stats.cycles <= 1.05 * fast_stats.cycles


def test_default_objective_is_cycles(both):
    target, program, out = both
    again = compile_auto(program, target)
    assert encode(again.compiled.binary) == encode(out["cycles"][0].compiled.binary)


def test_explain_names_the_objective(both):
    target, _, out = both
    text = out["energy"][0].plan.explain(target)
    assert "objective: energy" in text and "the fastest candidate" in text
    assert "objective:" not in out["cycles"][0].plan.explain(target)


def test_unknown_objective_is_refused(tmp_path):
    target = load_target("tg1")
    program = parse_program(CONV, "<conv3x3_64>", "tg1")
    with pytest.raises(ValueError, match="unknown schedule objective 'speed'"):
        compile_auto(program, target, "speed")
    op = tmp_path / "conv.yaml"
    op.write_text(CONV)
    run = subprocess.run(
        [sys.executable, "-m", "tensorgen.cli", "check", str(op), "--objective", "speed"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 2 and "invalid choice: 'speed'" in run.stderr


def test_sweep_points_differ_by_objective(tmp_path):
    op = tmp_path / "conv.yaml"
    op.write_text(CONV)
    base = {"name": "tg1"}
    (a,), (b,) = (make_points(str(op), base, {}, {}, "qnnpack", o) for o in ("cycles", "energy"))
    assert a["key"] != b["key"] and b["objective"] == "energy"
