"""The rules of the data-movement operators, pinned against PyTorch (torch 2.13, CPU): `cat` of
inputs with different quantization parameters, on 1e5+ random elements per case and on
constructed cases (every code, extreme scale ratios, ties), under qnnpack and x86, contiguous
and channels-last (quantized convs produce channels-last tensors)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from tensorgen.frontend import numerics, pooling
from tensorgen.mc import arith

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

ENGINES = ("qnnpack", "x86")


def qtensor(q: np.ndarray, scale: float, zp: int, channels_last: bool = False) -> torch.Tensor:
    t = torch._make_per_tensor_quantized_tensor(torch.from_numpy(q.astype(np.uint8)), scale, zp)
    return t.contiguous(memory_format=torch.channels_last) if channels_last else t


def torch_cat_part(q: np.ndarray, s_in: float, zp_in: int, s_out: float, zp_out: int, cl: bool):
    """What torch.cat makes of `q` when it follows a first input with (s_out, zp_out)."""
    first = qtensor(np.zeros((q.shape[0], 3, *q.shape[2:]), np.uint8), s_out, zp_out, cl)
    y = torch.cat([first, qtensor(q, s_in, zp_in, cl)], 1)
    assert (y.q_scale(), y.q_zero_point()) == (s_out, zp_out)  # the first input's qparams
    return y.int_repr().numpy()[:, 3:]


def is_nhwc_kernel(q: np.ndarray, channels_last: bool) -> bool:
    """Whether torch.cat of such inputs along channels runs its channels-last kernel."""
    return channels_last or q.shape[2:] == (1, 1)


@pytest.mark.parametrize("eng", ENGINES)
@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "nhwc"])
def test_cat_requantizes_each_input_by_dequantize_then_quantize(engine, eng, channels_last):
    engine(eng)
    rng = np.random.default_rng(7)
    total = 0
    for _ in range(6):
        s_in, s_out = (float(np.exp(rng.uniform(-7, 0))) for _ in range(2))
        zp_in, zp_out = (int(z) for z in rng.integers(0, 256, 2))
        c = int(rng.integers(1, 70))  # past 32 and 64: AVX2's vector body and its tail
        q = rng.integers(0, 256, (2, c, 17, 19))
        got = torch_cat_part(q, s_in, zp_in, s_out, zp_out, channels_last)
        table = numerics.requantize_codes(s_in, zp_in, s_out, zp_out, 0, 255, channels_last)
        np.testing.assert_array_equal(got, table[q])
        m = numerics.requantize_multiplier(s_in, zp_in, s_out, zp_out, 0, 255, channels_last)
        assert m is not None
        np.testing.assert_array_equal(arith.requantize(q - zp_in, m, zp_out, 0, 255), got)
        total += q.size
    assert total >= 100_000


CASES = [
    (0.05, 128, 0.05, 3),  # same scale: a zero point shift only
    (0.5, 0, 0.25, 0),  # exact ratio 2: every product exact
    (0.1, 7, 1e-4, 250),  # ratio 1000: nearly everything saturates
    (1e-4, 200, 0.1, 9),  # ratio 1e-3: everything rounds to the zero point
    (0.2, 10, 0.4, 100),  # ratio 1/2: half the codes fall on ties (x.5)
    (0.2, 10, 0.4, 101),  # the same with an odd zero point: the two kernels disagree
]
# On these PyTorch's two roundings can break ties that no single multiplier reproduces: tensorgen
# refuses such a cat (tests/frontend/test_ops_models.py) rather than be off by one.
NO_MULTIPLIER = {(0.2, 10, 0.4, 100), (0.2, 10, 0.4, 101)}


@pytest.mark.parametrize("eng", ENGINES)
@pytest.mark.parametrize("s_in, zp_in, s_out, zp_out", CASES)
@pytest.mark.parametrize("shape", [(1, 256, 1, 1), (1, 256, 2, 3), (256, 40, 1, 1)])
def test_cat_requantization_on_every_code(engine, eng, s_in, zp_in, s_out, zp_out, shape):
    """Every code in every channel position (40 channels: a vector body of 32 and a tail)."""
    engine(eng)
    n, c = np.indices(shape[:2])
    q = ((n + c) % 256)[:, :, None, None] + np.zeros((1, 1, *shape[2:]), int)
    for cl in (False, True):
        got = torch_cat_part(q, s_in, zp_in, s_out, zp_out, cl)
        nhwc = is_nhwc_kernel(q, cl)
        table = numerics.requantize_codes(s_in, zp_in, s_out, zp_out, 0, 255, nhwc)
        np.testing.assert_array_equal(got, table[q])
        m = numerics.requantize_multiplier(s_in, zp_in, s_out, zp_out, 0, 255, nhwc)
        if m is None:  # then not even the plain ratio reproduces PyTorch
            assert (s_in, zp_in, s_out, zp_out) in NO_MULTIPLIER
            plain = np.float32(s_in) * numerics.inv_scale(s_out)
            assert (arith.requantize(q - zp_in, plain, zp_out, 0, 255) != got).any()
            continue
        np.testing.assert_array_equal(arith.requantize(q - zp_in, m, zp_out, 0, 255), got)


@pytest.mark.parametrize("eng", ENGINES)
def test_the_two_cat_kernels_round_ties_apart(engine, eng):
    """Ratio 1/2 puts half the codes on x.5: the channels-last kernel rounds the scaled value and
    then adds the zero point, quantize_per_tensor adds it inside the rounding. PyTorch's two
    kernels disagree on those codes, each agreeing with its rule and not the other's."""
    engine(eng)
    args = (0.2, 10, 0.4, 101, 0, 255)
    q = np.arange(256).reshape(1, 256, 1, 1) + np.zeros((1, 1, 2, 2), int)
    nchw = torch_cat_part(q, *args[:4], False)
    nhwc = torch_cat_part(q, *args[:4], True)
    assert (nchw != nhwc).sum() > 100
    np.testing.assert_array_equal(nchw, numerics.requantize_codes(*args, nhwc=False)[q])
    np.testing.assert_array_equal(nhwc, numerics.requantize_codes(*args, nhwc=True)[q])


def test_requantize_multiplier_search_is_nearly_always_the_plain_ratio():
    """The derived multiplier RN(f32(s_in) * RN(1/f32(s_out))) reproduces PyTorch's two roundings
    on almost every scale pair; where no multiplier does, the search says so (None)."""
    rng = np.random.default_rng(1)
    plain = none = 0
    for i in range(300):
        s_in, s_out = (float(np.exp(rng.uniform(-6, 0))) for _ in range(2))
        zi, zo = (int(z) for z in rng.integers(0, 256, 2))
        m = numerics.requantize_multiplier(s_in, zi, s_out, zo, 0, 255, nhwc=bool(i % 2))
        plain += m == np.float32(s_in) * numerics.inv_scale(s_out)
        none += m is None
    assert plain >= 290 and none <= 5


# -- ATen's average pool (ceil_mode under qnnpack, everything under x86), contiguous input ------


def aten_avg_pool_expected(q, zp, s_in, s_out, zp_out, k, s, p, ceil, include_pad, block=0):
    """ATen's rule, window by window, with the windows computed here from PyTorch's formulas;
    `block`: the channels-last kernel's vector width (0: contiguous input)."""
    n, c, h, w = q.shape
    vector = (np.arange(c) < (block * (c // block) if block else 0))[None, :]

    def wins(n_in):
        n_out = (n_in + 2 * p - k + (s - 1 if ceil else 0)) // s + 1
        if ceil and (n_out - 1) * s >= n_in + p:
            n_out -= 1
        for o in range(n_out):
            start = o * s - p
            end = min(start + k, n_in + p)
            yield max(start, 0), min(end, n_in), end - start

    y = []
    for h0, h1, ph in wins(h):
        row = []
        for w0, w1, pw in wins(w):
            real = (h1 - h0) * (w1 - w0)
            m = numerics.aten_avgpool_multiplier(s_in, s_out, ph * pw if include_pad else real)
            acc = q[:, :, h0:h1, w0:w1].sum((2, 3)) - zp * real
            d = ph * pw if include_pad else real
            once = arith.requantize(
                acc, (np.float32(s_in) / np.float32(s_out)) / np.float32(d), zp_out, 0, 255
            )
            row.append(np.where(vector, once, numerics.aten_avgpool(acc, m, zp_out, 0, 255)))
        y.append(np.stack(row, -1))
    return np.stack(y, -2)


@pytest.mark.parametrize("eng", ENGINES)
def test_aten_avg_pool_on_contiguous_input(engine, eng):
    """Random shapes, windows, strides, padding, ceil_mode and count_include_pad both ways (under
    qnnpack only ceil_mode reaches ATen's kernel)."""
    engine(eng)
    rng = np.random.default_rng(11)
    total = 0
    while total < 100_000:
        k, s = int(rng.integers(1, 6)), int(rng.integers(1, 4))
        p, cip = int(rng.integers(0, k // 2 + 1)), bool(rng.integers(0, 2))
        ceil = True if eng == "qnnpack" else bool(rng.integers(0, 2))
        c, h, w = int(rng.integers(1, 40)), int(rng.integers(k, 15)), int(rng.integers(k, 15))
        q = rng.integers(0, 256, (2, c, h, w))
        s_in, zp = float(np.exp(rng.uniform(-5, 0))), int(rng.integers(0, 256))
        y = F.avg_pool2d(qtensor(q, s_in, zp), k, s, p, ceil_mode=ceil, count_include_pad=cip)
        want = aten_avg_pool_expected(
            q, zp, s_in, y.q_scale(), y.q_zero_point(), k, s, p, ceil, cip
        )
        np.testing.assert_array_equal(y.int_repr().numpy(), want)
        total += want.size


@pytest.mark.parametrize("eng", ENGINES)
def test_aten_avg_pool_rounds_twice_on_ties(engine, eng):
    """2x2 windows give exact halves; an odd zero point makes RNE(x.5 + zp) differ from
    RNE(x.5) + zp. PyTorch follows the two float roundings, not the latter, and the multiplier
    tensorgen picks reproduces them on the whole accumulator range."""
    engine(eng)
    q = np.arange(256 * 4).reshape(1, 256, 2, 2) % 256
    q[0, :, 0, 0] = np.arange(256)
    q[0, :, 1, 1] = (np.arange(256) + 1) % 256
    y = F.avg_pool2d(qtensor(q, 0.1, 3), 2, 2, 0, ceil_mode=True)
    got = y.int_repr().numpy()
    acc = q.sum((2, 3)) - 3 * 4
    m = numerics.aten_avgpool_multiplier(0.1, y.q_scale(), 4)
    np.testing.assert_array_equal(got[..., 0, 0], numerics.aten_avgpool(acc, m, 3, 0, 255))
    assert (arith.requantize(acc, m, 3, 0, 255) != got[..., 0, 0]).any()
    full = np.arange(-12, 253 * 4 + 1)
    fn, mult = numerics.single_rounding_for(
        numerics.aten_avgpool(full, m, 3, 0, 255), full, m, 3, 0, 255
    )
    pick = arith.avgpool_fbgemm if fn == "requant_fma" else arith.requantize
    np.testing.assert_array_equal(pick(acc, mult, 3, 0, 255), got[..., 0, 0])


def test_divisor_six_can_need_two_roundings_no_single_one_gives(engine):
    """Scale 0.05, zero point 5, divisor 6 (a 3x2 border window): PyTorch's result (checked
    here on every accumulator value) is reproduced by no requant or requant_fma multiplier, so
    tensorgen refuses such a layer (tensorgen.frontend.pooling) rather than be off by one."""
    engine("qnnpack")
    zp, div = 5, 6
    acc = np.arange(-zp * div, (255 - zp) * div + 1)
    m = numerics.aten_avgpool_multiplier(0.05, 0.05, div)
    want = numerics.aten_avgpool(acc, m, zp, 0, 255)
    assert numerics.single_rounding_for(want, acc, m, zp, 0, 255, ulps=64) is None
    # PyTorch on windows of 3x2 whose sums cover the range: q[..] + zp laid out to sum to acc
    q = np.full((1, acc.size, 3, 2), zp)
    rest = acc.copy()
    for i in range(3):
        for j in range(2):
            step = np.clip(rest, -zp, 255 - zp)
            q[0, :, i, j] += step
            rest -= step
    assert not rest.any()
    y = F.avg_pool2d(qtensor(q, 0.05, zp), (3, 2), ceil_mode=True)
    assert (y.q_scale(), y.q_zero_point()) == (0.05, zp)
    np.testing.assert_array_equal(y.int_repr().numpy()[0, :, 0, 0], want)


@pytest.mark.parametrize("eng", ENGINES)
def test_aten_avg_pool_on_channels_last_input(engine, eng):
    """The NHWC kernel: its first `block * (C // block)` channels round once, `RNE(RN(acc * m)) +
    zp` with m itself; the rest as the contiguous kernel. Random shapes (channels past 16 and 32),
    a quarter of them built of exact halves."""
    engine(eng)
    block = pooling.nhwc_block(eng)
    assert block in (8, 16)
    rng = np.random.default_rng(12)
    total = 0
    while total < 100_000:
        k, s = int(rng.integers(1, 6)), int(rng.integers(1, 4))
        p, cip = int(rng.integers(0, k // 2 + 1)), bool(rng.integers(0, 2))
        ceil = True if eng == "qnnpack" else bool(rng.integers(0, 2))
        c, h, w = int(rng.integers(1, 40)), int(rng.integers(k, 13)), int(rng.integers(k, 13))
        q = rng.integers(0, 256, (2, c, h, w))
        s_in, zp = float(np.exp(rng.uniform(-5, 0))), int(rng.integers(0, 256))
        if total % 4 == 0:
            q = q // 64 * 2 + zp % 7  # exact halves
        x = qtensor(q, s_in, zp, channels_last=True)
        y = F.avg_pool2d(x, k, s, p, ceil_mode=ceil, count_include_pad=cip)
        args = (q, zp, s_in, y.q_scale(), y.q_zero_point(), k, s, p, ceil, cip)
        np.testing.assert_array_equal(y.int_repr().numpy(), aten_avg_pool_expected(*args, block))
        total += y.numel()
