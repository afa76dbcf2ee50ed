"""The reference's own float rules of fbgemm's fused multiply-add kernels.

PyTorch's quantized add and channels-last average pool under the fbgemm / x86 engines round
through float32 fused multiply-adds, which torch has no operator for. The reference computes
each fused multiply-add exactly, in rational arithmetic (`fractions.Fraction`), and rounds the
exact value once to float32, nearest, ties to even: slow per element, so it runs once per
distinct operand triple (the operands are 8-bit values or window sums, few of them). Nothing
here comes from the compiler's side (`mc.arith`, `frontend.numerics`): the two are written
independently and meet in the bit-exact comparison (docs/numerics.md states the rules).
"""

from __future__ import annotations

import math
from fractions import Fraction

import torch

INT32_MIN = -(2**31)
# The AVX2 kernels clip at the largest float32 below 2**31 before converting to int32.
CLIP = float(2**31 - 128)


def round_f32(q: Fraction) -> float:
    """The float32 nearest to the exact `q`, ties to even (subnormals and overflow included)."""
    if q == 0:
        return 0.0
    sign, q = (-1.0 if q < 0 else 1.0), abs(q)
    e = q.numerator.bit_length() - q.denominator.bit_length()
    if Fraction(2) ** e > q:
        e -= 1  # now 2**e <= q < 2**(e + 1)
    ulp = Fraction(2) ** (max(e, -126) - 23)  # 24 significant bits; fixed quantum below 2**-126
    value = round(q / ulp) * ulp  # Fraction's round: half to even
    return sign * (math.inf if value >= 2**128 else float(value))


def _fma_exact(a: float, b: float, c: float) -> float:
    if not all(math.isfinite(v) for v in (a, b, c)):
        return a * b + c  # infinities and NaN propagate as IEEE says, whatever the rounding
    return round_f32(Fraction(a) * Fraction(b) + Fraction(c))


def fma_f32(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """round_f32(a * b + c) elementwise for float32 operands (broadcast), one rounding."""
    a, b, c = torch.broadcast_tensors(
        *(torch.as_tensor(v).to(torch.float32).to(torch.float64) for v in (a, b, c))
    )
    rows = torch.stack([a.reshape(-1), b.reshape(-1), c.reshape(-1)], dim=1)
    distinct, where = torch.unique(rows, dim=0, return_inverse=True)
    values = torch.tensor([_fma_exact(*map(float, r)) for r in distinct.tolist()])
    return values.to(torch.float32)[where].reshape(a.shape)


def int_to_f32(x: torch.Tensor) -> torch.Tensor:
    """int -> float32, nearest, ties to even (what `cvtdq2ps` does), exactly."""
    distinct, where = torch.unique(x.to(torch.int64), return_inverse=True)
    values = torch.tensor([round_f32(Fraction(int(v))) for v in distinct.tolist()])
    return values.to(torch.float32)[where]


def cvtps_epi32(t: torch.Tensor) -> torch.Tensor:
    """`_mm256_cvtps_epi32` after the kernels' clip at 2**31 - 128: nearest integer, ties to
    even; INT32_MIN below int32 and for NaN. int64."""
    r = torch.round(torch.clamp(t.to(torch.float64), max=CLIP))  # torch.round: half to even
    ok = r >= INT32_MIN  # False for NaN
    return torch.where(ok, r, torch.full_like(r, INT32_MIN)).to(torch.int64)


def _f32(v) -> torch.Tensor:
    """A constant as float32: one rounding of its float64 value, as a C float parameter."""
    return torch.as_tensor(v, dtype=torch.float64).to(torch.float32)


def wrap32(x: torch.Tensor) -> torch.Tensor:
    return ((x + 2**31) % 2**32) - 2**31


def requant_fma(acc: torch.Tensor, mult: float, zp: int, lo: int, hi: int) -> torch.Tensor:
    """fbgemm's channels-last average pool: clamp(RNE(fma(f32(acc), f32(M), f32(zp))))."""
    t = fma_f32(int_to_f32(wrap32(acc)), _f32(mult), int_to_f32(torch.tensor(zp)))
    return torch.clamp(cvtps_epi32(t), lo, hi)


def add_fbgemm(qa, qb, s_a, offset_a, s_b, offset_b, inv_out, zp_out: int) -> torch.Tensor:
    """`quantized::add` (fbgemm / x86, the AVX2 loop): each side dequantized by one fused
    multiply-add with the premultiplied offset, the float32 sum scaled by the float32 inverse
    output scale, converted to int32, the zero point added in an int32 register, uint8."""
    f = [_f32(v) for v in (s_a, offset_a, s_b, offset_b, inv_out)]
    da = fma_f32(f[0], int_to_f32(torch.as_tensor(qa)), f[1])
    db = fma_f32(f[2], int_to_f32(torch.as_tensor(qb)), f[3])
    c = da + db  # float32 + float32: one rounding
    y = wrap32(cvtps_epi32(c * f[4]) + int(zp_out))
    return torch.clamp(y, 0, 255)


def add_fbgemm_scalar(qa, qb, s_a, zp_a, s_b, zp_b, inv_out, zp_out: int) -> torch.Tensor:
    """`quantized::add` (fbgemm / x86, the scalar loop of ATen's qadd_kernel): each side
    dequantized as s * (q - zp) in float32, the sum scaled by the float32 inverse output scale,
    the zero point added in float32, then rounded half to even; uint8."""
    s = [_f32(v) for v in (s_a, s_b, inv_out)]
    da = int_to_f32(torch.as_tensor(qa) - int(zp_a)) * s[0]
    db = int_to_f32(torch.as_tensor(qb) - int(zp_b)) * s[1]
    t = (da + db) * s[2] + _f32(int(zp_out))  # every float32 operation rounded once
    return torch.clamp(torch.round(t.to(torch.float64)), 0, 255).to(torch.int64)
