"""Average pooling and nearest upsampling in a PT2E graph (docs/numerics.md, "PT2E").

- `avg_pool2d` of every configuration PyTorch accepts (non-dividing windows, `ceil_mode`,
  `count_include_pad` both ways, `divisor_override`): `acc = Σ (x − zp_x)` over the window's
  elements inside the input (padding holds the zero point, so it adds 0), then
  `y = clamp(RNE(RN(f32(acc)·M[h, w])) + zp_y)`, `M[h, w] = f32(s_x/(n[h, w]·s_y))` in double,
  `n[h, w]` PyTorch's divisor at that output position (one multiplier per position when the
  divisor varies: `ceil_mode`'s clipped windows, `count_include_pad=False` at the borders).
- `upsample_nearest2d` by integer factors, parameters shared: the integers copied,
  `Y[n, c, fh·h + a, fw·w + b] = X[n, c, h, w]`; the index map is PyTorch's own operator run on
  an index image.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import fx

from tensorgen.errors import SpecError
from tensorgen.frontend.layers import Layer, Port, affine
from tensorgen.frontend.layers import module_path as path_of

if TYPE_CHECKING:
    from tensorgen.frontend.pt2e import _Pt2e


def _pair(v) -> tuple[int, int]:
    v = list(v) if isinstance(v, (list, tuple)) else [v]
    return (int(v[0]), int(v[-1]))


def avg_pool_args(src: fx.Node) -> tuple:
    """(kernel, stride, padding, ceil_mode, count_include_pad, divisor_override) of the node."""
    names = ("kernel_size", "stride", "padding", "ceil_mode", "count_include_pad", "divisor")
    defaults = dict(zip(names, (None, (), 0, False, True, None), strict=True))
    given = dict(zip(names, src.args[1:], strict=False))
    given.update({("divisor" if k == "divisor_override" else k): v for k, v in src.kwargs.items()})
    a = defaults | given
    kernel = _pair(a["kernel_size"])
    stride = _pair(a["stride"]) if a["stride"] else kernel
    return kernel, stride, _pair(a["padding"]), a["ceil_mode"], a["count_include_pad"], a["divisor"]


def divisors(hw: tuple[int, int], out: tuple[int, int], args: tuple) -> np.ndarray:
    """PyTorch's divisor at each output position (ATen's avg_pool2d: the window clipped to the
    padded input counts with count_include_pad, to the input without)."""
    (kh, kw), (sh, sw), (ph, pw), _, include, override = args
    n = np.zeros(out, np.int64)
    for i in range(out[0]):
        for j in range(out[1]):
            h0, w0 = i * sh - ph, j * sw - pw
            h1, w1 = min(h0 + kh, hw[0] + ph), min(w0 + kw, hw[1] + pw)
            size = (h1 - h0) * (w1 - w0)
            h0, w0, h1, w1 = max(h0, 0), max(w0, 0), min(h1, hw[0]), min(w1, hw[1])
            n[i, j] = override or (size if include else (h1 - h0) * (w1 - w0))
    return n


def avg_pool(lw: _Pt2e, q: fx.Node, src: fx.Node, lo_f, hi_f) -> None:
    """The window sum of `x − zp_x`, requantized with PyTorch's divisor at each position."""
    x = lw.value_of(src.args[0])
    y = lw.new_value(q)
    args = avg_pool_args(src)
    (kh, kw), (sh, sw), (ph, pw) = args[:3]
    oh, ow = y.shape[2:]
    n = divisors(x.shape[2:], (oh, ow), args)
    if (n <= 0).any():
        raise SpecError("avg_pool2d with an empty window")
    m = (np.float64(x.scale) / (n * np.float64(y.scale))).astype(np.float32)
    xz = f" - {x.zp}" if x.zp else ""
    rows, cols = affine((sh, "h"), (1, "i"), const=-ph), affine((sw, "w"), (1, "j"), const=-pw)

    def body(lo, hi):  # the explicit zero: linked layers share DRAM, nothing starts at zero
        return [
            "ACC[n, c, h, w] = 0",
            {
                "stmt": f"ACC[n, c, h, w] += X[n, c, {rows}, {cols}]{xz}",
                "where": f"0 <= i < {kh} and 0 <= j < {kw}",
            },
            f"Y[n, c, h, w] = requant_fbgemm(ACC[n, c, h, w], BF[h, w], CM[h, w], {y.zp})",
        ]

    ports = [
        x.port("X", "input"),  # out of bounds: the zero point, so that x − zp_x adds nothing
        Port("ACC", y.shape, "int32", "none"),
        Port("BF", (oh, ow), "float32", "input", 0, None, np.zeros((oh, ow), np.float32)),
        Port("CM", (oh, ow), "float32", "input", 0, None, m),
        y.port("Y", "output"),
    ]
    lw.add(Layer(src.name, path_of(src), "avg_pool2d", ports, body))


def upsample_nearest(lw: _Pt2e, q: fx.Node, src: fx.Node, lo_f, hi_f) -> None:
    """Nearest upsampling by integer factors with shared parameters: a gathering copy."""
    x = lw.value_of(src.args[0])
    y = lw.new_value(q)
    if (x.scale, x.zp, x.dtype) != (y.scale, y.zp, y.dtype):
        raise SpecError("upsampling that changes the quantization parameters")
    if len(x.shape) != 4:
        raise SpecError(f"upsampling of a rank-{len(x.shape)} tensor (only NCHW)")
    (h, w), (oh, ow) = x.shape[2:], y.shape[2:]
    index = torch.arange(h * w, dtype=torch.float32).reshape(1, 1, h, w)
    with torch.no_grad():
        got = src.target(index, *src.args[1:], **src.kwargs).reshape(oh, ow)
    fh, fw = oh // h, ow // w
    want = (torch.arange(oh) // max(fh, 1))[:, None] * w + (torch.arange(ow) // max(fw, 1))[None]
    if fh * h != oh or fw * w != ow or not torch.equal(got, want.to(torch.float32)):
        raise SpecError(f"upsampling from {h}x{w} to {oh}x{ow}: only by integer factors")
    stmt = {
        "stmt": f"Y[n, c, {affine((fh, 'h'), (1, 'a'))}, {affine((fw, 'w'), (1, 'b'))}] = "
        "X[n, c, h, w]",
        "where": f"0 <= a < {fh} and 0 <= b < {fw}",
    }
    ports = [x.port("X", "input"), y.port("Y", "output")]
    lw.add(Layer(src.name, path_of(src), "upsample_nearest", ports, lambda lo, hi: [stmt]))


LAYERS = {
    "aten.avg_pool2d.default": avg_pool,
    "aten.upsample_nearest2d.vec": upsample_nearest,
    "aten.upsample_nearest2d.default": upsample_nearest,
}
