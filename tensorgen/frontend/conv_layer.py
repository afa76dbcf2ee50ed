"""The layer records of a convolution (plain, depthwise, grouped) and of a linear layer, which
the FX lowering (fx.py) and the PT2E lowering (pt2e_layers.py) both build: one place that writes
their op.yaml statements, from the quantized operands each lowering reads its own way.

The accumulator starts at the requantization's bias (`rq.init`), adds the products of the
inputs and weights less their zero points, and the output is the requantized accumulator,
clamped to [lo, hi] (a fused activation's bounds, or the dtype's range).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from tensorgen.frontend.layers import NATURAL, Layer, Port, affine, clamp
from tensorgen.frontend.rules import Requant

if TYPE_CHECKING:
    from tensorgen.frontend.fx import Value


@dataclass(frozen=True)
class ConvGeometry:
    """A 2-d convolution's stride, padding and dilation (pairs: rows, columns) and groups."""

    stride: tuple[int, int]
    padding: tuple[int, int]
    dilation: tuple[int, int]
    groups: int


def conv_op(x: Value, y: Value, groups: int) -> str:
    """The layer's kind: conv2d, depthwise (one channel per group) or grouped."""
    c, k = x.shape[1], y.shape[1]
    return "conv2d" if groups == 1 else "depthwise" if groups == c == k else "grouped"


def conv_layer(
    name: str,
    path: str,
    x: Value,
    y: Value,
    weights: tuple[np.ndarray, int],
    rq: Requant,
    geometry: ConvGeometry,
    bounds: tuple[int, int],
    epilogue: list[str],
) -> Layer:
    """The conv layer `y = conv(x, W)` of int8 weights `weights` = (W[k, c/g, r, s], zero point),
    requantized by `rq` (rules.Requant), with the output clamped to `bounds`."""
    wq, w_zp = weights
    (sh, sw), (ph, pw), (dh, dw) = geometry.stride, geometry.padding, geometry.dilation
    g, (n, c), k = geometry.groups, x.shape[:2], y.shape[1]
    rows = affine((sh, "h"), (dh, "r"), const=-ph)
    cols = affine((sw, "w"), (dw, "s"), const=-pw)
    xz = f" - {x.zp}" if x.zp else ""
    wz = f" - {w_zp}" if w_zp else ""
    if g == c == k and x.zp and not w_zp:
        # depthwise runs on the vector unit, where subtracting the input's zero point costs
        # two more instructions per tap: fold it into the bias instead,
        # sum((x - zp) * w) = sum(x * w) - zp * sum(w); padding reads zp, so its taps still cancel
        rq = rq.plus(-x.zp * wq.reshape(k, -1).astype(np.int64).sum(axis=1))
        xz = ""
    x_port, shape = x.port("X", "input"), y.shape
    if g == 1:
        acc, xin, wt, channel = "n, k, h, w", f"X[n, c, {rows}, {cols}]", "W[k, c, r, s]", "k"
    elif g == c == k:
        acc, xin, wt, channel = "n, k, h, w", f"X[n, k, {rows}, {cols}]", "W[k, 0, r, s]", "k"
    else:  # grouped: a 5-d view with the group as its own index (reshapes are free in DRAM)
        cg, kg = c // g, k // g
        x_port = Port("X", (n, g, cg, *x.shape[2:]), x.dtype, "input", x.zp, x.buffer)
        wq = wq.reshape(g, kg, cg, *wq.shape[2:])
        rq = rq.grouped(g, kg)
        acc, xin, wt, channel = (
            "n, g, k, h, w",
            f"X[n, g, c, {rows}, {cols}]",
            "W[g, k, c, r, s]",
            "g, k",
        )
        shape = (n, g, kg, *y.shape[2:])
    ports = [x_port, *_operands(wq, rq, shape, y)]
    # the weights' zero point is subtracted with or without the input's (the conv rule dropped
    # it when the input's was 0: sum(x * w) for sum(x * (w - zp_w)) on per-tensor affine weights)
    product = (
        f"({xin}{xz}) * ({wt}{wz})" if wz else f"({xin}{xz}) * {wt}" if xz else f"{xin} * {wt}"
    )
    body = _statements(acc, channel, product, rq, y)
    lo, hi = bounds
    op = conv_op(x, y, g)
    return Layer(name, path, op, ports, body, lo, hi, fusable=True, epilogue=epilogue)


def linear_layer(
    name: str,
    path: str,
    x: Value,
    y: Value,
    weights: tuple[np.ndarray, int],
    rq: Requant,
    bounds: tuple[int, int],
    epilogue: list[str],
) -> Layer:
    """The linear layer `y = x W^T` over [rows, features] (every leading dimension of `x` one
    row), of int8 weights `weights` = (W[o, i], zero point), requantized by `rq`."""
    wq, w_zp = weights
    rows = int(np.prod(x.shape[:-1]))
    o, i = wq.shape
    xz = f" - {x.zp}" if x.zp else ""
    wz = f" - {w_zp}" if w_zp else ""
    ports = [
        Port("X", (rows, i), x.dtype, "input", x.zp, x.buffer),
        *_operands(wq, rq, (rows, o), y),
    ]
    product = (
        f"(X[n, i]{xz}) * (W[o, i]{wz})"
        if wz
        else f"(X[n, i]{xz}) * W[o, i]"
        if xz
        else "X[n, i] * W[o, i]"
    )
    body = _statements("n, o", "o", product, rq, y)
    lo, hi = bounds
    return Layer(name, path, "linear", ports, body, lo, hi, fusable=True, epilogue=epilogue)


def _statements(acc: str, channel: str, product: str, rq: Requant, y: Value):
    """The layer's body, (lo, hi) -> statements: the accumulator's init, the sum of `product`
    over the reduction, the requantized output clamped to [lo, hi]."""
    natural = NATURAL[y.dtype]

    def body(lo, hi):
        return [
            f"ACC[{acc}] = {rq.init(channel)}",
            f"ACC[{acc}] += {product}",
            f"Y[{acc}] = " + clamp(rq.expr(f"ACC[{acc}]", channel, y.zp), lo, hi, natural),
        ]

    return body


def _operands(wq: np.ndarray, rq: Requant, shape: tuple[int, ...], y: Value) -> list[Port]:
    """The ports after the input: the weights, the requantization's, the accumulator, the output."""
    return [
        Port("W", wq.shape, "int8", "input", 0, None, wq),
        *rq.ports,
        Port("ACC", shape, "int32", "none"),
        Port("Y", shape, y.dtype, "output", y.zp, y.buffer),
    ]
