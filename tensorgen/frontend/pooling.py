"""Average pooling of every size PyTorch accepts, by the rule of the kernel PyTorch runs.

qnnpack runs its own kernel for `avg_pool2d` without `ceil_mode`
(tensorgen.frontend.fx_pooling); every other `avg_pool2d` -- `ceil_mode` under qnnpack, all of
them under x86 -- runs ATen's generic kernel: the window sum of `q - zp` over its real
elements, one float32 multiplier per divisor (the padded window, the real one, or
`divisor_override`), two float roundings
(`numerics.aten_avgpool`). The accelerator rounds once, so for each divisor a multiplier is
found that gives ATen's result on the window's whole accumulator range
(`numerics.single_rounding_for`), else the layer is refused in one line. ATen's channels-last
kernel (what a conv's output is) rounds its vector channels -- the first `block * (C // block)`,
block 16 with AVX512, measured by `nhwc_block` -- once, `RNE(RN(acc * m)) + zp` (a `requant`
with m itself), and the rest like the contiguous kernel."""

from __future__ import annotations

from functools import cache
from typing import TYPE_CHECKING

import numpy as np
import torch

from tensorgen.errors import SpecError
from tensorgen.frontend import numerics
from tensorgen.frontend.layers import NATURAL, Layer, Port, affine, f32, module_path
from tensorgen.mc import arith

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
    vector = _vector_channels(lw, node, x)
    (kh, kw), (sh, sw), (ph, pw) = (_pair(v) for v in (kernel, stride or kernel, padding))
    _, _, h, w = x.shape
    oh, ow = y.shape[2:]
    wh, ww = windows(h, oh, kh, sh, ph), windows(w, ow, kw, sw, pw)
    finals = _final_statements(x, y, wh, ww, 0 if include_pad else 1, divisor, vector)
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


def _vector_channels(lw: _Lowering, node: fx.Node, x) -> int:
    """Channels [0, result) take the NHWC kernel's vector rounding (0: the input is contiguous)."""
    if not lw.results[node.args[0]].is_contiguous(memory_format=torch.channels_last):
        return 0
    block = nhwc_block(lw.engine)
    if block is None:
        raise SpecError(
            f"avg_pool2d of a channels-last tensor under {lw.engine}: this PyTorch's "
            "channels-last kernel matched no known vector width"
        )
    return block * (x.shape[1] // block)


def _final_statements(x, y, wh, ww, pick: int, divisor, vector: int) -> list[dict]:
    """One requantizing statement per class of windows sharing a divisor (two where the vector
    channels round differently), each checked over the class's whole accumulator range."""
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
            where = f"{r0} <= h < {r1} and {c0} <= w < {c1}"
            if vector:
                finals.append(
                    {
                        "stmt": f"Y[n, c, h, w] = requant(ACC[n, c, h, w], {f32(m_once(x, y, div))}"
                        f", {y.zp})",
                        "where": f"{where} and c < {vector}",
                    }
                )
                if vector == x.shape[1]:
                    continue
                where += f" and c >= {vector}"
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
                    "where": where,
                }
            )
    return finals


def m_once(x, y, divisor: int) -> np.float32:
    """The NHWC kernel's vector multiplier, ``m = RN(RN(f32(s_in) / f32(s_out)) / divisor)``
    used as is (QuantizeAvx2/512 multiply by it)."""
    return (np.float32(x.scale) / np.float32(y.scale)) / np.float32(divisor)


@cache
def nhwc_block(engine: str) -> int | None:
    """How many channels ATen's channels-last average pool rounds by its vector rule on this
    CPU and PyTorch (8 with AVX2, 16 with AVX512), measured once: a pool over every code in 24
    channels, checked against both widths; None if neither matches."""
    from tensorgen.frontend.quantize import quantized_engine

    rng = np.random.default_rng(0)
    q = rng.integers(0, 256, (4, 24, 6, 6))
    q[:2] = q[:2] // 64 * 2 + 3  # exact halves, where the two rules part
    with quantized_engine(engine), torch.no_grad():
        xt = torch._make_per_tensor_quantized_tensor(torch.from_numpy(q.astype(np.uint8)), 0.1, 3)
        got = (
            torch.nn.functional.avg_pool2d(
                xt.contiguous(memory_format=torch.channels_last), 2, 2, ceil_mode=True
            )
            .int_repr()
            .numpy()
        )
    acc = q.reshape(4, 24, 3, 2, 3, 2).sum((3, 5)) - 3 * 4
    m = (np.float32(0.1) / np.float32(0.1)) / np.float32(4)
    once = arith.requantize(acc, m, 3, 0, 255)
    twice = numerics.aten_avgpool(acc, numerics.aten_avgpool_multiplier(0.1, 0.1, 4), 3, 0, 255)
    for block in (16, 8, 32):
        vec = (np.arange(24) < block * (24 // block))[None, :, None, None]
        if (np.where(vec, once, twice) == got).all():
            return block
    return None


def _pair(v) -> tuple[int, int]:
    return (v, v) if isinstance(v, int) else tuple(v)
