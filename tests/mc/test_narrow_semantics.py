"""The vector instructions' int32 paths (`semantics._narrow`: the simulator's values as held, int32
arithmetic) against plain Python integers, element by element, and against the int64 path,
for every dtype pair, extreme values, out-of-range shifts and immediates."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from tensorgen.mc import arith, isa

RANGES = {"int8": (-128, 127), "uint8": (0, 255), "int32": (-(2**31), 2**31 - 1)}


@dataclass(frozen=True, eq=False)
class FakeView:
    dtype: str
    shape: tuple[int, ...]


class PlainState:
    """Arrays by view; `write` keeps the low bits of each integer, element by element."""

    def __init__(self, arrays: dict, narrow: bool) -> None:
        self.arrays = arrays
        if narrow:
            self.stored = lambda v: self.arrays[v]

    def read(self, v) -> np.ndarray:
        return self.arrays[v].astype(np.int64)

    def write(self, v, values) -> None:
        values = np.broadcast_to(np.asarray(values), v.shape)
        out = self.arrays[v]
        for i, x in enumerate(values.tolist()):
            out[i] = _wrap(int(x), v.dtype)


def _wrap(x: int, dtype: str) -> int:
    lo, hi = RANGES[dtype]
    return (x - lo) % (hi - lo + 1) + lo


def _round_shift(x: int, s: int) -> int:
    """x / 2**s rounded to nearest, ties away from zero (floor division and the remainder)."""
    q, r = divmod(x, 1 << s)
    if 2 * r > (1 << s) or (2 * r == (1 << s) and x > 0):
        q += 1
    return q


def _clamp(y: int) -> int:
    return min(max(y, 0), 31)


REFERENCE = {
    "VADD": lambda x, y: _wrap(x + y, "int32"),
    "VSUB": lambda x, y: _wrap(x - y, "int32"),
    "VMUL": lambda x, y: _wrap(x * y, "int32"),
    "VMAX": max,
    "VMIN": min,
    "VSHL": lambda x, y: _wrap(x << _clamp(y), "int32"),
    "VSHR": lambda x, y: x >> _clamp(y),
    "VSHRR": lambda x, y: _round_shift(x, _clamp(y)),
}


def _values(draw, dtype: str, n: int) -> np.ndarray:
    lo, hi = RANGES[dtype]
    edge = st.sampled_from([lo, hi, lo + 1, hi - 1, 0, -1 if lo < 0 else 1, 1])
    vals = draw(st.lists(st.one_of(edge, st.integers(lo, hi)), min_size=n, max_size=n))
    return np.array(vals, dtype=dtype)


dtypes = st.sampled_from(sorted(RANGES))


def _run(mnemonic: str, arrays: dict, fields: dict, narrow: bool) -> dict:
    arrays = {v: a.copy() for v, a in arrays.items()}
    isa.BY_MNEMONIC[mnemonic].execute(PlainState(arrays, narrow), fields)
    return arrays


@settings(max_examples=300, deadline=None)
@given(
    data=st.data(),
    mnemonic=st.sampled_from(sorted(REFERENCE)),
    dts=st.tuples(dtypes, dtypes, dtypes),
    use_imm=st.booleans(),
    imm=st.one_of(st.integers(-(2**31), 2**31 - 1), st.integers(-3, 40)),
)
def test_binary_int32_path_equals_python_integers(data, mnemonic, dts, use_imm, imm) -> None:
    n = data.draw(st.integers(1, 12))
    dst, a, b = FakeView(dts[0], (n,)), FakeView(dts[1], (n,)), FakeView(dts[2], (n,))
    x = _values(data.draw, dts[1], n)
    if mnemonic == "VSHRR":  # its shift is one immediate (`arith.rounding_shift_right`)
        use_imm = True
    y = np.full(n, imm, np.int64) if use_imm else _values(data.draw, dts[2], n)
    arrays = {dst: np.zeros(n, dts[0]), a: x}
    if not use_imm:
        arrays[b] = y.astype(dts[2])
    fields = {"dst": dst, "a": a, "b": None if use_imm else b, "imm": imm}
    fast = _run(mnemonic, arrays, fields, True)
    want = [_wrap(REFERENCE[mnemonic](int(p), int(q)), dts[0]) for p, q in zip(x, y, strict=True)]
    assert fast[dst].tolist() == want
    assert _run(mnemonic, arrays, fields, False)[dst].tolist() == want


@settings(max_examples=200, deadline=None)
@given(data=st.data(), dts=st.tuples(dtypes, dtypes, dtypes, dtypes))
def test_vmac_vclamp_vfill_vlut_int32_paths(data, dts) -> None:
    n = data.draw(st.integers(1, 10))
    dst, a, b = FakeView(dts[0], (n,)), FakeView(dts[1], (n,)), FakeView(dts[2], (n,))
    acc, x, y = (_values(data.draw, dt, n) for dt in dts[:3])
    arrays = {dst: acc, a: x, b: y}
    want = [_wrap(int(p) + int(q) * int(r), "int32") for p, q, r in zip(acc, x, y, strict=True)]
    want = [_wrap(v, dts[0]) for v in want]
    for narrow in (True, False):
        got = _run("VMAC", arrays, {"dst": dst, "a": a, "b": b}, narrow)[dst].tolist()
        assert got == want
    lo = data.draw(st.integers(-(2**31), 2**31 - 1))
    hi = data.draw(st.integers(-(2**31), 2**31 - 1))
    want = [_wrap(min(max(int(q), lo), hi), dts[0]) for q in x]
    for narrow in (True, False):
        got = _run("VCLAMP", arrays, {"dst": dst, "a": a, "lo": lo, "hi": hi}, narrow)[dst]
        assert got.tolist() == want
        got = _run("VFILL", arrays, {"dst": dst, "imm": lo}, narrow)[dst]
        assert got.tolist() == [_wrap(lo, dts[0])] * n
    tdt = "int8" if dts[3] == "int32" else dts[3]  # a table is one int8/uint8 row
    table = FakeView(tdt, (256,))
    arrays[table] = _values(data.draw, tdt, 256)
    want = [_wrap(int(arrays[table][int(q) & 0xFF]), dts[0]) for q in x]
    for narrow in (True, False):
        got = _run("VLUT", arrays, {"dst": dst, "a": a, "table": table}, narrow)[dst]
        assert got.tolist() == want


@settings(max_examples=200, deadline=None)
@given(data=st.data(), dtype=dtypes, shift=st.integers(0, 31))
def test_rounding_shift_right_int32_arrays(data, dtype, shift) -> None:
    x = _values(data.draw, dtype, data.draw(st.integers(1, 16)))
    got = arith.rounding_shift_right(x, shift)
    assert got.dtype == np.int32
    assert got.tolist() == [_round_shift(int(v), shift) for v in x]
    assert arith.rounding_shift_right(x.astype(np.int64), shift).tolist() == got.tolist()
