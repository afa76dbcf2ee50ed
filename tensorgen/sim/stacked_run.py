"""Running a stacked plan (`tensorgen.sim.stacked.Plan`) over a chunk of its iterations: a
scratch row of each written memory per iteration, and each effect computed for every
iteration at once over those rows."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from tensorgen.sim import blocks, taps
from tensorgen.sim.batch import Piece, compact, reduce_into
from tensorgen.sim.boxes import dram_boxes, store_boxes, write_loaded

if TYPE_CHECKING:
    from tensorgen.sim.stacked import Effect, Plan, Ref


def run_chunk(plan: Plan, machine, binary, k: int, first: int) -> None:
    """Iterations [first, first + k) of the plan."""
    mem = machine.mem
    rows = {}
    for m, (lo, hi) in plan.hulls.items():
        rows[m] = np.empty((k + 1, hi - lo), np.uint8)
        rows[m][0] = mem[m][lo:hi]

    def array(r: Ref, writeable=False) -> np.ndarray:
        if r.mode == "shared":
            buf, lead, off = mem[r.mem], r.step, r.offset + r.step * first
        else:
            buf, lead = rows[r.mem], rows[r.mem].shape[1]
            off = r.offset - plan.hulls[r.mem][0] + (lead if r.mode == "cur" else 0)
        # one constructor, not a view and `as_strided` of it (4x the time); the rows and
        # the shared operands' extents are in bounds by construction (`plan`)
        return np.ndarray(
            (k, *r.shape), r.dtype, buffer=buf, offset=off, strides=(lead, *r.strides)
        )

    def locate(r: Ref, offset: int) -> tuple[np.ndarray, int, int]:
        """`array`'s buffer, byte of `offset` (in r's memory) in row 0, row stride."""
        if r.mode == "shared":
            return mem[r.mem], offset + r.step * first, r.step
        lead = rows[r.mem].shape[1]
        return (
            rows[r.mem],
            offset - plan.hulls[r.mem][0] + (lead if r.mode == "cur" else 0),
            lead,
        )

    skip = 0
    for i, e in enumerate(plan.effects):
        if i < skip:
            continue  # computed with the tap run it belongs to
        if i in plan.taps:
            end, t = plan.taps[i]
            if taps.run_stacked(plan.effects[i:end], t, array, locate, k, plan.scratch):
                skip = end
                continue
        _effect(e, array, machine, binary, k, first)
    for m, ranges in plan.written.items():
        lo0 = plan.hulls[m][0]
        for lo, hi in ranges:
            mem[m][lo:hi] = rows[m][-1, lo - lo0 : hi - lo0]


def _effect(e: Effect, array, machine, binary, k: int, first: int) -> None:
    """One effect for iterations [first, first + k): `array` gives its operands' views."""
    mem = machine.mem
    box = None
    if e.box is not None:
        t, origin, steps, shape = e.box
        box = (
            t,
            tuple(o + s * first for o, s in zip(origin, steps, strict=True)),
            steps,
            shape,
        )
    if e.kind == "load":
        write_loaded(array(e.refs[0], True), dram_boxes(binary, mem, box, k))
    elif e.kind == "chain":
        blocks.run_chain(e.refs[0], array, binary, mem, k, first)
    elif e.kind == "store":
        store_boxes(binary, mem, box, k, array(e.refs[0]))
    elif e.kind == "mm":
        pieces = [Piece(array(a), array(b), azp, bzp, term) for a, b, azp, bzp, term in e.refs[1:]]
        reduce_into(array(e.refs[0], True), pieces, e.accumulate, batch=k)
    elif e.kind == "sem":
        ins = binary.code[e.pc]
        fields = dict(ins.args)
        arrays = {id(fields[n]): array(r, n == "dst") for n, r in e.refs}
        ins.defn.execute(_Stacked(arrays), fields)
    else:
        _vector(e, array)


class _Stacked:
    """`isa.MachineState` over every iteration's views of one instruction at once, converting
    values as `state.Machine` does."""

    def __init__(self, arrays: dict[int, np.ndarray]) -> None:
        self.arrays = arrays

    def read(self, view) -> np.ndarray:
        arr = self.arrays[id(view)]
        return arr.astype(np.float32) if arr.dtype.kind == "f" else arr.astype(np.int64)

    def stored(self, view) -> np.ndarray:
        """`read` without the conversion: the values as held (`semantics._store`, `requant.vrequant`)."""
        return self.arrays[id(view)]

    destination = stored  # `Machine.destination`: the written view's array, every iteration's

    def write(self, view, values: np.ndarray) -> None:
        arr = self.arrays[id(view)]
        if values.dtype == arr.dtype and values.shape == arr.shape:
            arr[...] = values
            return
        values = np.broadcast_to(values, arr.shape)
        if arr.dtype.kind != "f" and values.dtype.kind in "iub":
            np.copyto(arr, values, casting="unsafe")  # wraps as through int64 (`Machine.write`)
            return
        arr[...] = (
            values.astype(np.float32)
            if arr.dtype.kind == "f"
            else values.astype(np.int64).astype(arr.dtype)
        )


def _vector(e: Effect, array) -> None:
    """`batch.VectorOp.run` for every iteration: int32 in place."""
    dst_ref, a_ref, b_ref = e.refs
    if b_ref is not None:
        b = compact(array(b_ref)).astype(np.int32)  # a broadcast weight: a few values cast
    else:
        b = np.int32(np.int64(e.imm).astype(np.int32))
    prod = np.multiply(array(a_ref), b, dtype=np.int32)  # in int32: wraps as VectorOp.run
    dst = array(dst_ref, True)
    if e.kind == "VMAC":
        np.add(dst, prod, out=dst)
    else:
        dst[...] = prod


# --- planning ----------------------------------------------------------------------------
