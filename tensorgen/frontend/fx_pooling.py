"""The pooling layers of the FX lowering (fx.py): max pooling, adaptive average pooling, and
qnnpack's own average pooling (every other average pooling runs ATen's kernel: pooling.py), each
a function of the lowering and the node, with the helpers that read the pooling arguments of a
module or a function call.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from torch import fx, nn

from tensorgen.errors import SpecError
from tensorgen.frontend import numerics, pooling
from tensorgen.frontend.layers import NATURAL, Layer, Port, affine, f32, module_path
from tensorgen.mc import arith

if TYPE_CHECKING:
    from tensorgen.frontend.fx import _Lowering


def max_pool(lw: _Lowering, node: fx.Node, kernel, stride, padding, dilation) -> None:
    """max_pool2d: the window's maximum, its padding the dtype's minimum."""
    x = lw.value_of(node.args[0])
    y = lw.result_value(node)
    (kh, kw), (sh, sw), (ph, pw), (dh, dw) = (
        _pair(v) for v in (kernel, stride or kernel, padding, dilation)
    )
    if lw.engine == "qnnpack" and max(dh, dw) > 1 and max(ph, pw) > 0:
        # see tests/frontend/test_models.py::test_qnnpack_dilated_max_pool_bug_is_still_in_torch
        raise SpecError(
            "torch's qnnpack quantized max pooling is "
            f"wrong at the borders when dilation > 1 and padding > 0 (dilation {dh}x{dw}, "
            f"padding {ph}x{pw}), so PyTorch's reference is wrong; use --engine x86, or padding 0"
        )
    lo, _ = NATURAL[x.dtype]
    rows, cols = (
        affine((sh, "h"), (dh, "i"), const=-ph),
        affine((sw, "w"), (dw, "j"), const=-pw),
    )

    def body(lo_, hi_):
        return [
            f"Y[n, c, h, w] = {lo}",
            {
                "stmt": f"Y[n, c, h, w] max= X[n, c, {rows}, {cols}]",
                "where": f"0 <= i < {kh} and 0 <= j < {kw}",
            },
        ]

    # padding acts as -inf: the dtype's minimum never beats a real element of the window
    lw.add(
        Layer(
            node.name,
            module_path(node),
            "max_pool2d",
            [x.port("X", "input", lo), y.port("Y", "output")],
            body,
        ),
        y,
    )


def adaptive_avg_pool(lw: _Lowering, node: fx.Node, output_size) -> None:
    """adaptive_avg_pool2d to sizes that divide the input's: the window sum requantized by the
    engine's kernel's rule (qnnpack's multiplier, or fbgemm's for NCHW and channels-last)."""
    x = lw.value_of(node.args[0])
    y = lw.result_value(node)
    n, c, h, w = x.shape
    oh, ow = y.shape[2:]
    if h % oh or w % ow:
        raise SpecError(f"adaptive_avg_pool2d from {h}x{w} to {oh}x{ow}: only sizes that divide")
    kh, kw = h // oh, w // ow
    xz = f" - {x.zp}" if x.zp else ""
    if lw.engine != "qnnpack" and (oh, ow) != (1, 1):
        raise SpecError(f"adaptive_avg_pool2d to {oh}x{ow} under {lw.engine} (only to 1x1)")
    if lw.engine == "qnnpack":
        mult = numerics.avgpool_multiplier(x.scale, y.scale, kh * kw)
        result = f"requant(ACC[n, c, h, w], {f32(mult)}, {y.zp})"
    elif lw.results[node.args[0]].is_contiguous():  # fbgemm's NCHW kernel: zero points never enter
        mult = numerics.fbgemm_avgpool_multiplier(kh, kw, channels_last=False)
        xz, result = "", f"requant(ACC[n, c, h, w], {f32(mult)}, 0)"
    else:  # channels-last: the zero point inside one fused multiply-add, on 8-channel vectors
        mult = numerics.fbgemm_avgpool_multiplier(kh, kw, True, x.scale, y.scale)
        result = f"requant_fma(ACC[n, c, h, w], {f32(mult)}, {y.zp})"
    finals = [f"Y[n, c, h, w] = {result}"]
    if lw.engine != "qnnpack" and not lw.results[node.args[0]].is_contiguous():
        finals = _fbgemm_scalar_channels(x, y, kh * kw, mult, result)

    def body(lo, hi):  # the explicit zero: linked layers share DRAM, nothing starts at zero
        return [
            "ACC[n, c, h, w] = 0",
            {
                "stmt": f"ACC[n, c, h, w] += X[n, c, {affine((kh, 'h'), (1, 'i'))}, "
                f"{affine((kw, 'w'), (1, 'j'))}]{xz}",
                "where": f"0 <= i < {kh} and 0 <= j < {kw}",
            },
            *finals,
        ]

    lw.add(
        Layer(
            node.name,
            module_path(node),
            "adaptive_avg_pool2d",
            [
                x.port("X", "input"),
                Port("ACC", y.shape, "int32", "none"),
                y.port("Y", "output"),
            ],
            body,
        ),
        y,
    )


def _fbgemm_scalar_channels(x, y, n: int, mult, vector: str) -> list:
    """fbgemm's channels-last adaptive pooling: the first 8·⌊C/8⌋ channels by the vector rule
    (`vector`, one fused multiply-add), the last C mod 8 by its scalar loop's
    `RNE(RN(RN(acc·M) + zp))` (arith.avgpool_fbgemm, pinned in test_numerics_x86.py), for which
    a single-rounding `requant` / `requant_fma` is searched and checked on the window's whole
    accumulator range (numerics.single_rounding_for); refused when none reproduces it."""
    c = x.shape[1]
    split = c // numerics.FBGEMM_AVGPOOL_BLOCK * numerics.FBGEMM_AVGPOOL_BLOCK
    if split == c:
        return [f"Y[n, c, h, w] = {vector}"]
    lo, hi = NATURAL[y.dtype]
    acc = np.arange((NATURAL[x.dtype][0] - x.zp) * n, (NATURAL[x.dtype][1] - x.zp) * n + 1)
    want = arith.avgpool_fbgemm(acc, mult, y.zp, lo, hi, scalar=True)
    fit = numerics.single_rounding_for(want, acc, mult, y.zp, lo, hi)
    if fit is None:
        raise SpecError(
            f"adaptive_avg_pool2d of {c} channels: no single rounding reproduces the two float "
            f"roundings of fbgemm's scalar loop in its last {c - split} channels"
        )
    fn, m = fit
    stmts = [{"stmt": f"Y[n, c, h, w] = {vector}", "where": f"c < {split}"}] if split else []
    stmts.append(
        {
            "stmt": f"Y[n, c, h, w] = {fn}(ACC[n, c, h, w], {f32(m)}, {y.zp})",
            "where": f"c >= {split}",
        }
    )
    return stmts


def avg_pool(
    lw: _Lowering,
    node: fx.Node,
    kernel,
    stride,
    padding,
    ceil_mode: bool,
    include_pad=True,
    div=None,
) -> None:
    """qnnpack's average pooling: padding holds the zero point and counts in the divisor
    (qnnpack ignores count_include_pad=False and divisor_override), one float multiplier.
    Anything else runs ATen's kernel: tensorgen.frontend.pooling."""
    if lw.engine != "qnnpack" or ceil_mode:
        return pooling.avg_pool_aten(lw, node, kernel, stride, padding, include_pad, div)
    x = lw.value_of(node.args[0])
    y = lw.result_value(node)
    (kh, kw), (sh, sw), (ph, pw) = (_pair(v) for v in (kernel, stride or kernel, padding))
    mult = numerics.avgpool_multiplier(x.scale, y.scale, kh * kw)
    xz = f" - {x.zp}" if x.zp else ""
    rows, cols = affine((sh, "h"), (1, "i"), const=-ph), affine((sw, "w"), (1, "j"), const=-pw)

    def body(lo, hi):
        return [
            "ACC[n, c, h, w] = 0",
            {
                "stmt": f"ACC[n, c, h, w] += X[n, c, {rows}, {cols}]{xz}",
                "where": f"0 <= i < {kh} and 0 <= j < {kw}",
            },
            f"Y[n, c, h, w] = requant(ACC[n, c, h, w], {f32(mult)}, {y.zp})",
        ]

    lw.add(
        Layer(
            node.name,
            module_path(node),
            "avg_pool2d",
            [
                x.port("X", "input"),
                Port("ACC", y.shape, "int32", "none"),
                y.port("Y", "output"),
            ],
            body,
        ),
        y,
    )


def _pair(v) -> tuple[int, int]:
    return (v, v) if isinstance(v, int) else tuple(v)


def max_pool_module(lw: _Lowering, node: fx.Node, mod: nn.MaxPool2d) -> None:
    if mod.return_indices:
        raise SpecError("max_pool2d with return_indices")
    max_pool(lw, node, mod.kernel_size, mod.stride, mod.padding, mod.dilation)


def max_pool_function(lw: _Lowering, node: fx.Node) -> None:
    args = list(node.args[1:]) + [None] * 5
    kw = node.kwargs
    kernel = kw.get("kernel_size", args[0])
    stride = kw.get("stride", args[1]) or kernel
    max_pool(
        lw, node, kernel, stride, kw.get("padding", args[2] or 0), kw.get("dilation", args[3] or 1)
    )


def avg_pool_args(node: fx.Node) -> tuple:
    """avg_pool2d's arguments, positional or by name, with their defaults."""
    names = (
        "kernel_size",
        "stride",
        "padding",
        "ceil_mode",
        "count_include_pad",
        "divisor_override",
    )
    args = dict(zip(names, node.args[1:], strict=False))
    args.update({k: v for k, v in node.kwargs.items() if k in names})
    return (
        args["kernel_size"],
        args.get("stride"),
        args.get("padding", 0),
        args.get("ceil_mode", False),
        args.get("count_include_pad", True),
        args.get("divisor_override"),
    )
