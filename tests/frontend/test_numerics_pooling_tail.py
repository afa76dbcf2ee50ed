"""x86 / fbgemm adaptive average pooling of a channels-last tensor whose channel count is not a
multiple of 8: the last C mod 8 channels take fbgemm's scalar loop, `RNE(RN(RN(acc·M) + zp))`
(two float roundings), the others its vector rule. tensorgen lowers the scalar channels with a
single-rounding `requant` / `requant_fma` found by `numerics.single_rounding_for` on the
window's whole accumulator range, or refuses the layer in one line. Pinned here against
PyTorch's kernel on >= 1e5 random windows plus windows built to sit on exact halves (where
`RNE(acc·M) + zp` and the two-rounding rule part)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from tensorgen.errors import SpecError
from tensorgen.frontend import numerics
from tensorgen.mc import arith
from tensorgen.model import check_model, compile_model
from tensorgen.target import load_target

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def pool(q: np.ndarray, s: float, zp: int) -> np.ndarray:
    t = torch._make_per_tensor_quantized_tensor(torch.from_numpy(q.astype(np.uint8)), s, zp)
    t = t.contiguous(memory_format=torch.channels_last)
    return nn.functional.adaptive_avg_pool2d(t, 1).int_repr().numpy()[:, :, 0, 0].astype(int)


@pytest.mark.parametrize("eng", ["x86", "fbgemm"])
@pytest.mark.parametrize("kh, kw", [(2, 3), (3, 3), (4, 4), (6, 6), (7, 7)])
def test_scalar_channels_follow_the_fitted_single_rounding(engine, eng, kh, kw):
    engine(eng)
    rng = np.random.default_rng(kh * 10 + kw)
    n, checked, fitted = kh * kw, 0, 0
    for zp in (0, 1, 2, 3, 64, 127, 128, 200, 255):
        m = numerics.fbgemm_avgpool_multiplier(kh, kw, True, 0.05, 0.05)
        acc_range = np.arange(-zp * n, (255 - zp) * n + 1)
        want = arith.avgpool_fbgemm(acc_range, m, zp, 0, 255, scalar=True)
        fit = numerics.single_rounding_for(want, acc_range, m, zp, 0, 255)
        if fit is None:  # refused by the lowering: the two-rounding rule must differ from both
            assert not (arith.requantize(acc_range, m, zp, 0, 255) == want).all()
            continue
        fitted += 1
        fn, mult = fit
        # random windows, and windows whose sums sit on every multiple of n/2 (exact halves)
        q = rng.integers(0, 256, (2000, 13, kh, kw))
        sums = rng.integers(0, 255 * n // (n // 2 or 1) + 1, (2000, 13)) * (n // 2 or 1)
        base, rem = np.divmod(np.minimum(sums, 255 * n), n)
        ties = base[..., None] + (np.arange(n) < rem[..., None])
        q = np.concatenate([q, ties.reshape(2000, 13, kh, kw)])
        got = pool(q, 0.05, zp)[:, 8:]
        acc = q.sum(axis=(2, 3))[:, 8:] - zp * n
        apply = arith.avgpool_fbgemm if fn == "requant_fma" else arith.requantize
        assert np.array_equal(apply(acc, mult, zp, 0, 255), got)
        assert np.array_equal(arith.avgpool_fbgemm(acc, m, zp, 0, 255, scalar=True), got)
        checked += got.size
    assert fitted and checked >= 1e5 * fitted / 9


class _Pool(nn.Module):
    def __init__(self, c: int):
        super().__init__()
        self.conv = nn.Conv2d(3, c, 3, padding=1)
        self.relu = nn.ReLU()
        self.pool = nn.AdaptiveAvgPool2d(1)

    def forward(self, x):
        return self.pool(self.relu(self.conv(x)))


@pytest.mark.parametrize("c, size", [(13, 6), (5, 8), (21, 7), (3, 9)])
def test_x86_adaptive_pool_of_any_channel_count_is_bit_exact_or_refused(c, size, wide_inputs):
    torch.manual_seed(c)
    example = (torch.randn(1, 3, size, size),)
    try:
        cm = compile_model(_Pool(c).eval(), example, load_target("tg1"), engine="x86")
    except SpecError as err:  # an even window with no single rounding for the scalar loop
        assert "fbgemm's scalar loop" in str(err) and "\n" not in str(err)
        assert size % 2 == 0 and size & (size - 1)
        return
    assert any(layer.op == "adaptive_avg_pool2d" for layer in cm.graph.layers)
    for seed in range(3):
        comparison, _ = check_model(cm, wide_inputs(cm, seed, spread=2.0))
        assert comparison.exact, comparison.message
