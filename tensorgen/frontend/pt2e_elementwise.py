"""The element-wise layers of a PT2E graph beyond add and the clamps (docs/numerics.md, "PT2E").

- A float function of one quantized tensor (`hardswish`, `hardsigmoid`, `sigmoid`, `tanh`,
  `leaky_relu`, `elu`, `gelu`, `silu`, and `mul` / `add` / `sub` of a tensor and a number), dequantized before
  it and quantized after it, is a function of the input's 256 codes: a lookup table (`lut`, the
  VLUT instruction, built by elementwise.lut_layer as in the FX lowering). The table is the
  graph's own three nodes (dequantize, the operator, quantize) run by PyTorch on a tensor of all
  256 codes, so it is bit-exact with PyTorch's float execution by construction; the recorded run
  of the model is checked against it before it is used (a vectorized kernel whose result
  depended on an element's position would be refused, never silently mismatched).
- `mul` of two quantized tensors (squeeze-excite's `[N, C, H, W] * [N, C, 1, 1]`):
  `y = clamp(RNE(RN(f32((a − zp_a)·(b − zp_b))·M)) + zp_y)`, `M = f32(s_a·s_b/s_y)` in double,
  the integer product exact, as the conv rule; the float graph rounds `RN(RN(s_a·(a − zp_a))·
  RN(s_b·(b − zp_b)))` first, which differs only within a few roundings of a tie.

Each takes the lowering (`tensorgen.frontend.pt2e._Pt2e`), the quantize node `q` that ends the
layer, the float operator `src` it quantizes and the float bounds of a fused activation.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import fx

from tensorgen.errors import SpecError
from tensorgen.frontend.elementwise import all_codes, lut_layer
from tensorgen.frontend.layers import Layer, axes, f32, idx
from tensorgen.frontend.layers import module_path as path_of
from tensorgen.frontend.pt2e import DQ, op_of

if TYPE_CHECKING:
    from tensorgen.frontend.pt2e import _Pt2e

LOOKUPS = (
    "aten.hardswish.default",
    "aten.hardswish_.default",
    "aten.hardsigmoid.default",
    "aten.hardsigmoid_.default",
    "aten.sigmoid.default",
    "aten.sigmoid_.default",
    "aten.tanh.default",
    "aten.tanh_.default",
    "aten.leaky_relu.default",
    "aten.leaky_relu_.default",
    "aten.elu.default",
    "aten.elu_.default",
    "aten.gelu.default",
    "aten.silu.default",
    "aten.silu_.default",
)


def _table(lw: _Pt2e, q: fx.Node, src: fx.Node, dq: fx.Node, dtype: str) -> torch.Tensor:
    """PyTorch's output codes of dq -> src -> q for each of the 256 input codes (table order)."""
    codes = torch.from_numpy(all_codes(dtype).copy())
    env: dict[fx.Node, object] = {dq.args[0]: codes}

    def run(node: fx.Node):
        def arg(a):
            if not isinstance(a, fx.Node):
                return a
            return env[a] if a in env else lw.results[a]

        args = [arg(a) for a in node.args]
        kwargs = {k: arg(v) for k, v in node.kwargs.items()}
        env[node] = node.target(*args, **kwargs)
        return env[node]

    with torch.no_grad():
        for node in (dq, src):
            run(node)
        env[q.args[0]] = env[src]  # a fused relu / hardtanh between: lookup() clamps after
        return run(q)


def lookup(lw: _Pt2e, q: fx.Node, src: fx.Node, lo_f, hi_f) -> None:
    """`Y = T[X]`, T the graph's own dequantize -> operator -> quantize on the 256 codes."""
    dq = src.args[0]
    if not isinstance(dq, fx.Node) or op_of(dq) != DQ:
        raise SpecError("input is not a dequantized tensor")
    if any(isinstance(a, fx.Node) for a in (*src.args[1:], *src.kwargs.values())):
        raise SpecError("not a function of one quantized tensor")
    x = lw.value_of(dq)
    y = lw.new_value(q)
    out = _table(lw, q, src, dq, x.dtype)
    if not isinstance(out, torch.Tensor) or out.shape != (256,):
        raise SpecError("is not an element-wise function of one tensor")
    table = out.numpy().astype(np.dtype(y.dtype))
    if lo_f is not None or hi_f is not None:  # a fused relu / hardtanh: quantize is monotone,
        table = np.clip(table, *lw.bounds(y, lo_f, hi_f))  # so it commutes with the clamp
    seen = lw.results[dq.args[0]].numpy().view(np.uint8)
    if not np.array_equal(table[seen], lw.results[q].numpy()):
        raise SpecError(
            "PyTorch's float result in the model is not its result on the same codes alone "
            "(the kernel depends on an element's position), so no lookup table reproduces it"
        )
    lw.add(lut_layer(q.name, path_of(src), x, y, table))


def mul(lw: _Pt2e, q: fx.Node, src: fx.Node, lo_f, hi_f) -> None:
    """Of a tensor and a number, a lookup; of two tensors, the integer product requantized with
    one multiplier, the second operand broadcast along dimensions of size 1."""
    na, nb = src.args[0], src.args[1]
    if not isinstance(nb, fx.Node):
        return lookup(lw, q, src, lo_f, hi_f)
    a, b = lw.value_of(na), lw.value_of(nb)
    y = lw.new_value(q)
    if a.shape != y.shape and b.shape == y.shape:  # the integer product commutes exactly
        a, b = b, a
    if a.shape != y.shape or len(b.shape) != len(y.shape):
        raise SpecError(f"mul of {list(a.shape)} and {list(b.shape)}: only broadcasts of one input")
    if any(m not in (1, n) for m, n in zip(b.shape, y.shape, strict=True)):
        raise SpecError(f"mul of {list(a.shape)} and {list(b.shape)}: shapes do not broadcast")
    m = np.float32(np.float64(a.scale) * np.float64(b.scale) / np.float64(y.scale))
    ia = axes(len(y.shape))
    ib = [i if n > 1 else "0" for i, n in zip(ia, b.shape, strict=True)]
    az, bz = (f" - {a.zp}" if a.zp else ""), (f" - {b.zp}" if b.zp else "")
    stmt = f"Y[{idx(ia)}] = requant((A[{idx(ia)}]{az}) * (B[{idx(ib)}]{bz}), {f32(m)}, {y.zp})"
    ports = [a.port("A", "input"), b.port("B", "input"), y.port("Y", "output")]
    lw.add(Layer(src.name, path_of(src), "mul", ports, lambda lo, hi: [stmt]))


def scalar_add(lw: _Pt2e, q: fx.Node, src: fx.Node, lo_f, hi_f) -> bool:
    """An add of a tensor and a number (and its fused relu) is a lookup (True when it was)."""
    if isinstance(src.args[1], fx.Node):
        return False
    lookup(lw, q, src, lo_f, hi_f)
    return True


LAYERS = {name: lookup for name in LOOKUPS} | {"aten.mul.Tensor": mul, "aten.mul_.Tensor": mul}
LAYERS |= {"aten.sub.Tensor": lookup}  # of a number (of two tensors: refused in one line)
