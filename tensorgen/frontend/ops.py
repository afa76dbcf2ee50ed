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
from tensorgen.frontend.layers import NATURAL, Layer, affine, axes, f32, idx, module_path

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
    ports, stmts, off = [], [], 0
    for i, p in enumerate(parts):
        ix = axes(len(y.shape))
        out = list(ix)
        out[dim] = affine((1, ix[dim]), const=off)
        ports.append(p.port(f"X{i}", "input"))
        # where: bounds the concatenated index by this part (Y's dimension is larger)
        stmts.append(
            {
                "stmt": f"Y[{idx(out)}] = {requant_expr(f'X{i}[{idx(ix)}]', p, y, nhwc)}",
                "where": f"0 <= {ix[dim]} < {p.shape[dim]}",
            }
        )
        off += p.shape[dim]
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
