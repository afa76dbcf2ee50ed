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
