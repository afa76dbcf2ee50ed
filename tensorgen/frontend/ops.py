"""Lowerings of the data-movement and requantizing operators of a quantized model: `cat` of
inputs with different quantization parameters, and the float round trips (dequantize, an
operation that only moves elements, quantize) that FX's default qconfig leaves around
operators it does not quantize.

Each function takes the `_Lowering` of tensorgen.frontend.fx and the FX node, and adds layers
to it. Requantizing one tensor to another's qparams is PyTorch's dequantize-then-quantize
(`numerics.requantize_codes`); the accelerator does it in one `requant`, with a multiplier that
is checked against PyTorch's rule on all 256 codes (`numerics.requantize_multiplier`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from tensorgen.errors import SpecError
from tensorgen.frontend import numerics
from tensorgen.frontend.layers import NATURAL, Layer, affine, axes, cat_parts, f32, idx, module_path

if TYPE_CHECKING:
    from torch import fx

    from tensorgen.frontend.fx import Value, _Lowering


def requant_expr(read: str, x: Value, y: Value, nhwc: bool = False) -> str:
    """`read` (an element of `x`) requantized to `y`'s qparams by PyTorch's rule (`nhwc`: the
    rule of its channels-last cat kernel), as an op.yaml expression; the bare read when the
    qparams agree."""
    if (x.scale, x.zp) == (y.scale, y.zp) and x.dtype == y.dtype:
        return read
    if x.dtype != y.dtype:
        raise SpecError(f"requantization from {x.dtype} to {y.dtype}")
    lo, hi = NATURAL[y.dtype]
    m = numerics.requantize_multiplier(x.scale, x.zp, y.scale, y.zp, lo, hi, nhwc)
    if m is None:
        raise SpecError(
            f"requantizing from scale {x.scale!r}, zero point {x.zp} to scale {y.scale!r}, zero "
            f"point {y.zp}: no single float32 multiplier reproduces PyTorch's dequantize-then-"
            "quantize on all 256 codes"
        )
    xz = f" - {x.zp}" if x.zp else ""
    return f"requant({read}{xz}, {f32(m)}, {y.zp})"


def cat(lw: _Lowering, node: fx.Node) -> None:
    """torch.cat along any dimension; an input whose qparams differ from the output's (PyTorch
    gives the output the first input's) is requantized on the way."""
    parts = [lw.value_of(a) for a in node.args[0]]
    dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", 0)
    y = lw.result_value(node)
    dim %= len(y.shape)
    ins = [lw.results[a] for a in node.args[0]]
    # PyTorch's channels-last kernel rounds ties differently (numerics.requantize_codes)
    nhwc = dim == 1 and all(
        t.dim() == 4 and t.is_contiguous(memory_format=torch.channels_last) for t in ins
    )
    ports, stmts = cat_parts(
        parts, len(y.shape), dim, lambda i, p, read: requant_expr(read, p, y, nhwc)
    )
    lw.add(
        Layer(
            node.name,
            module_path(node),
            "cat",
            ports + [y.port("Y", "output")],
            lambda lo, hi: stmts,
        ),
        y,
    )


def nearest_upsample(lw: _Lowering, node: fx.Node, run) -> None:
    """Nearest upsampling by integer factors, `Y[n, c, fh*h + a, fw*w + b] = X[n, c, h, w]`: a
    copy. On a quantized tensor (PyTorch's quantized kernel keeps the qparams) it copies the
    integers; on a float one between FX's dequantize and quantize (the default qconfig leaves
    nn.Upsample unquantized) it is that dequantize with a gathering subscript, exactly
    PyTorch's since dequantize is element-wise. `run(t)` applies the node's own operator to a
    float tensor: the index map is PyTorch's, read off an index image."""
    src = node.args[0]
    x, y = lw.value_of(src), lw.result_value(node)
    if x.dtype == "float32":
        producer = lw.producer.get(getattr(src, "name", ""))
        if producer is None or producer.op != "dequantize":
            raise SpecError("interpolate of a float tensor that is not a dequantized one")
        q = lw.value_of(src.args[0])  # the quantized tensor the dequantize reads
        read = f"dequantize(X[n, c, h, w], {q.scale!r}, {q.zp})"
        ports = [q.port("X", "input"), y.port("Y", "output", 0)]
    else:
        if (x.scale, x.zp) != (y.scale, y.zp):
            raise SpecError("quantized interpolate that changes the quantization parameters")
        read, ports = "X[n, c, h, w]", [x.port("X", "input"), y.port("Y", "output")]
    fh, fw = _factors(x.shape, y.shape, run)
    stmt = {
        "stmt": f"Y[n, c, {affine((fh, 'h'), (1, 'a'))}, {affine((fw, 'w'), (1, 'b'))}] = {read}",
        "where": f"0 <= a < {fh} and 0 <= b < {fw}",
    }
    lw.add(Layer(node.name, module_path(node), "upsample_nearest", ports, lambda lo, hi: [stmt]), y)


def _factors(xs: tuple[int, ...], ys: tuple[int, ...], run) -> tuple[int, int]:
    """The integer factors (fh, fw) of a nearest upsampling from `xs` to `ys`, checked against
    the map PyTorch's operator `run` computes (sizes, scale factors, every mode's own rounding)."""
    if len(xs) != 4:
        raise SpecError(f"interpolate of a rank-{len(xs)} tensor (only NCHW)")
    (h, w), (oh, ow) = xs[2:], ys[2:]
    index = torch.arange(h * w, dtype=torch.float32).reshape(1, 1, h, w)
    with torch.no_grad():
        got = run(index).reshape(oh, ow)
    fh, fw = oh // h, ow // w
    if fh * h == oh and fw * w == ow:
        want = (torch.arange(oh) // fh)[:, None] * w + (torch.arange(ow) // fw)[None, :]
        if torch.equal(got, want.to(torch.float32)):
            return fh, fw
    raise SpecError(
        f"interpolate from {h}x{w} to {oh}x{ow}: only nearest upsampling by integer factors"
    )


def transpose(lw: _Lowering, node: fx.Node) -> None:
    """transpose(a, b) (a channel shuffle's middle step): a copy into the transposed layout, so
    the view that follows it is again an alias of contiguous bytes."""
    x, y = lw.value_of(node.args[0]), lw.result_value(node)
    a, b = node.args[1:3] if len(node.args) > 2 else (node.kwargs["dim0"], node.kwargs["dim1"])
    src = axes(len(x.shape))
    dst = list(src)
    dst[a % len(src)], dst[b % len(src)] = dst[b % len(src)], dst[a % len(src)]
    lw.add(
        Layer(
            node.name,
            module_path(node),
            "transpose",
            [x.port("X", "input"), y.port("Y", "output")],
            lambda lo, hi: [f"Y[{idx(dst)}] = X[{idx(src)}]"],
        ),
        y,
    )


def split(lw: _Lowering, node: fx.Node) -> None:
    """chunk / split / tensor_split: a tuple, nothing to compute; each `getitem` of it is a
    slice (`piece`). Only its input is checked here."""
    x = lw.value_of(node.args[0])
    parts = lw.results[node]
    if not isinstance(parts, (tuple, list)) or any(p.dtype != parts[0].dtype for p in parts):
        raise SpecError("split into something other than a tuple of tensors")
    if x.dtype == "float32":
        _dequantized(lw, node.args[0], node)


def _dequantized(lw: _Lowering, src, node: fx.Node) -> Value:
    """The quantized tensor that the float `src` is the dequantize of, else the usual refusal of
    a float operation."""
    producer = lw.producer.get(getattr(src, "name", ""))
    if producer is None or producer.op != "dequantize":
        lw._refuse(node)
    return lw.value_of(src.args[0])


def python_value(lw: _Lowering, node: fx.Node) -> None:
    """`getattr(x, "shape")`, `shape[1]`, `c // 2`: Python integers of a traced model's shape
    arithmetic, static once traced; nothing to compute. Anything that yields a tensor is not
    this."""
    if isinstance(lw.results.get(node), torch.Tensor):
        lw._refuse(node)


def piece(lw: _Lowering, node: fx.Node) -> None:
    """`parts[i]` of a chunk / split: a copy of that slice, `Y[.., c, ..] = X[.., c + off, ..]`,
    along the dimension the recorded pieces differ from the input in."""
    source = node.args[0]
    if not isinstance(lw.results.get(node), torch.Tensor):
        return python_value(lw, node)  # an element of a shape
    if not (hasattr(source, "op") and isinstance(lw.results.get(source), (tuple, list))):
        raise SpecError("getitem of something other than a split tensor")
    x, y = lw.value_of(source.args[0]), lw.result_value(node)
    ports, read = [x.port("X", "input"), y.port("Y", "output")], "X"
    if x.dtype == "float32":  # FX splits the dequantized tensor: a dequantize of the slice
        q = _dequantized(lw, source.args[0], node)
        ports, read = [q.port("X", "input"), y.port("Y", "output", 0)], "dequantize(X"
    parts, i = lw.results[source], node.args[1]
    dims = [d for d in range(len(x.shape)) if parts[i].shape[d] != x.shape[d]]
    dim = dims[0] if dims else 0
    off = sum(int(p.shape[dim]) for p in parts[:i])
    ix = axes(len(y.shape))
    src = list(ix)
    src[dim] = affine((1, ix[dim]), const=off)
    tail = f", {q.scale!r}, {q.zp})" if read != "X" else ""
    stmt = {  # where: the slice is narrower than X
        "stmt": f"Y[{idx(ix)}] = {read}[{idx(src)}]{tail}",
        "where": f"0 <= {ix[dim]} < {y.shape[dim]}",
    }
    lw.add(Layer(node.name, module_path(node), "slice", ports, lambda lo, hi: [stmt]), y)
