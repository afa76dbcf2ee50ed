"""Every rule of tensorgen.mc.arith and tensorgen.frontend.numerics, pinned against PyTorch.

Each test builds quantized tensors from random integers, runs the PyTorch quantized
kernel (torch 2.13, CPU) and recomputes its output integers from the *exact* integer
accumulator with the arith/numerics functions: equality must be bit for bit on 1e5+
elements. Where random data cannot tell the documented rule from a plausible
alternative (a double instead of a float product, an FMA instead of a multiply-add),
a test constructs the inputs on which the two disagree and asserts that PyTorch sides
with the rule and not with the alternative, so every rule here could fail.

fbgemm/x86 and the CPU: without AVX512-VNNI fbgemm sums uint8 x int8 pairs with a saturating
int16 add, so its conv/linear are exact only while activations stay <= 127 with full-range int8
weights; with VNNI PyTorch's products are exact. tensorgen.frontend.probe finds out which; the
conv tests use full-range activations where the probe says exact and [0, 127] elsewhere, one
test asserts what this CPU does beyond 127, and the saturating behaviour is also pinned by its
numpy model (arith.dot_sat16), so both behaviours are tested on every CPU.
"""

from __future__ import annotations

from collections.abc import Callable
from fractions import Fraction

import numpy as np
import pytest
import torch
import torch.ao.nn.intrinsic.quantized as nniq
import torch.ao.nn.quantized as nnq

from tensorgen.frontend import numerics, onednn
from tensorgen.frontend.probe import x86_behaviour
from tensorgen.mc import arith

pytestmark = pytest.mark.filterwarnings(
    "ignore:torch.quantize_per_tensor, torch.quantize_per_channel:UserWarning"
)

F32 = np.float32
FBGEMM_ENGINES = ("fbgemm", "x86")
X_SAFE_MAX = 127  # largest activation for which fbgemm's int16 pair sums cannot saturate


def x_max_exact(eng: str, case: str = "3x3", per_channel: bool = True) -> int:
    """The largest activation for which `eng`'s conv/linear are exact on this CPU. Depthwise
    convs run other kernels: fbgemm's (also under x86 when the weights have a zero point,
    which oneDNN does not take) or, under x86 with symmetric weights, oneDNN's."""
    if case == "depthwise":
        b = x86_behaviour(eng if per_channel else "fbgemm")
        return 255 if b.exact_depthwise else X_SAFE_MAX
    return 255 if x86_behaviour(eng).exact_products else X_SAFE_MAX


# -- fixtures and helpers --------------------------------------------------------------------


def qtensor(q: np.ndarray, scale: float, zp: int) -> torch.Tensor:
    """A per-tensor quint8 tensor holding exactly the integers `q`."""
    return torch._make_per_tensor_quantized_tensor(torch.from_numpy(q.astype(np.uint8)), scale, zp)


def ints(t: torch.Tensor) -> np.ndarray:
    """The integers of a quantized tensor, as int64."""
    return t.int_repr().numpy().astype(np.int64)


def qweight(
    rng: np.random.Generator, shape: tuple[int, ...], per_channel: bool
) -> tuple[torch.Tensor, np.ndarray, float | np.ndarray, np.ndarray]:
    """Full-range int8 weights: (torch qint8 tensor, w_q, s_w, w_zp broadcastable to w_q).

    Per-tensor weights get a non-zero zero point (qnnpack and fbgemm both allow one);
    per-channel ones the symmetric zero points PyTorch's observers produce.
    """
    wq = rng.integers(-128, 128, size=shape).astype(np.int8)
    if per_channel:
        s_w = rng.uniform(1e-3, 2e-2, shape[0])
        w_zp = np.zeros(shape[0], np.int64)
        w = torch._make_per_channel_quantized_tensor(
            torch.from_numpy(wq), torch.from_numpy(s_w), torch.from_numpy(w_zp), 0
        )
        return w, wq, s_w, w_zp.reshape((-1,) + (1,) * (len(shape) - 1))
    s_w = float(rng.uniform(1e-3, 2e-2))
    w_zp = int(rng.integers(-20, 21))
    w = torch._make_per_tensor_quantized_tensor(torch.from_numpy(wq), s_w, w_zp)
    return w, wq, s_w, np.int64(w_zp)


def conv_acc(xz: np.ndarray, wz: np.ndarray, **conv_args) -> np.ndarray:
    """The exact accumulator of a conv on zero-point-subtracted integers.

    float64 is exact here: every product and partial sum is an integer below 2^53.
    """
    acc = torch.nn.functional.conv2d(torch.from_numpy(xz), torch.from_numpy(wz), **conv_args)
    return np.rint(acc.numpy()).astype(np.int64)


def channel(v: float | np.ndarray, ndim: int) -> float | np.ndarray:
    """Per-channel parameters shaped to broadcast over axis 1 of an `ndim`-d output."""
    return np.reshape(v, (-1,) + (1,) * (ndim - 2)) if np.ndim(v) else v


def expected_qnnpack(acc, bias, s_in, s_w, s_out, zp_out, lo) -> np.ndarray:
    """qnnpack conv/linear output from the exact accumulator (NCHW or NC)."""
    b_q = numerics.quantize_bias(bias, s_in, s_w)
    m = numerics.requant_multiplier(s_in, s_w, s_out)
    return arith.requantize(acc + channel(b_q, acc.ndim), channel(m, acc.ndim), zp_out, lo, 255)


def expected_fbgemm(acc, bias, s_in, s_w, s_out, zp_out, lo) -> np.ndarray:
    """fbgemm/x86 conv/linear output from the exact accumulator (NCHW or NC)."""
    p = numerics.fbgemm_requant_params(s_in, s_w, s_out)
    n = acc.ndim
    b = channel(bias, n)
    return arith.requantize_fbgemm(
        acc,
        b,
        channel(p.atws, n),
        channel(p.inv_atws, n),
        channel(p.cm, n),
        zp_out,
        lo,
        255,
        p.per_channel,
    )


def expected_x86_conv(eng: str, groups: int, w_zp):
    """The rule `eng` runs a conv of `groups` groups with weight zero points `w_zp` by: oneDNN's
    where the probe saw oneDNN take such convs (tests/frontend/test_numerics_onednn.py), else
    fbgemm's."""
    if not onednn.runs_on_onednn(eng, groups, w_zp):
        return expected_fbgemm

    def rule(acc, bias, s_in, s_w, s_out, zp_out, lo):
        sc = onednn.onednn_scales(s_in, s_w, s_out)
        sc = onednn.OnednnScales(sc.src, channel(sc.wei, acc.ndim), sc.dst_inv)
        return onednn.requantize_onednn(acc, channel(bias, acc.ndim), sc, zp_out, lo)

    return rule


def output_scale(s_in: float, s_w: float | np.ndarray, acc: np.ndarray) -> float:
    """An output scale that spreads the outputs over most of [0, 255]."""
    return float(s_in * np.mean(s_w) * acc.std() / 40)


# -- fma_f32 ---------------------------------------------------------------------------------


def exact_rn32(value: Fraction) -> np.float32:
    """The float32 nearest to an exact rational, ties to even (the reference for fma_f32)."""
    x0 = F32(float(value))
    best = None
    for c in (np.nextafter(x0, F32(-np.inf)), x0, np.nextafter(x0, F32(np.inf))):
        d = abs(Fraction(float(c)) - value)
        even = int(np.asarray(c).view(np.int32)) % 2 == 0
        if best is None or d < best[0] or (d == best[0] and even):
            best = (d, c)
    return best[1]


def fma_cases(rng: np.random.Generator, n: int) -> dict[str, tuple[np.ndarray, ...]]:
    """Three families of float32 (a, b, c) triples for fma_f32.

    - random: random signs, mantissas and exponents over 2^-40..2^40;
    - ties: small integers times a power of two whose exact result is often halfway
      between two float32 values;
    - double_rounding: c with a random mantissa and a*b just beside half an ulp of c,
      where computing a*b + c in float64 then rounding to float32 rounds twice and errs.
    """

    def sign() -> np.ndarray:
        return rng.choice([-1, 1], n).astype(F32)

    def rand() -> np.ndarray:
        return (rng.uniform(1, 2, n) * np.exp2(rng.integers(-40, 40, n)) * sign()).astype(F32)

    scale = np.exp2(rng.integers(-20, 20, n)).astype(F32)
    ties = (
        (rng.integers(1, 2**12, n) * scale).astype(F32),
        rng.integers(1, 2**12, n).astype(F32),
        (rng.integers(-(2**25), 2**25, n) * scale).astype(F32),
    )
    c = (rng.uniform(1, 2, n) * np.exp2(rng.integers(-20, 20, n)) * sign()).astype(F32)
    u = rng.integers(1, 2**8, n).astype(F32) * F32(2**-23)
    s = sign()
    a = (np.abs(np.spacing(c)) / 2 * (1 + u) * s).astype(F32)
    b = (1 - s * sign() * u).astype(F32)
    return {"random": (rand(), rand(), rand()), "ties": ties, "double_rounding": (a, b, c)}


def test_fma_f32_is_correctly_rounded_on_hard_cases() -> None:
    """fma_f32 equals the exactly rounded a*b + c; the naive float64 sum does not."""
    rng = np.random.default_rng(0)
    n = 1500
    naive_wrong = {}
    for family, (a, b, c) in fma_cases(rng, n).items():
        got = arith.fma_f32(a, b, c)
        naive = (a.astype(np.float64) * b + c).astype(F32)
        want = np.array(
            [
                exact_rn32(Fraction(float(x)) * Fraction(float(y)) + Fraction(float(z)))
                for x, y, z in zip(a, b, c, strict=False)
            ],
            dtype=F32,
        )
        assert np.array_equal(got.view(np.int32), want.view(np.int32)), family
        naive_wrong[family] = int((naive.view(np.int32) != want.view(np.int32)).sum())
    assert naive_wrong["double_rounding"] > n // 10  # the family really is hard


def test_fma_f32_broadcasts_and_keeps_shape() -> None:
    out = arith.fma_f32(np.ones((2, 3), F32), F32(2), np.arange(3, dtype=F32))
    assert out.dtype == F32 and out.shape == (2, 3)
    assert np.array_equal(out, np.array([[2, 3, 4], [2, 3, 4]], F32))
    assert arith.fma_f32(F32(3), F32(4), F32(5)).shape == ()


# -- integer helpers -------------------------------------------------------------------------


def test_rounding_shift_right_rounds_half_away_from_zero() -> None:
    """Against exact rational rounding, on every shift, with exact halves included."""
    rng = np.random.default_rng(1)
    for shift in range(0, 32):
        lim = 2 ** min(12, 32 - shift)  # keeps k << (shift - 1) inside int32
        x = np.concatenate(
            [
                rng.integers(-(2**31), 2**31, 3000),
                (rng.integers(-lim, lim, 3000) << max(shift - 1, 0)),  # many exact halves
                [arith.INT32_MIN, arith.INT32_MAX, 0, -1, 1],
            ]
        )
        got = arith.rounding_shift_right(x, shift)
        half = Fraction(1, 2)
        want = [int(np.sign(v)) * int(abs(Fraction(int(v), 2**shift)) + half) for v in x]
        assert got.tolist() == want, shift


def test_rounding_shift_right_wraps_to_int32_and_checks_shift() -> None:
    assert arith.rounding_shift_right(2**31 + 8, 2) == (arith.INT32_MIN + 8) >> 2
    with pytest.raises(ValueError, match="rounding_shift_right.*shift"):
        arith.rounding_shift_right(1, 32)


# -- quantize / dequantize -------------------------------------------------------------------


def test_quantize_per_tensor_matches_random_and_tail_lengths() -> None:
    """1e5+ random floats, in lengths that leave scalar tails after the AVX2 body."""
    rng = np.random.default_rng(2)
    for n in (5, 13, 100_003):
        for _ in range(2):
            s, zp = float(rng.uniform(1e-3, 0.1)), int(rng.integers(0, 256))
            x = (rng.normal(0, 80, n) * s).astype(F32)  # clamps at both ends too
            y = ints(torch.quantize_per_tensor(torch.from_numpy(x), s, zp, torch.quint8))
            assert np.array_equal(arith.quantize(x, numerics.inv_scale(s), zp, 0, 255), y)


def test_quantize_adds_zero_point_inside_one_fma() -> None:
    """On inputs built next to ties, PyTorch agrees with fma(x, 1/s, zp), never with
    RN(x * 1/s) + zp (two roundings) nor with the zero point added after rounding."""
    rng = np.random.default_rng(3)
    s, zp = float(F32(0.0371)), 201
    inv = numerics.inv_scale(s)
    k = rng.integers(-zp, 255 - zp, 400_000)
    near_tie = ((k + 0.5) / np.float64(inv)).astype(F32)
    x = (near_tie.view(np.int32) + rng.integers(-3, 4, k.size).astype(np.int32)).view(F32)
    rule = arith.quantize(x, inv, zp, 0, 255)
    two_roundings = np.clip(np.rint((x * inv).astype(F32) + F32(zp)), 0, 255)
    after = np.clip(np.rint(x * inv) + zp, 0, 255)
    differ = (rule != two_roundings) | (rule != after)
    assert differ.sum() > 10_000
    y = ints(torch.quantize_per_tensor(torch.from_numpy(x), s, zp, torch.quint8))
    assert np.array_equal(rule, y)
    assert np.all(two_roundings[rule != two_roundings] != y[rule != two_roundings])


def test_quantize_rounds_exact_ties_to_even_after_adding_zp() -> None:
    """A power-of-two scale makes x/s exactly k + 1/2: RNE(k + 1/2 + zp), for odd zp too."""
    rng = np.random.default_rng(4)
    s = 2.0**-6
    for zp in (0, 3, 128, 255):
        x = ((rng.integers(-300, 300, 100_000) + 0.5) * s).astype(F32)
        y = ints(torch.quantize_per_tensor(torch.from_numpy(x), s, zp, torch.quint8))
        assert np.array_equal(arith.quantize(x, numerics.inv_scale(s), zp, 0, 255), y)


@pytest.mark.parametrize("shape", [(1, 10), (1, 37), (1, 1000), (1, 64, 7, 7), (2, 50_001)])
def test_dequantize_is_one_float32_product_everywhere(shape: tuple[int, ...]) -> None:
    """RN(f32(s) * (q - zp)) at every position; the FMA form of a vectorised body is wrong."""
    rng = np.random.default_rng(5)
    fma_wrong = 0
    for _ in range(20):
        s, zp = float(rng.uniform(1e-3, 1)), int(rng.integers(0, 256))
        q = rng.integers(0, 256, size=shape)
        got = qtensor(q, s, zp).dequantize().numpy()
        want = arith.dequantize(q, s, zp)
        assert want.dtype == F32
        assert np.array_equal(want.view(np.int32), got.view(np.int32))
        fma_form = arith.fma_f32(F32(s), q.astype(F32), F32(s) * F32(-zp))
        fma_wrong += int((fma_form.view(np.int32) != got.view(np.int32)).sum())
    assert fma_wrong > 0


# -- conv and linear -------------------------------------------------------------------------

CONV_CASES = {  # name: (C, K, kernel, stride, padding, groups, H)
    "3x3": (16, 32, 3, 1, 1, 1, 14),
    "5x5/2": (16, 32, 5, 2, 2, 1, 15),
    "depthwise": (32, 32, 3, 1, 1, 32, 14),
    "grouped/2": (32, 64, 3, 2, 1, 4, 15),
}


def run_conv(rng, case, per_channel, relu, x_max, bias_std=2.0, with_w_zp=False):
    """One quantized conv through torch: (torch output ints, exact acc, qparams), and the
    weights' zero points last `with_w_zp`."""
    c, k, ks, stride, pad, groups, h = CONV_CASES[case]
    w, wq, s_w, w_zp = qweight(rng, (k, c // groups, ks, ks), per_channel)
    s_in, x_zp = float(rng.uniform(1e-3, 5e-2)), int(rng.integers(0, x_max + 1))
    xq = rng.integers(0, x_max + 1, size=(4, c, h, h))
    bias = rng.normal(0, bias_std, k).astype(F32)
    acc = conv_acc(
        xq - float(x_zp), wq - w_zp.astype(np.float64), stride=stride, padding=pad, groups=groups
    )
    s_out, zp_out = output_scale(s_in, s_w, acc), int(rng.integers(0, 256))
    mod = (nniq.ConvReLU2d if relu else nnq.Conv2d)(c, k, ks, stride, pad, groups=groups)
    mod.set_weight_bias(w, torch.from_numpy(bias))
    mod.scale, mod.zero_point = s_out, zp_out
    y = ints(mod(qtensor(xq, s_in, x_zp)))
    params = (bias, s_in, s_w, s_out, zp_out, zp_out if relu else 0)
    return (y, acc, params, w_zp) if with_w_zp else (y, acc, params)


@pytest.mark.parametrize("case", list(CONV_CASES))
@pytest.mark.parametrize("per_channel", [False, True], ids=["per_tensor", "per_channel"])
def test_conv2d_qnnpack(engine, case: str, per_channel: bool) -> None:
    """qnnpack conv, full-range uint8 activations: exact int32 accumulation, then
    requantize(acc + b_q, M)."""
    engine("qnnpack")
    rng = np.random.default_rng(6)
    total = 0
    while total < 100_000:
        y, acc, params = run_conv(rng, case, per_channel, relu=False, x_max=255)
        assert np.array_equal(expected_qnnpack(acc, *params), y)
        total += y.size


@pytest.mark.parametrize("eng", FBGEMM_ENGINES)
@pytest.mark.parametrize("case", ["3x3", "depthwise", "grouped/2"])
@pytest.mark.parametrize("per_channel", [False, True], ids=["per_tensor", "per_channel"])
def test_conv2d_fbgemm(engine, eng: str, case: str, per_channel: bool) -> None:
    """fbgemm/x86 conv: full-range activations where this CPU's products are exact, else in
    [0, 127] (no int16 saturation)."""
    engine(eng)
    rng = np.random.default_rng(7)
    total = 0
    while total < 100_000:
        y, acc, params, w_zp = run_conv(
            rng, case, per_channel, False, x_max_exact(eng, case, per_channel), with_w_zp=True
        )
        expected = expected_x86_conv(eng, CONV_CASES[case][5], w_zp)
        assert np.array_equal(expected(acc, *params), y)
        total += y.size


@pytest.mark.parametrize("eng", FBGEMM_ENGINES)
def test_conv2d_fbgemm_full_range_activations_follow_the_probe(engine, eng: str) -> None:
    """With uint8 activations up to 255 the conv is exact exactly when the probe says so: on
    CPUs without VNNI fbgemm saturates (a mismatch in > 5% of outputs), with VNNI it does not."""
    engine(eng)
    rng = np.random.default_rng(8)
    y, acc, params = run_conv(rng, "3x3", True, relu=False, x_max=255)
    mismatch = (expected_fbgemm(acc, *params) != y).mean()
    if x86_behaviour(eng).exact_products:
        assert mismatch == 0
    else:
        assert mismatch > 0.05


@pytest.mark.parametrize("eng", ["qnnpack", "x86"])
@pytest.mark.parametrize("s_out", [1.1920928955078125e-07, 1e-4, 1e-12, 1e-30])
def test_requantize_with_multiplier_above_one(engine, eng: str, s_out: float) -> None:
    """A dead ReLU's output scale (float32 eps) gives M = s_in * s_w / s_out far above 1: PyTorch
    runs the layer with the same rules, and a product beyond int32 converts to INT32_MIN (x86's
    cvtps2dq), so it comes out as the clamp's low end whatever its sign; saturating it to 255
    instead (what an int64 conversion gives) is what PyTorch does not do."""
    engine(eng)
    rng = np.random.default_rng(21)
    f_in, f_out, s_in, zp_x, zp_y = 256, 8, 0.5, 128, 7
    wq = rng.integers(-128, 128, size=(f_out, f_in))
    w = (
        torch._make_per_tensor_quantized_tensor(torch.from_numpy(wq.astype(np.int8)), 0.5, 0)
        if eng == "qnnpack"
        else torch._make_per_channel_quantized_tensor(
            torch.from_numpy(wq.astype(np.int8)),
            torch.full((f_out,), 0.5, dtype=torch.float64),
            torch.zeros(f_out, dtype=torch.long),
            0,
        )
    )
    xq = np.concatenate([rng.integers(0, 256, (1000, f_in)), rng.integers(127, 130, (1000, f_in))])
    bias = rng.normal(0, 1, f_out).astype(F32)
    acc = (xq - zp_x) @ wq.T
    if eng != "qnnpack" and not x86_behaviour(eng).exact_products:
        # without VNNI fbgemm's pair sums saturate at int16 (the activations reach 255 here);
        # the zero-point term is subtracted afterwards, exactly
        acc = arith.dot_sat16(xq, wq) - zp_x * wq.sum(axis=1)
    mod = nnq.Linear(f_in, f_out)
    mod.set_weight_bias(w, torch.from_numpy(bias))
    mod.scale, mod.zero_point = s_out, zp_y
    y = ints(mod(qtensor(xq, s_in, zp_x)))
    if eng == "qnnpack":
        m = numerics.requant_multiplier(s_in, 0.5, s_out)
        assert m > 1
        acc_b = acc + numerics.quantize_bias(bias, s_in, 0.5)
        want = arith.requantize(acc_b, m, zp_y, 0, 255)
        prod = acc_b.astype(F32) * m
    else:
        p = numerics.fbgemm_requant_params(s_in, np.full(f_out, 0.5), s_out)
        want = arith.requantize_fbgemm(acc, bias, p.atws, p.inv_atws, p.cm, zp_y, 0, 255, True)
        prod = (acc.astype(F32) + bias / p.atws) * p.cm
    assert np.array_equal(want, y)
    if s_out == 1.1920928955078125e-07:  # every kind of element occurs: 0, 255, in between
        big = np.abs(prod) >= 2**31
        assert big.any() and (y[big & (prod > 0)] == 0).all() and (y == 255).any()


def test_dot_sat16_is_fbgemms_saturating_pair_sum() -> None:
    """The pinned model of the behaviour without VNNI (tested on every CPU): pairs of products
    saturate to int16 before the exact int32 sum, so 255 * 127 pairs lose their excess; it is
    the exact dot product while activations stay <= 127, and with full-range activations it
    changes a large share of the requantized outputs, as fbgemm on AVX2 does."""
    x = np.array([[255, 255, 255, 255, 1, 2, 3]])
    w = np.array([[127, 127, -128, -128, 5, 6, 7]])
    assert arith.dot_sat16(x, w).tolist() == [[32767 - 32768 + 17 + 21]]
    rng = np.random.default_rng(20)
    wq = rng.integers(-128, 128, (32, 64))
    safe = rng.integers(0, 128, (500, 64))
    assert np.array_equal(arith.dot_sat16(safe, wq), safe @ wq.T)
    full = rng.integers(0, 256, (500, 64))
    exact, sat = full @ wq.T, arith.dot_sat16(full, wq)
    assert (sat != exact).mean() > 0.3
    m = np.float32(1 / 2000)
    assert (
        arith.requantize(sat, m, 128, 0, 255) != arith.requantize(exact, m, 128, 0, 255)
    ).mean() > 0.05


def test_probe_verdict_is_one_consistent_record() -> None:
    """The probe's record says what the tests above rely on, is cached, and names the CPU."""
    for eng in FBGEMM_ENGINES:
        b = x86_behaviour(eng)
        assert x86_behaviour(eng) is b
        assert b.add_block is not None  # 64 on AVX2 and AVX512 CPUs: torch 2.13 has no AVX512 qadd
        text = b.describe()
        assert text.startswith(f"{eng} engine: ") and "\n" not in text
        assert ("exact int8 products" in text) == b.exact_products
    with pytest.raises(ValueError, match="x86_behaviour"):
        x86_behaviour("qnnpack")


@pytest.mark.parametrize(
    "eng,per_channel",
    [("qnnpack", False), ("qnnpack", True), ("x86", True), ("fbgemm", False)],
)
def test_conv_relu_fusion(engine, eng: str, per_channel: bool) -> None:
    """ConvReLU2d (torch.ops.quantized.conv2d_relu) clamps at lo = zp_out, both via the
    module and via the op called directly."""
    engine(eng)
    rng = np.random.default_rng(9)
    x_max = 255 if eng == "qnnpack" else X_SAFE_MAX
    zp0 = np.zeros(1, np.int64)  # per-channel weights are symmetric; per-tensor: fbgemm below
    expected = (
        expected_qnnpack if eng == "qnnpack" else expected_x86_conv(eng, 1, zp0 + 1 - per_channel)
    )
    total = 0
    while total < 100_000:
        y, acc, params = run_conv(rng, "3x3", per_channel, relu=True, x_max=x_max)
        want = expected(acc, *params)
        assert np.array_equal(want, y)
        assert (want == params[4]).mean() > 0.2  # the ReLU clamp is really exercised
        total += y.size
    c, k = CONV_CASES["3x3"][:2]
    mod = nniq.ConvReLU2d(c, k, 3, 1, 1)
    w, wq, s_w, w_zp = qweight(rng, (k, c, 3, 3), per_channel)
    mod.set_weight_bias(w, None)
    xq = rng.integers(0, x_max + 1, size=(2, c, 9, 9))
    x = qtensor(xq, 0.02, 7)
    acc = conv_acc(xq - 7.0, wq - w_zp.astype(np.float64), padding=1)
    s_out = output_scale(0.02, s_w, acc)
    y = ints(torch.ops.quantized.conv2d_relu(x, mod._packed_params, s_out, 100))
    zero_bias = np.zeros(k, F32)
    assert np.array_equal(expected(acc, zero_bias, 0.02, s_w, s_out, 100, 100), y)


def test_conv2d_qnnpack_rounds_exact_ties_to_even(engine) -> None:
    """Power-of-two scales make M = 2^-4 exactly, so acc * M lands on halves often:
    RNE matches PyTorch, rounding half away from zero does not."""
    engine("qnnpack")
    rng = np.random.default_rng(10)
    c, k = 4, 32
    wq = rng.integers(-4, 5, size=(k, c, 3, 3)).astype(np.int8)  # small acc: few clamps
    w = torch._make_per_tensor_quantized_tensor(torch.from_numpy(wq), 2.0**-7, 0)
    s_in, s_out, zp_out = 2.0**-6, 2.0**-9, 128
    mod = nnq.Conv2d(c, k, 3, padding=1)
    mod.set_weight_bias(w, None)
    mod.scale, mod.zero_point = s_out, zp_out
    xq = rng.integers(0, 256, size=(4, c, 28, 28))
    y = ints(mod(qtensor(xq, s_in, 128)))
    acc = conv_acc(xq - 128.0, wq.astype(np.float64), padding=1)
    m = numerics.requant_multiplier(s_in, 2.0**-7, s_out)
    assert m == F32(2.0**-4)
    assert np.array_equal(arith.requantize(acc, m, zp_out, 0, 255), y)
    assert y.size >= 100_000
    exact = acc * 2.0**-4
    away = np.clip(np.sign(exact) * np.floor(np.abs(exact) + 0.5) + zp_out, 0, 255)
    assert (away != y).sum() > 100


@pytest.mark.parametrize(
    "eng,per_channel,relu",
    [
        ("qnnpack", False, False),
        ("qnnpack", True, False),
        ("qnnpack", False, True),
        ("x86", True, False),
        ("x86", False, True),
        ("fbgemm", False, False),
    ],
)
def test_linear(engine, eng: str, per_channel: bool, relu: bool) -> None:
    """torch.ao.nn.quantized.Linear / LinearReLU against the exact integer matmul."""
    engine(eng)
    rng = np.random.default_rng(11)
    x_max = 255 if eng == "qnnpack" else X_SAFE_MAX
    expected = expected_qnnpack if eng == "qnnpack" else expected_fbgemm
    f_in, f_out, batch = 200, 256, 400
    total = 0
    while total < 100_000:
        w, wq, s_w, w_zp = qweight(rng, (f_out, f_in), per_channel)
        s_in, x_zp = float(rng.uniform(1e-3, 5e-2)), int(rng.integers(0, x_max + 1))
        xq = rng.integers(0, x_max + 1, size=(batch, f_in))
        bias = rng.normal(0, 2, f_out).astype(F32)
        acc = (xq - x_zp) @ (wq.astype(np.int64) - w_zp).T
        s_out, zp_out = output_scale(s_in, s_w, acc), int(rng.integers(0, 256))
        mod = (nniq.LinearReLU if relu else nnq.Linear)(f_in, f_out)
        mod.set_weight_bias(w, torch.from_numpy(bias))
        mod.scale, mod.zero_point = s_out, zp_out
        y = ints(mod(qtensor(xq, s_in, x_zp)))
        lo = zp_out if relu else 0
        assert np.array_equal(expected(acc, bias, s_in, s_w, s_out, zp_out, lo), y)
        total += y.size


# -- the parameters that random data cannot tell apart ----------------------------------------


def linear_with_acc(
    acc: np.ndarray, f_in: int = 128, x_zp: int = 128
) -> tuple[np.ndarray, np.ndarray]:
    """Activations (one row per wanted accumulator) and one weight row [1, 127, ..., 127]
    with which a Linear layer's exact accumulator sum((x - x_zp) * w) is exactly `acc`."""
    n = f_in - 1
    big = np.rint(acc / 127).astype(np.int64)
    small = acc - 127 * big
    assert np.all(np.abs(small) <= 64) and np.all(np.abs(big) <= 127 * n)
    base, rem = np.divmod(big, n)
    cols = base[:, None] + (np.arange(n)[None, :] < rem[:, None])
    x = np.concatenate([small[:, None], cols], axis=1) + x_zp
    assert x.min() >= 0 and x.max() <= 255
    w = np.full((1, f_in), 127, np.int64)
    w[0, 0] = 1
    assert np.array_equal((x - x_zp) @ w[0], acc)
    return x, w


def run_linear_qnnpack(xq, wq, s_in, s_w, bias, s_out, zp_out) -> np.ndarray:
    """A per-tensor qnnpack Linear (x_zp = 128, w_zp = 0) on given integers."""
    mod = nnq.Linear(wq.shape[1], wq.shape[0])
    w = torch._make_per_tensor_quantized_tensor(torch.from_numpy(wq.astype(np.int8)), s_w, 0)
    mod.set_weight_bias(w, torch.from_numpy(bias))
    mod.scale, mod.zero_point = s_out, zp_out
    return ints(mod(qtensor(xq, s_in, 128)))


def scales_where(
    rng: np.random.Generator, differ: Callable[[float, float], bool]
) -> tuple[float, float]:
    """Random double (s_in, s_w), not float32 values, for which `differ(s_in, s_w)` holds."""
    while True:
        s_in, s_w = float(rng.uniform(1e-3, 5e-2)), float(rng.uniform(1e-3, 2e-2))
        if differ(s_in, s_w):
            return s_in, s_w


def accs_near_halves(m: np.float32, width: int = 4) -> np.ndarray:
    """Accumulators whose product with `m` lies near t + 1/2 for every output t in [-128, 127]."""
    t = np.arange(-128, 128) + 0.5
    centre = np.rint(t / np.float64(m)).astype(np.int64)
    return (centre[:, None] + np.arange(-width, width + 1)[None, :]).ravel()


def test_requant_multiplier_uses_the_float32_scale_product(engine) -> None:
    """M = RN(RN(f32(s_w) * f32(s_in)) * RN(1/s_out)): on accumulators chosen where the
    double product s_w * s_in would round the other way, PyTorch follows the float one.
    A small M (~1e-5) gives many accumulators per output value, hence many such cases."""
    engine("qnnpack")
    rng = np.random.default_rng(20)
    m_target = 1.5e-5

    def double_product(s_in: float, s_w: float) -> np.float32:
        return F32(s_w * s_in) * (F32(1) / F32(s_in * s_w / m_target))

    def differ(s_in: float, s_w: float) -> bool:
        m = numerics.requant_multiplier(s_in, s_w, s_in * s_w / m_target)
        return m != double_product(s_in, s_w)

    s_in, s_w = scales_where(rng, differ)
    s_out = s_in * s_w / m_target
    m, m_double = numerics.requant_multiplier(s_in, s_w, s_out), double_product(s_in, s_w)
    acc = accs_near_halves(m)
    rule = arith.requantize(acc, m, 128, 0, 255)
    acc = acc[rule != arith.requantize(acc, m_double, 128, 0, 255)]
    assert acc.size >= 10
    xq, wq = linear_with_acc(acc, f_in=1024)
    y = run_linear_qnnpack(xq, wq, s_in, s_w, np.zeros(1, F32), s_out, 128)[:, 0]
    assert np.array_equal(y, arith.requantize(acc, m, 128, 0, 255))
    assert np.all(y != arith.requantize(acc, m_double, 128, 0, 255))


BIAS_RECIPROCAL_ALTERNATIVES: dict[str, Callable[[float, float], np.float32]] = {
    "float32 product": lambda s_in, s_w: F32(1) / (F32(s_w) * F32(s_in)),
    "double reciprocal": lambda s_in, s_w: F32(1.0 / (s_w * s_in)),
}


@pytest.mark.parametrize("alternative", list(BIAS_RECIPROCAL_ALTERNATIVES))
def test_bias_reciprocal_is_float32_of_the_double_product(engine, alternative: str) -> None:
    """b_q = RNE(RN(b * RN(1 / RN(s_w * s_in)))): the product in double, rounded to float32,
    then a float32 division. Biases are chosen where the alternative reciprocal would give
    another b_q, and M ~ 0.9999 makes each output read b_q + zp_out."""
    engine("qnnpack")
    alt = BIAS_RECIPROCAL_ALTERNATIVES[alternative]

    def rule(s_in: float, s_w: float) -> np.float32:
        return F32(1) / F32(s_w * s_in)

    s_in, s_w = scales_where(np.random.default_rng(21), lambda a, b: rule(a, b) != alt(a, b))
    inv_rule, inv_alt = rule(s_in, s_w), alt(s_in, s_w)
    j = np.arange(-120, 120)
    centre = ((j + 0.5) / np.float64(inv_rule)).astype(F32).view(np.int32)
    b = (centre[:, None] + np.arange(-8, 9, dtype=np.int32)[None, :]).ravel().view(F32)
    b = b[np.rint(b * inv_rule) != np.rint(b * inv_alt)]
    assert b.size >= 20
    b_q = numerics.quantize_bias(b, s_in, s_w)
    assert np.array_equal(b_q, np.rint(b * inv_rule).astype(np.int32))
    s_out = float(F32(s_w) * F32(s_in)) / 0.9999
    xq = np.full((2, 4), 128)  # the zero point: acc = 0
    wq = np.ones((b.size, 4), np.int64)
    y = run_linear_qnnpack(xq, wq, s_in, s_w, b, s_out, 128)
    assert np.array_equal(y[0], b_q + 128)
    assert np.all(y[0] != np.rint(b * inv_alt) + 128)


def test_quantize_bias_agrees_with_torch_quantize_to_qint32() -> None:
    """The bias rule is PyTorch's own quantize_per_tensor/per_channel to qint32 at scale
    s_w * s_in (double): checked directly on 1e5 biases, per tensor and per channel."""
    rng = np.random.default_rng(12)
    b = (rng.normal(0, 3, 100_000) * np.exp2(rng.integers(-8, 8, 100_000))).astype(F32)
    s_in, s_w = float(rng.uniform(1e-3, 5e-2)), float(rng.uniform(1e-3, 2e-2))
    want = torch.quantize_per_tensor(torch.from_numpy(b), s_w * s_in, 0, torch.qint32)
    assert np.array_equal(numerics.quantize_bias(b, s_in, s_w), want.int_repr().numpy())
    b2 = b.reshape(1000, 100)
    s_wc = rng.uniform(1e-3, 2e-2, 1000)
    want = torch.quantize_per_channel(
        torch.from_numpy(b2),
        torch.from_numpy(s_wc * s_in),
        torch.zeros(1000, dtype=torch.long),
        0,
        torch.qint32,
    )
    got = numerics.quantize_bias(b2, s_in, s_wc[:, None])
    assert got.dtype == np.int32
    assert np.array_equal(got, want.int_repr().numpy())


@pytest.mark.parametrize("eng", FBGEMM_ENGINES)
def test_fbgemm_per_tensor_bias_is_one_fma(engine, eng: str) -> None:
    """xf = RN(fma(b, inv_atws, f32(acc))): with atws = 1 - 2^-23 (so inv_atws = 1 + 2^-23),
    cm = 2^-4 and b just above half an ulp of acc, the fused sum lands above a tie that
    a separate multiply and add would round to even, and the output differs by one."""
    engine(eng)
    # |acc| in [512, 1024) has an ulp of 2^-14; acc/16 = k + 1/2 with RNE rounding down
    acc = np.concatenate([np.arange(520, 1024, 32), -np.arange(536, 1024, 32)])
    b = F32(2.0**-15 * (1 - 2.0**-24))
    s_in, s_w = 1.0, 1 - 2.0**-23
    s_out = 16 * s_w
    p = numerics.fbgemm_requant_params(s_in, s_w, s_out)
    assert (p.inv_atws, p.cm, p.per_channel) == (F32(1 + 2.0**-23), F32(2.0**-4), False)
    xq, wq = linear_with_acc(acc, f_in=16, x_zp=64)
    mod = nnq.Linear(16, 1)
    w = torch._make_per_tensor_quantized_tensor(torch.from_numpy(wq.astype(np.int8)), s_w, 0)
    mod.set_weight_bias(w, torch.tensor([b]))
    mod.scale, mod.zero_point = s_out, 128
    y = ints(mod(qtensor(xq, s_in, 64)))[:, 0]
    rule = arith.requantize_fbgemm(acc, b, p.atws, p.inv_atws, p.cm, 128, 0, 255, False)
    xf_separate = acc.astype(F32) + b * p.inv_atws
    separate = np.clip(np.rint(xf_separate * p.cm) + 128, 0, 255)
    assert np.array_equal(rule, y)
    assert np.all(separate != y)


# -- element-wise ops ------------------------------------------------------------------------


@pytest.mark.parametrize("eng", ["qnnpack", "x86"])
def test_relu_and_relu6(engine, eng: str) -> None:
    """relu = max(q, zp); relu6 (F.relu6, hardtanh(0, 6), quantized::relu6) =
    min(max(q, zp), Q(6)) with Q(6) = relu6_max(scale, zp)."""
    engine(eng)
    rng = np.random.default_rng(13)
    for _ in range(10):
        s, zp = float(rng.uniform(6 / 255 / 2, 0.1)), int(rng.integers(0, 200))
        q = rng.integers(0, 256, 10_000)
        x = qtensor(q, s, zp)
        assert np.array_equal(ints(torch.relu(x)), np.maximum(q, zp))
        want = np.minimum(np.maximum(q, zp), numerics.relu6_max(s, zp))
        for y in (
            torch.nn.functional.relu6(x),
            torch.nn.functional.hardtanh(x, 0.0, 6.0),
            torch.ops.quantized.relu6(x),
        ):
            assert np.array_equal(ints(y), want)


def test_relu6_max_on_scales_that_separate_the_rules() -> None:
    """Q(6) adds the zero point before rounding and multiplies by RN(1/s): scales where
    RNE(6/s) + zp or a float division would give another Q(6) follow the rule."""
    rng = np.random.default_rng(14)
    s = rng.uniform(6 / 255 / 2, 0.2, 1_000_000)
    zp = rng.integers(0, 200, s.size)
    inv = F32(1) / s.astype(F32)
    rule = np.minimum(np.rint(arith.fma_f32(F32(6), inv, zp.astype(F32))), 255)
    after = np.minimum(np.rint(6 / s) + zp, 255)
    division = np.minimum(np.rint((F32(6) / s.astype(F32)) + zp.astype(F32)), 255)
    pick = np.flatnonzero((rule != after) | (rule != division))
    assert pick.size >= 5
    alternative_wrong = 0
    for i in pick:
        x = qtensor(np.array([255]), float(s[i]), int(zp[i]))
        got = int(ints(torch.nn.functional.relu6(x))[0])
        assert got == numerics.relu6_max(float(s[i]), int(zp[i])) == rule[i]
        alternative_wrong += int(after[i] != got) + int(division[i] != got)
    assert alternative_wrong >= pick.size


@pytest.mark.parametrize("relu", [False, True], ids=["add", "add_relu"])
@pytest.mark.parametrize("shape", [(1, 3), (1, 7), (1, 9), (4, 16, 13, 13), (1, 100_003)])
def test_add_qnnpack(engine, relu: bool, shape: tuple[int, ...]) -> None:
    """torch.ops.quantized.add / add_relu (qnnpack, quint8, same shapes) is the fixed-point
    rule; sizes below 8 take the kernel's scalar path."""
    engine("qnnpack")
    rng = np.random.default_rng(15)
    op = torch.ops.quantized.add_relu if relu else torch.ops.quantized.add
    total = 0
    while total < 100_000:
        s_a, s_b = (float(v) for v in rng.uniform(1e-3, 0.1, 2))
        s_out = float(rng.uniform(max(s_a, s_b) / 50, 2 * (s_a + s_b)))
        zp_a, zp_b = (int(v) for v in rng.integers(0, 256, 2))
        zp_out = int(rng.integers(0, 255))  # qnnpack refuses add_relu's range [255, 255]
        qa, qb = rng.integers(0, 256, shape), rng.integers(0, 256, shape)
        y = ints(op(qtensor(qa, s_a, zp_a), qtensor(qb, s_b, zp_b), s_out, zp_out))
        p = numerics.add_params(s_a, zp_a, s_b, zp_b, s_out)
        assert 2**21 <= max(p.a_mult, p.b_mult) < 2**22
        want = arith.add_qnnpack(
            qa, qb, p.a_mult, p.b_mult, p.zp_product, p.shift, zp_out, zp_out if relu else 0, 255
        )
        assert np.array_equal(want, y)
        total += y.size + 100  # tiny shapes still end after a few hundred cases


def test_add_qnnpack_rounds_ties_away_from_zero(engine) -> None:
    """s_out = 2 s_a = 2 s_b gives a_mult = b_mult = 2^21 and shift 22, so half of the
    sums are exact halves; qnnpack rounds them away from zero, not to even."""
    engine("qnnpack")
    rng = np.random.default_rng(16)
    qa, qb = rng.integers(0, 256, 100_000), rng.integers(0, 256, 100_000)
    p = numerics.add_params(0.01, 100, 0.01, 30, 0.02)
    assert (p.a_mult, p.b_mult, p.shift) == (2**21, 2**21, 22)
    y = ints(torch.ops.quantized.add(qtensor(qa, 0.01, 100), qtensor(qb, 0.01, 30), 0.02, 50))
    assert np.array_equal(
        arith.add_qnnpack(qa, qb, p.a_mult, p.b_mult, p.zp_product, p.shift, 50, 0, 255), y
    )
    to_even = np.clip(np.rint((qa - 100 + qb - 30) / 2) + 50, 0, 255)
    assert (to_even != y).sum() > 1000


def test_add_params_refuses_ratios_qnnpack_refuses() -> None:
    with pytest.raises(ValueError, match=r"add_params: s_a / s_out .* \[2\^-14, 2\^8\)"):
        numerics.add_params(1.0, 0, 0.01, 0, 0.001)
    with pytest.raises(ValueError, match="add_params: s_out must be finite and positive"):
        numerics.add_params(1.0, 0, 1.0, 0, 0.0)


# -- pooling ---------------------------------------------------------------------------------


def window_sums(d: np.ndarray, k: int, stride: int, reduce: Callable) -> np.ndarray:
    """Reduce every k x k window (stride `stride`) of an NCHW array with `reduce`."""
    n, c, h, w = d.shape
    ho, wo = (h - k) // stride + 1, (w - k) // stride + 1
    views = [
        d[:, :, i : i + stride * (ho - 1) + 1 : stride, j : j + stride * (wo - 1) + 1 : stride]
        for i in range(k)
        for j in range(k)
    ]
    return reduce(np.stack(views), axis=0)


@pytest.mark.parametrize("eng", ["qnnpack", "x86"])
@pytest.mark.parametrize("k,stride,pad", [(2, 2, 0), (3, 2, 1), (3, 1, 1)])
def test_max_pool2d_padding_is_minus_infinity(
    engine, eng: str, k: int, stride: int, pad: int
) -> None:
    """Integer max over the window; padded positions never win (they act as -inf), even
    next to a border column of values 0..2."""
    engine(eng)
    rng = np.random.default_rng(17)
    q = rng.integers(0, 256, size=(8, 32, 28, 28))
    q[:, :, :, 0] = rng.integers(0, 3, size=(8, 32, 28))  # small values at a padded border
    y = ints(torch.nn.functional.max_pool2d(qtensor(q, 0.05, 200), k, stride, pad))
    padded = np.pad(q, ((0, 0), (0, 0), (pad, pad), (pad, pad)), constant_values=-1)
    assert np.array_equal(window_sums(padded, k, stride, np.max), y)
    assert y.size >= 50_000


def test_adaptive_avg_pool2d_qnnpack_multiplier_is_float(engine) -> None:
    """qnnpack adaptive_avg_pool2d: RNE(RN(f32(sum(q - zp)) * M)) + zp with
    M = avgpool_multiplier (float32); a double M or RN(1/n) fails (n = 100 tells them apart)."""
    engine("qnnpack")
    rng = np.random.default_rng(18)
    wrong = {"double": 0, "1/n": 0}
    for h, out in [(10, 1), (20, 2), (7, 1), (8, 2), (4, 1)]:
        kk = h // out
        for _ in range(6):
            s, zp = float(rng.uniform(1e-3, 1)), int(rng.integers(0, 256))
            q = rng.integers(0, 256, size=(16, 64, h, h))
            y = torch.nn.functional.adaptive_avg_pool2d(qtensor(q, s, zp), (out, out))
            assert (y.q_scale(), y.q_zero_point()) == (s, zp)
            sums = (q - zp).reshape(16, 64, out, kk, out, kk).sum(axis=(3, 5))
            m = numerics.avgpool_multiplier(s, s, kk * kk)
            assert np.array_equal(arith.requantize(sums, m, zp, 0, 255), ints(y))
            for name, alt in (
                ("double", F32(float(F32(s)) / (float(F32(s)) * kk * kk))),
                ("1/n", F32(1 / (kk * kk))),
            ):
                wrong[name] += int((arith.requantize(sums, alt, zp, 0, 255) != ints(y)).sum())
    assert wrong["double"] > 0 and wrong["1/n"] > 0


@pytest.mark.parametrize(
    "k,stride,pad,count_include_pad,divisor",
    [
        (2, 2, 0, True, None),
        (3, 1, 1, True, None),
        (3, 2, 1, True, None),
        (3, 1, 1, False, None),
        (3, 1, 1, True, 5),
        (10, 1, 0, True, None),
    ],
)
def test_avg_pool2d_qnnpack(engine, k, stride, pad, count_include_pad, divisor) -> None:
    """Plain avg_pool2d on the qnnpack engine follows the adaptive rule with n = k*k;
    padding holds the zero point and still counts, and qnnpack ignores
    count_include_pad=False and divisor_override."""
    engine("qnnpack")
    rng = np.random.default_rng(19)
    h = 10 if k == 10 else 17
    total = 0
    while total < 100_000:
        s, zp = float(rng.uniform(1e-3, 1)), int(rng.integers(0, 256))
        q = rng.integers(0, 256, size=(8, 32, h, h))
        y = ints(
            torch.nn.functional.avg_pool2d(
                qtensor(q, s, zp),
                k,
                stride,
                pad,
                count_include_pad=count_include_pad,
                divisor_override=divisor,
            )
        )
        d = np.pad(q - zp, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
        sums = window_sums(d, k, stride, np.sum)
        want = arith.requantize(sums, numerics.avgpool_multiplier(s, s, k * k), zp, 0, 255)
        assert np.array_equal(want, y)
        total += y.size


# -- argument checks -------------------------------------------------------------------------


def test_parameter_functions_check_their_arguments() -> None:
    assert numerics.requant_multiplier(1.0, 1.0, 0.5) == 2  # M >= 1 is allowed, as PyTorch runs it
    with pytest.raises(ValueError, match="requant_multiplier: s_out must be finite and positive"):
        numerics.requant_multiplier(1.0, 1.0, 0.0)
    with pytest.raises(ValueError, match="quantize_bias: s_w must be finite and positive"):
        numerics.quantize_bias(np.zeros(2, F32), 0.1, np.array([0.1, -1.0]))
    with pytest.raises(ValueError, match="avgpool_multiplier: n must be"):
        numerics.avgpool_multiplier(0.1, 0.1, 0)
    per_channel = numerics.fbgemm_requant_params(0.1, np.array([0.01]), 0.2)
    assert per_channel.per_channel and per_channel.cm.shape == (1,)
    assert not numerics.fbgemm_requant_params(0.1, 0.01, 0.2).per_channel
