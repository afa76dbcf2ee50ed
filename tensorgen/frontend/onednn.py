"""oneDNN's requantization of quantized convolutions under PyTorch's x86 engine, and the
constants of tensorgen's ``requant_onednn`` that compute it.

On Linux, on a CPU with AVX512-VNNI, PyTorch's x86 engine prepacks a conv for oneDNN instead of
fbgemm when its weights are symmetric and it has at most 100 groups (``should_use_onednn_quant``;
``tensorgen.frontend.probe`` measures where the running PyTorch draws the line). Linear layers
stay with fbgemm. oneDNN's kernels (brgconv_1x1, brg_conv_fwd, brdgmm_dw, jit_int8: all of them,
found by experiment, torch 2.13 / oneDNN 3.12) compute from the exact int32 accumulator, each
step a float32 operation rounded once::

    t = RN(RN(RN(f32(acc) * s_src) * s_w[c]) + b[c])     scales one at a time, then the bias
    t = max(t, 0)                                          ConvReLU2d only
    y = clamp(RNE(RN(RN(t * d) + f32(zp_out))), 0, 255)   the zero point added before rounding

with ``s_src = RN(1 / f32(1.0 / s_in))`` (PyTorch hands oneDNN the reciprocal of the input scale,
computed in double; ideep inverts it back in float), ``s_w[c] = f32(s_w[c])`` and ``d = RN(1 /
RN(1 / f32(1.0 / s_out)))`` (the output scale inverted three times). fbgemm's rule
(``arith.requantize_fbgemm``) rounds twice and adds the zero point after rounding; the two differ
only on near-ties (about 1 output in 10^5; ``tests/frontend/test_numerics_onednn.py``).

tensorgen's accelerator computes this rule itself: ``VREQUANTO`` (tensorgen.mc.isa), which
op.yaml writes ``requant_onednn(acc, SW[c], BO[c], s_src, d, zp)``, takes the float32 weight
scale and bias per output channel and the two scalar factors, and performs the same five
roundings (the float saturated to the output's range before it converts, as oneDNN does).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike

from tensorgen.errors import SpecError
from tensorgen.frontend.layers import Port
from tensorgen.frontend.probe import x86_behaviour
from tensorgen.frontend.rules import Requant

F32 = np.float32


@dataclass(frozen=True)
class OnednnScales:
    """The float32 factors of oneDNN's requantization (see the module docstring)."""

    src: np.float32
    wei: np.ndarray
    dst_inv: np.float32


def onednn_scales(s_in: float, s_w: ArrayLike, s_out: float) -> OnednnScales:
    """oneDNN's factors from PyTorch's qparams (python floats: doubles)."""
    for name, v in (("s_in", s_in), ("s_w", s_w), ("s_out", s_out)):
        a = np.asarray(v, np.float64)
        if not (np.all(np.isfinite(a)) and np.all(a > 0)):
            raise ValueError(f"onednn_scales: {name} must be finite and positive, got {v!r}")
    src = F32(1) / F32(1.0 / float(s_in))
    dst = F32(1) / F32(1.0 / float(s_out))
    return OnednnScales(F32(src), np.asarray(s_w, np.float64).astype(F32), F32(F32(1) / dst))


def requantize_onednn(
    acc: ArrayLike, bias: ArrayLike, sc: OnednnScales, zp: int, lo: int = 0, hi: int = 255
) -> np.ndarray:
    """oneDNN's conv output from the exact accumulator; `bias` and `sc.wei` broadcast to `acc`
    (one value per output channel). ReLU is ``lo = zp``: clamping at the zero point after the
    rule equals oneDNN's max(t, 0) before the output scale. Returns int64."""
    t = np.asarray(acc, np.int64).astype(F32) * sc.src
    t = (t.astype(F32) * np.asarray(sc.wei, F32)).astype(F32)
    t = (t + np.asarray(bias, F32)).astype(F32)
    t = (t * sc.dst_inv).astype(F32)
    t = (t + F32(zp)).astype(F32)
    return np.clip(np.rint(t.astype(np.float64)), lo, hi).astype(np.int64)


def runs_on_onednn(engine: str, groups: int, w_zp) -> bool:
    """Whether PyTorch runs this conv on oneDNN: the x86 engine, symmetric weights and no more
    groups than the probe saw oneDNN take (tensorgen.frontend.probe)."""
    if engine != "x86" or np.any(np.asarray(w_zp) != 0):
        return False
    limit = x86_behaviour(engine).onednn_groups
    if limit < 0:
        raise SpecError(
            f"quantized conv under {engine}: this PyTorch's convs matched neither fbgemm's nor "
            f"oneDNN's rounding ({x86_behaviour(engine).describe()})"
        )
    return groups <= limit


def onednn_requant(s_in: float, s_w, s_out: float, bias: np.ndarray) -> Requant:
    """The Requant of a conv PyTorch runs on oneDNN: its float32 weight scales and bias per
    output channel (ports SW, BO) and the factors s_src and d of ``requantize_onednn``."""
    if not np.ndim(s_w):
        raise SpecError(
            "per-tensor weights under x86 are not supported yet (the default x86 "
            "qconfig quantizes weights per channel)"
        )
    sc = onednn_scales(s_in, s_w, s_out)
    b = np.asarray(bias, F32)
    return Requant(
        [
            Port("SW", sc.wei.shape, "float32", "input", 0, None, sc.wei),
            Port("BO", b.shape, "float32", "input", 0, None, b),
        ],
        onednn=(float(sc.src), float(sc.dst_inv)),
    )
