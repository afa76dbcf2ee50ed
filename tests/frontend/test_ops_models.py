"""Small models around each operator of tensorgen.frontend.ops and the pooling lowerings:
compiled, simulated and compared bit for bit with PyTorch under qnnpack and x86, and the
documented one-line refusals."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tensorgen.errors import SpecError
from tensorgen.frontend import ops
from tensorgen.frontend.fx import Value
from tensorgen.model import check_model, compile_model
from tensorgen.target import load_target

TG1 = load_target("tg1")
ENGINES = ("qnnpack", "x86")

warnings.filterwarnings("ignore", category=UserWarning)


def assert_bit_exact(model: nn.Module, shape=(1, 3, 8, 8), engine="qnnpack", seeds=(0, 1)):
    torch.manual_seed(0)
    example = (torch.randn(*shape),)
    cm = compile_model(model.eval(), example, TG1, engine=engine)
    for seed in seeds:
        x = torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * 1.5
        cmp, _ = check_model(cm, (x,))
        assert cmp.exact, cmp.message
    return cm


class CatBranches(nn.Module):
    """A conv branch and a ReLU6 branch (its own qparams) concatenated, then a 1x1 conv; and a
    cat along the width of two tensors of one qparams."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(3)
        self.a = nn.Conv2d(3, 8, 3, padding=1)
        self.b = nn.Conv2d(3, 5, 3, padding=1)
        self.r = nn.ReLU6()
        self.c = nn.Conv2d(13, 4, 1)

    def forward(self, x):
        y = self.c(torch.cat([self.a(x), self.r(self.b(x))], 1))
        return torch.cat([y, y], 3)


@pytest.mark.parametrize("engine", ENGINES)
def test_cat_of_inputs_with_different_qparams_is_bit_exact(engine):
    cm = assert_bit_exact(CatBranches(), engine=engine)
    cats = [layer for layer in cm.graph.layers if layer.op == "cat"]
    assert len(cats) == 2
    assert "requant(" in cats[0].text("tg1")  # the second input is requantized on the way


def test_cat_refuses_a_requantization_no_multiplier_reproduces():
    x = Value("x", (1, 256, 1, 1), "uint8", 0.2, 10)
    y = Value("y", (1, 256, 1, 1), "uint8", 0.4, 101)
    with pytest.raises(SpecError, match="no single float32 multiplier") as err:
        ops.requant_expr("X[i]", x, y, nhwc=True)
    assert "\n" not in str(err.value)
    assert ops.requant_expr("X[i]", x, x) == "X[i]"


class Pools(nn.Module):
    """A padded 3x3 window (divisor 9) and ceil_mode with count_include_pad=False on 5x5 (border
    divisors 2 and 1) after a ReLU6 (whose output is contiguous under qnnpack:
    tensorgen.frontend.quantize.repair_qnnpack_clamp)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(4)
        self.a = nn.Conv2d(3, 8, 3, padding=1)
        self.r = nn.ReLU6()
        self.p1 = nn.AvgPool2d(3, 2, 1, ceil_mode=True)
        self.p2 = nn.AvgPool2d(2, 2, 0, ceil_mode=True, count_include_pad=False)

    def forward(self, x):
        return self.p2(self.p1(self.r(self.a(x))))


def test_avg_pool_of_any_size_with_ceil_mode_is_bit_exact_under_qnnpack():
    cm = assert_bit_exact(Pools(), shape=(1, 3, 9, 9))
    assert [layer.op for layer in cm.graph.layers].count("avg_pool2d") == 2


@pytest.mark.parametrize("engine", ENGINES)
def test_avg_pool_of_a_channels_last_tensor_is_bit_exact(engine):
    """Right after a conv (channels-last) with ceil_mode: ATen's NHWC kernel, its vector channels
    (16 of the 20 with AVX512) and its scalar ones, both engines."""
    cm = assert_bit_exact(ChannelsLastPools(), shape=(1, 3, 9, 9), engine=engine)
    assert [layer.op for layer in cm.graph.layers].count("avg_pool2d") == 2


class ChannelsLastPools(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(7)
        self.a = nn.Conv2d(3, 20, 3, padding=1)
        self.p1 = nn.AvgPool2d(3, 2, 1, ceil_mode=True)
        self.b = nn.Conv2d(20, 20, 1)
        self.p2 = nn.AvgPool2d(2, 2, 0, ceil_mode=True, count_include_pad=False)

    def forward(self, x):
        return self.p2(self.b(self.p1(self.a(x))))


class Upsampling(nn.Module):
    """nn.Upsample (left in float by FX: dequantize, upsample, quantize) concatenated with a
    skip of another scale, and F.interpolate by (3, 2) on a quantized tensor (its quantized
    kernel), each a different path."""

    def __init__(self, mode: str = "nearest", size=None) -> None:
        super().__init__()
        torch.manual_seed(5)
        self.a, self.r1 = nn.Conv2d(3, 8, 3, padding=1), nn.ReLU()
        self.b, self.r2 = nn.Conv2d(8, 8, 3, stride=2, padding=1), nn.ReLU()
        self.up = nn.Upsample(scale_factor=2, mode=mode) if size is None else nn.Upsample(size)
        self.c = nn.Conv2d(16, 4, 1)
        self.skip = size is None  # a cat needs the skip's size

    def forward(self, x):
        a = self.r1(self.a(x))
        b = self.r2(self.b(a))
        if not self.skip:
            return self.up(b)
        return self.c(torch.cat([self.up(b), a], 1)), F.interpolate(b, scale_factor=(3, 2))


@pytest.mark.parametrize("engine", ENGINES)
def test_nearest_upsampling_by_integer_factors_is_bit_exact(engine):
    cm = assert_bit_exact(Upsampling(), engine=engine)
    assert [layer.op for layer in cm.graph.layers].count("upsample_nearest") == 2


def test_bilinear_upsample_left_in_float_is_refused_in_one_line():
    """FX leaves nn.Upsample in float: bilinear is then float arithmetic on dequantized values
    (non-integer sizes of nearest are supported now: tests/frontend/test_upsample_models.py)."""
    with pytest.raises(SpecError, match="bilinear upsampling left in float by FX") as err:
        assert_bit_exact(Upsampling(mode="bilinear"))
    assert "\n" not in str(err.value)


class ShuffleSplit(nn.Module):
    """A ShuffleNetV2 unit's data movement: chunk along channels (FX splits the dequantized
    tensor, each piece quantized on its own), a cat, the view/transpose/view channel shuffle
    (with its traced shape arithmetic), and a split into unequal parts."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(6)
        self.a, self.r = nn.Conv2d(3, 8, 3, padding=1), nn.ReLU()
        self.b, self.c = nn.Conv2d(4, 4, 3, padding=1, groups=4), nn.Conv2d(4, 4, 1)

    def forward(self, x):
        left, right = self.r(self.a(x)).chunk(2, dim=1)
        z = torch.cat([left, self.c(self.b(right))], 1)
        n, c, h, w = z.shape
        z = z.view(n, 2, c // 2, h, w).transpose(1, 2).contiguous().view(n, c, h, w)
        p, q = torch.split(z, [3, 5], dim=1)  # (returning the tuple itself is refused)
        return p, q


@pytest.mark.parametrize("engine", ENGINES)
def test_channel_shuffle_chunk_and_split_are_bit_exact(engine):
    cm = assert_bit_exact(ShuffleSplit(), engine=engine)
    ops_ = [layer.op for layer in cm.graph.layers]
    assert ops_.count("transpose") == 1 and ops_.count("slice") == 4, ops_
