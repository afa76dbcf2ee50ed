"""The reference's own fbgemm float rules (tensorgen/reference/fbgemm.py), pinned against
PyTorch's quantized kernels directly, never against the compiler's `mc.arith`."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
import torch

from tensorgen.reference import fbgemm

pytestmark = pytest.mark.filterwarnings(
    "ignore:torch.quantize_per_tensor, torch.quantize_per_channel:UserWarning"
)

F32 = np.float32


@pytest.fixture
def x86_engine():
    saved = torch.backends.quantized.engine
    torch.backends.quantized.engine = "x86"
    yield
    torch.backends.quantized.engine = saved


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")
def test_round_f32_is_numpy_float32_of_a_double():
    """A double is rounded once to float32 by numpy: the same as rounding its exact value."""
    rng = np.random.default_rng(1)
    values = np.concatenate(  # normal, subnormal, overflowing (inf), signed zero
        [rng.standard_normal(2000) * 10.0 ** rng.integers(-45, 39, 2000), [1e-46, 3.5e38, -0.0]]
    )
    for v in values:
        assert F32(fbgemm.round_f32(Fraction(float(v)))) == F32(v), v


def test_fma_rounds_once():
    """Cases where a*b + c in float64, then float32, double-rounds: the exact value lies just
    past a float32 midpoint that float64 rounds onto."""
    a = F32(1 + 2**-12)
    exact = Fraction(float(a)) ** 2 + Fraction(2**-60)
    got = fbgemm.fma_f32(torch.tensor(a), torch.tensor(a), torch.tensor(F32(2**-60)))
    assert float(got) == fbgemm.round_f32(exact)
    naive = F32(np.float64(a) * np.float64(a) + np.float64(2**-60))
    assert float(got) != float(naive)  # the case separates the two


def test_add_matches_quantized_add(x86_engine):
    """quantized::add on the AVX2 loop's elements (a multiple of every vector block, one thread)."""
    rng = np.random.default_rng(2)
    torch.set_num_threads(1)
    for _ in range(30):
        s_a, s_b = (float(v) for v in rng.uniform(1e-3, 0.1, 2))
        s_out = float(rng.uniform(max(s_a, s_b) / 8, 2 * (s_a + s_b)))
        zp_a, zp_b, zp_out = (int(v) for v in rng.integers(0, 256, 3))
        qa, qb = rng.integers(0, 256, 4096), rng.integers(0, 256, 4096)
        ta = torch._make_per_tensor_quantized_tensor(
            torch.from_numpy(qa.astype(np.uint8)), s_a, zp_a
        )
        tb = torch._make_per_tensor_quantized_tensor(
            torch.from_numpy(qb.astype(np.uint8)), s_b, zp_b
        )
        want = torch.ops.quantized.add(ta, tb, s_out, zp_out).int_repr().to(torch.int64)
        sa, sb = F32(s_a), F32(s_b)
        got = fbgemm.add_fbgemm(
            torch.from_numpy(qa),
            torch.from_numpy(qb),
            sa,
            sa * F32(-zp_a),
            sb,
            sb * F32(-zp_b),
            F32(1) / F32(s_out),
            zp_out,
        )
        assert torch.equal(got, want)


@pytest.mark.parametrize("hw", [6, 10, 7])
def test_requant_fma_matches_channels_last_average_pool(x86_engine, hw):
    """adaptive_avg_pool2d to 1x1 on channels_last data, 32 channels (the vector channels):
    requant_fma of the zero-point-corrected window sum with M = RN(1 / RN(1 / RN(1 / n)))."""
    rng = np.random.default_rng(3)
    for _ in range(4):
        s, zp = float(rng.uniform(1e-3, 1)), int(rng.integers(0, 256))
        q = rng.integers(0, 256, (64, 32, hw, hw))
        t = torch._make_per_tensor_quantized_tensor(torch.from_numpy(q.astype(np.uint8)), s, zp)
        y = torch.nn.functional.adaptive_avg_pool2d(
            t.contiguous(memory_format=torch.channels_last), 1
        )
        m = F32(1) / (F32(1) / (F32(1) / F32(hw * hw)))
        acc = torch.from_numpy(q.sum(axis=(2, 3)) - zp * hw * hw)
        got = fbgemm.requant_fma(acc, float(m), zp, 0, 255)
        assert torch.equal(got, y.int_repr()[:, :, 0, 0].to(torch.int64))
