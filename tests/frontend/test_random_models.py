"""The random-model property test: small CNNs composed from every layer kind tensorgen lowers
(examples/models/random_cnn.py), quantized by PyTorch, compiled, simulated and compared bit for
bit -- or refused with one of the documented one-line refusals (`random_cnn.REFUSALS`). Never a
traceback, never a mismatch. This is the fast profile; benchmarks/random_models.py is the long
one and prints the tally."""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tensorgen.errors import SpecError
from tensorgen.frontend.quantize import load_factory
from tensorgen.model import check_model, compile_model
from tensorgen.target import load_target

RANDOM_CNN = Path(__file__).parents[2] / "examples" / "models" / "random_cnn.py"
TG1 = load_target("tg1")

warnings.filterwarnings("ignore", category=UserWarning)


def refusals() -> dict[str, str]:
    import importlib.util

    spec = importlib.util.spec_from_file_location("_random_cnn", RANDOM_CNN)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.REFUSALS


def outcome(seed: int, engine: str, size: int = 8, quantizer: str = "fx") -> str:
    """ "exact", or the kind of documented refusal; raises AssertionError on anything else.
    With quantizer "pt2e" the engine is unused: the reference is tensorgen's PT2E rule."""
    model, example = load_factory(f"{RANDOM_CNN}:build", {"size": size, "seed": seed})
    try:
        cm = compile_model(model, example, TG1, engine=engine, quantizer=quantizer)
    except SpecError as err:
        text = str(err)
        assert "\n" not in text, text
        kind = next((k for k, rx in refusals().items() if re.search(rx, text)), None)
        assert kind is not None, f"seed {seed}: undocumented refusal: {text}"
        return kind
    for trial in range(2):
        x = torch.randn(*example[0].shape, generator=torch.Generator().manual_seed(trial)) * 1.5
        cmp, _ = check_model(cm, (x,))
        assert cmp.exact, f"seed {seed}, {engine}: {cmp.message}"
    return "exact"


@settings(max_examples=3, deadline=None, suppress_health_check=list(HealthCheck))
@given(seed=st.integers(0, 10_000))
def test_random_models_are_bit_exact_or_refused_in_one_line(seed):
    outcome(seed, "qnnpack")


@pytest.mark.parametrize("seed", [0, 1, 2, 3, 4, 5])
def test_random_model_architectures_cover_the_kinds(seed):
    """The generator itself: every architecture runs in float, and together the seeds draw
    several kinds."""
    model, example = load_factory(f"{RANDOM_CNN}:build", {"size": 8, "seed": seed})
    with torch.no_grad():
        assert torch.isfinite(model(*example)).all()
