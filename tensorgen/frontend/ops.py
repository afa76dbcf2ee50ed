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
