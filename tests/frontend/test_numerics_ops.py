"""The rules of the data-movement operators, pinned against PyTorch (torch 2.13, CPU): `cat` of
inputs with different quantization parameters, on 1e5+ random elements per case and on
constructed cases (every code, extreme scale ratios, ties), under qnnpack and x86, contiguous
and channels-last (quantized convs produce channels-last tensors)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tensorgen.frontend import numerics
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
