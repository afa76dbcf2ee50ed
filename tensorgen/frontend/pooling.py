"""Average pooling of every size PyTorch accepts, by the rule of the kernel PyTorch runs.

qnnpack runs its own kernel for `avg_pool2d` without `ceil_mode` (tensorgen.frontend.fx); every
other `avg_pool2d` -- `ceil_mode` under qnnpack, all of them under x86 -- runs ATen's generic
kernel: the window sum of `q - zp` over its real elements, one float32 multiplier per divisor
(the padded window, the real one, or `divisor_override`), two float roundings
(`numerics.aten_avgpool`). The accelerator rounds once, so for each divisor a multiplier is
found that gives ATen's result on the window's whole accumulator range
(`numerics.single_rounding_for`), else the layer is refused in one line. ATen's channels-last
kernel (what a conv's output is) rounds its vector channels yet another way that is not pinned
here, so channels-last input is refused."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch

from tensorgen.errors import SpecError
from tensorgen.frontend import numerics
from tensorgen.frontend.layers import NATURAL, Layer, Port, affine, f32, module_path

if TYPE_CHECKING:
    from torch import fx

    from tensorgen.frontend.fx import _Lowering


def windows(n_in: int, n_out: int, k: int, s: int, p: int) -> list[tuple[int, int]]:
    """(padded size, real size) of each output position's window along one dimension, as ATen
    clips it: to the padded input, then to the input."""
    out = []
    for o in range(n_out):
        start = o * s - p
        end = min(start + k, n_in + p)
        out.append((end - start, min(end, n_in) - max(start, 0)))
    return out


def runs(values: list[int]) -> list[tuple[int, int, int]]:
    """Maximal runs of equal values: (first, last + 1, value)."""
    out: list[tuple[int, int, int]] = []
    for i, v in enumerate(values):
        if out and out[-1][2] == v:
            out[-1] = (out[-1][0], i + 1, v)
        else:
            out.append((i, i + 1, v))
    return out


def avg_pool_aten(
    lw: _Lowering, node: fx.Node, kernel, stride, padding, include_pad: bool, divisor
) -> None:
    x, y = lw.value_of(node.args[0]), lw.result_value(node)
    if lw.results[node.args[0]].is_contiguous(memory_format=torch.channels_last):
        raise SpecError(
            f"avg_pool2d of a channels-last tensor under {lw.engine} runs ATen's channels-last "
            "kernel (ceil_mode under qnnpack, always under x86), whose rounding tensorgen does not "
            "reproduce yet"
        )
    (kh, kw), (sh, sw), (ph, pw) = (_pair(v) for v in (kernel, stride or kernel, padding))
    _, _, h, w = x.shape
    oh, ow = y.shape[2:]
    wh, ww = windows(h, oh, kh, sh, ph), windows(w, ow, kw, sw, pw)
    pick = 0 if include_pad else 1
    lo, hi = NATURAL[y.dtype]
    rows, cols = runs([d[pick] for d in wh]), runs([d[pick] for d in ww])
    finals = []
    for r0, r1, dh in rows:
        for c0, c1, dw in cols:
            div = int(divisor) if divisor else dh * dw
            m = numerics.aten_avgpool_multiplier(x.scale, y.scale, div)
            # the accumulator's reachable range: the largest real window of this class
            size = max(d[1] for d in wh[r0:r1]) * max(d[1] for d in ww[c0:c1])
            acc = np.arange((NATURAL[x.dtype][0] - x.zp) * size, (hi - x.zp) * size + 1)
            want = numerics.aten_avgpool(acc, m, y.zp, lo, hi)
            fit = numerics.single_rounding_for(want, acc, m, y.zp, lo, hi)
            if fit is None:
                raise SpecError(
                    f"avg_pool2d with divisor {div}: no single rounding reproduces ATen's two "
                    "float roundings on the whole accumulator range"
                )
            fn, mult = fit
            finals.append(
                {
                    "stmt": f"Y[n, c, h, w] = {fn}(ACC[n, c, h, w], {f32(mult)}, {y.zp})",
                    "where": f"{r0} <= h < {r1} and {c0} <= w < {c1}",
                }
            )
    xz = f" - {x.zp}" if x.zp else ""
    rix, cix = affine((sh, "h"), (1, "i"), const=-ph), affine((sw, "w"), (1, "j"), const=-pw)

    def body(lo_, hi_):  # padding reads the zero point: it adds nothing to sum(q - zp)
        return [
            "ACC[n, c, h, w] = 0",
            {
                "stmt": f"ACC[n, c, h, w] += X[n, c, {rix}, {cix}]{xz}",
                "where": f"0 <= i < {kh} and 0 <= j < {kw}",
            },
            *finals,
        ]

    lw.add(
        Layer(
            node.name,
            module_path(node),
            "avg_pool2d",
            [x.port("X", "input"), Port("ACC", y.shape, "int32", "none"), y.port("Y", "output")],
            body,
        ),
        y,
    )


def _pair(v) -> tuple[int, int]:
    return (v, v) if isinstance(v, int) else tuple(v)
