"""VREQUANT's int32/float32 kernel (`arith.requantize_int32`, what the simulator runs on int32
accumulators) against the requantization rule itself (`arith.requantize`, pinned against
PyTorch by tests/frontend/test_numerics.py): the same integers on random and extreme
accumulators, scales (tiny, >= 1, huge, infinite, NaN, negative) and bounds."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from tensorgen.mc import arith

SCALES = st.one_of(
    st.floats(1e-12, 1e-1),
    st.floats(0.5, 4.0),
    st.floats(1e3, 1e12),
    st.sampled_from([0.0, -0.0, -0.37, 1.0, float("inf"), float("-inf"), float("nan"), 2.0**-24]),
    # the largest float32 below 1 (either sign): no range test, the extremes still in int32
    st.sampled_from([1 - 2.0**-24, -(1 - 2.0**-24)]),
)
EXTREMES = np.array([-(2**31), -(2**31) + 1, -1, 0, 1, 2**24 + 1, 2**31 - 129, 2**31 - 1], np.int32)


@settings(max_examples=300, deadline=None)
@given(
    scale=SCALES,
    zp=st.integers(-300, 300),
    lo=st.integers(-200, 260),
    width=st.integers(-5, 300),
    seed=st.integers(0, 2**16),
)
def test_the_int32_kernel_gives_the_rule_s_integers(scale, zp, lo, width, seed) -> None:
    rng = np.random.default_rng(seed)
    x = np.concatenate([EXTREMES, rng.integers(-(2**31), 2**31, 500).astype(np.int32)])
    x = np.concatenate([x, rng.integers(-5000, 5000, 500).astype(np.int32)]).reshape(3, -1)
    s, hi = np.float32(scale), lo + width  # width < 0: an empty range, clamped alike
    with np.errstate(invalid="ignore", over="ignore"):
        want = arith.requantize(x, s, zp, lo, hi)
        got = arith.requantize_int32(x, s, zp, lo, hi)
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got.astype(np.int64), want)
    for dt in (np.int8, np.uint8):  # a destination's dtype: direct when it holds [lo, hi]
        narrow = arith.requantize_int32(x, s, zp, lo, hi, dt)
        info = np.iinfo(dt)
        fits = info.min <= min(lo, hi) and max(lo, hi) <= info.max
        assert narrow.dtype == (dt if fits else np.int32)
        np.testing.assert_array_equal(narrow.astype(np.int64), want)
        if fits:  # written into a destination of that dtype: the same integers
            out = np.full(x.shape, 7, dt)
            assert arith.requantize_int32(x, s, zp, lo, hi, dt, out=out) is out
            np.testing.assert_array_equal(out.astype(np.int64), want)
    inplace = x.copy()  # an int32 VREQUANT onto its own operand: x read before it is written
    with np.errstate(invalid="ignore", over="ignore"):
        arith.requantize_int32(inplace, s, zp, lo, hi, np.int32, out=inplace)
    np.testing.assert_array_equal(inplace.astype(np.int64), want)


def test_scales_that_overflow_come_out_as_the_lower_bound() -> None:
    """A product outside int32 converts to INT32_MIN, so it is `lo` whatever its sign."""
    x = np.array([2**31 - 1, -(2**31), 5, 0], np.int32)
    got = arith.requantize_int32(x, np.float32(1e10), 3, -10, 20)
    np.testing.assert_array_equal(got, [-10, -10, -10, 3])
    np.testing.assert_array_equal(got, arith.requantize(x, np.float32(1e10), 3, -10, 20))


def test_an_empty_view_requantizes_to_nothing() -> None:
    for scale in (0.5, 3.0, float("nan")):
        got = arith.requantize_int32(np.zeros((0, 4), np.int32), np.float32(scale), 1, 0, 255)
        assert got.shape == (0, 4)
