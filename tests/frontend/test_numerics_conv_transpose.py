"""PyTorch's quantized ConvTranspose2d, pinned by experiment: the exact int32 accumulation of
`(x - zp_x) * (w - zp_w)` over the transposed convolution, then

- qnnpack: conv's rule, `clamp(RNE(RN((acc + b_q) * M)) + zp)`, b_q and M as for Conv2d;
- x86 where the probe saw convs run on oneDNN (Linux, AVX512-VNNI): oneDNN's rule
  (tensorgen/frontend/onednn.py: five float32 roundings, the zero point added before rounding),
  not fbgemm's (constructed cases where the two disagree); elsewhere (AVX2) fbgemm's
  per-channel rule with the one weight scale on every channel;
- x86 on oneDNN, on some layers with different input and output channels: PyTorch's result is
  not the transposed convolution of its own weights (a canary; tensorgen finds such layers by a
  probe of PyTorch's kernel and refuses them). fbgemm's kernel (AVX2) computes them right.

The accumulator comes from the test's own float64 conv_transpose2d of the integer codes."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
import torch.ao.nn.quantized as nnq
import torch.nn.functional as F

from tensorgen.frontend import numerics, onednn
from tensorgen.frontend.probe import x86_behaviour
from tensorgen.mc import arith

warnings.filterwarnings("ignore", category=UserWarning)


@pytest.fixture(params=("qnnpack", "x86"))
def engine(request):
    old = torch.backends.quantized.engine
    torch.backends.quantized.engine = request.param
    yield request.param
    torch.backends.quantized.engine = old


def layer(cin, cout, k, stride, padding, out_pad, groups, dilation, seed, s_w=0.02):
    g = torch.Generator().manual_seed(seed)
    m = nnq.ConvTranspose2d(cin, cout, k, stride, padding, out_pad, groups, True, dilation)
    w = torch.quantize_per_tensor(
        torch.randn(cin, cout // groups, k, k, generator=g) * 0.05, s_w, 0, torch.qint8
    )
    m.set_weight_bias(w, torch.randn(cout, generator=g) * 0.3)
    m.scale, m.zero_point = 0.031, 117
    return m


def accumulator(m, xq: torch.Tensor) -> np.ndarray:
    w = m.weight().int_repr().double() - m.weight().q_zero_point()
    x = xq.int_repr().double() - xq.q_zero_point()
    acc = F.conv_transpose2d(
        x, w, None, m.stride, m.padding, m.output_padding, m.groups, m.dilation
    )
    return np.round(acc.numpy()).astype(np.int64)


def rule(engine: str, m, xq: torch.Tensor) -> np.ndarray:
    acc = accumulator(m, xq)
    s_in, s_w, zp = xq.q_scale(), m.weight().q_scale(), m.zero_point
    bias = m.bias().detach().numpy().astype(np.float32).reshape(1, -1, 1, 1)
    if engine == "qnnpack":
        b_q = numerics.quantize_bias(bias, s_in, s_w).astype(np.int64)
        return arith.requantize(
            acc + b_q, numerics.requant_multiplier(s_in, s_w, m.scale), zp, 0, 255
        )
    if on_onednn(m.groups):
        return onednn.requantize_onednn(acc, bias, onednn.onednn_scales(s_in, s_w, m.scale), zp)
    p = numerics.fbgemm_requant_params(s_in, s_w, m.scale, per_channel=True)
    b = bias.reshape(-1, 1, 1)
    return arith.requantize_fbgemm(acc, b, p.atws, p.inv_atws, p.cm, zp, 0, 255, True)


def on_onednn(groups: int) -> bool:
    """Whether the x86 engine runs a layer of `groups` groups on oneDNN on this CPU (what the
    probe saw its convs do; without AVX512-VNNI none do)."""
    return 0 < groups <= x86_behaviour("x86").onednn_groups


CONFIGS = [  # cin, cout, kernel, stride, padding, output padding, groups, dilation
    (6, 5, 3, 2, 1, 1, 1, 1),
    (4, 4, 4, 2, 1, 0, 2, 1),
    (3, 7, 3, 3, 0, 2, 1, 1),
    (4, 4, 3, 2, 1, 1, 1, 2),
    (8, 8, 2, 2, 0, 0, 8, 1),
    (4, 4, 5, 1, 2, 0, 1, 1),
]


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: "-".join(map(str, c)))
def test_conv_transpose_rule(engine, config):
    m = layer(*config, seed=sum(config))
    g = torch.Generator().manual_seed(1)
    total = 0
    while total < 100_000:
        x = torch.rand(8, config[0], 9, 7, generator=g) * 8
        xq = torch.quantize_per_tensor(x, 0.03, 5, torch.quint8)
        got = m(xq).int_repr().numpy().astype(np.int64)
        assert np.array_equal(got, rule(engine, m, xq))
        total += got.size


def test_x86_rule_follows_the_probe():
    """A 1x1 layer whose accumulator is `x - zp` over all 256 codes, with scales and a bias at
    which oneDNN's rule and fbgemm's disagree (found by search): PyTorch takes oneDNN's where the
    probe saw convs run on oneDNN, fbgemm's elsewhere."""
    old = torch.backends.quantized.engine
    torch.backends.quantized.engine = "x86"
    try:
        rng = np.random.default_rng(0)
        acc = np.arange(256) - 128
        seen = 0
        for _ in range(30_000):
            s_in, s_w, s_out = (float(np.float32(rng.uniform(a, b))) for a, b in
                                ((0.005, 0.05), (0.001, 0.02), (0.002, 0.05)))  # fmt: skip
            b = np.float32(rng.uniform(-2, 2))
            p = numerics.fbgemm_requant_params(s_in, s_w, s_out, per_channel=True)
            fb = arith.requantize_fbgemm(acc, b, p.atws, p.inv_atws, p.cm, 128, 0, 255, True)
            one = onednn.requantize_onednn(acc, b, onednn.onednn_scales(s_in, s_w, s_out), 128)
            if np.array_equal(fb, one):
                continue
            m = nnq.ConvTranspose2d(1, 1, 1)
            w = torch.quantize_per_tensor(torch.full((1, 1, 1, 1), s_w), s_w, 0, torch.qint8)
            m.set_weight_bias(w, torch.tensor([float(b)]))
            m.scale, m.zero_point = s_out, 128
            codes = torch.arange(256, dtype=torch.uint8).reshape(1, 1, 1, -1)
            xq = torch._make_per_tensor_quantized_tensor(codes, s_in, 128)
            got = m(xq).int_repr().numpy().ravel().astype(np.int64)
            assert np.array_equal(got, one if on_onednn(1) else fb)
            seen += 1
            if seen == 10:
                break
        assert seen == 10
    finally:
        torch.backends.quantized.engine = old


@pytest.mark.parametrize(
    "config", [(8, 4, 4, 2, 1, 0, 2, 1), (5, 3, 5, 1, 2, 0, 1, 1), (3, 6, 4, 2, 1, 0, 1, 1)]
)
def test_x86_canary(config):
    """PyTorch's x86 kernel on oneDNN, on some layers whose input and output channels differ
    (grouped 8 to 4, stride 1 from 5 to 3, 4x4 stride 2 from 3 to 6; others, like 3x3 stride 2
    from 6 to 5, are right) is not the transposed conv of its weights (qnnpack's is, and
    fbgemm's on CPUs without VNNI): if this starts failing there, PyTorch was fixed."""
    old = torch.backends.quantized.engine
    try:
        for engine, exact in (("qnnpack", True), ("x86", not on_onednn(config[6]))):
            torch.backends.quantized.engine = engine
            m = layer(*config, seed=3)
            xq = torch.quantize_per_tensor(
                torch.rand(2, config[0], 5, 5) * 4, 0.03, 0, torch.quint8
            )
            got = m(xq).int_repr().numpy().astype(np.int64)
            want = rule(engine, m, xq)
            assert (np.abs(got - want).max() <= 1) == exact
    finally:
        torch.backends.quantized.engine = old
