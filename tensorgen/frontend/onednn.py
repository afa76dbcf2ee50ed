"""oneDNN's requantization of quantized convolutions under PyTorch's x86 engine, and its exact
translation into the constants of tensorgen's ``requant_fbgemm``.

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

tensorgen's accelerator has fbgemm's requantization (``requant_fbgemm(acc, BF, CM, zp)``:
``RNE(RN(RN(f32(acc) + BF) * CM)) + zp``), not oneDNN's five roundings. Both are non-decreasing
step functions of the accumulator, so they agree on a range of accumulators exactly when their
255 steps (the least accumulator giving each output 1..255) fall at the same places.
``fit_requant_fbgemm`` finds oneDNN's steps over the layer's reachable accumulators by
bisection, then per channel a float32 (BF, CM) pair (the output zero point folded into BF)
meeting as many as it can; the steps it misses -- near-ties that oneDNN's own roundings decide,
a few per channel where outputs have many inputs -- are moved back by one correction term each,
``+ [acc >= ON] - [acc >= FB]`` (``Fit``, ``apply_fit``). The bisection is the proof of
equality. More than ``MAX_CORRECTIONS`` in a channel is refused in one line.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike

from tensorgen.errors import SpecError
from tensorgen.frontend.layers import Port
from tensorgen.frontend.probe import x86_behaviour
from tensorgen.frontend.rules import Requant
from tensorgen.mc import arith

F32 = np.float32
#: How far (in ULPs) from the plain product the multiplier CM is searched.
CM_ULPS = 4
#: Most steps per channel where requant_fbgemm may differ from oneDNN (each one corrected;
#: 10 keeps the statement within op.yaml's 512 expression nodes, index names included).
MAX_CORRECTIONS = 10
#: Outputs a step can move when BF is searched: the rules differ by float32 roundings, far less.
BF_REACH = 1e-3


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


def _fbgemm_form(acc, bf, cm, zp: int, lo: int, hi: int) -> np.ndarray:
    """``requant_fbgemm``: clamp(RNE(RN(RN(f32(acc) + BF) * CM)) + zp)."""
    t = (np.asarray(acc, np.int64).astype(F32) + np.asarray(bf, F32)).astype(F32)
    return np.clip(arith.cvt_int32((t * np.asarray(cm, F32)).astype(F32)) + zp, lo, hi)


def acc_range(wq: np.ndarray, x_zp: int, x_lo: int = 0, x_hi: int = 255) -> np.ndarray:
    """(lowest, highest) accumulator each output channel can reach: shape (K, 2), for int8
    weights ``wq[k, ...]`` and activations in [x_lo, x_hi] less ``x_zp`` (padding adds 0)."""
    w = np.asarray(wq, np.int64).reshape(len(wq), -1)
    a, b = w * (x_lo - x_zp), w * (x_hi - x_zp)
    return np.stack([np.minimum(a, b).sum(1), np.maximum(a, b).sum(1)], axis=1)


def steps(fn, ranges: np.ndarray, lo: int, hi: int) -> np.ndarray:
    """For a function non-decreasing in the accumulator, ``fn(acc[K, n]) -> outputs[K, n]``
    (row k is channel k), the least accumulator in ``[ranges[k, 0], ranges[k, 1]]`` giving at
    least ``lo + 1 .. hi``: shape (K, hi - lo); ``ranges[k, 1] + 1`` where none does."""
    k = np.arange(lo + 1, hi + 1)[None, :]
    left = np.broadcast_to(ranges[:, :1], (len(ranges), k.size)).copy()
    right = np.broadcast_to(ranges[:, 1:] + 1, left.shape).copy()
    while (left < right).any():
        mid = (left + right) // 2
        ok = fn(mid) >= k
        right = np.where(ok, mid, right)
        left = np.where(ok, left, mid + 1)
    return left


def _ordered(x: np.ndarray) -> np.ndarray:
    """float32 -> int64 keys in the floats' order (both zeros map to 0)."""
    i = np.asarray(x, F32).view(np.int32).astype(np.int64)
    return np.where(i >= 0, i, -(i & 0x7FFFFFFF))


def _unordered(key: np.ndarray) -> np.ndarray:
    k = np.asarray(key, np.int64)
    bits = np.where(k >= 0, k, (-k) | 0x80000000).astype(np.uint32)
    return bits.view(np.int32).view(F32)


@dataclass(frozen=True)
class Fit:
    """requant_fbgemm constants per channel (the zero point folded into BF), and the steps where
    they differ from oneDNN: at channel k, oneDNN's output steps up at ``on[k, j]`` where
    requant_fbgemm's does at ``fb[k, j]`` (pairs with ``on == fb`` are padding). Then for every
    accumulator in the channel's range, ``requantize_onednn = clamp(requant_fbgemm, lo, 255) +
    sum_j ([acc >= on[k, j]] - [acc >= fb[k, j]])``. ``ok[k]``: requant_fbgemm stays inside
    int32 on the range (so it is non-decreasing there and the steps say everything)."""

    bf: np.ndarray
    cm: np.ndarray
    on: np.ndarray
    fb: np.ndarray
    ok: np.ndarray


def fit_requant_fbgemm(
    bias: np.ndarray, sc: OnednnScales, zp: int, ranges: np.ndarray, lo: int = 0
) -> Fit:
    """Per output channel, float32 (BF, CM) for ``requant_fbgemm(acc, BF, CM, 0)`` whose steps
    agree with ``requantize_onednn(acc, bias, sc, zp, lo)``'s on as many of the 255 - lo as
    found (``ranges``: shape (K, 2), as ``acc_range`` gives), and the steps where they do not."""
    nk = len(ranges)
    b = np.broadcast_to(np.asarray(bias, F32), (nk,)).astype(F32)
    wei = np.broadcast_to(np.asarray(sc.wei, F32), (nk,)).astype(F32)
    col = (slice(None), None)

    def onednn(acc):
        return requantize_onednn(acc, b[col], OnednnScales(sc.src, wei[col], sc.dst_inv), zp, lo)

    want = steps(onednn, ranges, lo, 255)  # (K, 255 - lo)
    s = (sc.src * wei).astype(F32)
    cm0 = (s * sc.dst_inv).astype(F32)
    # the zero point rides in the bias, so that the product lands where oneDNN's sum with the
    # zero point does, on the same float32 grid: its ties then fall where oneDNN's do
    bf0 = (b / s + F32(zp) / cm0).astype(F32)
    best = None
    for u in sorted(range(-CM_ULPS, CM_ULPS + 1), key=lambda u: (abs(u), u)):
        cm = (cm0.view(np.int32) + u).view(F32)
        bf = _fit_bias(want, ranges, bf0, cm, lo)
        got, ok = _steps_of(ranges, bf, cm, lo)
        bad = np.where(ok, (got != want).sum(axis=1), 1 << 20)
        if best is None:
            best = [bf, cm, got, ok, bad]
        better = bad < best[4]
        for i, v in enumerate((bf, cm, got, ok, bad)):
            best[i] = np.where(better[(slice(None),) + (None,) * (v.ndim - 1)], v, best[i])
        if not best[4].any():
            break
    bf, cm, got, ok, bad = best
    j = int(bad[ok].max(initial=0))
    on, fb = np.zeros((nk, j), np.int64), np.zeros((nk, j), np.int64)
    for k in np.flatnonzero(ok & (bad > 0)):
        d = np.flatnonzero(got[k] != want[k])
        on[k, : d.size], fb[k, : d.size] = want[k, d], got[k, d]
    return Fit(bf.astype(F32), cm.astype(F32), on, fb, ok)


def apply_fit(acc: ArrayLike, fit: Fit, k: int, lo: int = 0) -> np.ndarray:
    """What the accelerator computes for channel `k` with `fit` (see Fit)."""
    a = np.asarray(acc, np.int64)
    y = _fbgemm_form(a, fit.bf[k], fit.cm[k], 0, lo, 255)
    for on, fb in zip(fit.on[k], fit.fb[k], strict=True):
        y = y + np.clip(a - on + 1, 0, 1) - np.clip(a - fb + 1, 0, 1)
    return y


def _fit_bias(want, ranges, bf0, cm, lo: int) -> np.ndarray:
    """Per channel, the float32 BF nearest bf0 (within BF_REACH outputs) meeting every step of
    `want` with multiplier `cm`, or bf0 where the steps leave no room; `requant_fbgemm` is
    non-decreasing in BF, so each step bounds BF on one side and bisection finds the bound."""
    k = np.arange(lo + 1, 256)[None, :]
    if not k.size:  # ReLU at zero point 255: a constant output, no steps to meet
        return bf0
    reach = (BF_REACH / cm.astype(np.float64) + 4 * np.abs(np.spacing(bf0))).astype(F32)
    key_lo = _ordered((bf0 - reach).astype(F32))[:, None]
    key_hi = _ordered((bf0 + reach).astype(F32))[:, None]
    col = (slice(None), None)
    # step k at acc = want: output >= k there (when in range), < k one below (when in range)
    at, below = want, want - 1
    has_at, has_below = at <= ranges[:, 1:], below >= ranges[:, :1]

    def bisect(acc):
        left = np.broadcast_to(key_lo, acc.shape).copy()
        right = np.broadcast_to(key_hi + 1, acc.shape).copy()
        while (left < right).any():
            mid = (left + right) // 2
            y = _fbgemm_form(np.clip(acc, *_int32()), _unordered(mid), cm[col], 0, lo, 255)
            ok = y >= k
            right = np.where(ok, mid, right)
            left = np.where(ok, left, mid + 1)
        return left  # least key with output >= k at acc (key_hi + 1: none)

    need_min = np.where(has_at, bisect(at), key_lo)  # BF >= this
    need_max = np.where(has_below, bisect(below) - 1, key_hi)  # BF <= this
    lo_key, hi_key = need_min.max(axis=1), need_max.min(axis=1)
    k0 = _ordered(bf0)
    key = np.clip(k0, lo_key, hi_key)
    return np.where(lo_key <= hi_key, _unordered(key), bf0).astype(F32)


def _int32() -> tuple[int, int]:
    return arith.INT32_MIN, arith.INT32_MAX


def _steps_of(ranges, bf, cm, lo: int) -> tuple[np.ndarray, np.ndarray]:
    """requant_fbgemm(., bf, cm, 0)'s steps on every channel's range, and whether it stays
    inside int32 there (where it is non-decreasing, so that its steps describe it)."""
    col = (slice(None), None)

    def fbgemm(acc):
        return _fbgemm_form(acc, bf[col], cm[col], 0, lo, 255)

    ends = (ranges.astype(np.int64).astype(F32) + bf[col]).astype(F32)
    finite = np.all(np.abs((ends * cm[col]).astype(np.float64)) < 2.0**31, axis=1)
    return steps(fbgemm, ranges, lo, 255), finite


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


def onednn_requant(
    s_in: float, x_zp: int, wq: np.ndarray, s_w, s_out: float, zp: int, bias: np.ndarray, lo: int
) -> Requant:
    """The Requant of a conv PyTorch runs on oneDNN: requant_fbgemm constants proven equal to
    oneDNN's rule on every accumulator the layer can reach (`fit_requant_fbgemm`), or a one-line
    refusal naming the channels where there are none."""
    if not np.ndim(s_w):
        raise SpecError(
            "per-tensor weights under x86 are not supported yet (the default x86 "
            "qconfig quantizes weights per channel)"
        )
    sc = onednn_scales(s_in, s_w, s_out)
    fit = fit_requant_fbgemm(bias, sc, zp, acc_range(wq, x_zp), lo)
    if not fit.ok.all() or fit.on.shape[1] > MAX_CORRECTIONS:
        raise SpecError(
            f"conv under x86 on oneDNN (AVX512-VNNI): oneDNN requantizes in five float32 "
            f"roundings with the zero point added before rounding; requant_fbgemm would need "
            f"{fit.on.shape[1]} corrected steps in a channel (at most {MAX_CORRECTIONS})"
            + ("" if fit.ok.all() else " or leaves int32")
        )
    bf, cm = fit.bf, fit.cm
    return Requant(
        [
            Port("BF", bf.shape, "float32", "input", 0, None, bf),
            Port("CM", cm.shape, "float32", "input", 0, None, cm),
            *(
                Port(name, v.shape, "int32", "input", 0, None, v.astype(np.int32))
                for name, v in (("ON", fit.on), ("FB", fit.fb))
                if v.shape[1]
            ),
        ],
        zp_in_bias=True,
        corrections=fit.on.shape[1],
        lo=lo,
    )
