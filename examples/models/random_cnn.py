"""Random small CNNs composed from every layer kind tensorgen lowers, for the random-model
property test (tests/frontend/test_random_models.py) and its long profile
(benchmarks/random_models.py). Plain torch; `build(size, seed)` draws the architecture from
`seed` (Python's `random.Random`), so a seed names a model.

Kinds: conv (kernel 1/3/5, stride 1/2, padding, dilation, groups 1 / 2 / depthwise, BN, odd
channel counts) with ReLU, ReLU6, Hardtanh or nothing; residual adds; two-branch concatenations
(a branch ending in ReLU6 gets its own quantization parameters); max and average pooling
(ceil_mode, count_include_pad); nearest upsampling x2; channel shuffle; chunk; and a head of
adaptive average pooling, flatten and linear, or a per-pixel 1x1 conv.
"""

from __future__ import annotations

import random

import torch
from torch import nn

KINDS = ("conv", "residual", "concat", "maxpool", "avgpool", "upsample", "shuffle", "chunk")


def act(rng: random.Random) -> nn.Module:
    return rng.choice([nn.ReLU(), nn.ReLU6(), nn.Hardtanh(-1.0, 1.0), nn.Identity()])


def conv(rng: random.Random, c_in: int, c_out: int, hw: int, stride: int = 1) -> nn.Module:
    k = rng.choice([1, 3, 3, 5])
    dilation = 2 if k == 3 and stride == 1 and rng.random() < 0.2 else 1
    groups = 1
    if c_in == c_out and rng.random() < 0.3:
        groups = c_in  # depthwise
    elif c_in % 2 == 0 and c_out % 2 == 0 and rng.random() < 0.2:
        groups = 2
    pad = dilation * (k // 2) if rng.random() < 0.8 else 0
    if dilation * (k - 1) + 1 > hw + 2 * pad:  # the window must fit the (padded) input
        k, dilation, pad = 1, 1, 0
    return nn.Sequential(
        nn.Conv2d(c_in, c_out, k, stride, pad, dilation, groups, bias=rng.random() < 0.5),
        nn.BatchNorm2d(c_out),
        act(rng),
    )


class Residual(nn.Module):
    def __init__(self, rng: random.Random, c: int) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(c, c, 3, 1, 1, bias=False), nn.BatchNorm2d(c), nn.ReLU(),
            nn.Conv2d(c, c, 3, 1, 1, bias=False), nn.BatchNorm2d(c),
        )  # fmt: skip
        self.relu = nn.ReLU() if rng.random() < 0.7 else nn.Identity()

    def forward(self, x):
        return self.relu(self.body(x) + x)


class Concat(nn.Module):
    def __init__(self, rng: random.Random, c: int, c_a: int, c_b: int) -> None:
        super().__init__()
        self.a = nn.Sequential(nn.Conv2d(c, c_a, 1), nn.ReLU())
        self.b = nn.Sequential(nn.Conv2d(c, c_b, 3, 1, 1), nn.ReLU6())

    def forward(self, x):
        return torch.cat([self.a(x), self.b(x)], 1)


class Shuffle(nn.Module):
    def forward(self, x):
        n, c, h, w = x.shape
        return x.view(n, 2, c // 2, h, w).transpose(1, 2).contiguous().view(n, c, h, w)


class Chunk(nn.Module):
    def __init__(self, c: int) -> None:
        super().__init__()
        self.conv = nn.Sequential(nn.Conv2d(c - c // 2, c - c // 2, 1), nn.ReLU())

    def forward(self, x):
        left, right = torch.split(x, [x.shape[1] // 2, x.shape[1] - x.shape[1] // 2], 1)
        return torch.cat([left, self.conv(right)], 1)


def layer(rng: random.Random, kind: str, c: int, hw: int) -> tuple[nn.Module, int, int]:
    """A layer of `kind` on c channels of hw x hw: (module, channels after, size after)."""
    if kind == "conv":
        stride = 2 if hw >= 6 and rng.random() < 0.4 else 1
        c_out = rng.randint(3, 17)
        m = conv(rng, c, c_out, hw, stride)
        return m, c_out, _conv_out(m[0], hw)
    if kind == "residual":
        return Residual(rng, c), c, hw
    if kind == "concat":
        c_a, c_b = rng.randint(2, 9), rng.randint(2, 9)
        return Concat(rng, c, c_a, c_b), c_a + c_b, hw
    if kind == "maxpool":
        k = rng.choice([2, 3])
        return nn.MaxPool2d(k, 2, k // 2 if rng.random() < 0.5 else 0), c, -1
    if kind == "avgpool":
        k, ceil = rng.choice([2, 3]), rng.random() < 0.5
        pad = k // 2 if rng.random() < 0.5 else 0
        return nn.AvgPool2d(k, 2, pad, ceil_mode=ceil, count_include_pad=rng.random() < 0.5), c, -1
    if kind == "upsample":
        return nn.Upsample(scale_factor=2, mode="nearest"), c, 2 * hw
    if kind == "shuffle":
        return Shuffle(), c, hw
    return Chunk(c), c, hw


def architecture(seed: int, size: int) -> tuple[nn.Module, int, list[str]]:
    rng = random.Random(seed)
    layers: list[nn.Module] = [conv(rng, 3, rng.randint(4, 12), size)]
    c, hw, kinds = layers[0][0].out_channels, _conv_out(layers[0][0], size), ["conv"]
    for _ in range(rng.randint(1, 4)):
        kind = rng.choice(
            [k for k in KINDS if _fits(k, c, hw) and (k, k) != (kinds[-1], "upsample")]
        )
        m, c, new = layer(rng, kind, c, hw)
        hw = new if new >= 0 else _pooled(m, hw)
        layers.append(m)
        kinds.append(kind)
    if rng.random() < 0.5:
        head = nn.Sequential(
            nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(c, rng.randint(2, 11))
        )
        kinds.append("linear")
    else:
        head = nn.Conv2d(c, rng.randint(2, 6), 1)
    return nn.Sequential(*layers, head), hw, kinds


def _conv_out(m: nn.Conv2d, hw: int) -> int:
    k, s, p, d = m.kernel_size[0], m.stride[0], m.padding[0], m.dilation[0]
    return (hw + 2 * p - d * (k - 1) - 1) // s + 1


def _fits(kind: str, c: int, hw: int) -> bool:
    if kind in ("maxpool", "avgpool"):
        return hw >= 4
    if kind == "upsample":
        return hw <= 8
    if kind == "shuffle":
        return c % 2 == 0
    return kind != "chunk" or c >= 2  # (a chunk right after an upsampling is float: refused)


def _pooled(m: nn.Module, hw: int) -> int:
    k, s, p = m.kernel_size, m.stride, m.padding
    k, s, p = (v if isinstance(v, int) else v[0] for v in (k, s, p))
    out = (hw + 2 * p - k + (s - 1 if m.ceil_mode else 0)) // s + 1
    return out - 1 if m.ceil_mode and (out - 1) * s >= hw + p else out


def build(size: int = 10, seed: int = 0) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """Random CNN number `seed` with seeded weights and BN statistics, in eval mode, and a
    1x3xSIZExSIZE input."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model, _, _ = architecture(seed, size)
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                n = m.num_features
                with torch.no_grad():
                    m.weight.copy_(0.5 + torch.rand(n))
                    m.bias.copy_(0.2 * torch.randn(n))
                    m.running_mean.copy_(0.2 * torch.randn(n))
                    m.running_var.copy_(0.5 + torch.rand(n))
    model.eval()
    example = torch.randn(1, 3, size, size, generator=torch.Generator().manual_seed(seed + 2))
    return model, (example,)


#: The documented one-line refusals a random model may meet (docs/models.md), by kind: any
#: other error, a traceback or a mismatch fails the property test.
REFUSALS = {
    "avg_pool2d channels-last, unknown vector width": r"matched no known vector width",
    "avg_pool2d divisor (two roundings)": r"avg_pool2d with divisor \d+: no single rounding",
    "cat requantization": r"no single float32 multiplier reproduces",
    "qnnpack dilated max pool bug": r"qnnpack quantized max pooling is wrong at the borders",
    "qnnpack add scale ratio": r"PyTorch's qnnpack cannot run this model",
    "x86 add of a strided view": r"quantized add under \S+ of a strided view",
    "x86 add with many thread chunks": r"thread chunks of \d+ threads take fbgemm's scalar",
    "x86 adaptive pool scalar channels (even window)": r"roundings of fbgemm.s scalar loop",
    "float upsampling of a float upsampling": r"interpolate of a float tensor that is not a dequan",
    "float op after a float upsampling": r"a float operation inside the quantized model",
}
