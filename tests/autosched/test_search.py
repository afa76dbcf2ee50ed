"""The automatic scheduler: bit-exact choices, a cost model that agrees with the simulator,
explanations that replay, and a clear fallback."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from tensorgen.autosched.layer import recognise
from tensorgen.autosched.search import MAX_CANDIDATES, Space, _nest_key, auto_schedule
from tensorgen.codegen.scheduled import compile_scheduled
from tensorgen.driver import Job, compile_auto, compile_default, random_inputs, run_and_compare
from tensorgen.errors import CapacityError
from tensorgen.mc.binary import encode
from tensorgen.schedule.cost import cost_product
from tensorgen.schedule.files import render, replay
from tensorgen.spec.loader import load_program, parse_program
from tensorgen.target import load_target

ROOT = Path(__file__).parents[2]
SMALL_CONV = """tensorgen: 1
tensors:
  X: {shape: [1, 20, 9, 11], dtype: int8, role: input}
  W: {shape: [24, 20, 3, 3], dtype: int8, role: input}
  Y: {shape: [1, 24, 5, 6], dtype: int32, role: output}
statements:
  - Y[n, k, h, w] += X[n, c, 2*h + r - 1, 2*w + s - 1] * W[k, c, r, s]
"""


def _check(program, target_name: str):
    target = load_target(target_name)
    result = compile_auto(program, target)
    assert result.plan.schedule is not None, result.plan.reason
    cmp, sim = run_and_compare(Job(program, target, result.compiled), random_inputs(program, 7))
    assert cmp.exact, cmp.message
    model = result.plan.chosen.cycles
    assert abs(model - sim.stats.cycles) <= 0.1 * sim.stats.cycles, (model, sim.stats.cycles)
    return result


@pytest.mark.parametrize(
    "name",
    [
        "matmul_odd",
        "conv1x1",
        "depthwise3x3",
        pytest.param("conv3x3_resnet18", marks=pytest.mark.slow),
        pytest.param("matmul_256", marks=pytest.mark.slow),
    ],
)
def test_examples_on_tg1(name: str) -> None:
    _check(load_program(ROOT / "examples" / f"{name}.yaml"), "tg1")


@pytest.mark.parametrize("target", ["tg1", "tiny"])
def test_strided_conv_with_partial_tiles(target: str) -> None:
    result = _check(parse_program(SMALL_CONV), target)
    # the search stays well inside its budget, counted in candidates (never in seconds: the
    # machine is shared, and the choice must not depend on its speed)
    assert 0 < len(result.plan.considered) < MAX_CANDIDATES // 2


def test_explanation_is_a_replayable_schedule_file() -> None:
    program = load_program(ROOT / "examples" / "matmul_odd.yaml")
    tg1 = load_target("tg1")
    plan = auto_schedule(program, tg1)
    text = plan.explain(tg1)
    assert "bottleneck:" in text and "neighbours (one choice changed):" in text
    again = replay(render(plan.schedule), program, tg1)
    assert again.trace == plan.schedule.trace
    a = compile_scheduled(program, tg1, again).binary
    assert a == compile_scheduled(program, tg1, plan.schedule).binary


def test_programs_outside_the_search_space_get_the_primitive_built_schedule() -> None:
    program = load_program(ROOT / "examples" / "rnn_cell.yaml")
    result = compile_auto(program, load_target("tg1"))
    # outside the layer search: the fastest of the primitive-built schedules, measured
    assert result.plan.schedule is not None and result.plan.chosen is None
    assert "recurrences" in result.plan.explain(load_target("tg1"))
    cmp, _ = run_and_compare(
        Job(program, load_target("tg1"), result.compiled), random_inputs(program, 1)
    )
    assert cmp.exact


def test_a_target_too_small_for_any_tile_is_a_capacity_error(tmp_path: Path) -> None:
    small = tmp_path / "micro.yaml"
    small.write_text(
        (ROOT / "tensorgen" / "target" / "isa" / "tiny.yaml")
        .read_text()
        .replace("name: tiny", "name: micro")
        .replace("bytes: 2048", "bytes: 16")
    )
    with pytest.raises(CapacityError, match=r"does not fit target micro"):
        compile_auto(parse_program(SMALL_CONV), load_target(str(small)))


# -- fused layers: init + contraction + element-wise epilogue -------------------------------------

LAYERS = Path(__file__).parent / "layers"


def _dma_tensors(binary) -> set[str]:
    """The tensors that some LOAD or STORE moves between DRAM and the chip."""
    out = set()
    for ins in binary.code:
        if ins.mnemonic in ("LOAD", "STORE"):
            box = ins.arg("src") if ins.mnemonic == "LOAD" else ins.arg("dst")
            out.add(binary.tensors[box.tensor].name)
    return out


def _check_layer(path: Path, target_name: str):
    program = load_program(path)
    result = _check(program, target_name)
    plan = result.plan
    assert plan.layer is not None and plan.layer.others, "the init and epilogue must be fused"
    temporaries = {t.name for t in program.tensors if t.role == "none"}
    assert not temporaries & _dma_tensors(result.compiled.binary), "a temporary went to DRAM"
    return result


@pytest.mark.parametrize(
    "name",
    [
        "resnet_conv3x3_q",
        "proj1x1s2_q",
        "linear_q",
        "depthwise3x3s2_q",
        "stem7x7s2_q",
        "classifier_q",
    ],
)
def test_quantized_layers_on_tg1(name: str) -> None:
    _check_layer(LAYERS / f"{name}.yaml", "tg1")


@pytest.mark.parametrize(
    "name",
    [
        "depthwise3x3s2_q",
        pytest.param("resnet_conv3x3_q", marks=pytest.mark.slow),
        pytest.param("proj1x1s2_q", marks=pytest.mark.slow),
        pytest.param("linear_q", marks=pytest.mark.slow),
        pytest.param("stem7x7s2_q", marks=pytest.mark.slow),
    ],
)
def test_quantized_layers_on_tiny(name: str) -> None:
    _check_layer(LAYERS / f"{name}.yaml", "tiny")


def test_fused_layer_beats_the_default_schedule_and_explains_itself() -> None:
    program = load_program(ROOT / "examples" / "conv_bias_relu_requant.yaml")
    tg1 = load_target("tg1")
    result = _check_layer(ROOT / "examples" / "conv_bias_relu_requant.yaml", "tg1")
    _, default = run_and_compare(
        Job(program, tg1, compile_default(program, tg1)), random_inputs(program, 7)
    )
    _, auto = run_and_compare(Job(program, tg1, result.compiled), random_inputs(program, 7))
    assert auto.stats.cycles < default.stats.cycles
    text = result.plan.explain(tg1)
    assert "fused: S0 (init) and S2 (epilogue) with the contraction S1" in text
    assert "ACC never leaves the chip" in text
    # the accumulator tile lives in the accumulator SRAM, and the explanation replays
    assert "s.stage('ACC'" in text and "'acc')" in text
    again = replay(render(result.plan.schedule), program, tg1)
    assert again.trace == result.plan.schedule.trace


def test_a_plain_contraction_with_a_zero_point() -> None:
    program = parse_program("""tensorgen: 1
tensors:
  X: {shape: [1, 40, 6, 6], dtype: uint8, role: input, pad: 9}
  W: {shape: [20, 40, 3, 3], dtype: int8, role: input}
  Y: {shape: [1, 20, 6, 6], dtype: int32, role: output}
statements:
  - Y[n, k, h, w] += (X[n, c, h + r - 1, w + s - 1] - 9) * (W[k, c, r, s] - 1)
""")
    result = _check(program, "tg1")
    assert result.plan.layer is not None and not result.plan.layer.others


@pytest.mark.parametrize(
    "text, reason",
    [
        (
            """tensorgen: 1
tensors:
  A: {shape: [8, 8], dtype: int8, role: input}
  T: {shape: [8, 8], dtype: int32}
  C: {shape: [8, 8], dtype: int32, role: output}
statements:
  - T[i, j] += A[i, k] * A[k, j]
  - C[i, j] += T[i, k] * A[k, j]
""",
            "one reduction",
        ),
        (
            """tensorgen: 1
tensors:
  A: {shape: [8, 8], dtype: int8, role: input}
  T: {shape: [8, 8], dtype: int32}
  C: {shape: [8, 8], dtype: int32, role: output}
statements:
  - T[i, j] += A[i, k] * A[k, j]
  - C[i, j] = T[j, i]
""",
            "not point-wise",
        ),
    ],
)
def test_programs_that_are_not_layers_fall_back_with_the_reason(text: str, reason: str) -> None:
    program = parse_program(text)
    result = compile_auto(program, load_target("tg1"))
    # outside the layer search: the fastest of the primitive-built schedules, measured
    assert result.plan.chosen is None
    assert reason in result.plan.reason
    cmp, _ = run_and_compare(
        Job(program, load_target("tg1"), result.compiled), random_inputs(program, 1)
    )
    assert cmp.exact


@pytest.mark.parametrize(("name", "target_name"), [("conv1x1", "tg1"), ("matmul_odd", "tiny")])
def test_schedule_on_the_probed_skeleton_equals_a_rebuilt_one(name: str, target_name: str) -> None:
    # Space.schedule stages a candidate on a fork of the skeleton its probe built: the same
    # schedule (trace, maps, stages) and the same binary as on a skeleton built afresh, and the
    # probed skeleton's own schedule is left as it was
    program = load_program(ROOT / "examples" / f"{name}.yaml")
    target = load_target(target_name)
    space = Space.of(program, target, recognise(program))
    for shape, order in list(space.nests())[:6]:
        probed = space.probed(shape, order)
        fitting = [c for c in cost_product(*probed) if c.cycles != math.inf]
        if not fitting:
            continue
        cand = min(fitting, key=lambda c: c.cycles)
        probed_sk = space.skeletons[_nest_key(shape[0], order, shape[3])]
        before = (list(probed_sk.schedule.trace), probed_sk.schedule.state)
        forked, _ = space.schedule(cand, shape)
        assert (list(probed_sk.schedule.trace), probed_sk.schedule.state) == before
        space.skeletons.clear()
        rebuilt, _ = space.schedule(cand, shape)
        assert forked.trace == rebuilt.trace
        assert str(forked.union_map()) == str(rebuilt.union_map())
        assert forked.stages == rebuilt.stages
        a = compile_scheduled(program, target, forked)
        b = compile_scheduled(program, target, rebuilt)
        assert encode(a.binary) == encode(b.binary)
