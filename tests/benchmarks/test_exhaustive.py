"""benchmarks/exhaustive.py: the automatic scheduler against every candidate of its search space,
simulated. The acceptance of issue 4: auto within 5 % of the exhaustive optimum."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tensorgen.target import load_target

REPO = Path(__file__).resolve().parents[2]
# benchmarks/ is a folder of scripts, not a package: exhaustive.py imports its sibling layers.py
if str(REPO / "benchmarks") not in sys.path:
    sys.path.insert(0, str(REPO / "benchmarks"))

import exhaustive  # noqa: E402
import layers  # noqa: E402


def _check(row: dict) -> None:
    assert row["error"] is None
    assert row["all_bit_exact"] is True
    assert 0 < row["simulated"] <= row["fitting"] <= row["candidates"]
    assert row["best_cycles"] <= row["auto_cycles"]  # the auto choice is one of the candidates
    assert row["auto_over_best"] <= 1.05, f"auto {row['auto']} vs best {row['best']}"


def test_auto_is_within_5_percent_of_the_exhaustive_optimum_on_a_small_matmul():
    """A 32^3 matmul on the tiny target: 182 candidates, 41 of which fit, in a few seconds."""
    row = exhaustive.enumerate_layer(
        layers.Layer("mm32", layers.Matmul(32, 32, 32)), load_target("tiny")
    )
    _check(row)
    report = {"target": "tiny", "layers": [row], "summary": exhaustive.summarize([row])}
    json.loads(json.dumps(report))
    assert report["summary"]["auto_within_5_percent"] is True
    exhaustive.render(report)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["resnet18_layer3_proj_1x1s2"])
def test_auto_is_within_5_percent_on_suite_layers(name: str):
    (layer,) = exhaustive.select([name])
    _check(exhaustive.enumerate_layer(layer, load_target("tg1")))


def test_the_enumerated_layers_exist():
    assert len(exhaustive.select(None)) >= 3
    with pytest.raises(ValueError, match="no such layer"):
        exhaustive.select(["nonesuch"])
