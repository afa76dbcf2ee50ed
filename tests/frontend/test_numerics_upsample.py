"""PyTorch's quantized upsampling, pinned by experiment under qnnpack and x86 (the kernels are
ATen's, not the engine's, but both engines are run), and tensorgen's rules for it.

- nearest: `i = min(floor(RN(o * scale)), in - 1)`, `scale = RN(in / out)` in float32, or
  `RN(1 / scale_factor)` when a scale factor is given (`nearest-exact`: `(o + 0.5) * scale`);
- bilinear (quantized kernel, output keeps the input's parameters): float32
  `r = h0*(w0*x00 + w1*x01) + h1*(w0*x10 + w1*x11) - zp`, then `RNE(r + zp)` (not `zp + RNE(r)`:
  the ties test tells them apart); with weights
  that are multiples of 2^-kh and 2^-kw (kh + kw <= 16) that is exactly `RNE(N / 2^(kh+kw))` of
  the integer `N = sum(Wh*Ww*x)`, tensorgen's rule (tensorgen/frontend/upsample.py). The
  weights come from the test's own transcription of ATen's source-index formula."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

ENGINES = ("qnnpack", "x86")
F32 = np.float32


@pytest.fixture(params=ENGINES)
def engine(request):
    old = torch.backends.quantized.engine
    torch.backends.quantized.engine = request.param
    yield request.param
    torch.backends.quantized.engine = old


def source_weights(size_in: int, size_out: int, align: bool, scale_factor=None):
    """(i0, i1, lambda0, lambda1) per output index, ATen's float32 formula."""
    if align:
        scale = F32(size_in - 1) / F32(size_out - 1) if size_out > 1 else F32(0)
    else:
        scale = F32(1.0 / scale_factor) if scale_factor else F32(size_in) / F32(size_out)
    out = []
    for o in range(size_out):
        src = scale * F32(o) if align else max(scale * (F32(o) + F32(0.5)) - F32(0.5), F32(0))
        i0 = int(src)
        i1 = i0 + (1 if i0 < size_in - 1 else 0)
        lam1 = F32(src - F32(i0))
        out.append((i0, i1, F32(1) - lam1, lam1))
    return out


def float_rule(codes: np.ndarray, zp: int, rows, cols, lo: int, hi: int) -> np.ndarray:
    """The kernel's float32 arithmetic, transcribed (numpy float32 does not fuse)."""
    x = codes.astype(F32)
    out = np.empty(codes.shape[:2] + (len(rows), len(cols)), np.int64)
    for oh, (h0, h1, lh0, lh1) in enumerate(rows):
        for ow, (w0, w1, lw0, lw1) in enumerate(cols):
            top = lw0 * x[:, :, h0, w0] + lw1 * x[:, :, h0, w1]
            bottom = lw0 * x[:, :, h1, w0] + lw1 * x[:, :, h1, w1]
            r = lh0 * top + lh1 * bottom - F32(zp)
            # quantize_val adds the zero point before it rounds: RNE(r + zp), not zp + RNE(r)
            out[:, :, oh, ow] = np.clip(np.rint(r + F32(zp)).astype(np.int64), lo, hi)
    return out


def dyadic_matrix(table, size_in: int, bits: int) -> np.ndarray:
    """The weights as integers over 2^bits (taps at the same input add up)."""
    m = np.zeros((len(table), size_in), np.int64)
    for o, (i0, i1, l0, l1) in enumerate(table):
        for i, lam in ((i0, l0), (i1, l1)):
            v = float(lam) * (1 << bits)
            assert v == int(v), "weight not a multiple of 2^-bits"
            m[o, i] += int(v)
    return m


def rne_shift(n: np.ndarray, bits: int) -> np.ndarray:
    """Round n / 2^bits half to even, in integers."""
    q, r = np.divmod(n, 1 << bits)
    half = 1 << (bits - 1) if bits else 0
    up = (r > half) | ((r == half) & (q % 2 == 1)) if bits else np.zeros_like(r, bool)
    return q + up


def quantized(codes: np.ndarray, dtype, scale=0.05, zp=0) -> torch.Tensor:
    return torch._make_per_tensor_quantized_tensor(torch.from_numpy(codes), scale, zp)


# (input size, output size or None, scale factor or None, align_corners, bits per dimension)
DYADIC = [
    (6, None, 2.0, False, 4),
    (5, None, 4.0, False, 6),
    (8, None, 0.5, False, 1),
    (5, 9, None, True, 1),
    (4, 7, None, True, 1),
    (7, 7, None, False, 0),
]


@pytest.mark.parametrize("size, out, factor, align, bits", DYADIC)
@pytest.mark.parametrize("dtype", [torch.quint8, torch.qint8])
@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
def test_bilinear_dyadic_weights_are_an_integer_rule(
    engine, size, out, factor, align, bits, dtype, layout
):
    lo, hi = (0, 255) if dtype == torch.quint8 else (-128, 127)
    g = np.random.default_rng(size * 31 + bits)
    o = out or int(size * factor)
    n_ch = max(4, -(-100_000 // (o * o)))
    codes = g.integers(lo, hi + 1, (1, n_ch, size, size)).astype(
        np.uint8 if dtype == torch.quint8 else np.int8
    )
    zp = 7 if dtype == torch.quint8 else -3
    x = quantized(codes, dtype, 0.03, zp)
    if layout == "channels_last":
        x = x.contiguous(memory_format=torch.channels_last)
    kwargs = dict(mode="bilinear", align_corners=align)
    y = (
        F.interpolate(x, size=out, scale_factor=factor, **kwargs)
        if out is None
        else F.interpolate(x, size=(o, o), **kwargs)
    )
    got = y.int_repr().numpy().astype(np.int64)
    assert (y.q_scale(), y.q_zero_point()) == (x.q_scale(), x.q_zero_point())
    table = source_weights(size, o, align, factor)
    c = codes.astype(np.int64)
    assert np.array_equal(got, float_rule(c, zp, table, table, lo, hi))
    m = dyadic_matrix(table, size, bits)
    n = np.einsum("oi,ncij,pj->ncop", m, c, m)
    assert np.array_equal(got, np.clip(rne_shift(n, 2 * bits), lo, hi))
    assert got.size >= 100_000


def test_bilinear_ties_round_half_to_even(engine):
    """2x2 -> 4x4 (weights 9, 3, 3, 1 over 16 at output (1, 1)): codes chosen so that every
    sum is exactly a half; half-up rounding, or rounding `S - zp` with an odd zero point, would
    differ on half of them."""
    g = np.random.default_rng(1)
    abc = g.integers(0, 256, (50_000, 3))
    d = (8 - 9 * abc[:, 0] - 3 * abc[:, 1] - 3 * abc[:, 2]) % 16 + 16 * g.integers(0, 15, 50_000)
    codes = np.stack([abc[:, 0], abc[:, 1], abc[:, 2], d], 1).reshape(1, -1, 2, 2).astype(np.uint8)
    y = F.interpolate(quantized(codes, torch.quint8, 0.1, 3), scale_factor=2, mode="bilinear")
    got = y.int_repr().numpy().astype(np.int64)[0, :, 1, 1]
    n = 9 * abc[:, 0] + 3 * abc[:, 1] + 3 * abc[:, 2] + d
    assert np.all(n % 16 == 8)
    assert np.array_equal(got, rne_shift(n, 4))
    assert not np.array_equal(got, (n + 8) // 16)  # not half up
    assert not np.array_equal(got, 3 + rne_shift(n - 16 * 3, 4))  # not zp + RNE(S - zp)


@pytest.mark.parametrize("size, out, align", [(4, 12, False), (6, 11, True), (5, 7, False)])
def test_bilinear_other_weights_round_in_float32(engine, size, out, align):
    """Weights that are not short dyadic fractions: the kernel is its float32 arithmetic (the
    transcription matches), which tensorgen refuses rather than approximates."""
    g = np.random.default_rng(size)
    codes = g.integers(0, 256, (1, 100_000 // (out * out) + 1, size, size)).astype(np.uint8)
    y = F.interpolate(
        quantized(codes, torch.quint8, 0.1, 3),
        size=(out, out),
        mode="bilinear",
        align_corners=align,
    )
    table = source_weights(size, out, align)
    got = y.int_repr().numpy().astype(np.int64)
    assert np.array_equal(got, float_rule(codes.astype(np.int64), 3, table, table, 0, 255))


def nearest_index(size_in: int, size_out: int, factor, exact: bool) -> np.ndarray:
    scale = F32(1.0 / factor) if factor else F32(size_in) / F32(size_out)
    o = np.arange(size_out, dtype=F32)
    src = ((o + F32(0.5)) * scale) if exact else (o * scale)
    return np.minimum(np.floor(src.astype(F32)).astype(np.int64), size_in - 1)


NEAREST = [
    (8, 12, None),
    (7, 5, None),
    (5, 13, None),
    (6, None, 1.5),
    (9, None, 2.3),
    (4, None, 3.0),
    (10, 31, None),
    (3, None, 0.7),
]


@pytest.mark.parametrize("mode", ["nearest", "nearest-exact"])
@pytest.mark.parametrize("size, out, factor", NEAREST)
def test_nearest_index_rule(engine, mode, size, out, factor):
    g = np.random.default_rng(size)
    codes = g.integers(0, 256, (2, 3, size, size)).astype(np.uint8)
    x = quantized(codes, torch.quint8, 0.2, 9)
    if out:
        y = F.interpolate(x, size=(out, out), mode=mode)
    else:
        y = F.interpolate(x, scale_factor=factor, mode=mode)
    o = y.shape[2]
    i = nearest_index(size, o, factor, mode == "nearest-exact")
    assert np.array_equal(y.int_repr().numpy(), codes[:, :, i][:, :, :, i])
