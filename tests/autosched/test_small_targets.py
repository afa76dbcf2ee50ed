"""The automatic scheduler on small targets: every layer kind gets an automatic schedule (not
the default one) on tiny, whose accumulators hold fewer rows of M than these layers have, and
on a target smaller still; and its isl operation limit falls back to the default schedule."""

from __future__ import annotations

import warnings
from pathlib import Path

import islpy as isl
import pytest

from tensorgen.autosched import search as auto
from tensorgen.driver import Job, compile_auto, random_inputs, run_and_compare
from tensorgen.spec.loader import parse_program
from tensorgen.target import load_target

ROOT = Path(__file__).parents[2]


def _matmul(m: int, k: int, n: int) -> str:
    return f"""tensorgen: 1
tensors:
  A: {{shape: [{m}, {k}], dtype: int8, role: input}}
  B: {{shape: [{k}, {n}], dtype: int8, role: input}}
  C: {{shape: [{m}, {n}], dtype: int32, role: output}}
statements:
  - C[i, j] += A[i, k] * B[k, j]
"""


def _conv(cin: int, cout: int, h: int, w: int, kernel: int, stride: int, pad: int) -> str:
    oh, ow = (h + 2 * pad - kernel) // stride + 1, (w + 2 * pad - kernel) // stride + 1
    return f"""tensorgen: 1
tensors:
  X: {{shape: [1, {cin}, {h}, {w}], dtype: int8, role: input}}
  W: {{shape: [{cout}, {cin}, {kernel}, {kernel}], dtype: int8, role: input}}
  Y: {{shape: [1, {cout}, {oh}, {ow}], dtype: int32, role: output}}
statements:
  - Y[n, k, h, w] += X[n, c, {stride}*h + r - {pad}, {stride}*w + s - {pad}] * W[k, c, r, s]
"""


# small variants of the suite's layers that fell back to the default schedule on tiny: M (the
# streamed rows: a matmul's rows, an image's columns) above the 64 rows of accumulators tiny has
LAYERS = {
    "matmul": _matmul(72, 24, 20),  # matmul_256
    "bert": _matmul(80, 48, 12),  # the BERT matmuls: K above N
    "stem7x7s2": _conv(3, 8, 9, 143, 7, 2, 3),  # resnet18_stem_7x7s2: 72 output columns
    "pw_32to16": _conv(16, 8, 2, 70, 1, 1, 0),  # mbv2_pw_32to16_112
    "pw_16to96": _conv(8, 24, 2, 70, 1, 1, 0),  # mbv2_pw_16to96_112
}


def _micro(tmp_path: Path) -> str:
    """tiny with a 128-byte scratchpad: a tile of tiny's M rows leaves no room for the operands."""
    path = tmp_path / "micro.yaml"
    path.write_text(
        (ROOT / "tensorgen" / "target" / "isa" / "tiny.yaml")
        .read_text()
        .replace("name: tiny", "name: micro")
        .replace("bytes: 2048", "bytes: 128")
    )
    return str(path)


def _check_auto(text: str, target_name: str):
    program = parse_program(text)
    target = load_target(target_name)
    result = compile_auto(program, target)
    assert result.plan.schedule is not None, result.plan.reason  # no fallback
    cmp, sim = run_and_compare(Job(program, target, result.compiled), random_inputs(program, 3))
    assert cmp.exact, cmp.message
    model = result.plan.chosen.cycles
    assert abs(model - sim.stats.cycles) <= 0.1 * sim.stats.cycles, (model, sim.stats.cycles)
    return result


@pytest.mark.parametrize("name", list(LAYERS))
def test_layers_wider_than_the_accumulators_get_an_automatic_schedule_on_tiny(name: str) -> None:
    _check_auto(LAYERS[name], "tiny")


@pytest.mark.parametrize(
    "text", [LAYERS["matmul"], _conv(20, 24, 9, 11, 3, 2, 1)], ids=["matmul", "conv3x3s2"]
)
def test_a_target_smaller_than_tiny_still_gets_an_automatic_schedule(
    text: str, tmp_path: Path
) -> None:
    # the M blocks that fill the accumulators (and for the conv, half of them) leave no room for
    # the operands: the search retries with smaller ones
    _check_auto(text, _micro(tmp_path))


def test_the_isl_operation_limit_falls_back_to_the_default_schedule(monkeypatch) -> None:
    program = parse_program(LAYERS["matmul"])
    tiny = load_target("tiny")
    ctx = isl.DEFAULT_CONTEXT
    before = ctx.get_max_operations()
    monkeypatch.setattr(auto, "ISL_MAX_OPERATIONS", 2000)
    with pytest.warns(UserWarning, match="operation limit"):
        result = compile_auto(program, tiny)
    # the default schedule, built from the primitives, is auto's choice then: the search chose none
    assert result.plan.schedule is not None and result.plan.chosen is None
    assert "isl's operation limit (2,000 operations" in result.plan.reason
    assert "operation limit" in result.plan.explain(tiny)
    # the limit is gone once the search is: the default schedule compiled, and runs bit-exact
    assert ctx.get_max_operations() == before
    cmp, _ = run_and_compare(Job(program, tiny, result.compiled), random_inputs(program, 5))
    assert cmp.exact, cmp.message
    # and the next search, with the usual limit, is not affected
    monkeypatch.undo()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        again = compile_auto(program, tiny)
    assert again.plan.schedule is not None, again.plan.reason
    assert ctx.get_max_operations() == before


def test_a_limit_reached_inside_any_isl_call_is_recognised() -> None:
    # however the search fails when it runs out of operations (isl errors, None from islpy), the
    # plan says it was the limit; every limit from tiny to just short of enough does (enough is
    # about 17,000 once the parsed transforms, staged boxes, compositions, widths and legal
    # verdicts of earlier searches are cached -- 23,600 before the widths, constant rows and
    # initial readers were read without isl's heavier calls, 44,000 before legality checks went
    # through the dependences -- and over 100,000 without those caches)
    program = parse_program(LAYERS["pw_32to16"])
    tiny = load_target("tiny")
    for limit in (1, 100, 10_000, 15_000):
        with pytest.warns(UserWarning, match="operation limit"):
            plan = auto.auto_schedule(program, tiny, max_operations=limit)
        assert plan.schedule is None and "operation limit" in plan.reason, (limit, plan.reason)
    assert auto.auto_schedule(program, tiny, max_operations=0).schedule is not None  # 0: no limit
