"""Buffer planning: where each staged tensor lives (spad/acc), its box, row
compaction and which buffers need no zero-fill."""

from __future__ import annotations

import islpy as isl
import numpy as np

from tensorgen.codegen.compiled import align
from tensorgen.codegen.lowering.bands import _uniform_pieces
from tensorgen.errors import CapacityError, CodegenError
from tensorgen.ir.queries import mac_mapping
from tensorgen.mc.binary import TensorEntry
from tensorgen.schedule.compaction import compacted_size, row_compaction


class _BufferPlan:
    """Methods of the scheduled lowering (tensorgen.codegen.scheduled._Lowering), one pass."""

    # -- memory -----------------------------------------------------------------------------
    def _layout(self) -> None:
        """Where every tensor lives: its slot in DRAM, and the scratchpad or accumulator buffer
        of each staged one (those staged at a loop first, then those staged whole), checked
        against the target's capacities; with the facts about each buffer the lowering needs."""
        self._dram_layout()
        self.buf: dict[
            str, tuple[str, int, tuple[int, ...], tuple[int, ...]]
        ] = {}  # mem, base, origin, size
        self.written = {s.lhs.tensor for s in self.program.statements}
        self.stored = set(self.written)  # staged tensors whose buffers are stored after each stage
        self.loop_stages = {}  # tensor -> (position, statements, mem, base, offset, size)
        self.fresh: set[str] = set()  # staged tensors whose buffers start as zeros: no load
        self.unfilled: set[str] = set()  # fresh buffers that need not even be zeroed
        self.double: set[str] = set()  # loop-staged tensors with two buffers
        self.first: dict = {}  # staged tensor -> FirstTouch: the iterations that zero its buffer, not load it
        self.disjoint: set[str] = (
            set()
        )  # written loop-staged tensors whose boxes in a pass of the loop are disjoint
        self.no_fill: set[str] = set()  # tensors in `first` whose first iterations need no zeros
        self.layouts = {
            st.tensor: st.layout for st in self.schedule.stages if st.layout is not None
        }
        top = {"spad": 0, "acc": 0}
        for st in self.schedule.stages:
            if st.loop:
                self._plan_loop_stage(st, top)
        self._plan_whole_stages(top)
        self.temp_base = top["spad"]
        self._check_buffers_fit(top)

    def _dram_layout(self) -> None:
        """The binary's tensor table: each tensor's slot in DRAM, 64-byte aligned, in program
        order, temporaries included."""
        self.entries, self.index, offset = [], {}, 0
        for t in self.program.tensors:
            self.index[t.name] = len(self.entries)
            self.entries.append(
                TensorEntry(
                    t.name, t.dtype, t.shape, "temp" if t.role == "none" else t.role, offset, t.pad
                )
            )
            offset += -(-t.nbytes // 64) * 64
        self.dram = offset

    def _plan_whole_stages(self, top: dict[str, int]) -> None:
        """A buffer for each tensor staged around the whole nest (not at a loop), after the
        loop-staged ones: in the memory its stage names, else the accumulator for the output of
        a MAC-array statement and the scratchpad for the rest."""
        explicit = {st.tensor: st for st in self.schedule.stages}
        on_array = {
            s.lhs.tensor
            for s in self.program.statements
            for band in self.schedule.tensorized
            if mac_mapping(self.program, s)
        }
        for t in self.program.tensors:
            if t.name in self.loop_stages:
                continue
            box = self.schedule.staged_box(t.name, None)
            if box is None:
                continue
            mem = (
                explicit[t.name].memory
                if t.name in explicit
                else ("acc" if t.name in on_array else "spad")
            )
            size = self._compaction(t, box)
            self.buf[t.name] = (mem, top[mem], tuple(const for const, _ in box.offset), size)
            top[mem] += align(int(np.prod(size)) * t.itemsize)
            self._note_fresh(t, box)

    def _check_buffers_fit(self, top: dict[str, int]) -> None:
        """Refuse a plan whose buffers overflow the scratchpad or the accumulator, naming what
        each holds whole, so that the user knows which tensor to stage smaller."""
        for mem, cap in (("spad", self.target.spad.bytes), ("acc", self.target.acc.bytes)):
            need = top[mem]
            if need > cap:
                live = ", ".join(
                    f"{n} ({int(np.prod(b[3])) * self.program.tensor(n).itemsize} B)"
                    for n, b in self.buf.items()
                    if b[0] == mem
                )
                raise CapacityError(
                    f"{mem} holds {need} B with every tensor staged whole but has {cap} B "
                    f"({need - cap} B over): {live}; stage smaller footprints"
                )

    def _plan_loop_stage(self, st, top: dict[str, int]) -> None:
        """A buffer for the footprint of `st.tensor` in one iteration of loop `st.loop` (its box from
        isl: offset affine in the schedule dimensions up to the loop, size its maximum)."""
        pos, stmts = self.schedule.position(st.loop), self.schedule.statements_of(st.loop)
        t = self.program.tensor(st.tensor)
        outside = [
            s.name
            for s in self.program.statements
            if s.name not in stmts and any(a.tensor == t.name for a in [s.lhs] + s.reads)
        ]
        if outside:
            raise CodegenError(
                f"stage({t.name}, {st.loop}): {', '.join(outside)} also access {t.name} outside "
                f"{st.loop}; stage it at a loop that encloses them"
            )
        box = self.schedule.staged_box(t.name, st.loop)
        if None in box.offset:
            raise CodegenError(
                f"stage({t.name}, {st.loop}): the footprint's origin is not one affine function "
                f"of the loops (at the edges of a skewed tile?); stage it elsewhere"
            )
        size = self._compaction(t, box)
        self.loop_stages[t.name] = (pos, stmts, st.memory, top[st.memory], list(box.offset), size)
        self._note_fresh(t, box)
        if box.disjoint_in_loop:
            self.disjoint.add(t.name)
        top[st.memory] += align(int(np.prod(size)) * t.itemsize) * (2 if st.double_buffered else 1)
        if st.double_buffered:
            self.double.add(t.name)

    def _compaction(self, t, box) -> tuple[int, ...]:
        """The size of `t`'s buffer for `box`: only its accessed rows, if it is compacted."""
        comp = row_compaction(box, t.itemsize, self.target, t.name in self.written)
        if comp is not None:
            self.compact[t.name] = comp
        return compacted_size(box.size, comp)

    def _note_fresh(self, t, box) -> None:
        """A buffer whose boxes no other iteration meets starts as zeros, not loaded; it is not
        even zeroed when every element is written before it is read (and, if it is stored,
        every element of the box is written). A temporary in such a buffer never leaves the chip.
        A buffer whose boxes meet is loaded, except in the iterations that are the first to touch
        their box (the tensor starts as zeros): those zero it."""
        if box.first is not None:
            self.first[t.name] = box.first
        if not box.fresh:
            return
        self.fresh.add(t.name)
        if t.role == "none":
            self.stored.discard(t.name)
        zeros_read = self.schedule.initial_value_read(t.name) and not self._overwrites_first(t.name)
        if not zeros_read and t.role == "none" and (t.pad or box.halo):
            # an activation between fused layers: filled with its pad, which its halo holds
            # (a pad of 0 too: the buffer's bytes are what the last program left there)
            pass
        elif not zeros_read and (t.name not in self.stored or box.covered):
            self.unfilled.add(t.name)

    def _overwrites_first(self, tensor: str) -> bool:
        """Whether the first `+=` to each element of the fresh `tensor` runs as an overwrite, so
        that its buffer need not be zeroed: the schedule allows it (Schedule.overwrites_first) and
        splitting the first writes from the others leaves every band in whole pieces."""
        if not self.schedule.overwrites_first(tensor):
            return False
        stmt = next(s for s in self.program.statements if s.lhs.tensor == tensor)
        points = self.schedule.statement_map(stmt.name).range()
        positions = sorted({p for _, ps, stmts in self.bands if stmt.name in stmts for p in ps})
        if not positions:
            first = self.schedule.first_writes(stmt.name)
            self.first_writes[stmt.name] = (([first], None), ([points.subtract(first)], None))
            return True
        # the first writes are whole blocks of the band: those of the earliest block of each element
        first = self.schedule.first_writes(stmt.name, positions[0])
        _, rest = _uniform_pieces(points, positions)
        split = (
            _uniform_pieces(first, positions),
            _uniform_pieces(points.subtract(first), positions),
        )
        for _, extra in split:
            if (
                extra is not None
                and not extra.is_empty()
                and (rest is None or not extra.is_subset(rest))
            ):
                return False  # a first write would run element by element that a vector runs now
        # a staging loop whose iterations do not all hold first writes: isl would peel them out of it
        n = points.dim(isl.dim_type.set)
        for st in self.schedule.stages:
            pos, stmts = (
                (self.schedule.position(st.loop), self.schedule.statements_of(st.loop))
                if st.loop
                else (-1, ())
            )
            if stmt.name in stmts and not first.project_out(
                isl.dim_type.set, pos + 1, n - pos - 1
            ).is_equal(points.project_out(isl.dim_type.set, pos + 1, n - pos - 1)):
                return False
        tensorized = any(kind == "array" and stmt.name in stmts for kind, _, stmts in self.bands)
        if tensorized and split[0][1] is not None and not split[0][1].is_empty():
            return False  # element by element, an instance of a first block is not each element's first
        self.first_writes[stmt.name] = split
        return True
