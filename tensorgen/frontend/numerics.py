"""Quantization parameters of the accelerator's instructions, computed as PyTorch computes them.

PyTorch's quantized kernels derive float32 multipliers, quantized biases and
fixed-point add parameters from a model's qparams (python floats: doubles) with
a specific mix of float and double arithmetic; a multiplier that differs in its
last bit changes outputs. This module reproduces those derivations exactly, so
that the requantize/add instructions of ``tensorgen.mc.arith`` applied to the
exact integer accumulator give PyTorch's output integers bit for bit.
tests/frontend/test_numerics.py checks every function here against torch 2.13
(CPU) on 1e5+ random elements. Only numpy is needed.

The rules are documented in docs/numerics.md. Findings by experiment (torch 2.13, on AVX2 and
AVX512-VNNI CPUs; what differs between CPUs is probed by ``tensorgen.frontend.probe``):

- ``Tensor.dequantize()`` (quint8, per tensor) is ``RN(f32(s) * (q - zp))`` for
  every element, whatever its position: no vector-body/scalar-tail split
  (checked on sizes 10, 31, 33, 37, 65, 1000, 3136 and 1e5; the FMA form
  ``fma(s, q, RN(s * -zp))`` mismatches on about 40% of elements).
- qnnpack average pooling: the multiplier is computed in **float**,
  ``RN(f32(s_in) / RN(f32(s_out) * n))`` (float32 division), not in double and
  not ``RN(1/n)``: with n = 100, up to 0.5% of outputs tell them apart. Since the
  output of qnnpack pooling keeps the input's qparams, s_out = s_in.
- Plain ``avg_pool2d`` on quint8 with the qnnpack engine (and ``ceil_mode``
  False) runs the same qnnpack kernel, so it follows the same rule
  ``clamp(RNE(RN(f32(sum(q - zp)) * M)) + zp)`` with ``n = kh * kw``. At padded
  borders the padding holds the input zero point (it adds 0 to ``sum(q - zp)``)
  and the divisor stays ``kh * kw``: that is ``count_include_pad=True``, and
  PyTorch's qnnpack path *ignores* ``count_include_pad=False`` and
  ``divisor_override`` (they give the same result as the defaults).
- NUMERICS.md's "``s_w * s_in`` in double" for the bias, made precise: the
  qnnpack bias reciprocal is ``RN(1 / RN(s_w * s_in))``, the product taken in
  double, rounded to float32, then a *float32* division. ``RN(1 / (s_w * s_in))``
  divided in double differs for about a quarter of random scales, and so does
  the float32 product ``RN(f32(s_w) * f32(s_in))``, which is what the
  requantization multiplier M uses. (The two products differ only when the
  scales are not float32 values themselves; python floats are doubles.)
- ``add`` (qnnpack): the scale ratios are float32 divisions ``RN(f32(s_a) /
  f32(s_out))``, as ``pytorch_qnnp_compute_add_quantization_params`` computes
  them (random data agrees, but rarely separates this from a double division). qnnpack
  refuses ``add_relu`` with ``zp_out = 255`` (its output range [255, 255] is
  empty): PyTorch raises an internal assert there.
- Depthwise and grouped convolutions, strided ones, and fbgemm/x86 with a
  non-zero per-tensor weight zero point all follow the same rules.
- fbgemm / x86 quantized ``add`` / ``add_relu`` (ATen's ``qadd_kernel``, not fbgemm
  proper) is float arithmetic whose rounding depends on the element's position: the
  vectorised body and the scalar tail of each run dequantize and round differently (see
  ``arith.add_fbgemm`` and ``fbgemm_add_scalar_mask``). The run is the whole tensor in memory
  order when both inputs share a dense layout (per thread chunk from 32768 elements on), and
  every element is scalar when the layouts differ.
- fbgemm / x86 ``adaptive_avg_pool2d`` has two kernels: channels_last (what conv outputs
  are) adds the zero point before the integer rounding, with an FMA in the vector channels
  and two roundings in the last ``C % 8``; contiguous input multiplies ``sum(q)`` by
  ``RN(RN(1/kh)/kw)``. See ``arith.avgpool_fbgemm``. ``quantize_per_tensor``, ``dequantize``
  and ``max_pool2d`` follow the same rules under qnnpack, x86 and fbgemm.
- Q(6) for relu6/hardtanh uses the quantize rule: ``RNE(6 * RN(1/s) + zp)``
  with the zero point added before rounding.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike

from tensorgen.mc import arith


def _f32(x: ArrayLike) -> np.ndarray:
    """``x`` rounded once to float32 (a C ``(float)`` cast of a double)."""
    return np.asarray(x, dtype=np.float32)


def _scalar_or_array(x: np.ndarray) -> np.ndarray | np.float32:
    """Unwrap 0-d arrays so that per-tensor parameters come back as numpy scalars."""
    return x[()] if x.ndim == 0 else x


def _check_positive(fn: str, **scales: ArrayLike) -> None:
    for name, value in scales.items():
        v = np.asarray(value, dtype=np.float64)
        if not (np.all(np.isfinite(v)) and np.all(v > 0)):
            raise ValueError(f"{fn}: {name} must be finite and positive, got {value!r}")


def inv_scale(scale: ArrayLike) -> np.ndarray | np.float32:
    """``RN(1 / f32(s))``: a float32 division, as fbgemm's ``1.f / scale``.

    The factor ``quantize`` multiplies by; PyTorch never divides by the scale.
    """
    _check_positive("inv_scale", scale=scale)
    return _scalar_or_array(np.float32(1) / _f32(scale))


def quantize_scalar(value: float, scale: float, zp: int, lo: int, hi: int) -> int:
    """One float quantized as PyTorch's ``quantize_val`` does: ``clamp(RNE(v * RN(1/s) + zp))``.

    Used for the clamp bounds of relu6 / hardtanh (``Q(6)``), whose kernels
    quantize their float bounds with the input's qparams.
    """
    q = arith.quantize(np.float32(value), inv_scale(scale), int(zp), lo, hi)
    return int(q)


def relu6_max(scale: float, zp: int) -> int:
    """``Q(6)``, the upper clamp of quantized relu6 (and hardtanh(0, 6)) on quint8.

    Quantized relu6 is ``min(max(q, zp), Q(6))`` with the input's qparams.
    """
    return quantize_scalar(6.0, scale, zp, 0, 255)


def quantize_bias(bias_f32: ArrayLike, s_in: float, s_w: ArrayLike) -> np.ndarray:
    """qnnpack's int32 bias: ``b_q = RNE(RN(b * RN(1 / RN(s_w * s_in))))``.

    PyTorch quantizes the float bias with ``quantize_per_tensor`` (or
    ``quantize_per_channel``) to qint32 at scale ``s_w * s_in`` computed in
    *double* (``q_scale()`` and ``q_per_channel_scales()`` are doubles); the
    quantize kernel rounds that scale to float32 and multiplies by its float32
    reciprocal ``1.f / scale`` (not a reciprocal taken in double). ``s_w`` is a
    scalar (per-tensor weights) or one scale per output channel, broadcastable
    to the bias. Values beyond int32 saturate. Returns an int32 array.
    """
    _check_positive("quantize_bias", s_in=s_in, s_w=s_w)
    b = _f32(bias_f32)
    scale = np.asarray(s_w, dtype=np.float64) * np.float64(s_in)
    inv = np.float32(1) / _f32(scale)
    q = arith.quantize(b, inv, 0, arith.INT32_MIN, arith.INT32_MAX)
    return q.astype(np.int32)


def requant_multiplier(s_in: float, s_w: ArrayLike, s_out: float) -> np.ndarray | np.float32:
    """qnnpack's requantization scale ``M = RN(RN(f32(s_w) * f32(s_in)) * RN(1 / f32(s_out)))``.

    All float32 arithmetic (``generate_requantization_scales``). A scalar for
    per-tensor weights, an array of one M per output channel for per-channel
    weights. M >= 1 is allowed: PyTorch's qnnpack conv and linear (its runtime
    path, not ``pytorch_qnnp_create_convolution2d_nhwc_q8``, which refuses
    them) run such layers with the same formula; ``arith.requantize`` gives
    products beyond int32 the x86 conversion's INT32_MIN. A dead ReLU after a
    conv or linear (its calibrated output all zero, so s_out ~ float32 eps)
    produces them.
    """
    _check_positive("requant_multiplier", s_in=s_in, s_w=s_w, s_out=s_out)
    m = (_f32(s_w) * _f32(s_in)) * (np.float32(1) / _f32(s_out))
    return _scalar_or_array(m)


@dataclass(frozen=True)
class FbgemmRequantParams:
    """The float32 operands of ``arith.requantize_fbgemm`` for one layer.

    ``atws = RN(f32(s_in) * f32(s_w))``, ``inv_atws = RN(1 / atws)`` divided in
    double (fbgemm writes ``1.0 / act_times_w_scale``), ``cm = RN(atws / f32(s_out))``;
    scalars for per-tensor weights, arrays (one per output channel) otherwise.
    ``per_channel`` selects fbgemm's bias rule.
    """

    atws: np.ndarray | np.float32
    inv_atws: np.ndarray | np.float32
    cm: np.ndarray | np.float32
    per_channel: bool


def fbgemm_requant_params(
    s_in: float, s_w: ArrayLike, s_out: float, per_channel: bool | None = None
) -> FbgemmRequantParams:
    """fbgemm / x86 requantization parameters from the model's qparams.

    ``per_channel`` defaults to "``s_w`` is an array": PyTorch picks fbgemm's
    per-output-channel granularity from the weight's qscheme, so a per-channel
    weight with a single channel still takes the per-channel bias rule.
    """
    _check_positive("fbgemm_requant_params", s_in=s_in, s_w=s_w, s_out=s_out)
    if per_channel is None:
        per_channel = np.ndim(s_w) > 0
    atws = _f32(s_in) * _f32(s_w)
    inv_atws = (1.0 / atws.astype(np.float64)).astype(np.float32)
    cm = atws / _f32(s_out)
    return FbgemmRequantParams(
        _scalar_or_array(atws), _scalar_or_array(inv_atws), _scalar_or_array(cm), per_channel
    )


@dataclass(frozen=True)
class AddParams:
    """Operands of ``arith.add_qnnpack``.

    ``y = clamp(rounding_shift_right(a_mult*qa + b_mult*qb + zp_product, shift) + zp_out)``.
    """

    a_mult: int
    b_mult: int
    zp_product: int
    shift: int


def add_params(s_a: float, zp_a: int, s_b: float, zp_b: int, s_out: float) -> AddParams:
    """qnnpack's fixed-point add parameters (``pytorch_qnnp_compute_add_quantization_params``).

    The ratios ``r = RN(f32(s_x) / f32(s_out))`` are float32 divisions and must
    lie in [2^-14, 2^8) (qnnpack refuses others). With ``e`` the binary exponent
    of the larger ratio, ``shift = 21 - e`` and each multiplier is
    ``lrintf(r * 2^shift)`` (exact product, round half to even), so the larger
    multiplier lies in [2^21, 2^22). ``zp_product = -(m_a*zp_a + m_b*zp_b)``
    wrapped to int32 as the C code's uint32 arithmetic does.
    """
    _check_positive("add_params", s_a=s_a, s_b=s_b, s_out=s_out)
    r_a = np.float32(s_a) / np.float32(s_out)
    r_b = np.float32(s_b) / np.float32(s_out)
    for name, r in (("s_a / s_out", r_a), ("s_b / s_out", r_b)):
        if not 2.0**-14 <= r < 2.0**8:
            raise ValueError(f"add_params: {name} = {r!r} must be in [2^-14, 2^8) (qnnpack)")
    r_max = max(r_a, r_b)
    exponent = int((int(np.float32(r_max).view(np.uint32)) >> 23) - 127)
    shift = 21 - exponent
    scale = np.float32(2.0**shift)
    a_mult = int(np.rint(r_a * scale))
    b_mult = int(np.rint(r_b * scale))
    zp_product = int(arith.wrap_int32(-(a_mult * int(zp_a) + b_mult * int(zp_b))))
    return AddParams(a_mult, b_mult, zp_product, shift)


def avgpool_multiplier(s_in: float, s_out: float, n: int) -> np.float32:
    """qnnpack average-pool multiplier ``RN(f32(s_in) / RN(f32(s_out) * n))``, in float32.

    For ``adaptive_avg_pool2d`` (sizes that divide) and ``avg_pool2d`` on the
    qnnpack engine, ``y = clamp(RNE(RN(f32(sum(q - zp)) * M)) + zp)`` over the
    ``n = kh * kw`` window, i.e. ``arith.requantize(sum(q - zp), M, zp, 0, 255)``.
    Computed in float, as ``pytorch_qnnp_create_average_pooling2d_nhwc_q8`` does;
    a double computation fails on some outputs (see the module docstring).
    """
    _check_positive("avgpool_multiplier", s_in=s_in, s_out=s_out)
    if int(n) < 1:
        raise ValueError(f"avgpool_multiplier: n must be a positive window size, got {n}")
    return np.float32(s_in) / (np.float32(s_out) * np.float32(n))


# -- fbgemm / x86: quantized add and average pooling ---------------------------------------------

#: ``at::internal::GRAIN_SIZE``: element-wise kernels run on one thread below this many elements.
ATEN_GRAIN_SIZE = 32768
#: Elements per iteration of ATen's vectorised loop for quint8 with AVX2 (two 32-byte vectors);
#: the running PyTorch's value comes from ``tensorgen.frontend.probe.x86_behaviour``.
FBGEMM_ADD_BLOCK = 64
#: Channels per vector step of the channels-last adaptive average pool with AVX2.
FBGEMM_AVGPOOL_BLOCK = 8


@dataclass(frozen=True)
class FbgemmAddParams:
    """The float32 operands of ``arith.add_fbgemm`` (``qadd_kernel`` under fbgemm / x86).

    ``s_a = f32(s_a)``, ``offset_a = RN(s_a * f32(-zp_a))`` (the vector dequantize's
    premultiplied offset), likewise for ``b``; ``inv_out = RN(1 / f32(s_out))``.
    """

    s_a: np.float32
    zp_a: int
    offset_a: np.float32
    s_b: np.float32
    zp_b: int
    offset_b: np.float32
    inv_out: np.float32
    zp_out: int


def fbgemm_add_params(
    s_a: float, zp_a: int, s_b: float, zp_b: int, s_out: float, zp_out: int
) -> FbgemmAddParams:
    """Parameters of ``quantized::add`` / ``add_relu`` under fbgemm / x86, as ``qadd_kernel``
    computes them: every scale is rounded to float32 first and all arithmetic is float32.

    Use as ``arith.add_fbgemm(qa, qb, p.s_a, p.zp_a, p.offset_a, p.s_b, p.zp_b, p.offset_b,
    p.inv_out, p.zp_out, lo, 255, scalar)`` with ``lo = zp_out`` for add_relu, else 0, and
    ``scalar = fbgemm_add_scalar_mask(...)`` (in the tensors' memory order).
    """
    _check_positive("fbgemm_add_params", s_a=s_a, s_b=s_b, s_out=s_out)
    sa, sb = np.float32(s_a), np.float32(s_b)
    return FbgemmAddParams(
        s_a=sa,
        zp_a=int(zp_a),
        offset_a=sa * np.float32(-int(zp_a)),
        s_b=sb,
        zp_b=int(zp_b),
        offset_b=sb * np.float32(-int(zp_b)),
        inv_out=np.float32(1) / np.float32(s_out),
        zp_out=int(zp_out),
    )


def fbgemm_add_scalar_mask(
    numel: int, num_threads: int = 1, same_layout: bool = True, block: int = FBGEMM_ADD_BLOCK
) -> np.ndarray:
    """Which elements of a fbgemm / x86 quantized add take the scalar path (True).

    The mask indexes the elements in *memory order* (NHWC order for channels_last tensors,
    which quantized convs produce). ``qadd_kernel`` runs ATen's ``cpu_kernel_vec``:

    - both inputs in the same dense layout (both contiguous or both channels_last): the
      tensor is one run of ``numel`` elements, split over threads when ``numel >=
      ATEN_GRAIN_SIZE`` and ``num_threads > 1`` into ``k = min(num_threads, ceil(numel /
      32768))`` chunks of ``ceil(numel / k)`` elements (the last one shorter). In each chunk
      the vector loop covers whole blocks of 64 elements from the chunk's start, and the last
      ``len % 64`` elements are the scalar tail. So results depend on ``numel`` and, above
      32767 elements, on ``torch.get_num_threads()``;
    - layouts differ (one contiguous, one channels_last): nothing is contiguous for all three
      tensors, so every element takes the scalar path (``same_layout=False``).

    ``block = 64`` is two AVX2 vectors; torch 2.13 runs this AVX2 kernel on AVX512 CPUs too
    (it registers no AVX512 quantized kernels). ``tensorgen.frontend.probe`` measures the block
    of the running PyTorch, and tensorgen passes that.
    """
    if numel < 0 or num_threads < 1 or block < 1:
        raise ValueError(
            f"fbgemm_add_scalar_mask: need numel >= 0, num_threads >= 1, block >= 1; got "
            f"{numel}, {num_threads}, {block}"
        )
    if not same_layout:
        return np.ones(numel, dtype=bool)
    mask = np.zeros(numel, dtype=bool)
    if numel < ATEN_GRAIN_SIZE or num_threads == 1:
        chunks = [(0, numel)]
    else:
        k = min(num_threads, -(-numel // ATEN_GRAIN_SIZE))
        size = -(-numel // k)
        chunks = [(b, min(numel, b + size)) for b in range(0, numel, size)]
    for begin, end in chunks:
        mask[end - (end - begin) % block : end] = True
    return mask


def fbgemm_avgpool_multiplier(
    kh: int, kw: int, channels_last: bool, s_in: float = 1.0, s_out: float = 1.0
) -> np.float32:
    """The float32 multiplier M of ``arith.avgpool_fbgemm`` for a ``kh x kw`` window.

    - channels_last (``_qadaptive_avg_pool_kernel``): ``m = RN(RN(f32(s_in) / f32(s_out)) /
      n)`` with ``n = kh * kw``, handed to fbgemm's Quantize as the scale ``RN(1 / m)``, which
      multiplies by its reciprocal: ``M = RN(1 / RN(1 / m))`` (equal to ``RN(1 / n)`` for
      every n < 5000 when ``s_in = s_out``);
    - contiguous (``adaptive_avg_pool_single_out_frame``): ``M = RN(RN(1 / kh) / kw)``; the
      scales do not enter.

    ``adaptive_avg_pool2d`` keeps the input's qparams, so ``s_in = s_out`` (the defaults).
    """
    _check_positive("fbgemm_avgpool_multiplier", s_in=s_in, s_out=s_out)
    if int(kh) < 1 or int(kw) < 1:
        raise ValueError(f"fbgemm_avgpool_multiplier: window {kh}x{kw} must be positive")
    if not channels_last:
        return (np.float32(1) / np.float32(kh)) / np.float32(kw)
    m = (np.float32(s_in) / np.float32(s_out)) / np.float32(int(kh) * int(kw))
    return np.float32(1) / (np.float32(1) / m)


def fbgemm_avgpool_scalar_channels(channels: int, block: int = FBGEMM_AVGPOOL_BLOCK) -> np.ndarray:
    """Channels of a channels-last fbgemm / x86 average pool that take the scalar path: the
    last ``channels % 8`` (AVX2). A bool array of shape ``(channels,)``."""
    if channels < 0 or block < 1:
        raise ValueError(f"fbgemm_avgpool_scalar_channels: bad channels={channels}, block={block}")
    return np.arange(channels) >= channels // block * block


# -- requantizing one tensor to another's qparams (cat, float round trips) ------------------------


def requantize_codes(
    s_in: float, zp_in: int, s_out: float, zp_out: int, lo: int, hi: int, nhwc: bool = False
) -> np.ndarray:
    """What PyTorch's ``torch.cat`` makes of every input code ``lo..hi`` of an input with qparams
    ``(s_in, zp_in)`` when the output has ``(s_out, zp_out)`` (PyTorch gives it the first
    input's). Index ``q - lo`` of the result. Two kernels, found by experiment (qnnpack and x86
    alike, ATen's own code):

    - ``nhwc`` (every input 4-d channels-last and ``dim == 1``: ``qcat_nhwc_kernel``): the
      vector dequantize ``fma(s, q, RN(s * -zp_in))``, times ``RN(1 / s_out)``, rounded
      (RNE), *then* the zero point added -- in all channels, the last ``C % 32`` too;
    - otherwise each input is dequantized (``RN(s * (q - zp))``) and the float cat quantized by
      ``quantize_per_tensor`` (the zero point inside the FMA, before rounding).

    The two differ on ties; tests/frontend/test_numerics_ops.py constructs them. A float op that
    only moves elements between a dequantize and a quantize follows the second rule."""
    _check_positive("requantize_codes", s_in=s_in, s_out=s_out)
    q = np.arange(lo, hi + 1)
    s, inv = np.float32(s_in), inv_scale(s_out)
    if not nhwc:
        return arith.quantize(arith.dequantize(q, s, int(zp_in)), inv, int(zp_out), lo, hi)
    d = arith.fma_f32(s, q.astype(np.float32), s * np.float32(-int(zp_in)))
    r = arith.cvt_int32((d * inv).astype(np.float32))
    return np.clip(r + int(zp_out), lo, hi)


def requantize_multiplier(
    s_in: float,
    zp_in: int,
    s_out: float,
    zp_out: int,
    lo: int,
    hi: int,
    nhwc: bool = False,
    ulps: int = 64,
) -> np.float32 | None:
    """A float32 M with ``arith.requantize(q - zp_in, M, zp_out, lo, hi)`` equal to
    ``requantize_codes`` on every code, or None if there is none near ``RN(f32(s_in) *
    RN(1 / f32(s_out)))`` (searched within ``ulps`` units in the last place, nearest first).

    PyTorch rounds twice, the accelerator's requant once, so M is checked on all 256 codes
    rather than derived: the table is small, so the check is the proof. On random scale pairs
    the plain product passes about 299 times in 300 (tests/frontend/test_numerics_ops.py)."""
    want = requantize_codes(s_in, zp_in, s_out, zp_out, lo, hi, nhwc)
    d = np.arange(lo, hi + 1) - int(zp_in)
    m0 = int(np.array(np.float32(s_in) * inv_scale(s_out), np.float32).view(np.int32))
    for u in sorted(range(-ulps, ulps + 1), key=lambda u: (abs(u), u)):
        m = np.array(m0 + u, np.int32).view(np.float32)[()]
        if np.isfinite(m) and m > 0 and (arith.requantize(d, m, zp_out, lo, hi) == want).all():
            return np.float32(m)
    return None


# -- the generic (ATen) average pool: ceil_mode under qnnpack, every avg_pool2d under x86 ------


def aten_avgpool_multiplier(s_in: float, s_out: float, divisor: int) -> np.float32:
    """``M = RN(1 / RN(1 / m))`` with ``m = RN(RN(f32(s_in) / f32(s_out)) / divisor)``: ATen's
    average pool computes ``m`` in float and quantizes with scale ``1 / m``, whose reciprocal
    ``quantize_val`` multiplies by."""
    _check_positive("aten_avgpool_multiplier", s_in=s_in, s_out=s_out)
    m = (np.float32(s_in) / np.float32(s_out)) / np.float32(divisor)
    return np.float32(1) / (np.float32(1) / m)


def aten_avgpool(acc: ArrayLike, multiplier: ArrayLike, zp: int, lo: int, hi: int) -> np.ndarray:
    """ATen's average pool on contiguous (NCHW) input, from ``acc = sum(q - zp_in)`` over the
    window's real elements: ``clamp(RNE(RN(RN(f32(acc) * M) + f32(zp_out))))``, two float
    roundings before the integer one (qnnpack and x86 alike; tests/frontend/test_numerics_ops.py).
    Returns int64."""
    a = np.asarray(acc, dtype=np.int64).astype(np.float32)
    t = (a * _f32(multiplier)).astype(np.float32) + np.float32(zp)
    return np.clip(np.rint(t.astype(np.float32).astype(np.float64)), lo, hi).astype(np.int64)


def single_rounding_for(
    want: np.ndarray, acc: np.ndarray, m0: np.float32, zp: int, lo: int, hi: int, ulps: int = 16
) -> tuple[str, np.float32] | None:
    """An op.yaml requantization -- ``("requant_fma", M)`` (``RNE(fma(acc, M, zp))``) or
    ``("requant", M)`` (``RNE(acc * M) + zp``) -- that gives ``want`` on every accumulator value
    ``acc``, M within ``ulps`` of ``m0``; None if there is none. The accumulator range of a
    pooling window is small (255 * window + 1 values), so checking all of it is the proof."""
    base = int(np.array(m0, np.float32).view(np.int32))
    for u in sorted(range(-ulps, ulps + 1), key=lambda u: (abs(u), u)):
        m = np.array(base + u, np.int32).view(np.float32)[()]
        if not (np.isfinite(m) and m > 0):
            continue
        if (arith.avgpool_fbgemm(acc, m, zp, lo, hi) == want).all():
            return "requant_fma", np.float32(m)
        if (arith.requantize(acc, m, zp, lo, hi) == want).all():
            return "requant", np.float32(m)
    return None


def mul_multiplier(s_a: float, s_b: float, s_out: float) -> np.float32:
    """The float32 multiplier of PyTorch's quantized mul of two tensors (qnnpack and x86):
    `RN(RN(f32(s_a)·f32(s_b)) · RN(1 / f32(s_out)))`; a double product, or a float32 division,
    differs on some scales (pinned in tests/frontend/test_numerics_ops.py)."""
    _check_positive("mul_multiplier", s_a=s_a, s_b=s_b, s_out=s_out)
    return _f32(_f32(s_a) * _f32(s_b)) * inv_scale(s_out)


def mul_codes(
    a: ArrayLike, b: ArrayLike, zp_a: int, zp_b: int, multiplier: float, zp_out: int
) -> np.ndarray:
    """PyTorch's quantized mul of uint8 codes (numpy broadcasting): the exact int32 product of
    the zero-point-shifted codes, requantized `clamp(RNE(RN(f32(c)·M)) + zp, 0, 255)`."""
    c = (np.asarray(a, np.int64) - zp_a) * (np.asarray(b, np.int64) - zp_b)
    return arith.requantize(c, np.float32(multiplier), zp_out, 0, 255)
