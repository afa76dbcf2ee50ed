"""Integer and float32 arithmetic of the accelerator's vector unit, bit-exact with PyTorch.

These functions *are* the semantics of the vector unit's requantize, quantize,
dequantize and fixed-point add instructions: the simulator calls them, and
tests/frontend/test_numerics.py (and test_numerics_x86.py for the fbgemm / x86 add and
average pool) pins every one against PyTorch's quantized CPU kernels (torch 2.13) on 1e5+
random elements. The rules come from
/work/shared/NUMERICS.md and from the qnnpack/fbgemm sources; see each function.

Notation (as in NUMERICS.md): RN(.) rounds to the nearest float32, ties to even
(every float32 operation rounds once); RNE(.) rounds a float to an integer,
ties to even (``np.rint``); f32(.) converts to float32.

Everything is vectorised numpy: no Python loop runs per element. Integer
results come back as int64 arrays; the int32 wrap-around of the hardware's
32-bit registers is applied explicitly where the kernels rely on it. Only
numpy is imported, so the simulator can use this module without torch.
"""

from __future__ import annotations

import functools

import numpy as np
from numpy.typing import ArrayLike

INT32_MIN = -(2**31)
INT32_MAX = 2**31 - 1
_INT32_HOLDS = (np.dtype(np.int8), np.dtype(np.uint8), np.dtype(np.int16), np.dtype(np.int32))


def wrap_int32(x: ArrayLike) -> np.ndarray:
    """Two's-complement wrap of integers to int32, returned as int64.

    Why: qnnpack accumulates and adds in int32 registers; values that overflow
    wrap rather than saturate, and the simulator must do the same.
    """
    x = np.asarray(x, dtype=np.int64)
    return ((x + 2**31) & 0xFFFFFFFF) - 2**31


def _f32(x: ArrayLike) -> np.ndarray:
    """``x`` as a float32 array (rounding a float64 once, as a C float parameter does)."""
    return np.asarray(x, dtype=np.float32)


def _int_to_f32(x: ArrayLike) -> np.ndarray:
    """f32(x) for int32 values: one round-to-nearest-even, like ``cvtdq2ps``."""
    return np.asarray(x, dtype=np.int64).astype(np.float32)


def fma_f32(a: ArrayLike, b: ArrayLike, c: ArrayLike) -> np.ndarray:
    """Float32 fused multiply-add ``RN(a*b + c)`` with a single rounding, vectorised.

    Why it is exact: for float32 operands the float64 product ``a*b`` is exact
    (24 + 24 <= 53 significant bits). The sum ``p + c`` is computed in float64
    with its exact rounding error (Knuth's two-sum), and the float64 result is
    then rounded *to odd* (when inexact, its last bit is forced to 1 by moving
    one ulp towards the true value). A float64 rounded to odd has 53 >= 24 + 2
    bits, so the final float32 round-to-nearest-even sees every tie and every
    sticky bit exactly as if it rounded the infinitely precise value
    (Boldo & Melquiond, "Emulation of FMA and correctly rounded sums: proved
    algorithms using rounding to odd", IEEE TC 2008). A plain float64
    ``a*b + c`` followed by a float32 rounding double-rounds and is wrong on
    about one in a million of fbgemm's bias additions.

    Operands are converted to float32 first and broadcast; returns float32.
    Infinite or NaN intermediates are passed through without the odd fix-up.
    """
    a64, b64, c64 = np.broadcast_arrays(
        _f32(a).astype(np.float64), _f32(b).astype(np.float64), _f32(c).astype(np.float64)
    )
    p = a64 * b64
    with np.errstate(invalid="ignore", over="ignore"):
        s = p + c64
        bv = s - p
        err = (p - (s - bv)) + (c64 - bv)
    s = np.array(s, dtype=np.float64, copy=True, ndmin=1)
    err = np.broadcast_to(err, s.shape)
    bits = s.view(np.int64)
    fix = (err != 0) & np.isfinite(s) & ((bits & 1) == 0)
    away = np.signbit(err) == np.signbit(s)  # true value lies further from zero than s
    bits[fix] += np.where(away[fix], 1, -1)
    return s.astype(np.float32).reshape(p.shape)


def requantize(acc: ArrayLike, multiplier: ArrayLike, zp: int, lo: int, hi: int) -> np.ndarray:
    """qnnpack requantization: ``clamp(RNE(RN(f32(acc) * M)) + zp, lo, hi)``.

    ``acc`` is the int32 accumulator *including* the quantized bias (int32
    values, possibly held in int64; anything outside int32 is wrapped, as the
    int32 register that holds ``acc + b_q`` in qnnpack would). ``multiplier``
    is the float32 M of ``requant_multiplier``: a scalar, or a per-channel
    array broadcastable to ``acc``; a float64 is rounded to float32 first,
    exactly as the C kernel's float parameter is.

    M may be >= 1 (a layer whose calibrated output was all zero gets an output
    scale near float32 eps): PyTorch runs such layers, and a product whose
    rounding leaves int32 converts, as x86's ``cvtps2dq`` does, to INT32_MIN
    ("integer indefinite"), so it comes out as ``lo`` whatever its sign
    (``cvt_int32``; pinned by tests/frontend/test_numerics.py).

    With a fused ReLU pass ``lo = zp``; the output range is [lo, hi].
    Returns int64.
    """
    xf = _int_to_f32(wrap_int32(acc))
    prod = xf * _f32(multiplier)  # float32 x float32: one rounding
    return np.clip(cvt_int32(prod) + int(zp), lo, hi)


def float32_exact(*values: int) -> bool:
    return all(abs(v) < 1 << 24 for v in values)  # exact in float32, and so are their sums


def requantize_int32(
    x: np.ndarray,
    scale: np.float32,
    zp: int,
    lo: int,
    hi: int,
    dtype=np.int32,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """`requantize` of int32 values with zero point and bounds below 2**24 in magnitude,
    in float32 and int32 without int64 or float64 round trips; the same integers (tested
    against it): RN(f32(x) * scale) is the same float32, its rint is exact in float32, whose
    range test against the exact bounds -2**31 and 2**31 is cvt_int32's; the clamp of r + zp
    to [lo, hi] is that of r to [lo - zp, hi - zp] (exact integers), then + zp; and a product
    outside int32 (INT32_MIN + zp, below any such lo) comes out as min(lo, hi) either way.
    Returns `dtype` (the destination's, saving a conversion) when it holds [lo, hi], else
    int32.

    With `out` (an array of x's shape whose dtype holds [lo, hi]), the integers are written
    into it (the one conversion the result needs anyway) and `out` is returned; x may be `out`
    itself or overlap it: x is read in full before `out` is written.

    Computed in place on one float32 copy (not in ufuncs that cast as they go: numpy's
    buffered casts cost twice a cast and a pass, measured); the range test is two reductions
    (none for a scale below 1 in magnitude, whose products all lie inside int32), and the
    mask only when some product lies outside int32 (or is NaN, which fails both
    comparisons)."""
    low, high = np.float32(lo - zp), np.float32(hi - zp)
    r = x.astype(np.float32)
    with np.errstate(invalid="ignore"):
        np.multiply(r, scale, out=r)
        np.rint(r, out=r)
        # |scale| < 1 (NaN fails it): |RN(f32(x) * scale)| <= 2**31 * (1 - 2**-24), inside
        # int32, so the range test's two reductions are needed only otherwise
        inside = (
            not r.size
            or bool(abs(scale) < 1)
            or (r.min() >= np.float32(-(2**31)) and r.max() < np.float32(2**31))
        )
        if not inside:
            ok = (r >= np.float32(-(2**31))) & (r < np.float32(2**31))  # False for NaN too
            np.copyto(r, low, where=~ok)
    np.clip(r, low, high, out=r)  # min(max(r, low), high), as the rule's clamp
    # + zp is exact in float32: the sum is an integer in [lo, hi], below 2**24 in magnitude,
    # so its conversion to an integer dtype that holds [lo, hi] is exact too
    r += np.float32(zp)
    if out is None:  # in `dtype` directly when it holds [lo, hi]
        return r.astype(dtype if holds(dtype, lo, hi) else np.int32)
    np.copyto(out, r, casting="unsafe")
    return out


def holds(dtype, lo: int, hi: int) -> bool:
    """Whether the integer `dtype` holds every integer of [lo, hi] (and lo and hi)."""
    least, most = _int_range(dtype)
    return least <= min(lo, hi) and max(lo, hi) <= most


@functools.lru_cache(maxsize=64)
def _int_range(dtype) -> tuple[int, int]:
    """np.iinfo(dtype)'s (min, max), once per dtype: iinfo is built anew at every call."""
    info = np.iinfo(dtype)
    return int(info.min), int(info.max)


def cvt_int32(t: ArrayLike) -> np.ndarray:
    """x86's float32 -> int32 conversion (``cvtps2dq``): RNE, and INT32_MIN for anything whose
    rounding lies outside int32, for infinities and NaN. Returns int64."""
    t = np.asarray(t, dtype=np.float32).astype(np.float64)
    with np.errstate(invalid="ignore"):
        r = np.rint(t)
        bad = ~((r >= INT32_MIN) & (r <= INT32_MAX))  # also catches NaN
        r = np.where(bad, INT32_MIN, r)
    return r.astype(np.int64)


def dot_sat16(x_q: ArrayLike, w_q: ArrayLike) -> np.ndarray:
    """fbgemm's raw uint8 x int8 dot product without AVX512-VNNI: ``sum_p sat16(x[2p] * w[2p] +
    x[2p+1] * w[2p+1])`` over consecutive pairs of the reduction axis (the last axis of both;
    an odd length is padded with a zero product), as ``vpmaddubsw`` adds each pair with int16
    saturation before ``vpmaddwd`` widens to int32. ``x_q`` (..., K) holds raw uint8 values
    (not minus the zero point: fbgemm subtracts the zero-point terms afterwards, exactly),
    ``w_q`` (M, K) raw int8; returns (..., M) int64.

    This is the pinned model of the saturating behaviour, used by the tests on CPUs whose
    PyTorch does not saturate (tensorgen.frontend.probe). It equals the exact product whenever
    every activation is <= 127 (a pair then stays within 2 * 127 * 128 = 32512).
    """
    x = np.asarray(x_q, dtype=np.int64)
    w = np.asarray(w_q, dtype=np.int64)
    if x.shape[-1] % 2:
        x = np.concatenate([x, np.zeros((*x.shape[:-1], 1), np.int64)], axis=-1)
        w = np.concatenate([w, np.zeros((*w.shape[:-1], 1), np.int64)], axis=-1)
    prods = x[..., None, :] * w  # (..., M, K)
    pairs = prods[..., 0::2] + prods[..., 1::2]
    return np.clip(pairs, -(2**15), 2**15 - 1).sum(axis=-1)


def requantize_fbgemm(
    acc: ArrayLike,
    bias: ArrayLike | None,
    atws: ArrayLike,
    inv_atws: ArrayLike,
    cm: ArrayLike,
    zp: int,
    lo: int,
    hi: int,
    per_channel: bool,
) -> np.ndarray:
    """fbgemm / x86 requantization with a float bias (``ReQuantizeOutput``, AVX2).

    Arguments (scalars or arrays broadcastable to ``acc``; floats are float32):

    - ``acc``: the exact integer accumulator ``sum (x_q - x_zp)(w_q - w_zp)``,
      *without* bias;
    - ``bias``: the float32 bias per output channel, or None for no bias;
    - ``atws``: ``RN(s_in * s_w[c])`` (used by the per-channel rule);
    - ``inv_atws``: ``RN(1 / atws)`` with the division done in double (used by
      the per-tensor rule);
    - ``cm``: ``RN(atws / s_out)``;
    - ``per_channel``: which of fbgemm's two bias rules applies.

    Rules:

    - per-tensor: ``xf = RN(fma(b, inv_atws, f32(acc)))``: the kernel writes a
      multiply and an add, and the compiler fuses them into one FMA, so there is
      a single rounding (emulated exactly by ``fma_f32``);
    - per-channel: ``xf = RN(f32(acc) + RN(b / atws))``: a division cannot fuse;
    - then ``y = clamp(RNE(RN(xf * cm)) + zp, lo, hi)``.

    Use ``tensorgen.frontend.numerics.fbgemm_requant_params`` to compute
    ``atws``, ``inv_atws`` and ``cm`` from PyTorch's qparams. ``acc`` is what the
    CPU's kernel accumulates: the exact dot product where PyTorch's products are
    exact (AVX512-VNNI; see tensorgen.frontend.probe), else the exact one only
    while uint8 activations stay <= 127 (``dot_sat16`` models the saturation).
    A product outside int32 converts to INT32_MIN (``cvt_int32``), as in ``requantize``.
    Returns int64.
    """
    xf = _int_to_f32(wrap_int32(acc))
    if bias is not None:
        b = _f32(bias)
        xf = xf + (b / _f32(atws)) if per_channel else fma_f32(b, inv_atws, xf)
    prod = xf * _f32(cm)
    return np.clip(cvt_int32(prod) + int(zp), lo, hi)


def quantize(x_f32: ArrayLike, inv_scale_f32: ArrayLike, zp: int, lo: int, hi: int) -> np.ndarray:
    """``quantize_per_tensor``: ``clamp(RNE(fma(x, RN(1/s), zp)), lo, hi)``.

    ``inv_scale_f32`` is ``RN(1 / f32(s))``, a float32 division (fbgemm computes
    ``1.f / scale``). The zero point is added *inside* the FMA, before rounding
    to an integer: adding it after ``RNE`` differs on ties. Returns int64.
    """
    t = fma_f32(x_f32, inv_scale_f32, np.float32(zp))
    with np.errstate(invalid="ignore"):
        r = np.clip(np.rint(t.astype(np.float64)), lo, hi)
    return r.astype(np.int64)


def dequantize(q: ArrayLike, scale_f32: ArrayLike, zp: ArrayLike) -> np.ndarray:
    """``Tensor.dequantize()`` of a per-tensor quint8 tensor: ``RN(f32(s) * f32(q - zp))``.

    Found by experiment on torch 2.13 (AVX2 CPU): every element follows this
    rule, whatever its position; neither the vectorised FMA form
    ``fma(s, q, RN(s * -zp))`` nor a double-precision product matches. ``q - zp``
    is an exact small integer, so its float32 conversion is exact; the double
    q_scale is rounded to float32 first. Returns float32.
    """
    d = (np.asarray(q, dtype=np.int64) - np.asarray(zp, dtype=np.int64)).astype(np.float32)
    return d * _f32(scale_f32)


def rounding_shift_right(x: ArrayLike, shift: int) -> np.ndarray:
    """qnnpack's rounding arithmetic shift right: half away from zero, int32 wrap.

    ``asr(x, shift) + (remainder > threshold)`` with ``mask = 2^shift - 1``,
    ``threshold = mask >> 1`` and ``remainder = (x & mask) - (x < 0)``. The
    arithmetic shift rounds towards minus infinity and a remainder above half
    rounds up; subtracting 1 from the remainder of a negative ``x`` turns its
    exact half into "not above half", so ties go away from zero on both sides.
    ``x`` is wrapped to int32 first. Returns int64, or int32 for an array of a dtype int32
    holds (int8, uint8, int16, int32: the simulator's registers), computed in int32 then: no
    wrap is needed, and no step leaves int32 (``asr`` shrinks; the + 1 needs a remainder
    above half, so shift >= 1 and ``asr`` < 2**30).
    """
    if not 0 <= int(shift) <= 31:
        raise ValueError(f"rounding_shift_right(x, {shift}): shift must be in [0, 31]")
    shift = int(shift)
    if isinstance(x, np.ndarray) and x.dtype in _INT32_HOLDS:
        x = x.astype(np.int32)
        mask = np.int32((1 << shift) - 1)
        remainder = np.bitwise_and(x, mask)
        remainder -= x < 0
        y = np.right_shift(x, np.int32(shift), out=x)
        y += remainder > (mask >> 1)
        return y
    x = wrap_int32(x)
    mask = (1 << shift) - 1
    threshold = mask >> 1
    remainder = (x & mask) - (x < 0)
    return (x >> shift) + (remainder > threshold)


def add_qnnpack(
    qa: ArrayLike,
    qb: ArrayLike,
    a_mult: int,
    b_mult: int,
    zp_product: int,
    shift: int,
    zp_out: int,
    lo: int,
    hi: int,
) -> np.ndarray:
    """qnnpack's fixed-point quantized add (``q8vadd``): int32 arithmetic with wrap.

    ``acc = zp_product + a_mult*qa + b_mult*qb`` in int32 (``zp_product`` is
    ``-(a_mult*zp_a + b_mult*zp_b)``, precomputed by ``add_params``), then
    ``y = clamp(rounding_shift_right(acc, shift) + zp_out, lo, hi)``. With a
    fused ReLU pass ``lo = zp_out``. The SSE2 kernel's saturating int16 pack
    before the clamp is monotone and so equals the clamp. Returns int64.
    """
    qa = np.asarray(qa, dtype=np.int64)
    qb = np.asarray(qb, dtype=np.int64)
    acc = wrap_int32(int(zp_product) + qa * int(a_mult) + qb * int(b_mult))
    return np.clip(rounding_shift_right(acc, shift) + int(zp_out), lo, hi)


# -- fbgemm / x86 element-wise ops -------------------------------------------------------------

_INT32_FLOAT_MAX = np.float32(INT32_MAX - 127)  # largest float32 below 2^31, as the kernels clip


def _cvtps_epi32(t: np.ndarray) -> np.ndarray:
    """``_mm256_cvtps_epi32`` after the kernels' ``min(t, 2^31 - 128)``: RNE to int32, and
    anything below int32 (or NaN) becomes INT32_MIN ("integer indefinite"). Returns int64."""
    t = np.minimum(np.asarray(t, dtype=np.float32), _INT32_FLOAT_MAX).astype(np.float64)
    with np.errstate(invalid="ignore"):
        r = np.rint(t)
        bad = ~(r >= INT32_MIN)  # also catches NaN
        r = np.where(bad, INT32_MIN, r)
    return r.astype(np.int64)


def add_fbgemm(
    qa: ArrayLike,
    qb: ArrayLike,
    s_a: ArrayLike,
    zp_a: int,
    offset_a: ArrayLike,
    s_b: ArrayLike,
    zp_b: int,
    offset_b: ArrayLike,
    inv_out: ArrayLike,
    zp_out: int,
    lo: int,
    hi: int,
    scalar: ArrayLike = False,
) -> np.ndarray:
    """``quantized::add`` / ``add_relu`` of two per-tensor quint8 tensors under the fbgemm and
    x86 engines (ATen's ``qadd_kernel``): float arithmetic whose rounding depends on position.

    Operands (use ``tensorgen.frontend.numerics.fbgemm_add_params``): the float32 scales
    ``s_a = f32(s_a)``, ``s_b``; the premultiplied offsets ``offset_a = RN(s_a * -zp_a)``,
    ``offset_b``; ``inv_out = RN(1 / f32(s_out))``; the integer zero points.

    Vector path (elements the AVX2 loop handles, ``scalar`` False):

    - ``c = RN(fma(s_a, f32(qa), offset_a) + fma(s_b, f32(qb), offset_b))``: the dequantize
      is one FMA with the premultiplied offset, not ``(q - zp) * s``;
    - ``y = clamp(RNE(RN(c * inv_out)) + zp_out, lo, hi)``: the zero point is added to the
      *rounded* integer (int32 add; ``_mm256_cvtps_epi32`` after clipping at 2^31 - 128).

    Scalar path (``scalar`` True: the tail of each vectorised run, or every element when the
    inputs' memory layouts differ; see ``numerics.fbgemm_add_scalar_mask``):

    - ``c = RN(RN(s_a * (qa - zp_a)) + RN(s_b * (qb - zp_b)))``;
    - ``y = clamp(RNE(RN(RN(c * inv_out) + f32(zp_out))), lo, hi)``: the zero point is added
      in float *before* rounding, with two roundings (no FMA).

    ``add_relu`` applies ``max(c, 0)`` to the float sum; since every step after it is
    monotone and maps ``c = 0`` to ``zp_out``, that equals ``lo = zp_out``: pass ``lo =
    zp_out`` for add_relu, 0 for add, and ``hi = 255``. ``scalar`` is a bool (scalar or array
    broadcastable to ``qa``). The two paths differ in the last bit of ``c`` or on ties, about
    one element in 10^4 for random data. Returns int64.
    """
    qa = np.asarray(qa, dtype=np.int64)
    qb = np.asarray(qb, dtype=np.int64)
    sa, sb, inv = _f32(s_a), _f32(s_b), _f32(inv_out)
    on_scalar = np.asarray(scalar, dtype=bool)
    if on_scalar.all():  # compute only the paths that some element takes
        y = _add_scalar_path(qa, qb, sa, zp_a, sb, zp_b, inv, zp_out, lo, hi)
    elif not on_scalar.any():
        y = _add_vector_path(qa, qb, sa, offset_a, sb, offset_b, inv, zp_out)
    else:
        y = np.where(
            on_scalar,
            _add_scalar_path(qa, qb, sa, zp_a, sb, zp_b, inv, zp_out, lo, hi),
            _add_vector_path(qa, qb, sa, offset_a, sb, offset_b, inv, zp_out),
        )
    return np.clip(np.broadcast_to(y, np.broadcast_shapes(y.shape, on_scalar.shape)), lo, hi)


def _add_vector_path(qa, qb, sa, offset_a, sb, offset_b, inv, zp_out: int) -> np.ndarray:
    da = fma_f32(sa, qa.astype(np.float32), offset_a)
    db = fma_f32(sb, qb.astype(np.float32), offset_b)
    return wrap_int32(_cvtps_epi32((da + db) * inv) + int(zp_out))


def _add_scalar_path(qa, qb, sa, zp_a: int, sb, zp_b: int, inv, zp_out: int, lo, hi):
    c = (qa - int(zp_a)).astype(np.float32) * sa + (qb - int(zp_b)).astype(np.float32) * sb
    t = (c * inv) + np.float32(zp_out)
    with np.errstate(invalid="ignore"):
        return np.clip(np.rint(t.astype(np.float64)), lo, hi).astype(np.int64)


def avgpool_fbgemm(
    acc: ArrayLike, multiplier: ArrayLike, zp: int, lo: int, hi: int, scalar: ArrayLike = False
) -> np.ndarray:
    """fbgemm / x86 ``adaptive_avg_pool2d`` (and the channels-last average-pool kernels) from
    the exact integer window sum. Returns int64.

    Channels-last input (``_qadaptive_avg_pool_kernel``): ``acc = sum(q) - zp * n`` over the
    ``n = kh * kw`` window (an int32, exact), ``multiplier`` from
    ``numerics.fbgemm_avgpool_multiplier(..., channels_last=True)`` and ``zp`` the input zero
    point (the output keeps the input's qparams):

    - vector channels (the first ``8 * (C // 8)``, AVX2): ``y = clamp(RNE(fma(f32(acc), M,
      f32(zp))))``, one rounding before the integer rounding (fbgemm's legacy Quantize);
    - scalar channels (the last ``C % 8``, ``scalar`` True): ``y = clamp(RNE(RN(RN(f32(acc) *
      M) + f32(zp))))``.

    Contiguous (NCHW) input (``adaptive_avg_pool_single_out_frame``): pass ``acc = sum(q)``
    itself, ``zp = 0`` and ``scalar=False``; the rule is ``RNE(RN(f32(sum q) * M))`` with the
    NCHW multiplier, and the zero point never enters.

    Adding the zero point *after* rounding (``RNE(acc * M) + zp``) is wrong whenever
    ``acc / n`` is an exact half and ``zp`` is odd. For odd ``n`` and powers of two all these
    forms give ``RNE(sum(q) / n)``; they differ only for other even ``n`` (6x6, 10x10, 14x14...).
    """
    a = _int_to_f32(acc)
    m = _f32(multiplier)
    with np.errstate(invalid="ignore"):
        y_vec = np.clip(_cvtps_epi32(fma_f32(a, m, np.float32(zp))), lo, hi)
        y_sca = np.clip(np.rint(((a * m) + np.float32(zp)).astype(np.float64)), lo, hi)
    return np.where(np.asarray(scalar, dtype=bool), y_sca.astype(np.int64), y_vec)
