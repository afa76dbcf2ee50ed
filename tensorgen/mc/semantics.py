"""The numpy semantics of the instructions (`isa.INSTRUCTIONS` binds each to its definition),
over the `MachineState` the simulator implements. Integer results wrap to their view's dtype;
an instruction whose operands are all int8, uint8 or int32 computes in int32 (`_narrow`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import numpy as np

from tensorgen.mc import arith
from tensorgen.mc.operands import Box, View


class MachineState(Protocol):
    """What the semantics of an instruction may use; implemented by the simulator."""

    def read(self, view: View) -> np.ndarray: ...  # int64 values, bounds-checked

    def write(self, view: View, values: np.ndarray) -> None: ...  # wraps to the view's dtype

    def load_box(self, box: Box) -> np.ndarray: ...  # pads out-of-bounds elements

    def store_box(self, box: Box, values: np.ndarray) -> None: ...

    def read_loop(self, view: View) -> np.ndarray: ...  # values of all iterations of the loop nest


def _wrap32(x: np.ndarray) -> np.ndarray:
    return x.astype(np.int64).astype(np.int32).astype(np.int64)


# --- semantics --------------------------------------------------------------------------


def _load(state: MachineState, a) -> None:
    state.write(a["dst"], state.load_box(a["src"]))


def _store(state: MachineState, a) -> None:
    # a state's `stored` (the simulator's) reads the values as held, bounds-checked like `read`:
    # store_box wraps them to the tensor's dtype just as it wraps read's int64 ones, without
    # the round trip through int64
    read = getattr(state, "stored", None) or state.read
    state.store_box(a["dst"], read(a["src"]))


def _exact_matmul(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """x @ w of int64 matrices, exact modulo 2**32 (all the int32 accumulator keeps): float64
    BLAS while every |sum| < 2**53 (real operands and zero points: far below it), else
    unsigned 64-bit integers, whose products and sums wrap modulo 2**64 (crafted zero points)."""
    if x.size and w.size:
        bound = int(np.abs(x).max()) * int(np.abs(w).max()) * x.shape[-1]
        if bound < 1 << 53:
            return (x.astype(np.float64) @ w.astype(np.float64)).astype(np.int64)
    return (x.astype(np.uint64) @ w.astype(np.uint64)).astype(np.uint32).astype(np.int64)


def _matmul(state: MachineState, a) -> None:
    x = state.read(a["a"]) - a["a_zp"]
    w = state.read(a["b"]) - a["b_zp"]
    # a is (M1, ..., K): its leading dimensions all stream through the array as M rows
    prod = _exact_matmul(x.reshape(-1, x.shape[-1]), w).reshape(a["acc"].shape)
    if a["accumulate"]:
        prod = prod + state.read(a["acc"])
    state.write(a["acc"], _wrap32(prod))


def _matmul_loop(state: MachineState, a) -> None:
    # A nest of hardware loops around one accumulating MATMUL whose acc does not move: the loop
    # axes are more reduction depth, so the whole nest is one BLAS call over (M, loops*K).
    x = state.read_loop(a["a"]) - a["a_zp"]
    w = state.read_loop(a["b"]) - a["b_zp"]
    ms = a["a"].shape[:-1]
    loops = x.shape[: x.ndim - len(ms) - 1]
    m, k, n = int(np.prod(ms)), x.shape[-1], w.shape[-1]
    x2 = np.moveaxis(x.reshape(*loops, m, k), len(loops), 0).reshape(m, -1)
    prod = _exact_matmul(x2, w.reshape(-1, n)).reshape(a["acc"].shape)
    state.write(a["acc"], _wrap32(state.read(a["acc"]) + prod))


def _vmac_loop(state: MachineState, a) -> None:
    prod = state.read_loop(a["a"]) * state.read_loop(a["b"])
    total = prod.reshape(-1, *a["dst"].shape).sum(axis=0)
    state.write(a["dst"], _wrap32(state.read(a["dst"]) + total))


# dtypes whose values int32 holds: an instruction over them computes in int32 (`_narrow`)
_INT32_HOLDS = frozenset(("int8", "uint8", "int32"))


def _narrow(state: MachineState, *views) -> Callable | None:
    """The simulator's `stored` (the values as held, no int64 copy) when every view is of a
    dtype int32 holds: int32 arithmetic then gives the integers int64 arithmetic wrapped to
    int32 gives (add, subtract, multiply and shift left wrap modulo 2**32 alike; max, min,
    shift right and clamp stay in range), and the write wraps them to dst's dtype as before."""
    stored = getattr(state, "stored", None)
    if stored is None or any(v is not None and v.dtype not in _INT32_HOLDS for v in views):
        return None
    return stored


def _binary(fn: Callable) -> Callable:
    def run(state: MachineState, a) -> None:
        stored = _narrow(state, a["dst"], a["a"], a["b"])
        if stored is not None:
            x = stored(a["a"])
            y = stored(a["b"]) if a["b"] is not None else np.int32(a["imm"])
            state.write(a["dst"], fn(x, y, dtype=np.int32))
            return
        x = state.read(a["a"])
        y = state.read(a["b"]) if a["b"] is not None else np.int64(a["imm"])
        state.write(a["dst"], _wrap32(fn(x, y)))

    return run


def _vmac(state: MachineState, a) -> None:
    stored = _narrow(state, a["dst"], a["a"], a["b"])
    if stored is not None:
        acc = stored(a["dst"]).astype(np.int32)
        prod = np.multiply(stored(a["a"]), stored(a["b"]), dtype=np.int32)
        state.write(a["dst"], np.add(acc, prod, out=acc))
        return
    acc = state.read(a["dst"])
    state.write(a["dst"], _wrap32(acc + state.read(a["a"]) * state.read(a["b"])))


def _vfill(state: MachineState, a) -> None:
    dst = a["dst"]
    dt = np.int32 if dst.dtype in _INT32_HOLDS else np.int64  # imm is an i32: int32 holds it
    state.write(dst, np.full(dst.shape, a["imm"], dtype=dt))


def _vclamp(state: MachineState, a) -> None:
    stored = _narrow(state, a["dst"], a["a"])
    if stored is not None:
        x = stored(a["a"]).astype(np.int32)
        state.write(a["dst"], np.clip(x, np.int32(a["lo"]), np.int32(a["hi"]), out=x))
        return
    state.write(a["dst"], np.clip(state.read(a["a"]), a["lo"], a["hi"]))


def _vlut(state: MachineState, a) -> None:
    stored = _narrow(state, a["dst"], a["a"], a["table"])
    if stored is not None:  # the table's own values, indexed by each element's low byte
        table, x = stored(a["table"]), stored(a["a"])
        idx = x.view(np.uint8) if x.itemsize == 1 else np.bitwise_and(x, 0xFF, dtype=np.int32)
        state.write(a["dst"], table[idx])
        return
    table = state.read(a["table"])  # the 256 entries, verified to be one int8/uint8 row
    state.write(a["dst"], table[state.read(a["a"]) & 0xFF])


def _amount(y):
    """A shift amount clamped to [0, 31], of y's dtype as np.clip gives it: an immediate's
    (a numpy scalar) without np.clip's Python wrapper, ~4 us of ~5 a shift."""
    if isinstance(y, np.ndarray):
        return np.clip(y, 0, 31)
    return y.dtype.type(min(max(int(y), 0), 31))


def _rshr(x, y, dtype=None):
    return arith.rounding_shift_right(x, _amount(y))


def _shl(x, y, dtype=None):
    return np.left_shift(x, _amount(y), dtype=dtype)


def _shr(x, y, dtype=None):
    return np.right_shift(x, _amount(y), dtype=dtype)
