"""Small models around each lowering of tensorgen.frontend.elementwise: the lookup-table
activations, add/mul of a number, the quantized mul of tensors (squeeze-excite's broadcast) and
mean, compiled, simulated and compared bit for bit with PyTorch under qnnpack and x86; and the
documented one-line refusals."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tensorgen.errors import SpecError
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


ACTIVATIONS = {
    "hardswish": nn.Hardswish(),
    "hardsigmoid": nn.Hardsigmoid(),
    "sigmoid": nn.Sigmoid(),
    "tanh": nn.Tanh(),
    "leaky_relu": nn.LeakyReLU(0.05),
    "elu": nn.ELU(0.7),
    "F.hardswish": F.hardswish,
    "torch.sigmoid": torch.sigmoid,
    "add_scalar": lambda x: x + 0.75,
    "mul_scalar_negative": lambda x: x * -1.25,
}


class Act(nn.Module):
    def __init__(self, act) -> None:
        super().__init__()
        torch.manual_seed(1)
        self.conv = nn.Conv2d(3, 16, 3, padding=1)
        self.act = act

    def forward(self, x):
        return self.act(self.conv(x))


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("name", list(ACTIVATIONS))
def test_activation_is_a_lookup_table(name, engine):
    cm = assert_bit_exact(Act(ACTIVATIONS[name]), engine=engine)
    layers = cm.graph.layers
    if name == "add_scalar" and not any("lut" in layer.epilogue for layer in layers):
        assert [layer.op for layer in layers] == ["quantize", "conv2d", "dequantize"]
        return  # PyTorch moved the zero point and kept the codes: an alias
    if engine == "qnnpack":  # the conv's only user: folded, requantized into Q, looked up
        assert [(layer.op, layer.epilogue) for layer in layers][1] == ("conv2d", ["lut"])
        assert "Y[n, k, h, w] = lut(Q[n, k, h, w], T)" in layers[1].text("tg1")
    else:  # x86: its own layer (the fold measured slower there)
        assert [layer.op for layer in layers][1:3] == ["conv2d", "lut"]
        assert "Y[i0, i1, i2, i3] = lut(X[i0, i1, i2, i3], T)" in layers[2].text("tg1")
    assert any(i.mnemonic == "VLUT" for b in cm.layer_binaries for i in b.code)


class TwoUsers(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(5)
        self.conv = nn.Conv2d(3, 8, 3, padding=1)

    def forward(self, x):
        y = self.conv(x)
        return F.hardswish(y) + torch.sigmoid(y)


@pytest.mark.parametrize("engine", ENGINES)
def test_a_lookup_of_a_shared_value_is_its_own_layer(engine):
    cm = assert_bit_exact(TwoUsers(), engine=engine)
    luts = [layer for layer in cm.graph.layers if layer.op == "lut"]
    assert len(luts) == 2 and not cm.graph.layers[1].epilogue
    assert "Y[i0, i1, i2, i3] = lut(X[i0, i1, i2, i3], T)" in luts[0].text("tg1")


def test_mul_by_a_positive_number_is_an_alias():
    cm = assert_bit_exact(Act(lambda x: F.relu(x) * 0.5))
    assert [layer.op for layer in cm.graph.layers] == ["quantize", "conv2d", "dequantize"]


class SqueezeExcite(nn.Module):
    """Conv, hardswish, squeeze-excite (pool, 1x1 conv, ReLU, 1x1 conv, hardsigmoid, mul)."""

    def __init__(self, mean: bool, relu_mul: bool = False) -> None:
        super().__init__()
        torch.manual_seed(2)
        self.mean = mean
        self.conv = nn.Conv2d(3, 16, 3, padding=1)
        self.fc1, self.fc2 = nn.Conv2d(16, 8, 1), nn.Conv2d(8, 16, 1)

    def forward(self, x):
        x = F.hardswish(self.conv(x))
        s = x.mean((2, 3), keepdim=True) if self.mean else F.adaptive_avg_pool2d(x, 1)
        s = F.hardsigmoid(self.fc2(F.relu(self.fc1(s))))
        return x * s


@pytest.mark.parametrize("engine", ENGINES)
def test_squeeze_excite_mul_broadcasts_over_space(engine):
    cm = assert_bit_exact(SqueezeExcite(mean=False), shape=(1, 3, 9, 7), engine=engine)
    (mul,) = [layer for layer in cm.graph.layers if layer.op == "mul"]
    assert "* (B[0, i1, 0, 0])" in mul.text("tg1")


def test_mean_over_space_under_qnnpack():
    cm = assert_bit_exact(SqueezeExcite(mean=True), shape=(1, 3, 9, 7))
    assert "adaptive_avg_pool2d" in [layer.op for layer in cm.graph.layers]


class Mul(nn.Module):
    def __init__(self, b_shape) -> None:
        super().__init__()
        torch.manual_seed(4)
        self.a, self.b = nn.Conv2d(3, 8, 3, padding=1), nn.Conv2d(3, 8, 3, padding=1)
        self.b_shape = b_shape

    def forward(self, x):
        b = self.b(x)
        if self.b_shape == "channel":
            b = F.adaptive_avg_pool2d(b, 1)
        return b * self.a(x) if self.b_shape == "channel" else self.a(x) * b


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("b_shape", ["same", "channel"])
def test_mul_of_two_tensors(engine, b_shape):
    assert_bit_exact(Mul(b_shape), engine=engine)


def refusal(model, match, engine="qnnpack", shape=(1, 3, 8, 8)) -> str:
    with pytest.raises(SpecError, match=match) as err:
        compile_model(model.eval(), (torch.randn(*shape),), TG1, engine=engine)
    assert "\n" not in str(err.value)
    return str(err.value)


def test_mean_under_x86_is_refused_in_one_line():
    refusal(
        SqueezeExcite(mean=True),
        r"^call_method mean at mean: quantized mean under x86: PyTorch takes the float mean",
        engine="x86",
    )


def test_mean_over_other_dimensions_is_refused():
    refusal(Act(lambda x: x.mean(1, keepdim=True)), r"mean over \[1\] keepdim=True \(only over")


def test_gelu_left_in_float_by_fx_is_refused():
    refusal(Act(nn.GELU()), r"^GELU at act: a float operation inside the quantized model")


def test_a_table_that_disagrees_with_the_recorded_run_is_refused(monkeypatch):
    """The canary: were PyTorch's kernel not element-wise on the model's data, the table built
    from the 256 codes would differ from the recorded run, and the layer is refused."""
    from tensorgen.frontend import elementwise

    real = elementwise.run_on

    def off_by_one(lw, node, x):
        out = real(lw, node, x)
        q = torch.from_numpy((out.int_repr().numpy().astype(np.int64) + 1).clip(0, 255))
        return torch._make_per_tensor_quantized_tensor(
            q.to(torch.uint8), out.q_scale(), out.q_zero_point()
        )

    monkeypatch.setattr(elementwise, "run_on", off_by_one)
    refusal(Act(nn.Hardsigmoid()), r"is not its result on the same codes alone")
