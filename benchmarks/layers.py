"""The layers of the benchmark suite, each generated from its sizes.

A `Layer` is a name, an operator (`Conv2d` or `Matmul`) and whether the suite
runs it by default. Each operator knows three things about itself:

- `op_yaml(name)`: its op.yaml text (the compiler's input);
- `torch_op(inputs)`: a zero-argument callable running PyTorch's own kernel for
  the same operator on the same data, for timing (built outside the timed call);
- `io_lower_bound(target)`: a lower bound on DRAM traffic in bytes that knows
  the operator's algebra (the matmul bound of Kwasniewski et al.), or None.

The layer list mirrors real networks so that it can grow by adding lines:
ResNet-18 and MobileNetV2 at 224x224, BERT-base at sequence length 128.

PyTorch paths timed (NUMERICS.md, "Plain-integer reference ops"):

- convolutions: `torch.nn.functional.conv2d` on int32 tensors (groups=C for
  depthwise), which wraps on overflow like the accelerator's accumulators;
- matmuls: `torch.matmul` on int32 tensors. `torch._int_mm` (int8 x int8 ->
  int32, exact) is the dedicated integer GEMM, but on the CPU the suite was
  first run on (AMD EPYC Zen 3, AVX2, no AVX-512 VNNI; 2 threads) it was 3x to
  20x slower than int32 `matmul` (256^3 and 128x768x3072), with identical
  results. Timing the faster integer path keeps sim/torch from looking better
  than it is.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from tensorgen.target import Target


def _affine(terms: list[tuple[int, str]], const: int) -> str:
    """`2*h + r - 3` from [(2, "h"), (1, "r")] and -3."""
    parts = [name if coef == 1 else f"{coef}*{name}" for coef, name in terms]
    text = " + ".join(parts)
    if const > 0:
        text += f" + {const}"
    elif const < 0:
        text += f" - {-const}"
    return text or str(const)


@dataclass(frozen=True)
class Conv2d:
    """`Y[n, k, h, w] += X[n, c, S*h + r - P, S*w + s - P] * W[k, c, r, s]`, int8 -> int32.

    `depthwise=True` gives one filter per channel (cout == cin, W is [C, 1, R, R]):
    `Y[n, c, h, w] += X[n, c, S*h + r - P, S*w + s - P] * W[c, 0, r, s]`.
    Square images and kernels, as in the networks the suite covers.
    """

    cin: int
    cout: int
    size: int  # input height and width
    kernel: int
    stride: int = 1
    pad: int = 0
    batch: int = 1
    depthwise: bool = False

    def __post_init__(self) -> None:
        if self.depthwise and self.cout != self.cin:
            raise ValueError(f"depthwise conv needs cout == cin, got {self.cin} -> {self.cout}")
        if self.out_size <= 0:
            raise ValueError(
                f"conv {self.kernel}x{self.kernel}/{self.stride} pad {self.pad} "
                f"on {self.size}x{self.size} has no output"
            )

    @property
    def out_size(self) -> int:
        return (self.size + 2 * self.pad - self.kernel) // self.stride + 1

    @property
    def macs(self) -> int:
        per_output = self.kernel**2 * (1 if self.depthwise else self.cin)
        return self.batch * self.cout * self.out_size**2 * per_output

    def describe(self) -> str:
        kind = "depthwise " if self.depthwise else ""
        k, o = self.kernel, self.out_size
        return (
            f"{kind}{k}x{k}/{self.stride} conv, {self.cin}->{self.cout} ch, "
            f"{self.size}x{self.size} -> {o}x{o}, pad {self.pad}"
        )

    def op_yaml(self, name: str) -> str:
        n, c, k, hw, ohw, r = self.batch, self.cin, self.cout, self.size, self.out_size, self.kernel
        ch = "c" if self.depthwise else "k"
        if r == 1:  # no kernel window indices: the form examples/conv1x1.yaml uses
            rows = _affine([(self.stride, "h")], -self.pad)
            cols = _affine([(self.stride, "w")], -self.pad)
            w_taps = "0, 0"
        else:
            rows = _affine([(self.stride, "h"), (1, "r")], -self.pad)
            cols = _affine([(self.stride, "w"), (1, "s")], -self.pad)
            w_taps = "r, s"
        w_shape, w_lead = ([c, 1, r, r], "c, 0") if self.depthwise else ([k, c, r, r], "k, c")
        return (
            f"# {self.describe()}\n"
            "tensorgen: 1\n"
            f"name: {name}\n"
            "tensors:\n"
            f"  X: {{shape: [{n}, {c}, {hw}, {hw}], dtype: int8, role: input}}\n"
            f"  W: {{shape: [{', '.join(map(str, w_shape))}], dtype: int8, role: input}}\n"
            f"  Y: {{shape: [{n}, {k}, {ohw}, {ohw}], dtype: int32, role: output}}\n"
            "statements:\n"
            f"  - Y[n, {ch}, h, w] += X[n, c, {rows}, {cols}] * W[{w_lead}, {w_taps}]\n"
        )

    @property
    def torch_name(self) -> str:
        groups = f", groups={self.cin}" if self.depthwise else ""
        return f"torch.nn.functional.conv2d(int32{groups})"

    def torch_op(self, inputs: dict[str, np.ndarray]) -> Callable[[], torch.Tensor]:
        x = torch.from_numpy(inputs["X"].astype(np.int32))
        w = torch.from_numpy(inputs["W"].astype(np.int32))
        groups = self.cin if self.depthwise else 1
        return lambda: F.conv2d(x, w, stride=self.stride, padding=self.pad, groups=groups)

    def io_lower_bound(self, target: Target) -> int | None:
        # No convolution-specific bound is implemented and checked yet (NUMERICS.md): the
        # suite falls back to compulsory traffic.
        return None


@dataclass(frozen=True)
class Matmul:
    """`C[i, j] += A[i, k] * B[k, j]` with A: M x K, B: K x N int8, C: M x N int32."""

    m: int
    n: int
    k: int

    @property
    def macs(self) -> int:
        return self.m * self.n * self.k

    def describe(self) -> str:
        return f"matmul {self.m}x{self.k} @ {self.k}x{self.n}"

    def op_yaml(self, name: str) -> str:
        return (
            f"# int8 {self.describe()} with an exact int32 result\n"
            "tensorgen: 1\n"
            f"name: {name}\n"
            "tensors:\n"
            f"  A: {{shape: [{self.m}, {self.k}], dtype: int8, role: input}}\n"
            f"  B: {{shape: [{self.k}, {self.n}], dtype: int8, role: input}}\n"
            f"  C: {{shape: [{self.m}, {self.n}], dtype: int32, role: output}}\n"
            "statements:\n"
            "  - C[i, j] += A[i, k] * B[k, j]\n"
        )

    @property
    def torch_name(self) -> str:
        return "torch.matmul(int32)"

    def torch_op(self, inputs: dict[str, np.ndarray]) -> Callable[[], torch.Tensor]:
        a = torch.from_numpy(inputs["A"].astype(np.int32))
        b = torch.from_numpy(inputs["B"].astype(np.int32))
        return lambda: torch.matmul(a, b)

    def io_lower_bound(self, target: Target) -> int:
        """2*M*N*K/sqrt(S) + M*N words (Kwasniewski et al., SC'19), in bytes.

        S = the scratchpad's bytes, i.e. its capacity in int8 words. The int32 accumulator
        SRAM is not counted (on tg1 it would add 16 Ki words to S's 256 Ki and lower the
        bound's first term by 3%). The 2*M*N*K/sqrt(S) input words are int8, one byte each;
        the M*N output words are counted at the output's size (int32: 4 bytes).
        """
        inputs = 2 * self.m * self.n * self.k / math.sqrt(target.spad.bytes)
        return math.ceil(inputs) + self.m * self.n * 4


Operator = Conv2d | Matmul


@dataclass(frozen=True)
class Layer:
    name: str
    op: Operator
    default: bool = False  # run without --only
    network: str = ""

    def op_yaml(self) -> str:
        return self.op.op_yaml(self.name)


def _resnet18() -> list[Layer]:
    """The conv shapes of ResNet-18 at 224x224 (He et al. 2016, table 1) beyond stage 1's 3x3."""

    def conv(
        name: str, cin: int, cout: int, size: int, kernel: int, stride: int, pad: int
    ) -> Layer:
        return Layer(
            name, Conv2d(cin, cout, size, kernel, stride=stride, pad=pad), network="ResNet-18"
        )

    layers = [conv("resnet18_stem_7x7s2", 3, 64, 224, 7, 2, 3)]
    for stage, (cin, cout, size) in enumerate([(64, 128, 56), (128, 256, 28), (256, 512, 14)], 2):
        layers += [
            conv(
                f"resnet18_layer{stage}_3x3s2", cin, cout, size, 3, 2, 1
            ),  # first conv of the stage
            conv(f"resnet18_layer{stage}_3x3", cout, cout, size // 2, 3, 1, 1),  # the other three
            conv(f"resnet18_layer{stage}_proj_1x1s2", cin, cout, size, 1, 2, 0),  # the shortcut
        ]
    return layers


def _mobilenet_v2() -> list[Layer]:
    """Depthwise and pointwise convs of MobileNetV2's first blocks at 224x224 (Sandler et al.
    2018, table 2): block 1 (dw 32, project 16), block 2 (expand 96, dw s2, project 24), block 3's dw."""

    def dw(name: str, channels: int, size: int, stride: int) -> Layer:
        conv = Conv2d(channels, channels, size, 3, stride=stride, pad=1, depthwise=True)
        return Layer(name, conv, network="MobileNetV2")

    def pw(name: str, cin: int, cout: int, size: int) -> Layer:
        return Layer(name, Conv2d(cin, cout, size, 1), network="MobileNetV2")

    return [
        dw("mbv2_dw3x3s1_32ch_112", 32, 112, 1),
        pw("mbv2_pw_32to16_112", 32, 16, 112),
        pw("mbv2_pw_16to96_112", 16, 96, 112),
        dw("mbv2_dw3x3s2_96ch_112", 96, 112, 2),
        pw("mbv2_pw_96to24_56", 96, 24, 56),
        dw("mbv2_dw3x3s1_144ch_56", 144, 56, 1),
    ]


def _bert_base() -> list[Layer]:
    """The matmuls of a BERT-base encoder layer at sequence length 128: the Q, K, V and output
    projections (768 -> 768) and the feed-forward network (768 -> 3072 -> 768)."""
    net = "BERT-base"
    return [
        Layer("bert_qkv_proj_128x768x768", Matmul(128, 768, 768), network=net),
        Layer("bert_ffn_up_128x768x3072", Matmul(128, 3072, 768), network=net),
        Layer("bert_ffn_down_128x3072x768", Matmul(128, 768, 3072), network=net),
    ]


LAYERS: tuple[Layer, ...] = (
    Layer("resnet18_conv3x3", Conv2d(64, 64, 56, 3, pad=1), default=True, network="ResNet-18"),
    Layer("matmul_256", Matmul(256, 256, 256), default=True),
    *_resnet18(),
    *_mobilenet_v2(),
    *_bert_base(),
)


# Reduced variants of suite layers for benchmarks/exhaustive.py, which simulates every candidate
# of the automatic scheduler's search space: up to 2,744 of them for a 3x3 convolution, and a
# BERT matmul or a 56x56 depthwise conv takes seconds per simulation. Same operator forms, loop
# structure and (for the matmul) K = 4N proportions, with smaller extents; not part of the suite.
SMALL_VARIANTS: tuple[Layer, ...] = (
    Layer("resnet18_conv3x3_small", Conv2d(32, 32, 28, 3, pad=1), network="ResNet-18"),
    Layer(
        "mbv2_dw3x3s1_small", Conv2d(32, 32, 28, 3, pad=1, depthwise=True), network="MobileNetV2"
    ),
    Layer("bert_ffn_down_small", Matmul(128, 256, 1024), network="BERT-base"),
)
