"""The simulated machine's state (`isa.MachineState`): memories and the accesses of the
instruction being executed, for the instruction semantics of `tensorgen.mc.isa`.

Every access is bounds-checked and recorded in `touched` (memory, first byte, end, written)
for the simulator's hazard checks (`tensorgen.sim.machine`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from tensorgen.errors import SimulatorError
from tensorgen.mc.binary import Binary
from tensorgen.mc.operands import ITEMSIZE, Box, View
from tensorgen.sim.batch import Decoded
from tensorgen.sim.boxes import copy_values
from tensorgen.target import Target


def _values(arr: np.ndarray) -> np.ndarray:
    """What an instruction computes with: int64 for integer memory (wrapped again on write),
    float32 as it is for float memory (the quantize and dequantize units)."""
    return arr.astype(np.float32) if arr.dtype.kind == "f" else arr.astype(np.int64)


def _eval(aff, counters: tuple[int, ...]) -> int:
    """`LoopAffine.eval` (an IndexError for a counter of no loop around it, as it gives)."""
    if len(aff.coefs) > len(counters):
        return aff.eval(counters)
    v = aff.const
    for c, n in zip(aff.coefs, counters, strict=False):
        v += c * n
    return v


# places kept per decoded LOAD or STORE (`Transfer.places`): beyond this many, not kept
MAX_PLACES = 4096


@dataclass(frozen=True)
class Transfer:
    """A LOAD or STORE decoded once (`Machine.transfer`): its on-chip view, its DRAM tensor,
    and its box's origin as affine coefficients per dimension. Only for a view of the box's
    shape and the tensor's dtype, outside the DRAM, whose tensor's pad the dtype holds: what
    its semantics (`load_box` then `write`, `stored` then `store_box`) then do is a copy
    between two views, and a fill of the pad for a LOAD's halo."""

    load: bool
    view: Decoded
    tensor: int
    consts: tuple[int, ...]
    coefs: tuple[tuple[int, ...], ...]  # per dimension of the box
    levels: int  # loop counters the origin reads
    shape: tuple[int, ...]
    dims: tuple[int, ...]  # the tensor's shape
    pad: int
    # `Machine.transfer`'s places by loop counters, kept with the binary's decode (`static`)
    places: dict = field(default_factory=dict, compare=False, repr=False)

    @staticmethod
    def of(ins, binary: Binary) -> Transfer | None:
        if ins.mnemonic not in ("LOAD", "STORE"):
            return None
        f, load = dict(ins.args), ins.mnemonic == "LOAD"
        view, box = (f.get("dst"), f.get("src")) if load else (f.get("src"), f.get("dst"))
        if not isinstance(view, View) or not isinstance(box, Box):
            return None
        if not 0 <= box.tensor < len(binary.tensors) or view.mem == "dram":
            return None
        t = binary.tensors[box.tensor]
        dt = np.dtype(t.dtype)
        if len(box.shape) != len(t.shape) or tuple(view.shape) != tuple(box.shape):
            return None
        if view.dtype != t.dtype or (
            dt.kind != "f" and not np.iinfo(dt).min <= t.pad <= np.iinfo(dt).max
        ):
            return None  # the semantics convert: they run
        if dt.kind == "f" and dt != np.float32:
            return None
        return Transfer(
            load,
            Decoded.of(view),
            box.tensor,
            tuple(a.const for a in box.origin),
            tuple(a.coefs for a in box.origin),
            max((len(a.coefs) for a in box.origin), default=0),
            tuple(box.shape),
            tuple(t.shape),
            t.pad,
        )


class _Accesses:
    """An `isa.MachineState` that records the views an instruction's semantics read and write,
    in order, computing on zeros (`access_pattern`)."""

    def __init__(self) -> None:
        self.accesses: list[tuple[View, bool]] = []

    def _zeros(self, view: View) -> np.ndarray:
        return np.zeros(view.shape, np.dtype(view.dtype))

    def read(self, view: View) -> np.ndarray:
        self.accesses.append((view, False))
        return _values(self._zeros(view))

    def stored(self, view: View) -> np.ndarray:
        self.accesses.append((view, False))
        return self._zeros(view)

    def write(self, view: View, values: np.ndarray) -> None:
        self.accesses.append((view, True))


def access_pattern(ins) -> tuple[tuple[View, bool], ...] | None:
    """The views, and whether written, that the semantics of an elementwise instruction
    touch, in the order they touch them: the same at every loop counter and for every value
    (their accesses follow the fields and the dtypes only), so `Machine.touch` gives what
    running them would record. None if they use anything else (boxes, loop nests)."""
    state = _Accesses()
    try:
        with np.errstate(all="ignore"):
            ins.defn.execute(state, dict(ins.args))
    except Exception:  # noqa: BLE001 -- any failure: no pattern, the semantics run
        return None
    return tuple(state.accesses)


def _check_input(t, value: np.ndarray, dtype: np.dtype) -> None:
    """Input `value` fits tensor `t` (of `dtype` in the DRAM): its shape, and a dtype whose
    values the tensor's holds (float32 for a float tensor, integers in its range)."""
    if tuple(value.shape) != tuple(t.shape):
        raise SimulatorError(
            f"input '{t.name}' has shape {list(value.shape)}, expected {list(t.shape)}"
        )
    if dtype.kind == "f":
        if value.dtype != np.float32:
            raise SimulatorError(f"input '{t.name}' has dtype {value.dtype}; expected float32")
    elif value.dtype != dtype:
        if not np.issubdtype(value.dtype, np.integer):
            raise SimulatorError(
                f"input '{t.name}' has dtype {value.dtype}; expected integers ({t.dtype})"
            )
        info = np.iinfo(dtype)
        if value.size and (value.min() < info.min or value.max() > info.max):
            raise SimulatorError(f"input '{t.name}' has values outside {t.dtype}")


def _unset(binary: Binary) -> list[tuple[int, int]]:
    """The DRAM byte ranges that `Simulator._set_inputs` does not write: all but the input,
    inout and constant tensors, which it writes whole before anything runs."""
    written = sorted(
        (t.dram_offset, t.dram_offset + t.nbytes)
        for t in binary.tensors
        if t.role in ("input", "inout", "const")
    )
    out, at = [], 0
    for lo, hi in written:
        if lo > at:
            out.append((at, lo))
        at = max(at, hi)
    if at < binary.dram_bytes:
        out.append((at, binary.dram_bytes))
    return out


class Machine:
    """Implements `isa.MachineState` for the instruction semantics."""

    def __init__(
        self, binary: Binary, target: Target, spare: dict | None = None, values: bool = True
    ) -> None:
        """`spare`: the memories of an earlier run of the same binary on the same target,
        zeroed and used again (their pages are mapped already: a fresh DRAM image of
        megabytes costs a page fault per 4 KiB on first touch). `values`: False for a
        values-free run (`machine.simulate(values=False)`), which computes none."""
        self.binary, self.target = binary, target
        sizes = {"spad": target.spad.bytes, "acc": target.acc.bytes, "dram": binary.dram_bytes}
        if spare is not None and all(spare[m].size == n for m, n in sizes.items()):
            spare["spad"].fill(0)
            spare["acc"].fill(0)
            for lo, hi in _unset(binary):  # the rest of the DRAM: the inputs overwrite it
                spare["dram"][lo:hi] = 0
            self.mem = spare
        else:
            self.mem = {m: np.zeros(n, np.uint8) for m, n in sizes.items()}
        self.counters: tuple[int, ...] = ()
        # False while a replayed loop's iterations are stepped for their timing only, and
        # throughout a values-free run: the fast paths then record what they touch but compute
        # nothing (`replay.run_loop`)
        self.values = values
        self.loop: list[tuple[int, int]] = []  # (level, count) of a nest run as one numpy call
        self.pc = 0
        self.touched: list[tuple[str, int, int, bool]] = []
        self.decoded: dict[int, Decoded] = {}
        self._tensors: dict[int, tuple] = {}  # `_tensor`'s, by tensor index
        self._box_dtypes: dict[int, np.dtype] = {}  # `load_box`'s, by tensor index

    def set_inputs(self, inputs: dict[str, np.ndarray]) -> None:
        """Check `inputs` against the binary's tensor table (every error a run raises for
        them) and, while the machine computes values, write them and the constants into the
        DRAM; a values-free run (`values` False) needs neither."""
        dram = self.mem["dram"]
        for t in self.binary.tensors:
            region = np.ndarray(t.shape, np.dtype(t.dtype), buffer=dram, offset=t.dram_offset)
            if t.role == "const" and self.values:
                region[...] = np.frombuffer(
                    self.binary.constants,
                    np.dtype(t.dtype),
                    t.const_bytes // region.itemsize,
                    t.const_offset,
                ).reshape(t.shape)
            elif t.role in ("input", "inout"):
                if t.name not in inputs:
                    raise SimulatorError(
                        f"missing input tensor '{t.name}' ({t.dtype}, shape {list(t.shape)})"
                    )
                value = np.asarray(inputs[t.name])
                _check_input(t, value, region.dtype)
                if self.values:
                    region[...] = value  # in range (`_check_input`): the cast is exact
        unknown = set(inputs) - {
            t.name for t in self.binary.tensors if t.role in ("input", "inout")
        }
        if unknown:
            raise SimulatorError(f"unknown input tensor(s): {', '.join(sorted(unknown))}")

    # -- MachineState ---------------------------------------------------------------------
    def _ndarray(self, view: View) -> np.ndarray:
        d, base = self._range(view)
        return d.array(self.mem[view.mem], base)

    def _range(self, view: View) -> tuple[Decoded, int]:
        """The view decoded and its base at the current counters, its bytes bounds-checked
        and kept in `_last_range`."""
        d = self.decoded.get(id(view))  # the binary holds its views: ids are stable
        if d is None:
            d = self.decoded[id(view)] = Decoded.of(view)
        base = d.base(self.counters)
        lo, hi = base + d.lo, base + d.hi
        memory = self.mem[view.mem]
        if lo < 0 or hi > memory.size:
            raise SimulatorError(
                f"instruction {self.pc}: {view} touches bytes [{lo}, {hi}) outside {view.mem} "
                f"({memory.size} bytes) at loop counters {list(self.counters)}"
            )
        self._last_range = (view.mem, lo, hi)
        return d, base

    def touch(self, pattern) -> None:
        """Record what semantics whose accesses are `pattern` (`access_pattern`) touch at the
        current counters, bounds-checked as they would be, computing nothing (no array)."""
        for view, write in pattern:
            self._range(view)
            self.touched.append((*self._last_range, write))

    def read(self, view: View) -> np.ndarray:
        arr = self._ndarray(view)
        self.touched.append((*self._last_range, False))
        return _values(arr)

    def stored(self, view: View) -> np.ndarray:
        """`read` without the conversion: the view itself, for a STORE (`semantics._store`)."""
        arr = self._ndarray(view)
        self.touched.append((*self._last_range, False))
        return arr

    def destination(self, view: View) -> np.ndarray:
        """The view's array, its bytes recorded as written: for semantics that compute
        values already of the view's dtype (`requant.vrequant`) to put them there directly,
        as `write` would copy them."""
        arr = self._ndarray(view)
        self.touched.append((*self._last_range, True))
        return arr

    def write(self, view: View, values: np.ndarray) -> None:
        arr = self._ndarray(view)
        self.touched.append((*self._last_range, True))
        if values.dtype == arr.dtype and values.shape == arr.shape:
            arr[...] = values  # a LOAD of the tensor's own dtype (`load_box`): no round trip
            return
        values = np.broadcast_to(values, view.shape)
        if arr.dtype.kind != "f" and values.dtype.kind in "iub":
            # integers wrap to the memory's dtype as through int64 (a C cast keeps the low
            # bits either way), without the two intermediate copies
            np.copyto(arr, values, casting="unsafe")
            return
        arr[...] = (
            values.astype(np.float32)
            if arr.dtype.kind == "f"
            else values.astype(np.int64).astype(arr.dtype)
        )

    def read_loop(self, view: View) -> np.ndarray:
        """The view at every iteration of the loop nest `self.loop`: shape (*counts, *view.shape)."""
        isz = ITEMSIZE[view.dtype]
        levels = [lvl for lvl, _ in self.loop]
        coefs = [view.base.coefs[lvl] if lvl < len(view.base.coefs) else 0 for lvl in levels]
        shape = tuple(n for _, n in self.loop) + view.shape
        byte_strides = tuple(coefs) + tuple(s * isz for s in view.strides)
        base = _eval(view.base, self.counters)
        lo = base + sum(min(0, (n - 1) * st) for n, st in zip(shape, byte_strides, strict=False))
        hi = (
            base
            + sum(max(0, (n - 1) * st) for n, st in zip(shape, byte_strides, strict=False))
            + isz
        )
        memory = self.mem[view.mem]
        if lo < 0 or hi > memory.size:
            raise SimulatorError(
                f"instruction {self.pc}: {view} touches bytes [{lo}, {hi}) outside {view.mem} "
                f"({memory.size} bytes) in the loop nest at counters {list(self.counters)}"
            )
        self.touched.append((view.mem, lo, hi, False))
        return _values(
            np.ndarray(
                shape, np.dtype(view.dtype), buffer=memory, offset=base, strides=byte_strides
            )
        )

    def transfer(self, op: Transfer) -> bool:
        """Execute a decoded LOAD or STORE (`Transfer`) at the current counters, recording
        what it touches as its semantics would; False (nothing done) when an operand is out
        of bounds or reads a counter of no loop around it: its semantics then report it."""
        place = op.places.get(self.counters)
        if place is None:
            place = self._place(op)
            if len(op.places) < MAX_PLACES:
                op.places[self.counters] = place
        if place is False:
            return False
        base, lo, hi, src, dst, inside, empty = place
        d = op.view
        arr, extent = self._tensor_array(op.tensor)
        if not self.values:
            self.touched = (
                [extent, (d.mem, lo, hi, True)] if op.load else [(d.mem, lo, hi, False), extent]
            )
            return True
        memory = self.mem[d.mem]
        view = np.ndarray(d.shape, d.dtype, buffer=memory, offset=base, strides=d.strides)
        if op.load:
            if inside:
                copy_values(view, arr[src])  # channels innermost: by channel
            else:  # a halo: the pad, and the part inside the tensor
                view[...] = op.pad
                if not empty:
                    view[dst] = arr[src]
            self.touched = [extent, (d.mem, lo, hi, True)]
        else:
            if not empty:  # wholly outside the tensor: a halo, nothing to write
                arr[src] = view[dst]
            self.touched = [(d.mem, lo, hi, False), extent]
        return True

    def _place(self, op: Transfer):
        """Where `op` copies at the current counters: (on-chip base, first byte, end, the
        tensor's and the view's slices, whether the box lies inside the tensor, whether
        outside it), or False when an operand is out of bounds or reads a counter of no loop
        around it. A function of the binary and the target's memory sizes (`static`'s key)."""
        counters, d = self.counters, op.view
        if op.levels > len(counters) or len(d.coefs) > len(counters):
            return False
        base = d.const
        for c, n in zip(d.coefs, counters, strict=False):
            base += c * n
        lo, hi = base + d.lo, base + d.hi
        if lo < 0 or hi > self.mem[d.mem].size:
            return False
        src, dst, inside, empty = [], [], True, False
        for const, coefs, n, dim in zip(op.consts, op.coefs, op.shape, op.dims, strict=True):
            o = const
            for c, x in zip(coefs, counters, strict=False):
                o += c * x
            a, b = max(o, 0), min(o + n, dim)
            inside = inside and a == o and b == o + n
            empty = empty or a >= b
            src.append(slice(a, b))
            dst.append(slice(a - o, b - o))
        return base, lo, hi, tuple(src), tuple(dst), inside, empty

    def _tensor_array(self, index: int):
        """Tensor `index`'s array over the DRAM and its extent, once a run (`_tensor`)."""
        known = self._tensors.get(index)
        if known is None:
            t = self.binary.tensors[index]
            arr = np.ndarray(
                t.shape, np.dtype(t.dtype), buffer=self.mem["dram"], offset=t.dram_offset
            )
            known = self._tensors[index] = (
                arr,
                ("dram", t.dram_offset, t.dram_offset + t.nbytes, None),
            )
        return known

    def _tensor(self, box: Box):
        t = self.binary.tensors[box.tensor]
        if len(box.shape) != len(t.shape):
            raise SimulatorError(
                f"instruction {self.pc}: box of {t.name} has rank {len(box.shape)}, tensor {len(t.shape)}"
            )
        known = self._tensor_array(box.tensor)
        origin = [_eval(a, self.counters) for a in box.origin]
        self.touched.append(known[1])
        return t, known[0], origin

    def load_box(self, box: Box) -> np.ndarray:
        t, arr, origin = self._tensor(box)
        dt = self._box_dtypes.get(box.tensor)
        if dt is None:
            dt = np.dtype(t.dtype)
            if dt.kind == "f":
                dt = np.dtype(np.float32)
            elif not np.iinfo(dt).min <= t.pad <= np.iinfo(dt).max:
                dt = np.dtype(np.int64)  # a pad outside the dtype: wrapped on write, as before
            self._box_dtypes[box.tensor] = dt
        if dt == arr.dtype and all(
            o >= 0 and o + n <= dim for o, n, dim in zip(origin, box.shape, t.shape, strict=False)
        ):  # wholly inside the tensor: the box itself, a view (`write` copies it on chip)
            return arr[tuple(slice(o, o + n) for o, n in zip(origin, box.shape, strict=False))]
        # the tensor's own dtype: the values are the same, without an int64 round trip
        out = np.full(box.shape, t.pad, dt)
        src, dst = [], []
        for o, n, dim in zip(origin, box.shape, t.shape, strict=False):
            lo, hi = max(o, 0), min(o + n, dim)
            if lo >= hi:
                return out
            src.append(slice(lo, hi))
            dst.append(slice(lo - o, hi - o))
        out[tuple(dst)] = arr[tuple(src)]
        return out

    def store_box(self, box: Box, values: np.ndarray) -> None:
        t, arr, origin = self._tensor(box)
        src, dst = [], []
        for o, n, dim in zip(origin, box.shape, t.shape, strict=False):
            lo, hi = max(o, 0), min(o + n, dim)
            if lo >= hi:
                return  # wholly outside the tensor: a halo, nothing to write
            dst.append(slice(lo, hi))
            src.append(slice(lo - o, hi - o))
        part = values[tuple(src)]
        arr[tuple(dst)] = part if part.dtype == arr.dtype else part.astype(arr.dtype)
