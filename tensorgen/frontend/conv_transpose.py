"""Quantized ConvTranspose2d as stride-1 convolutions, one per output phase.

`y[o] = sum over (i, kh) with o = s*i - p + d*kh of x[i] * w[kh]` (per dimension). The outputs
`o = s*t + a` of one phase `a` (0 <= a < s) receive exactly the taps `kh` with
`(a + p - d*kh) % s == 0`, an arithmetic progression, reading `x[t + (a + p - d*kh) / s]`; with
the taps in reverse order that is a plain stride-1 convolution over `x`, of dilation
`d / gcd(s, d)`, an offset for padding, and the phase's own slice of the flipped weights. So
every phase is an ordinary conv layer body (conv_layer.py, so the same accumulator, zero points
and requantization), with its own weights and accumulator, writing `Y[.., s*t + a, s*u + b]`:
affine, no modulo in any subscript, and MAC-array shaped.

Past MAX_PHASES phases (stride 3 by 3: 9 phases, 27 statements) a layer compiled for minutes
(the legality checks of the schedules grow with the square of the statements), so an ungrouped
or depthwise layer of more phases is one stride-1 convolution over the zero-inserted input
instead: `U` filled with the input's zero point, `U[.., s*i, s*j] = X[.., i, j]`, and the conv of
dilation `d`, padding `d*(k - 1) - p` (reads outside `U`, output padding's among them, are the
zero point too) and the flipped weights: five statements whatever the stride, for s*s times the
MACs (the inserted zeros).

Numerics (tests/frontend/test_numerics_conv_transpose.py): PyTorch's quantized ConvTranspose2d
rounds as its conv does under qnnpack (int32 bias, one float32 multiplier); under x86 it runs
fbgemm with per-tensor weights and fbgemm's per-channel bias rule, `RN(acc + RN(b / atws))`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np
import torch
import torch.nn.functional as F

from tensorgen.errors import SpecError
from tensorgen.frontend.conv_layer import ConvGeometry, conv_layer
from tensorgen.frontend.layers import NATURAL, Layer, Port, module_path
from tensorgen.frontend.onednn import onednn_requant, runs_on_onednn
from tensorgen.frontend.rules import Requant, bias_array, conv_requant, weights

if TYPE_CHECKING:
    from torch import fx

    from tensorgen.frontend.fx import Value, _Lowering


# phases a layer is written as (stride 2 by 2: 4); past it, the zero-inserted input's conv
MAX_PHASES = 4


@dataclass(frozen=True)
class Phase:
    """Outputs `s*t + a`, t < count, of one dimension: the kernel taps `taps` (in the order the
    stride-1 conv reads them) at input `t + offset + dilation*m` for the m-th tap."""

    a: int
    count: int
    taps: tuple[int, ...]
    offset: int
    dilation: int


def phases(size_out: int, stride: int, padding: int, kernel: int, dilation: int) -> list[Phase]:
    """The `stride` phases of one dimension of a transposed convolution."""
    out = []
    for a in range(min(stride, size_out)):
        taps = [kh for kh in range(kernel) if (a + padding - dilation * kh) % stride == 0]
        if not taps:
            raise SpecError(
                f"kernel {kernel} with stride {stride} and dilation {dilation} leaves output "
                f"phase {a} without taps (only kernels that reach every phase are supported)"
            )
        taps.reverse()  # ascending input index
        offset = (a + padding - dilation * taps[0]) // stride
        step = dilation // math.gcd(stride, dilation)
        out.append(Phase(a, -(-(size_out - a) // stride), tuple(taps), offset, step))
    return out


def conv_transpose_layer(
    name: str,
    path: str,
    x: Value,
    y: Value,
    weights: tuple[np.ndarray, int],
    rq: Callable[[np.ndarray], Requant],
    geometry: ConvGeometry,
    bounds: tuple[int, int],
    epilogue: list[str],
) -> Layer:
    """The layer `y = conv_transpose(x, W)` of int8 weights (W[c, k/g, r, s], zero point),
    requantized by `rq(phase weights)` (each phase its own: oneDNN's fit is proven on the
    accumulators a phase can reach), with
    `geometry` the transposed conv's stride, padding, dilation and groups (output padding is in
    `y`'s shape)."""
    wq, w_zp = weights
    g = geometry.groups
    c, kg, kh, kw = wq.shape
    # as conv weights: Wc[k, c/g, r, s] = W[c, k in group, r, s]
    wc = wq.reshape(g, c // g, kg, kh, kw).transpose(0, 2, 1, 3, 4).reshape(g * kg, c // g, kh, kw)
    (sh, sw), grouped = geometry.stride, g != 1 and not (g == c == y.shape[1])
    if sh * sw > MAX_PHASES and not grouped:
        flipped = np.ascontiguousarray(wc[:, :, ::-1, ::-1])
        return _zero_inserted(name, path, x, y, (flipped, w_zp), rq, geometry, bounds, epilogue)
    rows = phases(y.shape[2], geometry.stride[0], geometry.padding[0], kh, geometry.dilation[0])
    cols = phases(y.shape[3], geometry.stride[1], geometry.padding[1], kw, geometry.dilation[1])
    bodies, ports, first = [], [], None
    for ph in rows:
        for pw in cols:
            tag = f"{ph.a}{pw.a}" if max(sh, sw) <= 10 else f"{ph.a}_{pw.a}"
            wp = np.ascontiguousarray(wc[:, :, list(ph.taps)][:, :, :, list(pw.taps)])
            yp = replace(y, shape=(*y.shape[:2], ph.count, pw.count))
            phase_geo = ConvGeometry(
                (1, 1), (-ph.offset, -pw.offset), (ph.dilation, pw.dilation), g
            )
            layer = conv_layer(name, path, x, yp, (wp, w_zp), rq(wp), phase_geo, bounds, epilogue)
            first = first or layer
            rename = {p.name: f"{p.name}{tag}" for p in layer.ports if p.name not in ("X", "Y")}
            ports += [replace(p, name=rename[p.name]) for p in layer.ports if p.name in rename]
            bodies.append((layer.body, rename, (sh, ph.a), (sw, pw.a), grouped))
    y_port = next(p for p in first.ports if p.name == "Y")
    if grouped:
        y_port = replace(y_port, shape=(*y_port.shape[:3], *y.shape[2:]))
    else:
        y_port = replace(y_port, shape=y.shape)
    x_port = next(p for p in first.ports if p.name == "X")

    def body(lo, hi):
        return [s for b in bodies for s in _phase_statements(*b, lo, hi)]

    lo, hi = bounds
    return Layer(
        name, path, "conv_transpose", [x_port, *ports, y_port], body, lo, hi,
        fusable=True, epilogue=epilogue,
    )  # fmt: skip


def _zero_inserted(name, path, x: Value, y: Value, weights, rq, geometry, bounds, epilogue):
    """The layer as one stride-1 conv of the flipped weights over the input with s - 1 zero
    points inserted between its elements (module docstring)."""
    (sh, sw), (ph, pw), (dh, dw) = geometry.stride, geometry.padding, geometry.dilation
    (n, c, h, w), (kh, kw) = x.shape, weights[0].shape[2:]
    u = replace(x, shape=(n, c, (h - 1) * sh + 1, (w - 1) * sw + 1))
    pads = (dh * (kh - 1) - ph, dw * (kw - 1) - pw)
    conv_geo = ConvGeometry((1, 1), pads, (dh, dw), geometry.groups)
    layer = conv_layer(name, path, u, y, weights, rq(weights[0]), conv_geo, bounds, epilogue)
    ports = [x.port("X", "input"), Port("U", u.shape, x.dtype, "none", x.zp)]
    ports += [p for p in layer.ports if p.name != "X"]
    scatter = f"U[n, c, {_strided(sh, 'h', 0)}, {_strided(sw, 'w', 0)}] = X[n, c, h, w]"
    fill = [f"U[n, c, h, w] = {x.zp}"] if x.zp else []  # a temporary starts at zero

    def body(lo, hi):
        conv = [re.sub(r"\bX\[", "U[", st) for st in layer.body(lo, hi)]
        return [*fill, scatter, *conv]

    lo, hi = bounds
    return Layer(name, path, "conv_transpose", ports, body, lo, hi, fusable=True, epilogue=epilogue)


def _phase_statements(body, rename, rows, cols, grouped, lo, hi) -> list[str]:
    """A phase's conv statements with its own tensors, its output written at `s*h + a`."""
    (sh, a), (sw, b) = rows, cols
    names = "|".join(sorted(rename, key=len, reverse=True))
    pattern = re.compile(rf"\b({names})\[")
    out = []
    for stmt in body(lo, hi):
        stmt = pattern.sub(lambda m: f"{rename[m.group(1)]}[", stmt)
        if stmt.startswith("Y["):
            lhs, rhs = stmt.split(" = ", 1)
            head = "n, g, k" if grouped else "n, k"
            lhs = f"Y[{head}, {_strided(sh, 'h', a)}, {_strided(sw, 'w', b)}]"
            stmt = f"{lhs} = {rhs}"
        out.append(stmt)
    return out


def _strided(s: int, name: str, a: int) -> str:
    base = f"{s}*{name}" if s != 1 else name
    return f"{base} + {a}" if a else base


def transpose_requant(engine: str, x: Value, mod, s_w, y: Value, bias) -> Requant:
    """The requantization of a quantized ConvTranspose2d: conv's under qnnpack. Under x86
    PyTorch runs it on oneDNN where it runs a conv there and the output padding is zero
    (onednn.py, its rule with the per-tensor weight scale on every channel), else on fbgemm
    (its per-channel rule with that one scale)."""
    if engine == "qnnpack":
        return conv_requant(engine, x.scale, s_w, y.scale, bias)
    s_w = np.full(bias.shape[0], s_w)
    on_onednn = runs_on_onednn(engine, mod.groups, mod.weight().q_zero_point())
    if on_onednn and not any(mod.output_padding):
        return onednn_requant(x.scale, s_w, y.scale, bias)
    return conv_requant(engine, x.scale, s_w, y.scale, bias)


def conv_transpose(lw: _Lowering, node: fx.Node, mod) -> None:
    """A quantized nn.ConvTranspose2d module (FX's convert gives no fused-ReLU variant)."""
    x, y = lw.value_of(node.args[0]), lw.result_value(node)
    if getattr(mod, "padding_mode", "zeros") != "zeros":
        raise SpecError(f"padding_mode '{mod.padding_mode}' (only zeros)")
    wq, s_w, w_zp = weights(mod.weight())
    bias = bias_array(mod.bias(), y.shape[1])
    if np.ndim(s_w) or y.dtype != "uint8":
        raise SpecError("ConvTranspose2d with per-channel weights or a non-quint8 output")
    if not _pytorch_is_a_transposed_conv(mod, lw.results[node.args[0]], lw.engine):
        raise SpecError(
            f"PyTorch's {lw.engine} quantized ConvTranspose2d does not compute the transposed "
            f"convolution of its own weights on this layer ({x.shape[1]} to {y.shape[1]} "
            f"channels, stride {tuple(mod.stride)}, groups {mod.groups}; see "
            "tests/frontend/test_numerics_conv_transpose.py)"
        )

    def rq(wp: np.ndarray) -> Requant:  # one rule for every phase
        return transpose_requant(lw.engine, x, mod, s_w, y, bias)

    geometry = ConvGeometry(mod.stride, mod.padding, mod.dilation, mod.groups)
    layer = conv_transpose_layer(
        node.name, module_path(node), x, y, (wq, w_zp), rq, geometry, NATURAL[y.dtype], []
    )
    lw.add(layer, y)


def _pytorch_is_a_transposed_conv(mod, qx: torch.Tensor, engine: str) -> bool:
    """Whether PyTorch's kernel, on random codes of the layer's input, gives the accumulator of
    the transposed convolution of its weights (any requantization: outputs within 1, never
    more): PyTorch's x86 kernel does not on some shapes."""
    g = torch.Generator().manual_seed(0)
    lo, hi = (0, 255) if qx.dtype == torch.quint8 else (-128, 127)
    codes = torch.randint(lo, hi + 1, qx.shape, generator=g).to(qx.int_repr().dtype)
    probe = torch._make_per_tensor_quantized_tensor(codes, qx.q_scale(), qx.q_zero_point())
    w = mod.weight()
    with torch.no_grad():
        got = mod(probe).int_repr().double()
        acc = F.conv_transpose2d(
            codes.double() - qx.q_zero_point(),
            w.int_repr().double() - w.q_zero_point(),
            None, mod.stride, mod.padding, mod.output_padding, mod.groups, mod.dilation,
        )  # fmt: skip
        bias = mod.bias().detach().double() if mod.bias() is not None else 0.0
        scale = qx.q_scale() * w.q_scale() / mod.scale
        real = acc * scale + (bias / mod.scale).reshape(1, -1, 1, 1) + mod.zero_point
        want = torch.clamp(torch.round(real), 0, 255)  # FX's activations are quint8
    return bool((got - want).abs().max() <= 1)
