"""The layers of a PT2E graph: one function per float operator between dequantize and quantize
nodes, each emitting tensorgen's integer rule for it (docs/numerics.md, "PT2E").

Each takes the lowering (`tensorgen.frontend.pt2e._Pt2e`), the quantize node `q` that ends the
layer, the float operator `src` it quantizes and the float bounds of a fused activation.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from torch import fx

from tensorgen.errors import SpecError
from tensorgen.frontend import pt2e_elementwise, pt2e_pooling
from tensorgen.frontend.conv_layer import ConvGeometry, conv_layer, linear_layer
from tensorgen.frontend.layers import (
    NATURAL,
    Layer,
    Port,
    affine,
    axes,
    cat_parts,
    clamp,
    f32,
    idx,
)
from tensorgen.frontend.layers import module_path as path_of
from tensorgen.frontend.pt2e import DQ, inv_scale, op_of, requant_per_channel

if TYPE_CHECKING:
    from tensorgen.frontend.pt2e import _Pt2e


def _pair(v) -> tuple[int, int]:
    v = list(v) if isinstance(v, (list, tuple)) else [v]
    return (v[0], v[-1])


def _args(node: fx.Node, defaults: tuple) -> list:
    return list(node.args[1:]) + list(defaults[len(node.args) - 1 :])


def quantize(lw: _Pt2e, q: fx.Node) -> None:
    """The entry: tensorgen's quantize, clamp(RNE(fma(x, RN(1/s), zp))) (PyTorch's
    quantize_per_tensor rounds the product first and adds the zero point after RNE: they differ
    only where RN(x·RN(1/s)) is within one rounding of a half-integer)."""
    x = lw.values[q.args[0].name]
    y = lw.new_value(q)
    a = idx(axes(len(y.shape)))
    lw.add(
        Layer(
            q.name,
            path_of(q),
            "quantize",
            [x.port("X", "input", 0), y.port("Y", "output")],
            lambda lo, hi: [f"Y[{a}] = quantize(X[{a}], {y.scale!r}, {y.zp})"],
        )
    )


def dequantize(lw: _Pt2e, dq: fx.Node) -> None:
    """An exit: RN(f32(q − zp)·f32(s)), dequantize_per_tensor's float32 rule."""
    x = lw.value_of(dq)
    s, zp = float(dq.args[1]), int(dq.args[2])
    if (np.float32(s), zp) != (np.float32(x.scale), x.zp):
        raise SpecError("dequantize with parameters other than its quantize's")
    # the output's public name, at most 32 bytes (dequantize_per_tensor_default_109 is 33)
    name = dq.name.replace("dequantize_per_tensor_default", "dequantized")
    y = lw.values[dq.name] = type(x)(name, x.shape, "float32", buffer=name)
    a = idx(axes(len(y.shape)))
    lw.add(
        Layer(
            dq.name,
            path_of(dq),
            "dequantize",
            [x.port("X", "input"), y.port("Y", "output", 0)],
            lambda lo, hi: [f"Y[{a}] = dequantize(X[{a}], {x.scale!r}, {x.zp})"],
        )
    )


def clamp_only(lw: _Pt2e, q: fx.Node, dq: fx.Node, act, lo_f, hi_f) -> None:
    """relu / hardtanh of a quantized tensor into the same parameters: a clamp of integers."""
    x = lw.value_of(dq)
    y = lw.new_value(q)
    if act is None:  # dequantize -> quantize: a requantization tensorgen does not do
        if (y.scale, y.zp, y.dtype) != (x.scale, x.zp, x.dtype):
            raise SpecError("requantizes a tensor (dequantize, then quantize with new parameters)")
        lo, hi = NATURAL[y.dtype]
    else:
        if (y.scale, y.zp, y.dtype) != (x.scale, x.zp, x.dtype):
            raise SpecError(f"{op_of(act)} changes the quantization parameters")
        lo, hi = lw.bounds(y, lo_f, hi_f)
    a = idx(axes(len(y.shape)))
    natural = NATURAL[y.dtype]
    lw.add(
        Layer(
            q.name,
            path_of(q),
            op_of(act).split(".")[1] if act is not None else "copy",
            [x.port("X", "input"), y.port("Y", "output")],
            lambda lo_, hi_: [f"Y[{a}] = " + clamp(f"X[{a}]", lo_, hi_, natural)],
            lo,
            hi,
        )
    )


def _conv_parts(lw: _Pt2e, src: fx.Node):
    x = lw.value_of(src.args[0])
    wq, s_w = lw.weight(src.args[1])
    bias = src.args[2] if len(src.args) > 2 else None
    b_q = lw.weight(bias)[0] if isinstance(bias, fx.Node) else None
    if x.dtype == "float32":
        raise SpecError("input is not quantized")
    return x, wq.astype(np.int8), s_w, b_q


def conv(lw: _Pt2e, q: fx.Node, src: fx.Node, lo_f, hi_f) -> None:
    """acc = b_q + Σ (x − zp_x)·w exactly in int32, y = clamp(RNE(RN(f32(acc)·M[k])) + zp)."""
    x, wq, s_w, b_q = _conv_parts(lw, src)
    y = lw.new_value(q)
    stride, padding, dilation, g = _args(src, (None, None, (1, 1), (0, 0), (1, 1), 1))[2:6]
    geometry = ConvGeometry(_pair(stride), _pair(padding), _pair(dilation), g)
    if isinstance(padding, str):
        raise SpecError(f"padding '{padding}'")
    rq = requant_per_channel(b_q, x.scale, s_w, y.scale)
    bounds = lw.bounds(y, lo_f, hi_f)
    lw.add(conv_layer(src.name, path_of(src), x, y, (wq, 0), rq, geometry, bounds, []))


def linear(lw: _Pt2e, q: fx.Node, src: fx.Node, lo_f, hi_f) -> None:
    """The conv rule over [rows, features]."""
    x, wq, s_w, b_q = _conv_parts(lw, src)
    y = lw.new_value(q)
    rq = requant_per_channel(b_q, x.scale, s_w, y.scale)
    bounds = lw.bounds(y, lo_f, hi_f)
    lw.add(linear_layer(src.name, path_of(src), x, y, (wq, 0), rq, bounds, []))


def add(lw: _Pt2e, q: fx.Node, src: fx.Node, lo_f, hi_f) -> None:
    """The float32 graph's own add: c = RN(RN(s_a·f32(a − zp_a)) + RN(s_b·f32(b − zp_b))),
    y = clamp(RNE(RN(c·RN(1/s_y))) + zp_y): bit for bit what PyTorch computes."""
    if len(src.args) > 2 or src.kwargs.get("alpha", 1) != 1:
        raise SpecError("add with alpha")
    if pt2e_elementwise.scalar_add(lw, q, src, lo_f, hi_f):
        return
    a, b = lw.value_of(src.args[0]), lw.value_of(src.args[1])
    y = lw.new_value(q)
    if a.shape != y.shape or b.shape != y.shape:
        raise SpecError(f"broadcasting add of {list(a.shape)} and {list(b.shape)}")
    ix = idx(axes(len(y.shape)))
    ea = f"A[{ix}] - {a.zp}" if a.zp else f"A[{ix}]"
    eb = f"B[{ix}] - {b.zp}" if b.zp else f"B[{ix}]"
    consts = ", ".join(f32(v) for v in (a.scale, 0.0, b.scale, 0.0, inv_scale(y.scale)))
    natural = NATURAL[y.dtype]

    # the instruction saturates to [0, 255]: an int8 result is computed 128 higher
    shift = 128 if y.dtype == "int8" else 0
    expr = f"add_fbgemm({ea}, {eb}, {consts}, {y.zp + shift})" + (f" - {shift}" if shift else "")

    def body(lo, hi):
        return [f"Y[{ix}] = " + clamp(expr, lo, hi, natural)]

    lo, hi = lw.bounds(y, lo_f, hi_f)
    ports = [a.port("A", "input"), b.port("B", "input"), y.port("Y", "output")]
    lw.add(Layer(src.name, path_of(src), "add", ports, body, lo, hi))


def _same_params(x, y) -> None:
    if (x.scale, x.zp, x.dtype) != (y.scale, y.zp, y.dtype):
        raise SpecError(
            "output quantized with parameters other than its input's (the quantizer shares them)"
        )


def max_pool(lw: _Pt2e, q: fx.Node, src: fx.Node, lo_f, hi_f) -> None:
    """Integer max over the window (input and output share parameters); padding is −∞."""
    x = lw.value_of(src.args[0])
    y = lw.new_value(q)
    _same_params(x, y)
    kernel, stride, padding, dilation, ceil = _args(src, (None, (), 0, 1, False))[:5]
    if ceil:
        raise SpecError("max_pool2d with ceil_mode")
    (kh, kw), (ph, pw), (dh, dw) = _pair(kernel), _pair(padding), _pair(dilation)
    sh, sw = _pair(stride) if stride else (kh, kw)
    rows = affine((sh, "h"), (dh, "i"), const=-ph)
    cols = affine((sw, "w"), (dw, "j"), const=-pw)
    lo = NATURAL[x.dtype][0]

    def body(lo_, hi_):
        return [
            f"Y[n, c, h, w] = {lo}",
            {
                "stmt": f"Y[n, c, h, w] max= X[n, c, {rows}, {cols}]",
                "where": f"0 <= i < {kh} and 0 <= j < {kw}",
            },
        ]

    ports = [x.port("X", "input", lo), y.port("Y", "output")]
    lw.add(Layer(src.name, path_of(src), "max_pool2d", ports, body))


def adaptive_avg_pool(lw: _Pt2e, q: fx.Node, src: fx.Node, lo_f, hi_f) -> None:
    """acc = Σ (x − zp_in) over the window, exact; y = clamp(RNE(RN(f32(acc)·M)) + zp_out),
    M = f32(s_in / (n·s_out)) in double."""
    x = lw.value_of(src.args[0])
    y = lw.new_value(q)
    if op_of(src) == "aten.mean.dim":
        dims = sorted(d % len(x.shape) for d in src.args[1])
        keep = src.args[2] if len(src.args) > 2 else src.kwargs.get("keepdim", False)
        if len(x.shape) != 4 or dims != [2, 3] or not keep:
            raise SpecError(f"mean over {dims} keepdim={keep} (only over (2, 3) with keepdim)")
    h, w = x.shape[2:]
    oh, ow = y.shape[2:]
    if h % oh or w % ow:
        raise SpecError(f"adaptive_avg_pool2d from {h}x{w} to {oh}x{ow}: only sizes that divide")
    kh, kw = h // oh, w // ow
    m = np.float32(np.float64(x.scale) / (kh * kw * np.float64(y.scale)))
    xz = f" - {x.zp}" if x.zp else ""

    def body(lo, hi):
        return [
            "ACC[n, c, h, w] = 0",
            {
                "stmt": f"ACC[n, c, h, w] += X[n, c, {affine((kh, 'h'), (1, 'i'))}, "
                f"{affine((kw, 'w'), (1, 'j'))}]{xz}",
                "where": f"0 <= i < {kh} and 0 <= j < {kw}",
            },
            f"Y[n, c, h, w] = requant(ACC[n, c, h, w], {f32(m)}, {y.zp})",
        ]

    ports = [x.port("X", "input"), Port("ACC", y.shape, "int32", "none"), y.port("Y", "output")]
    lw.add(Layer(src.name, path_of(src), "adaptive_avg_pool2d", ports, body))


def alias(lw: _Pt2e, q: fx.Node, src: fx.Node, lo_f, hi_f) -> None:
    """flatten / view / reshape with shared parameters: the same DRAM bytes."""
    x = lw.value_of(src.args[0])
    if op_of(src.args[0]) != DQ:
        raise SpecError("reshape of a float result")
    if op_of(src) == "aten.dropout.default" and (src.args[2:3] or [False])[0]:
        raise SpecError("dropout in training mode (put the model in eval mode)")
    y = lw.new_value(q, buffer=x.buffer)
    _same_params(x, y)


def cat(lw: _Pt2e, q: fx.Node, src: fx.Node, lo_f, hi_f) -> None:
    """cat of inputs that share the output's parameters: copies at offsets."""
    parts = [lw.value_of(t) for t in src.args[0]]
    y = lw.new_value(q)
    dim = (src.args[1] if len(src.args) > 1 else 0) % len(y.shape)
    for p in parts:
        _same_params(p, y)
    ports, stmts = cat_parts(parts, len(y.shape), dim, lambda i, p, read: read)
    lw.add(
        Layer(src.name, path_of(src), "cat", [*ports, y.port("Y", "output")], lambda lo, hi: stmts)
    )


def permute(lw: _Pt2e, q: fx.Node, src: fx.Node, lo_f, hi_f) -> None:
    """transpose / permute with shared parameters: a copy with permuted indices."""
    x = lw.value_of(src.args[0])
    y = lw.new_value(q)
    _same_params(x, y)
    rank = len(x.shape)
    if op_of(src) == "aten.transpose.int":
        dims = list(range(rank))
        a, b = src.args[1] % rank, src.args[2] % rank
        dims[a], dims[b] = dims[b], dims[a]
    else:
        dims = [d % rank for d in src.args[1]]
    ix = axes(rank)
    out = idx([ix[d] for d in dims])
    ports = [x.port("X", "input"), y.port("Y", "output")]
    lw.add(
        Layer(src.name, path_of(src), "permute", ports, lambda lo, hi: [f"Y[{out}] = X[{idx(ix)}]"])
    )


PIECES = ("aten.chunk.default", "aten.split.Tensor", "aten.split_with_sizes.default")


def piece(lw: _Pt2e, q: fx.Node, src: fx.Node, lo_f, hi_f) -> None:
    """A getitem of chunk / split along a dimension, with shared parameters: a slice copy."""
    whole = src.args[0]
    if op_of(whole) not in PIECES:
        raise SpecError(f"getitem of {op_of(whole)}")
    lw.used.add(whole)
    x = lw.value_of(whole.args[0])
    y = lw.new_value(q)
    _same_params(x, y)
    dim = (whole.args[2] if len(whole.args) > 2 else 0) % len(x.shape)
    off = sum(t.shape[dim] for t in lw.results[whole][: src.args[1]])
    ix = axes(len(x.shape))
    at = list(ix)
    at[dim] = affine((1, ix[dim]), const=off)
    ports = [x.port("X", "input"), y.port("Y", "output")]
    stmt = {"stmt": f"Y[{idx(ix)}] = X[{idx(at)}]", "where": f"0 <= {ix[dim]} < {y.shape[dim]}"}
    lw.add(Layer(src.name, path_of(src), "slice", ports, lambda lo, hi: [stmt]))


LAYERS = (
    {
        "aten.transpose.int": permute,
        "aten.permute.default": permute,
        "<built-in function getitem>": piece,
        "aten.conv2d.default": conv,
        "aten.linear.default": linear,
        "aten.add.Tensor": add,
        "aten.add_.Tensor": add,
        "aten.max_pool2d.default": max_pool,
        "aten.adaptive_avg_pool2d.default": adaptive_avg_pool,
        "aten.mean.dim": adaptive_avg_pool,
        "aten.dropout.default": alias,
        "aten.flatten.using_ints": alias,
        "aten.view.default": alias,
        "aten.reshape.default": alias,
        "aten.contiguous.default": alias,
        "aten.clone.default": alias,
        "aten.cat.default": cat,
    }
    | pt2e_elementwise.LAYERS
    | pt2e_pooling.LAYERS
)
FUSABLE = (conv, linear, add)
