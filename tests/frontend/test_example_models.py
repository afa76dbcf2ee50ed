"""The example models of issue 15 (examples/models/segnet.py, shufflenetv2.py, inception.py,
mobilenetv3_small.py):
quantized, compiled, simulated and compared bit for bit under qnnpack and x86, at small sizes to
keep the suite fast (`tensorgen check examples/models/NAME.py --trials 3` runs the defaults)."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

from tensorgen.frontend.probe import x86_behaviour
from tensorgen.frontend.quantize import load_factory
from tensorgen.model import check_model, compile_model
from tensorgen.target import load_target

MODELS = Path(__file__).parents[2] / "examples" / "models"
TG1 = load_target("tg1")

warnings.filterwarnings("ignore", category=UserWarning)

#: Under x86 on an AVX512-VNNI CPU PyTorch runs these models' convs of <= 100 groups on oneDNN,
#: whose requantization tensorgen computes with VREQUANTO (tensorgen.frontend.onednn).
ONEDNN = x86_behaviour("x86").onednn_groups > 0


@pytest.mark.parametrize("engine", ["qnnpack", "x86"])
@pytest.mark.parametrize(
    "name, params, ops",
    [
        ("segnet", {"size": 16}, {"upsample_nearest": 2, "cat": 2}),
        ("shufflenetv2", {"size": 32}, {"transpose": 4, "cat": 4, "slice": 4}),
        ("inception", {"size": 8}, {"cat": 2, "max_pool2d": 3}),
        # the stem and the first five blocks: ReLU and hardswish blocks, with and without
        # squeeze-excite, and residual adds; lookups and adds fold into the convs before them
        (
            "mobilenetv3_small",
            {"size": 64, "blocks": 5, "classes": 10},
            {"lut": 10, "mul": 3, "adaptive_avg_pool2d": 4, "add": 2},
        ),
    ],
)
def test_example_model_bit_exact(name, params, ops, engine, wide_inputs):
    model, example = load_factory(str(MODELS / f"{name}.py"), params)
    cm = compile_model(model, example, TG1, engine=engine)
    onednn = any(i.mnemonic == "VREQUANTO" for i in cm.binary.code)
    assert onednn == (engine == "x86" and ONEDNN)
    kinds = [layer.op for layer in cm.graph.layers]
    kinds += [e for layer in cm.graph.layers for e in layer.epilogue]  # what folded into them
    assert {op: kinds.count(op) for op in ops} == ops, kinds
    for seed in (0, 1):
        cmp, _ = check_model(cm, wide_inputs(cm, seed))
        assert cmp.exact, cmp.message
    cmp, _ = check_model(cm, wide_inputs(cm, None))
    assert cmp.exact, cmp.message
