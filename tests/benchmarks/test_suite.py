"""Smoke test of benchmarks/suite.py: its machinery on one tiny layer, in a few seconds."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tensorgen.codegen.compiled import useful_macs
from tensorgen.spec.loader import load_program, parse_program
from tensorgen.target import load_target

REPO = Path(__file__).resolve().parents[2]
# benchmarks/ is a folder of scripts, not a package: suite.py imports its sibling layers.py
if str(REPO / "benchmarks") not in sys.path:
    sys.path.insert(0, str(REPO / "benchmarks"))

import layers  # noqa: E402
import suite  # noqa: E402

LAYER_KEYS = {
    "name",
    "macs",
    "cycles",
    "roofline_attainment",
    "dram_bytes",
    "dram_lower_bound",
    "compile_s",
    "sim_s",
    "torch_s",
    "bit_exact",
    "sim_over_torch",
    "dram_over_lower_bound",
    "utilization",
}
SUMMARY_KEYS = {
    "geomean_roofline_attainment",
    "geomean_sim_over_torch",
    "geomean_dram_over_lower_bound",
    "total_compile_s",
}
QUICK = suite.Options(seed=1, repeats=2, sim_repeats=1)


@pytest.fixture(scope="module")
def tiny_report() -> dict:
    tiny = layers.Layer("mm16", layers.Matmul(16, 16, 16))
    return suite.run_suite([tiny], load_target("tiny"), QUICK)


def test_tiny_matmul_row(tiny_report):
    (row,) = tiny_report["layers"]
    assert row.keys() >= LAYER_KEYS
    assert row["error"] is None
    assert row["bit_exact"] is True and row["torch_matches_reference"] is True
    assert row["macs"] == 16**3
    assert 0 < row["roofline_attainment"] <= 1.0
    # no schedule beats the useful peak of the unit the layer runs on
    assert row["unit"] == "array" and row["roofline_attainment"] <= row["unit_ceiling"] <= 1.0
    # no schedule beats compulsory traffic: A and B read once (int8), C written once (int32)
    assert row["dram_lower_bound"] >= 16 * 16 * 2 + 16 * 16 * 4
    assert row["dram_bytes"] >= row["dram_lower_bound"]


def test_report_is_json_with_summary(tiny_report):
    report = json.loads(json.dumps(tiny_report))
    assert report["target"] == "tiny"
    assert report["summary"].keys() >= SUMMARY_KEYS
    assert report["summary"]["below_half"] == [
        {k: r[k] for k in ("name", "roofline_attainment", "unit", "unit_ceiling")}
        for r in report["layers"]
        if r["roofline_attainment"] < 0.5
    ]
    assert report["summary"]["all_bit_exact"] is True
    # which layers the automatic scheduler scheduled, and why the others fell back (none here)
    assert report["summary"]["auto_scheduled"] == 1 and report["summary"]["fallbacks"] == []
    assert (
        report["layers"][0]["schedule"] == "auto"
        and report["layers"][0]["schedule_fallback"] is None
    )
    suite.render(report)  # the table renders from the JSON alone


class _Misspelt(layers.Matmul):
    def op_yaml(self, name: str) -> str:
        return super().op_yaml(name).replace("A[i, k]", "A[i, k, k]")


def test_failed_layer_is_reported_not_raised():
    broken = layers.Layer("broken", _Misspelt(4, 4, 4))
    report = suite.run_suite([broken], load_target("tiny"), QUICK)
    (row,) = report["layers"]
    assert row["error"].startswith("SpecError") and "shape mismatch" in row["error"]
    assert report["summary"]["failed"] == ["broken"] and report["summary"]["all_bit_exact"] is False
    suite.render(report)


@pytest.mark.parametrize(
    "name, example",
    [("resnet18_conv3x3", "conv3x3_resnet18.yaml"), ("matmul_256", "matmul_256.yaml")],
)
def test_generated_layers_match_the_examples(name, example):
    """The suite's default layers are the operators of the example files, generated from sizes."""
    (layer,) = [la for la in layers.LAYERS if la.name == name]
    generated = parse_program(layer.op_yaml(), "<generated>", "tg1")
    reference = load_program(REPO / "examples" / example, "tg1")
    assert generated.tensors == reference.tensors
    for g, r in zip(generated.statements, reference.statements, strict=True):
        assert (g.lhs, g.op, g.rhs, g.indices, g.bounds) == (
            r.lhs,
            r.op,
            r.rhs,
            r.indices,
            r.bounds,
        )


@pytest.mark.parametrize("layer", layers.LAYERS, ids=lambda la: la.name)
def test_every_layer_parses_with_the_intended_macs(layer):
    """The op.yaml generated from a layer's sizes describes that layer (checked without compiling)."""
    program = parse_program(layer.op_yaml(), f"<{layer.name}>", "tg1")
    assert useful_macs(program) == layer.op.macs


def test_compulsory_traffic_of_a_strided_1x1_conv():
    """A 1x1 stride-2 conv reads one input element in four: that is compulsory, not all of X."""
    conv = layers.Conv2d(4, 8, 8, 1, stride=2)
    program = parse_program(conv.op_yaml("proj"), "<proj>", "tiny")
    total, exact = suite.compulsory_bytes(program)
    x, w, y = 4 * 4 * 4, 8 * 4, 8 * 4 * 4 * 4
    assert exact and total == x + w + y


def test_only_selects_by_name_and_pattern():
    assert [la.name for la in suite.select_layers(None, False)] == [
        "resnet18_conv3x3",
        "matmul_256",
    ]
    assert all(la.name.startswith("bert_") for la in suite.select_layers(["bert_*"], False))
    with pytest.raises(ValueError, match="no such layer"):
        suite.select_layers(["nope"], False)
