"""Models around tensorgen/frontend/upsample.py and conv_transpose.py: nearest interpolation of
any scale or size, bilinear with dyadic weights, ConvTranspose2d (stride, padding, output
padding, groups, dilation), compiled, simulated and compared bit for bit with PyTorch under
qnnpack and x86; and their one-line refusals."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tensorgen.errors import SpecError
from tensorgen.model import check_model, compile_model
from tensorgen.target import load_target

TG1 = load_target("tg1")
warnings.filterwarnings("ignore", category=UserWarning)


def assert_bit_exact(model: nn.Module, engine: str, shape=(1, 3, 8, 8), seeds=(0, 1)):
    torch.manual_seed(0)
    cm = compile_model(model.eval(), (torch.randn(*shape),), TG1, engine=engine)
    for seed in seeds:
        x = torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * 1.5
        cmp, _ = check_model(cm, (x,))
        assert cmp.exact, cmp.message
    return cm


class Decoder(nn.Module):
    """Every path at once: bilinear x2 (align_corners False) and to 2n-1 (align_corners True)
    on quantized data, nearest by 1.5 and nearest-exact to a size, nn.Upsample to a size that
    does not divide (FX leaves it in float: a dequantize with a gathering subscript), and
    transposed convolutions (3x3 stride 2 with output padding, a depthwise 4x4 stride 2, a
    dilated stride-3 one)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(7)
        self.a, self.r = nn.Conv2d(3, 8, 3, padding=1), nn.ReLU()
        self.up = nn.Upsample(size=(11, 5))
        self.t1 = nn.ConvTranspose2d(8, 8, 3, stride=2, padding=1, output_padding=1)
        self.t2 = nn.ConvTranspose2d(8, 8, 4, stride=2, padding=1, groups=8)
        self.t3 = nn.ConvTranspose2d(8, 8, 5, stride=3, padding=2, dilation=2)

    def forward(self, x):
        a = self.r(self.a(x))
        return (
            F.interpolate(a, scale_factor=2, mode="bilinear"),
            F.interpolate(a, size=(15, 15), mode="bilinear", align_corners=True),
            F.interpolate(a, scale_factor=1.5),
            F.interpolate(a, size=(13, 6), mode="nearest-exact"),
            self.up(a),
            self.t1(a),
            self.t2(a),
            self.t3(a),
        )


@pytest.mark.slow  # eight outputs, 23 statements of conv phases: minutes of scheduling
@pytest.mark.parametrize("engine", ["qnnpack", "x86"])
def test_decoder_paths_are_bit_exact(engine):
    cm = assert_bit_exact(Decoder(), engine)
    ops = [layer.op for layer in cm.graph.layers]
    assert ops.count("upsample_bilinear") == 2
    assert ops.count("upsample_nearest") == 3
    assert ops.count("conv_transpose") == 3


class One(nn.Module):
    def __init__(self, op) -> None:
        super().__init__()
        torch.manual_seed(8)
        self.a, self.op = nn.Conv2d(3, 3, 3, padding=1), op

    def forward(self, x):
        return self.op(self.a(x))


@pytest.mark.parametrize(
    "op, engine, message",
    [
        (nn.Upsample(scale_factor=2, mode="bilinear"), "qnnpack", "left in float by FX"),
        (
            lambda t: F.interpolate(t, scale_factor=3, mode="bilinear"),
            "qnnpack",
            "not multiples of 2",
        ),
        (nn.ConvTranspose2d(3, 4, 3, stride=2, dilation=2), "qnnpack", "phase 1 without taps"),
        (
            nn.ConvTranspose2d(3, 6, 4, stride=2, padding=1),
            "x86",
            "does not compute the transposed",
        ),
    ],
    ids=["bilinear-float", "bilinear-x3", "empty-phase", "x86-pytorch-bug"],
)
def test_refusals_are_one_line(op, engine, message):
    with pytest.raises(SpecError, match=message) as err:
        assert_bit_exact(One(op), engine)
    assert "\n" not in str(err.value)
