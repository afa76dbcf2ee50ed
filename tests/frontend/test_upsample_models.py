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
from tensorgen.frontend import conv_transpose
from tensorgen.frontend.fx import lower_graph
from tensorgen.frontend.quantize import quantize, quantized_engine
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


PATHS = {
    "bilinear-x2": lambda: lambda t: F.interpolate(t, scale_factor=2, mode="bilinear"),
    "bilinear-align-2n-1": lambda: (
        lambda t: F.interpolate(t, size=(15, 15), mode="bilinear", align_corners=True)
    ),
    "nearest-x1.5": lambda: lambda t: F.interpolate(t, scale_factor=1.5),
    "nearest-exact-size": lambda: lambda t: F.interpolate(t, size=(13, 6), mode="nearest-exact"),
    "upsample-float-size": lambda: nn.Upsample(size=(11, 5)),  # FX leaves it in float
    "convT-3x3s2-outpad": lambda: nn.ConvTranspose2d(
        8, 8, 3, stride=2, padding=1, output_padding=1
    ),
    "convT-dw-4x4s2": lambda: nn.ConvTranspose2d(8, 8, 4, stride=2, padding=1, groups=8),
    "convT-dilated-s3": lambda: nn.ConvTranspose2d(8, 8, 5, stride=3, padding=2, dilation=2),
}
OPS = {
    "bilinear": "upsample_bilinear",
    "nearest": "upsample_nearest",
    "upsample": "upsample_nearest",
}


class Path(nn.Module):
    """One decoder path after a conv + ReLU: the path's layer is fed quantized data."""

    def __init__(self, op) -> None:
        super().__init__()
        torch.manual_seed(7)
        self.a, self.r, self.op = nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), op

    def forward(self, x):
        return self.op(self.r(self.a(x)))


@pytest.mark.slow  # sixteen compiled models, seconds each (convT-dilated-s3: about a minute)
@pytest.mark.parametrize("path", sorted(PATHS))
@pytest.mark.parametrize("engine", ["qnnpack", "x86"])
def test_decoder_paths_are_bit_exact(engine, path):
    cm = assert_bit_exact(Path(PATHS[path]()), engine)
    ops = [layer.op for layer in cm.graph.layers]
    assert ops.count(OPS.get(path.split("-")[0], "conv_transpose")) == 1, ops


@pytest.mark.parametrize(
    "path, statements", [("nearest-exact-size", 4), ("upsample-float-size", 5), ("nearest-x1.5", 9)]
)
def test_long_period_nearest_is_two_one_hot_contractions(path, statements):
    """A nearest gather of many class pairs (8 to 13 rows: 13 classes) is two one-hot
    contractions, not a copy per pair: 39 copies took minutes to compile (the statements'
    legality checks grow with their square). Few pairs stay copies."""
    torch.manual_seed(0)
    with quantized_engine("qnnpack"):
        qmodel = quantize(Path(PATHS[path]()).eval(), (torch.randn(1, 3, 8, 8),), engine="qnnpack")
        graph = lower_graph(qmodel, (torch.randn(1, 3, 8, 8),), "qnnpack")
    (layer,) = [la for la in graph.layers if la.op == "upsample_nearest"]
    assert len(layer.body(layer.lo, layer.hi)) == statements
    if statements < 9:
        r, c = (next(p for p in layer.ports if p.name == n).const for n in "RC")
        assert r.shape == ((13, 8) if path.startswith("nearest") else (11, 8))
        assert (r.sum(axis=1) == 1).all() and (c.sum(axis=1) == 1).all()


class One(nn.Module):
    def __init__(self, op) -> None:
        super().__init__()
        torch.manual_seed(8)
        self.a, self.op = nn.Conv2d(3, 3, 3, padding=1), op

    def forward(self, x):
        return self.op(self.a(x))


@pytest.mark.slow  # five compiled models
@pytest.mark.parametrize(
    "op, engine",
    [
        (nn.ConvTranspose2d(3, 4, 3, stride=3), "qnnpack"),
        (nn.ConvTranspose2d(3, 3, 3, stride=3, padding=1), "x86"),
        (nn.ConvTranspose2d(3, 3, 4, (3, 2), 2, output_padding=1, groups=3), "qnnpack"),
        (nn.ConvTranspose2d(3, 4, 2, stride=4, padding=(0, 1)), "qnnpack"),
        (nn.ConvTranspose2d(3, 4, 3, stride=2, padding=1, output_padding=1), "qnnpack"),
    ],
    ids=["s3-qnnpack", "s3-x86", "dw-s3x2-outpad", "s4-k2-empty-phases", "s2-outpad"],
)
def test_one_conv_over_the_zero_inserted_input(op, engine, monkeypatch):
    """A transposed conv of more than MAX_PHASES phases is one conv over its input with zero
    points inserted (conv_transpose.py), here forced for every stride: on an input of nonzero
    zero point (no ReLU before), with output padding, depthwise, and a kernel smaller than the
    stride (phases without taps, which the phase form refuses)."""
    monkeypatch.setattr(conv_transpose, "MAX_PHASES", 1)
    cm = assert_bit_exact(One(op), engine)
    (layer,) = [la for la in cm.graph.layers if la.op == "conv_transpose"]
    assert len(layer.body(layer.lo, layer.hi)) == 5  # fill, scatter, init, sum, requant


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
