"""The sums of shifted products (`tensorgen.sim.taps`): against int64 sums over random views,
weights and stacks; refused where a partial sum could overflow int32 or the path does not
apply; and taken by the simulator's VMUL/VMAC runs (stepped, one nest at once, and
replayed), with stepping's outputs and every counter."""

from __future__ import annotations

import math

import numpy as np
import pytest
import yaml
from hypothesis import event, given, settings
from hypothesis import strategies as st

from tensorgen.mc.binary import assemble
from tensorgen.sim import products, taps
from tensorgen.target import ISA_DIR, target_from_dict

DTYPES = {"int8": (-128, 128), "uint8": (0, 256)}


@st.composite
def tap_runs(draw):
    ndim = draw(st.integers(1, 3))
    shape = tuple(draw(st.integers(1, 5)) for _ in range(ndim))
    strides = [draw(st.sampled_from([1, 1, 2, 3]))]  # contiguous, or a strided conv's taps
    for n in reversed(shape[1:]):  # rows at least as long as the row below, or longer
        strides.insert(0, strides[0] * n + draw(st.integers(0, 3)))
    extent = sum((n - 1) * s for n, s in zip(shape, strides, strict=True)) + 1
    bases = draw(st.lists(st.integers(0, extent), min_size=2, max_size=9))  # overlapping
    count = draw(st.integers(1, 3))
    dtype = draw(st.sampled_from(sorted(DTYPES)))
    per_row = draw(st.booleans())  # a weight per row of the stack, or one scalar each
    return shape, tuple(strides), bases, count, dtype, per_row


@settings(max_examples=200, deadline=None)
@given(run=tap_runs(), seed=st.integers(0, 2**16))
def test_tap_sum_is_the_int64_sum(run, seed: int) -> None:
    shape, strides, bases, count, dtype, per_row = run
    rng = np.random.default_rng(seed)
    t = taps.plan(shape, strides, bases, np.dtype(dtype))
    inner = [s for n, s in zip(shape, strides, strict=True) if n > 1][-1:]
    extent = sum((n - 1) * s for n, s in zip(shape, strides, strict=True)) + 1
    sparse = max(bases) - min(bases) + extent > len(bases) * math.prod(shape)
    if inner in ([], [1]):
        assert (t is None) == sparse  # sparse views: refused
    if t is None:
        event("refused")  # a strided one: its planes' casts would read more than its taps
        return
    event(f"phases {t.phases}")
    lead = t.span + int(rng.integers(0, 5))
    lo, hi = DTYPES[dtype]
    buf = rng.integers(lo, hi, 3 + count * lead).astype(dtype).view(np.uint8)
    first = 3
    if per_row:
        weights = [rng.integers(-128, 128, (count,) + (1,) * len(shape)) for _ in bases]
    else:
        weights = [np.int32(rng.integers(-(2**15), 2**15)) for _ in bases]
    if not taps.bound(t, weights):
        return
    event("summed")
    got = taps.tap_sum(t, buf, first, count, lead, weights)
    # into kept buffers (a plan's), twice -- the second time over other bytes: the same sums
    scratch, other = products.Scratch(), buf.copy()
    other[first:] = rng.integers(0, 256, len(other) - first)
    kept_other = taps.tap_sum(t, other, first, count, lead, weights, scratch).copy()
    kept = taps.tap_sum(t, buf, first, count, lead, weights, scratch)
    np.testing.assert_array_equal(kept, got)
    np.testing.assert_array_equal(kept_other, taps.tap_sum(t, other, first, count, lead, weights))
    want = np.zeros((count, *shape), np.int64)
    for b, w in zip(bases, weights, strict=True):
        view = np.ndarray(
            (count, *shape),
            dtype,
            buffer=buf,
            offset=first + b - min(bases),
            strides=(lead, *strides),
        )
        want += view.astype(np.int64) * np.asarray(w, np.int64)
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, want)


def test_a_sum_that_could_overflow_int32_is_refused() -> None:
    t = taps.plan((4,), (1,), [0, 1], np.dtype(np.int8))
    assert taps.bound(t, [np.int32(2**23), np.int32(2**23 - 1)])
    assert not taps.bound(t, [np.int32(2**23), np.int32(2**23)])  # 128 * 2**24 = 2**31
    assert not taps.bound(t, [np.array([[1], [2**24]]), np.array([[1], [0]])])


def test_what_the_path_does_not_take() -> None:
    i8 = np.dtype(np.int8)
    assert taps.plan((4, 4), (8, 2), [0, 1], i8).phases == 2  # a strided row: de-interleaved
    assert taps.plan((2, 4, 4), (41, 8, 2), [0, 1], i8).leading == 1  # planes 41 bytes apart
    assert taps.plan((2, 4, 4), (400, 8, 2), [0, 1], i8) is None  # two planes far apart
    assert taps.plan((4,), (1,), [0], i8) is None  # one tap
    assert taps.plan((4,), (1,), [0, 1], np.dtype(np.int32)) is None
    assert taps.plan((4, 4), (-4, 1), [0, 1], i8) is None
    assert taps.plan((2, 4), (100, 1), [0, 1], i8) is None  # sparse: 105 bytes for 16 reads
    t = taps.plan((4,), (1,), [0, 2], i8)
    buf = np.zeros(8, np.uint8)
    assert taps.tap_sum(t, buf, 3, 1, 0, [1, 1]) is None  # the span leaves the buffer
    assert taps.tap_sum(t, buf, 2, 1, 0, [1, 1]) is not None


TARGET = target_from_dict(yaml.safe_load((ISA_DIR / "tiny.yaml").read_text()), "tiny.yaml")
DEPTHWISE = """.target tiny {hash}
.dram {dram}
.tensor X {xd} 16x16 input dram=0 pad=0
.tensor W int8 16x4 input dram=256 pad=0
.tensor D int32 {rows}x4 output dram=320 pad=0
LOAD dst=spad:{xd}@0[16x16:16,1] src=X(0,0)[16x16]
LOAD dst=spad:int8@512[16x4:4,1] src=W(0,0)[16x4] signal=EX
SYNC queue=1 wait=LD
{body}
"""


def _depthwise(xd: str, outer: int, weight: str, stride: int = 1) -> str:
    """A 3x3 depthwise tap nest (a VMUL, then a LOOP/LOOPB box of VMACs but its corner),
    in a LOOP of `outer` blocks when `outer`, each a row further down X and stored; with
    `stride` 2, a strided convolution's (every other row and column of X)."""
    d = 1 if outer else 0
    row, dst = ("+16*L0", "acc:int32@0+64*L0[4x4:4,1]") if outer else ("", "acc:int32@0[4x4:4,1]")
    b = "[4x4:0,0]" if weight == "tap" else "[4x4:4,1]"
    a = f"[4x4:{16 * stride},{stride}]"
    bs = 1 if weight == "tap" else 4
    ex = [
        f"VMUL dst={dst} a=spad:{xd}@0{row}{a} b=spad:int8@512{b} imm=0",
        "LOOP count=3 body=2",
        f"LOOPB lower=B(0/1;1-L{d}/1) upper=B(2/1) body=1",
        f"VMAC dst={dst} a=spad:{xd}@0{row}+16*L{d}+L{d + 1}{a} "
        f"b=spad:int8@512+{3 * bs}*L{d}+{bs}*L{d + 1}{b}",
        "SYNC queue=1 signal=ST",
        f"STORE dst=D({'4*L0' if outer else '0'},0)[4x4] src={dst} wait=EX",
    ]
    if outer:
        ex = [f"LOOP count={outer} body={len(ex)}", *ex]
    rows = max(outer, 1) * 4
    body = "\n".join(ex)
    return DEPTHWISE.format(
        hash=TARGET.hash.hex(), dram=320 + 16 * rows, xd=xd, rows=rows, body=body
    )


@pytest.mark.parametrize("xd", ["int8", "uint8"])
@pytest.mark.parametrize("outer", [0, 2, 8])
@pytest.mark.parametrize("weight", ["tap", "tile"])
@pytest.mark.parametrize("stride", [1, 2])
def test_the_simulator_s_tap_runs_take_it_and_equal_stepping(
    xd: str, outer: int, weight: str, stride: int, monkeypatch, outcome
) -> None:
    if stride == 2 and outer == 8:
        outer = 6  # the last block's taps stay inside X
    binary = assemble(_depthwise(xd, outer, weight, stride))
    rng = np.random.default_rng(3)
    lo, hi = DTYPES[xd]
    inputs = {
        "X": rng.integers(lo, hi, (16, 16)).astype(xd),
        "W": rng.integers(-128, 128, (16, 4)).astype(np.int8),
    }
    calls, real = [], taps.tap_sum
    monkeypatch.setattr(taps, "tap_sum", lambda *a: calls.append(a[3]) or real(*a))
    fast = outcome(binary, inputs, TARGET, True)
    assert calls  # the run took the tap sum (stacked iterations: tests/sim/test_replay.py)
    assert fast[0] != "error" and fast == outcome(binary, inputs, TARGET, False)
    monkeypatch.setattr(taps, "ENABLED", False)
    assert outcome(binary, inputs, TARGET, True) == fast  # and tap by tap, the same
    # and the depthwise sum itself, in int64
    x, w = inputs["X"].astype(np.int64), inputs["W"].astype(np.int64).ravel()
    for blk in range(max(outer, 1)):
        want = np.zeros((4, 4), np.int64)
        for i in range(3):
            for j in range(3):
                wt = w[3 * i + j] if weight == "tap" else w[12 * i + 4 * j :][:16].reshape(4, 4)
                rows, cols = (
                    slice(blk + i, blk + i + 4 * stride, stride),
                    slice(j, j + 4 * stride, stride),
                )
                want += x[rows, cols] * wt
        np.testing.assert_array_equal(np.array(fast[0]["D"])[4 * blk : 4 * blk + 4], want)


def test_narrow_weights_are_bounded_by_their_dtype_alone() -> None:
    """int8/uint8/int16 weights pass `bound` without a look at their values when the taps
    times the dtype's widest weight cannot reach 2**31, and only then: the worst values
    agree with the exact sum, and too many int16 taps fall through to it."""
    t = taps.plan((4,), (1,), [0, 1], np.dtype(np.uint8))
    worst = [np.full((3, 1), -128, np.int8)] * 9
    assert taps.bound(t, worst)
    assert 9 * 128 * 255 < 2**31
    wide = [np.full((3, 1), -(2**15), np.int16)] * 300  # 300 * 2**15 * 255 > 2**31: exact path
    assert not taps.bound(t, wide)
    assert taps.bound(t, [np.zeros((3, 1), np.int16)] * 300)  # exact path: all zeros
