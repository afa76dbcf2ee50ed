"""Lowering of a hand-written `Schedule` (any legal affine schedule) to microcode.

The loop structure is isl's AST of the schedule. Loops with constant bounds become LOOP,
others LOOPB (bounds as max/min of floor-affine terms of outer iterators), guards IF.
Statement instances run on the vector unit, one element at a time, or as whole vectors
over a `vectorize`d loop, or on the MAC array over a `tensorize`d band. Every tensor is
staged whole in the scratchpad (with its padding halo) at the start and stored at the end;
staging smaller footprints at a loop is not lowered by this backend yet.
"""

from __future__ import annotations

import islpy as isl
import numpy as np

from tensorgen.codegen.emitter import Emitter, _expr, floor_terms
from tensorgen.codegen.lower import Compiled, VectorExpr, _align, _row_major, useful_macs
from tensorgen.errors import CapacityError, CodegenError
from tensorgen.ir.core import Access, Program, Statement
from tensorgen.ir.queries import mac_mapping
from tensorgen.mc import isa
from tensorgen.mc.binary import Binary, TensorEntry
from tensorgen.mc.operands import ITEMSIZE, Bound, Box, LoopAffine, View
from tensorgen.schedule.api import Schedule
from tensorgen.schedule.compaction import compacted_size, row_compaction
from tensorgen.target import Target

BAND_LEVEL = 16  # pseudo loop levels standing for the lanes of a vector or array band


def compile_scheduled(program: Program, target: Target, schedule: Schedule) -> Compiled:
    low = _Lowering(program, target, schedule)
    low.emit()
    binary = Binary(target.name, target.hash, tuple(low.entries), tuple(low.em.finish()), low.dram)
    return Compiled(binary, (), useful_macs(program))


def vector_profile(program: Program, stmt: Statement) -> tuple[int, int]:
    """(vector instructions, int32 temporaries) that `stmt` lowers to over one block of its
    instances: what the instruction selection itself emits, so that a cost model cannot drift
    from it. Each instruction costs the vector unit's setup plus the block over its lanes."""

    class _Count:
        def __init__(self) -> None:
            self.code: list = []

        def emit(self, ins) -> None:
            self.code.append(ins)

    def view(dtype: str) -> View:
        return View("spad", dtype, LoopAffine.make(0), (1,), (1,))

    counter = _Count()
    expr = VectorExpr(
        counter,
        program,
        stmt,
        lambda acc: view(program.tensor(acc.tensor).dtype),
        lambda slot: view("int32"),
    )
    expr.statement()
    return len(counter.code), expr.next_slot


class _Lowering:
    def __init__(self, program: Program, target: Target, schedule: Schedule) -> None:
        self.program, self.target, self.schedule = program, target, schedule
        self.em = Emitter()
        self.by_name = {s.name: s for s in program.statements}
        self.piece_of: dict[str, str] = {}  # AST statement (a piece of a statement) -> statement
        self.piece_maps: dict[str, isl.Map] = {}  # AST statement -> its schedule
        self.compact: dict[
            str, tuple[int, int, int]
        ] = {}  # loaded one DMA per accessed row (row_compaction)
        self.bands = self._bands()
        self.first_writes: dict[
            str, tuple
        ] = {}  # statement -> its first writes and the rest, in uniform pieces
        self.overwriting: set[str] = (
            set()
        )  # AST statements whose `+=` overwrites (first writes, first touches)
        self._layout()

    # -- memory -----------------------------------------------------------------------------
    def _layout(self) -> None:
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
        on_array = {
            s.lhs.tensor
            for s in self.program.statements
            for band in self.schedule.tensorized
            if mac_mapping(self.program, s)
        }
        top = {"spad": 0, "acc": 0}
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
        explicit = {st.tensor: st for st in self.schedule.stages}
        self.layouts = {
            st.tensor: st.layout for st in self.schedule.stages if st.layout is not None
        }
        for st in self.schedule.stages:
            if st.loop:
                self._plan_loop_stage(st, top)
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
            top[mem] += _align(int(np.prod(size)) * t.itemsize)
            self._note_fresh(t, box)
        self.temp_base = top["spad"]
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
        top[st.memory] += _align(int(np.prod(size)) * t.itemsize) * (2 if st.double_buffered else 1)
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
        if not zeros_read and (t.name not in self.stored or box.covered):
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

    def _stage_origin(
        self, tensor: str, env: dict[str, LoopAffine], node
    ) -> tuple[LoopAffine, ...]:
        """The origin of `tensor`'s box in the iteration of its staging loop that the AST `node`
        runs in: schedule dimensions that are not loops around it are constants there."""
        return tuple(
            self._dims_value(const, coefs, env, node)
            for const, coefs in self.loop_stages[tensor][4]
        )

    def _dims_value(
        self, const: int, coefs: dict[str, int], env: dict[str, LoopAffine], node
    ) -> LoopAffine:
        """const + sum(c * d<k>) over schedule dimensions, in the loops around the AST `node`."""
        value = LoopAffine.make(const)
        for name, c in coefs.items():
            k = int(name[1:])  # the schedule dimension d<k>
            if f"c{k}" in env:
                value = value + env[f"c{k}"].scale(c)
            else:
                value = value + self._dim_constant(node, k) * c
        return value

    def _guarded(self, pieces, env: dict[str, LoopAffine], node, body) -> None:
        """`body` under each piece (a conjunction of constraints >= 0 over schedule dimensions)
        that can hold around `node`: unguarded where the piece always holds there, in an IF
        otherwise."""
        for piece in pieces:
            terms = [self._dims_value(const, coefs, env, node) for const, coefs in piece]
            if any(not any(t.coefs) and t.const < 0 for t in terms):
                continue
            terms = [t for t in terms if any(t.coefs)]
            if not terms:
                body()
                continue
            with self.em.block("IF", cond=Bound(tuple((t, 1) for t in terms))):
                body()

    def _load(self, tensor: str, env: dict[str, LoopAffine], node, raw: bool = False) -> None:
        """Load a staged buffer (or zero it, if fresh); a buffer whose iterations that are the
        first to touch their box are known is zeroed in those and loaded in the others. `raw`:
        without tokens (in a double-buffered loop; loads only, the zeroing is on EX)."""
        first = self.first.get(tensor)
        load = (
            (lambda: self._dma_raw("LOAD", tensor)) if raw else (lambda: self._dma("LOAD", tensor))
        )
        if first is None:
            load()
            return
        if not raw and tensor not in self.no_fill:
            self._guarded(first.first, env, node, lambda: self._zero(tensor))
        self._guarded(first.rest, env, node, load)

    def _zero(self, tensor: str, raw: bool = False) -> None:
        mem, base, _, size = self.active[tensor]
        view = View(
            mem,
            self.program.tensor(tensor).dtype,
            LoopAffine.make(base),
            size,
            self._strides(tensor, size),
        )
        ins = isa.make("VFILL", dst=view, imm=0)
        if raw:
            self.em.code.append(ins)
        else:
            self.em.emit(ins)

    def _dim_constant(self, node, k: int) -> int:
        """The value of schedule dimension `k` in every instance the AST `node` runs."""
        points = None
        for p in _points_under(node, self.points):
            points = p if points is None else points.union(p)
        lo, hi = points.dim_min(k), points.dim_max(k)
        if not (lo.is_cst() and hi.is_cst()) or _cst(lo) != _cst(hi):
            raise CodegenError(
                f"schedule dimension {k} is neither a loop nor a constant around a staged tensor"
            )
        return _cst(lo)

    def _bands(self) -> list[tuple[str, tuple[int, ...], frozenset[str]]]:
        """(kind, schedule positions, statements) of every vectorized or tensorized band."""
        out = []
        for name in self.schedule.vectorized:
            pos, stmts = self.schedule.position(name), self.schedule.statements_of(name)
            out.append(("vector", (pos,), stmts))
        self.n_position: dict[
            tuple[int, ...], int
        ] = {}  # an array band's positions -> its N loop's
        for ms, n, ks in self.schedule.tensorized:
            positions = tuple(self.schedule.position(x) for x in (*ms, n, *ks))
            self.n_position[positions] = positions[len(ms)]
            out.append(("array", positions, self.schedule.statements_of(ms[0] if ms else n)))
        return out

    def _declared_n(self, stmt: Statement, band) -> int | None:
        """The band slot of the loop that tensorize named N for `stmt` (None: isl emitted no loop)."""
        for kind, positions, stmts in self.bands:
            if kind == "array" and stmt.name in stmts:
                entry = band.get(f"c{self.n_position[positions]}")
                return entry[0] if entry else None
        return None

    def _banded(self, ast_name: str, band) -> bool:
        """Whether AST statement `ast_name` (a piece of a statement) runs as `band`."""
        return not ast_name.endswith("__rest") and self.piece_of.get(ast_name, ast_name) in band[2]

    def _band_at(self, pos: int, node) -> tuple[str, tuple[int, ...], frozenset[str]] | None:
        """The band one of whose loops is the AST loop `node` (at schedule position `pos`)."""
        under = _statements_under(node)
        for band in self.bands:
            if pos in band[1] and under and all(self._banded(n, band) for n in under):
                return band
        return None

    # -- program ----------------------------------------------------------------------------
    def emit(self) -> None:
        self.active = {
            name: (mem, base, tuple(LoopAffine.make(o) for o in origin), size)
            for name, (mem, base, origin, size) in self.buf.items()
        }
        schedule = self._separated()
        for name in self.buf:
            self._dma("LOAD", name)
        self.em.emit(isa.make("SYNC", queue=1))  # the nest runs on EX: enter it there
        build = isl.AstBuild.from_context(isl.Set("{ : }"))
        stage_dims = sorted({p for p, *_ in self.loop_stages.values()})
        if stage_dims:
            # the iterations of a staging loop that differ (a last, partial one) are separated from
            # it whole, every piece of every statement in them together: they are staged alone
            n = schedule.get_map_list().get_at(0).dim(isl.dim_type.out)
            dims = ", ".join(f"d{i}" for i in range(n))
            build = build.set_options(
                isl.UnionMap(
                    "{ " + "; ".join(f"[{dims}] -> separate[{p}]" for p in stage_dims) + " }"
                )
            )
        self.points: list[isl.Set] = []  # per AST statement: the schedule points it runs

        def note_points(node, build):
            executed = build.get_schedule().get_map_list().get_at(0)
            name = executed.get_tuple_name(isl.dim_type.in_)
            self.points.append(self.piece_maps[name].intersect_domain(executed.domain()).range())
            return node.set_annotation(isl.Id(f"points{len(self.points) - 1}"))

        build, handle = build.set_at_each_domain(note_points)
        ast = build.node_from_schedule_map(schedule)
        del handle
        self._walk(ast, {}, {})
        for name in self.buf:
            if name in self.stored:
                self._dma("STORE", name)

    def _separated(self) -> isl.UnionMap:
        """The schedule with each banded statement split into pieces in which every band loop
        has constant bounds (full tiles, then each kind of partial tile: one vector or MATMUL
        each); instances that fit no such piece form `S__rest` and run element by element.
        The MATMULs that hold the first update of every element they update (of a buffer that
        would be zeroed for them in the iterations that first touch it) form pieces `S__w<i>`
        that overwrite their accumulators, and the buffer is not zeroed."""
        out = isl.UnionMap("{ }")
        for stmt in self.program.statements:
            m = self.schedule.statement_map(stmt.name)
            positions = sorted({p for _, ps, stmts in self.bands if stmt.name in stmts for p in ps})
            if not positions and stmt.name not in self.first_writes:
                out = out.union(isl.UnionMap.from_map(m))
                self.piece_maps[stmt.name] = m
                continue
            if (
                stmt.name in self.first_writes
            ):  # the first writes of a fresh `+=`: pieces `S__first`
                parts = [
                    ("__first", self.first_writes[stmt.name][0]),
                    ("", self.first_writes[stmt.name][1]),
                ]
            else:  # the MATMULs that first touch a reloaded accumulator: pieces `S__w`
                parts, points = [], m.range()
                first = self._overwriting(stmt)
                if first is not None:
                    pieces, rest = _uniform_pieces(first, positions)
                    if rest is None or rest.is_empty():
                        parts.append(("__w", (pieces, None)))
                        self.no_fill.add(stmt.lhs.tensor)
                        points = points.subtract(first)
                parts.append(("", _uniform_pieces(points, positions)))
            for tag, (pieces, rest) in parts:
                named = [
                    (f"{stmt.name}{tag}" if i == 0 else f"{stmt.name}{tag}__p{i}", piece)
                    for i, piece in enumerate(p for p in pieces if not p.is_empty())
                ]
                if rest is not None and not rest.is_empty():
                    named.append((f"{stmt.name}{tag}__rest", rest))
                for name, where in named:
                    piece_map = m.intersect_range(where).set_tuple_name(isl.dim_type.in_, name)
                    out = out.union(isl.UnionMap.from_map(piece_map))
                    self.piece_of[name] = stmt.name
                    self.piece_maps[name] = piece_map
                    if tag:
                        self.overwriting.add(name)
        return out

    def _overwriting(self, stmt: Statement) -> isl.Set | None:
        """The schedule points of `stmt`'s MATMULs that may overwrite their accumulators, if its
        buffer is zeroed only in the iterations that first touch it, and they write all of it."""
        first = self.first.get(stmt.lhs.tensor)
        arrays = [ps for kind, ps, stmts in self.bands if kind == "array" and stmt.name in stmts]
        if first is None or not first.covered or len(arrays) != 1:
            return None
        points = self.schedule.overwriting_blocks(stmt.name, min(arrays[0]))
        return None if points is None or points.is_empty() else points

    def _walk(self, node, env: dict[str, LoopAffine], band: dict[str, tuple[int, int]]) -> None:
        self._walk_nodes([node], env, band)

    def _walk_nodes(
        self, nodes: list, env: dict[str, LoopAffine], band: dict[str, tuple[int, int]]
    ) -> None:
        """Sibling nodes in order. An iteration of a staging loop that isl peeled out of its loop
        is staged around the run of siblings that make it up (isl may emit it as several, one
        per piece of a statement): one load before them, one store after."""
        i = 0
        while i < len(nodes):
            missing = self._peeled_stages(nodes[i], env)
            if not missing:
                self._walk_node(nodes[i], env, band)
                i += 1
                continue
            # the outermost level first: its iteration may span siblings that differ deeper (a
            # loop of full iterations of an inner staging loop, then that loop's peeled one)
            level = min(self.loop_stages[t][0] for t in missing)
            outer = [t for t in missing if self.loop_stages[t][0] == level]
            origins = self._peeled_origins(nodes[i], outer, env)
            j = i + 1
            while (
                j < len(nodes)
                and set(outer) <= set(self._peeled_stages(nodes[j], env))
                and self._peeled_origins(nodes[j], outer, env) == origins
            ):
                j += 1
            saved = {t: self.active.get(t) for t in outer}
            for t in outer:
                _, _, mem, base, _, size = self.loop_stages[t]
                self.active[t] = (mem, base, origins[t], size)
                self._load(t, env, nodes[i])
            self._walk_nodes(nodes[i:j], env, band)  # stages the deeper levels among them
            for t in outer:
                if t in self.stored:
                    self._dma("STORE", t)
                self.active[t] = saved[t]
            i = j

    def _peeled_origins(self, node, missing: list[str], env) -> dict[str, tuple[LoopAffine, ...]]:
        return {t: self._stage_origin(t, env, node) for t in missing}

    def _peeled_stages(self, node, env) -> list[str]:
        t = node.get_type()
        if t not in (isl.ast_node_type.for_, isl.ast_node_type.user):
            return []
        limit = (
            int(node.for_get_iterator().get_id().get_name()[1:])
            if t == isl.ast_node_type.for_
            else 10**6
        )
        under = {self.piece_of.get(n, n) for n in _statements_under(node)}
        return [
            name
            for name, (p, stmts, *_) in self.loop_stages.items()
            if self.active.get(name) is None and p < limit and f"c{p}" not in env and under <= stmts
        ]

    def _walk_node(
        self, node, env: dict[str, LoopAffine], band: dict[str, tuple[int, int]]
    ) -> None:
        t = node.get_type()
        if t == isl.ast_node_type.block:
            self._walk_nodes(_block_children(node), env, band)
        elif t == isl.ast_node_type.for_:
            self._for(node, env, band)
        elif t == isl.ast_node_type.if_:
            terms = _conditions(node.if_get_cond(), env)
            with self.em.block("IF", cond=Bound(tuple(terms))):
                self._walk(node.if_get_then_node(), env, band)
            if node.if_has_else_node():
                # not (t0 and t1 and ...) as disjoint cases: not t0 | t0 and not t1 | ...
                for i, (a, _d) in enumerate(terms):
                    negated = (a.scale(-1) + (-1), 1)  # floor(a/d) < 0  <=>  a <= -1  (d > 0)
                    with self.em.block("IF", cond=Bound(tuple(terms[:i]) + (negated,))):
                        self._walk(node.if_get_else_node(), env, band)
        elif t == isl.ast_node_type.user:
            self._user(node.user_get_expr(), env, band)
        elif t == isl.ast_node_type.mark:
            self._walk(node.mark_get_node(), env, band)
        else:
            raise CodegenError(f"unexpected node in the schedule's loop nest: {node.to_C_str()}")

    def _for(self, node, env, band) -> None:
        name = node.for_get_iterator().get_id().get_name()
        pos = int(name[1:])
        cond = node.for_get_cond()
        if _const_int(node.for_get_inc()) != 1:
            raise CodegenError(f"loop {name} has a non-unit step")
        op = cond.get_op_type()
        if op not in (isl.ast_expr_op_type.le, isl.ast_expr_op_type.lt):
            raise CodegenError(f"unexpected loop condition {cond.to_C_str()}")
        lower = _bound_terms(node.for_get_init(), env, "max")
        upper = _bound_terms(cond.get_op_arg(1), env, "min")
        if op == isl.ast_expr_op_type.lt:
            upper = [(a + (-d), d) for a, d in upper]
        constant = (
            len(lower) == 1
            and len(upper) == 1
            and lower[0][1] == upper[0][1] == 1
            and not any(lower[0][0].coefs)
            and not any(upper[0][0].coefs)
        )
        in_band = self._band_at(pos, node)
        if in_band is not None and not constant:
            raise CodegenError(
                f"loop {name} of a vectorized or tensorized band has bounds that vary "
                f"({node.to_C_str().splitlines()[0]}); split by a factor that divides its extent"
            )
        if in_band is not None:
            lo, hi = lower[0][0].const, upper[0][0].const
            lanes = {**band, name: (len(band), hi - lo + 1)}
            self._walk(
                node.for_get_body(),
                {**env, name: LoopAffine.make(lo, {BAND_LEVEL + len(band): 1})},
                lanes,
            )
            return
        if band:
            raise CodegenError(
                f"a vectorized or tensorized loop ({', '.join(band)}) has a loop with non-constant "
                f"bounds inside it; split by a factor that divides the extent"
            )
        if constant and self._pipelined(node, pos, upper[0][0].const - lower[0][0].const + 1):
            self._pipelined_loop(node, pos, name, lower[0][0].const, upper[0][0].const, env, band)
        elif constant:
            lo, hi = lower[0][0].const, upper[0][0].const
            with self.em.loop(hi - lo + 1) as level:
                self._staged_body(node, pos, {**env, name: LoopAffine.make(lo, {level: 1})}, band)
        else:
            with self.em.block(
                "LOOPB", lower=Bound(tuple(lower)), upper=Bound(tuple(upper))
            ) as level:
                self._staged_body(node, pos, {**env, name: LoopAffine.make(0, {level: 1})}, band)

    def _staged_body(self, node, pos: int, env, band) -> None:
        """The body of a loop, with the DMAs of the tensors staged at it around it."""
        under = {self.piece_of.get(n, n) for n in _statements_under(node)}
        here = [t for t, (p, stmts, *_) in self.loop_stages.items() if p == pos and under <= stmts]
        saved = {t: self.active.get(t) for t in here}
        for t in here:
            _, _, mem, base, _, size = self.loop_stages[t]
            self.active[t] = (mem, base, self._stage_origin(t, env, node), size)
            self._load(t, env, node)
        self._walk(node.for_get_body(), env, band)
        for t in here:
            if t in self.stored:
                self._dma("STORE", t)
            self.active[t] = saved[t]

    # -- double buffering -----------------------------------------------------------------
    def _staged_here(self, node, pos: int) -> list[str]:
        under = {self.piece_of.get(n, n) for n in _statements_under(node)}
        return [t for t, (p, stmts, *_) in self.loop_stages.items() if p == pos and under <= stmts]

    def _pipelined(self, node, pos: int, count: int) -> bool:
        """Whether the loop can overlap its DMAs with its compute: every tensor staged at it has
        two buffers, a tensor both loaded and stored has disjoint boxes in the loop's iterations,
        and no DMA happens deeper inside (its body is pure compute)."""
        here = self._staged_here(node, pos)
        if count < 2 or not here or any(t not in self.double for t in here):
            return False
        if any(t not in self.fresh and t in self.stored and t not in self.disjoint for t in here):
            return False
        under = {self.piece_of.get(n, n) for n in _statements_under(node)}
        return not any(p > pos and stmts & under for t, (p, stmts, *_) in self.loop_stages.items())

    def _pipelined_loop(self, node, pos: int, name: str, lo: int, hi: int, env, band) -> None:
        """The loop unrolled by two over alternating buffers, with tokens only where buffers
        are shared: the loads of one iteration and the stores of the previous run while the
        MAC array or vector unit computes. Two credits per direction start the pipeline, and
        are drained at its end, so the loop leaves no token behind."""
        em, here = self.em, self._staged_here(node, pos)
        loads = [t for t in here if t not in self.fresh]
        stores = [t for t in here if t in self.stored]
        if set(loads) & set(stores):
            self._pipelined_ahead(node, name, lo, hi, env, band, here, loads, stores)
            return
        em.emit(isa.make("SYNC", queue=1))  # leave the serial chain on EX with everything done
        code = em.code
        sync = lambda q, wait=(), signal=(): code.append(  # noqa: E731
            isa.make("SYNC", queue=["LD", "EX", "ST"].index(q)).with_tokens(
                wait=set(wait), signal=set(signal)
            )
        )
        for _ in range(2):
            if loads:
                sync("EX", signal=["LD"])
            if stores:
                code.append(isa.make("SYNC", queue=2).with_tokens(signal={"EX"}))

        def activate(value: LoopAffine, parity: int) -> dict:
            saved = {t: self.active.get(t) for t in here}
            for t in here:
                _, _, mem, base, _, size = self.loop_stages[t]
                nbytes = _align(int(np.prod(size)) * self.program.tensor(t).itemsize)
                self.active[t] = (
                    mem,
                    base + parity * nbytes,
                    self._stage_origin(t, {**env, name: value}, node),
                    size,
                )
            return saved

        def load(value: LoopAffine, parity: int) -> None:
            if not loads:
                return
            saved = activate(value, parity)
            sync("LD", wait=["EX"])
            for t in loads:
                self._dma_raw("LOAD", t)
            sync("LD", signal=["EX"])
            self.active.update(saved)

        def rest(value: LoopAffine, parity: int) -> None:
            saved = activate(value, parity)
            waits = (["LD"] if loads else []) + (["ST"] if stores else [])
            sync("EX", wait=waits)
            em.queue, em.fresh_block = "EX", True
            for t in here:
                if t in self.fresh:
                    self._dma_raw("LOAD", t)  # the zero fill, on EX (if any)
            self._walk(node.for_get_body(), {**env, name: value}, band)
            if em.queue != "EX":
                raise CodegenError(
                    "a double-buffered loop's body must run on the compute queue only"
                )
            sync("EX", signal=(["LD"] if loads else []) + (["ST"] if stores else []))
            if stores:
                sync("ST", wait=["EX"])
                for t in stores:
                    self._dma_raw("STORE", t)
                code.append(isa.make("SYNC", queue=2).with_tokens(signal={"EX"}))
            self.active.update(saved)

        # Program order: the loads of the next iteration before the compute and stores of this one,
        # as the queues run them (the simulator gives the DRAM channel in program order among
        # transfers ready at once, so a prefetch behind a store would wait for it). Iteration j
        # uses buffer (j - lo) % 2.
        load(LoopAffine.make(lo), 0)
        steps = hi - lo  # {load(j + 1); rest(j)} for j in lo..hi-1, then rest(hi)
        if steps // 2:
            head = len(code)
            code.append(isa.make("LOOP", count=steps // 2, body=0))
            em.depth += 1
            level = em.depth - 1
            j = LoopAffine.make(lo, {level: 2})
            load(j + 1, 1)
            rest(j, 0)
            load(j + 2, 0)
            rest(j + 1, 1)
            em.depth -= 1
            code[head] = isa.make("LOOP", count=steps // 2, body=len(code) - head - 1)
        if steps % 2:
            load(LoopAffine.make(hi), (hi - lo) % 2)
            rest(LoopAffine.make(hi - 1), (hi - 1 - lo) % 2)
        rest(LoopAffine.make(hi), (hi - lo) % 2)
        for _ in range(2):
            if loads:
                sync("LD", wait=["EX"])
            if stores:
                sync("EX", wait=["ST"])
        em.queue = "LD" if loads and not stores else "EX"
        em.fresh_block = True

    def _pipelined_ahead(
        self, node, name: str, lo: int, hi: int, env, band, here, loads, stores
    ) -> None:
        """A double-buffered loop with a tensor that is loaded and stored (an accumulator whose
        partial sums come back from DRAM): the loop unrolled by two, each iteration loading the
        next one's boxes into the other buffers while it computes. A buffer is loaded once the
        store of the iteration before has emptied it, and an iteration's stores wait for the next
        one's loads, so that a load and a store of one tensor never overlap (their boxes differ,
        but the simulator, like a DMA engine without address checks, orders them by tokens)."""
        em, code = self.em, self.em.code
        em.emit(isa.make("SYNC", queue=1))  # leave the serial chain on EX with everything done
        sync = lambda q, wait=(), signal=(): code.append(  # noqa: E731
            isa.make("SYNC", queue=["LD", "EX", "ST"].index(q)).with_tokens(
                wait=set(wait), signal=set(signal)
            )
        )
        # two credits from ST (each buffer is empty), given after the serial chain
        for _ in range(2):
            sync("EX", signal=["ST"])
            sync("ST", wait=["EX"], signal=["LD", "EX"])
        saved = {t: self.active.get(t) for t in here}

        def use(value: LoopAffine, parity: int) -> dict[str, LoopAffine]:
            at = {**env, name: value}
            for t in here:
                _, _, mem, base, _, size = self.loop_stages[t]
                nbytes = _align(int(np.prod(size)) * self.program.tensor(t).itemsize)
                self.active[t] = (
                    mem,
                    base + parity * nbytes,
                    self._stage_origin(t, at, node),
                    size,
                )
            return at

        def load(value: LoopAffine, parity: int, guard: bool) -> None:
            at = use(value, parity)
            if not guard:
                for t in loads:
                    self._load(t, at, node, raw=True)
                return
            with em.block("IF", cond=Bound(((LoopAffine.make(hi) + value.scale(-1), 1),))):
                for t in loads:
                    self._load(t, at, node, raw=True)

        sync("LD", wait=["ST"])
        load(LoopAffine.make(lo), 0, False)
        sync("LD", signal=["EX"])

        def iteration(value: LoopAffine, parity: int, ahead: str) -> None:
            sync("LD", wait=["ST"])
            if ahead != "none":
                load(value + 1, 1 - parity, ahead == "guarded")
            sync("LD", signal=["EX", "ST"])
            sync("EX", wait=["LD", "ST"])
            em.queue, em.fresh_block = "EX", True
            at = use(value, parity)
            for t in here:
                if t in self.fresh:
                    self._dma_raw("LOAD", t)  # the zero fill, on EX (if any)
                elif t in self.first and t not in self.no_fill:
                    self._guarded(
                        self.first[t].first, at, node, lambda t=t: self._zero(t, raw=True)
                    )
            self._walk(node.for_get_body(), at, band)
            if em.queue != "EX":
                raise CodegenError(
                    "a double-buffered loop's body must run on the compute queue only"
                )
            sync("EX", signal=["ST"])
            sync("ST", wait=["EX", "LD"])
            for t in stores:
                self._dma_raw("STORE", t)
            sync("ST", signal=["LD", "EX"])

        count = hi - lo + 1
        head = len(code)
        code.append(isa.make("LOOP", count=count // 2, body=0))
        em.depth += 1
        level = em.depth - 1
        iteration(LoopAffine.make(lo, {level: 2}), 0, "all")
        iteration(LoopAffine.make(lo + 1, {level: 2}), 1, "all" if count % 2 else "guarded")
        em.depth -= 1
        code[head] = isa.make("LOOP", count=count // 2, body=len(code) - head - 1)
        if count % 2:
            iteration(LoopAffine.make(hi), 0, "none")
        for t in here:
            self.active[t] = saved[t]
        sync("LD", wait=["ST"])
        sync("EX", wait=["LD"])
        for _ in range(2):
            sync("EX", wait=["ST"])
        em.queue, em.fresh_block = "EX", True

    def _dma_raw(self, kind: str, tensor: str) -> None:
        """A DMA (or zero fill) appended without the serial token chain."""
        before = self.em.queue, len(self.em.code)
        self.em.queue = (
            {"LOAD": "LD", "STORE": "ST"}[kind]
            if not (kind == "LOAD" and tensor in self.fresh)
            else "EX"
        )
        self._dma(kind, tensor)
        for i in range(before[1], len(self.em.code)):
            self.em.code[i] = self.em.code[i].with_tokens(wait=set(), signal=set())
        self.em.queue = before[0]

    def _dma(self, kind: str, tensor: str) -> None:
        mem, base, origin, size = self.active[tensor]
        t = self.program.tensor(tensor)
        view = View(mem, t.dtype, LoopAffine.make(base), size, self._strides(tensor, size))
        if kind == "LOAD" and tensor in self.fresh:
            if tensor not in self.unfilled:
                self.em.emit(
                    isa.make("VFILL", dst=view, imm=0)
                )  # starts as zeros and no other box meets it
            return
        if kind == "LOAD" and tensor in self.compact:
            # one DMA per accessed row, each into its row of the compact buffer
            d, step, rows = self.compact[tensor]
            strides = self._strides(tensor, size)
            one = size[:d] + (1,) + size[d + 1 :]
            for i in range(rows):
                row = View(
                    mem, t.dtype, LoopAffine.make(base + i * strides[d] * t.itemsize), one, strides
                )
                at = tuple(o + i * step if k == d else o for k, o in enumerate(origin))
                self.em.emit(isa.make("LOAD", dst=row, src=Box(self.index[tensor], at, one)))
            return
        box = Box(self.index[tensor], tuple(origin), size)
        self.em.emit(
            isa.make(kind, dst=view, src=box)
            if kind == "LOAD"
            else isa.make(kind, dst=box, src=view)
        )

    # -- statements -------------------------------------------------------------------------
    def _user(self, call, env, band) -> None:
        ast_name = call.get_op_arg(0).get_id().get_name()
        stmt = self.by_name[self.piece_of.get(ast_name, ast_name)]
        values = {}
        for i, index in enumerate(stmt.indices):
            values[index] = _expr(call.get_op_arg(i + 1), env)
        kinds = {
            b[0]
            for b in self.bands
            if any(f"c{p}" in band for p in b[1]) and self._banded(ast_name, b)
        }
        if "array" in kinds:
            self._matmul(stmt, values, band, ast_name not in self.overwriting)
            return
        shape = tuple(n for _, n in sorted(band.values())) or (1,)

        def view_of(acc: Access) -> View:
            return self._view(acc, values, band)

        def temp(slot: int) -> View:
            nbytes = _align(4 * int(np.prod(shape)))
            base = self.temp_base + slot * nbytes
            if base + nbytes > self.target.spad.bytes:
                raise CapacityError(
                    f"vector temporaries overflow the scratchpad of {self.target.name}"
                )
            return View("spad", "int32", LoopAffine.make(base), shape, _row_major(shape))

        if band:
            lhs = self._view(stmt.lhs, values, band)
            if 0 in lhs.strides and stmt.op != "=":
                raise CodegenError(
                    f"vectorize: {stmt.name} reduces along the vector lanes; vectorize a loop "
                    f"that indexes its output"
                )
        VectorExpr(
            self.em, self.program, stmt, view_of, temp, overwrite=ast_name in self.overwriting
        ).statement()

    def _view(self, acc: Access, values: dict[str, LoopAffine], band) -> View:
        if self.active.get(acc.tensor) is None:
            raise CodegenError(f"{acc.tensor} is accessed outside the loop it is staged at")
        mem, base, origin, size = self.active[acc.tensor]
        t = self.program.tensor(acc.tensor)
        strides = self._strides(acc.tensor, size)
        addr = LoopAffine.make(base)
        comp = self.compact.get(acc.tensor)
        for d, sub in enumerate(acc.index):
            elem = LoopAffine.make(sub.const) + origin[d].scale(-1)
            for name, c in sub.terms:
                elem = elem + values[name].scale(c)
            if comp is not None and d == comp[0]:  # the row among the accessed rows
                step = comp[1]
                if elem.const % step or any(c % step for c in elem.coefs):
                    raise CodegenError(
                        f"{acc} does not step by {step} along dimension {d} of {acc.tensor}"
                    )
                elem = LoopAffine.make(elem.const // step, tuple(c // step for c in elem.coefs))
            addr = addr + elem.scale(strides[d] * t.itemsize)
        coefs = list(addr.coefs) + [0] * (BAND_LEVEL + 8 - len(addr.coefs))
        lane_strides = []
        for _, (slot, _) in sorted(band.items(), key=lambda kv: kv[1][0]):
            c = coefs[BAND_LEVEL + slot]
            if c % t.itemsize:
                raise CodegenError(f"unaligned lane stride for {acc}")
            lane_strides.append(c // t.itemsize)
            coefs[BAND_LEVEL + slot] = 0
        base_aff = LoopAffine.make(addr.const, tuple(coefs[:BAND_LEVEL]))
        if not band:
            return View(mem, t.dtype, base_aff, (1,), (1,))
        shape = tuple(n for _, (_, n) in sorted(band.items(), key=lambda kv: kv[1][0]))
        return View(mem, t.dtype, base_aff, shape, tuple(lane_strides))

    def _strides(self, tensor: str, size: tuple[int, ...]) -> tuple[int, ...]:
        """Element strides of a buffer of `tensor` holding a box of `size`: row-major in the
        order its stage's layout gives (the tensor's own order by default)."""
        order = self.layouts.get(tensor, tuple(range(len(size))))
        strides = [0] * len(size)
        step = 1
        for d in reversed(order):
            strides[d] = step
            step *= size[d]
        return tuple(strides)

    def _matmul(self, stmt: Statement, values, band, accumulate: bool = True) -> None:
        mp = mac_mapping(self.program, stmt)
        if mp is None or not band:
            raise CodegenError(
                f"tensorize: {stmt.name} is not an 8-bit contraction 'acc += a * b' over the band"
            )
        acc = self._view(stmt.lhs, values, band)
        a, b = self._view(mp.a, values, band), self._view(mp.b, values, band)
        # band slots -> roles: k moves a and b but not acc; m moves acc and a; n moves acc and b
        ms, n, k = [], [], []
        for slot in range(len(band)):
            moves = (acc.strides[slot] != 0, a.strides[slot] != 0, b.strides[slot] != 0)
            role = {(False, True, True): k, (True, True, False): ms, (True, False, True): n}.get(
                moves
            )
            if role is None:
                raise CodegenError(
                    f"tensorize: a loop of the band of {stmt.name} is not m, n or k of a matmul"
                )
            role.append(slot)
        if (
            self._declared_n(stmt, band) in ms
        ):  # tensorize named a loop of the usual M as N: swap the roles
            mp, a, b, ms, n = mp.swapped(), b, a, n, ms
        # isl emits no loop for a band loop of one iteration (a single row of M): it is a slot of size 1
        ms, n = ms or [None], n or [None]
        if len(n) != 1:
            raise CodegenError(
                f"tensorize: the band of {stmt.name} is not (m.., n, k..) of a matmul"
            )
        (n,) = n

        def pick(v: View, *slots: int | None) -> View:
            return View(
                v.mem,
                v.dtype,
                v.base,
                tuple(1 if x is None else v.shape[x] for x in slots),
                tuple(0 if x is None else v.strides[x] for x in slots),
            )

        a_k, b_k, depth = _coalesced_k(a, b, k)
        if depth is None:
            raise CodegenError(
                f"tensorize: the K loops of {stmt.name} are not one run of addresses in both "
                f"operands' buffers (strides {[a.strides[x] for x in k]} and "
                f"{[b.strides[x] for x in k]}); stage them with a layout that makes them one"
            )
        if pick(b, n).shape[0] > self.target.cols:
            raise CodegenError(
                f"tensorize: N={pick(b, n).shape[0]} exceeds the {self.target.cols} columns of "
                f"the array; split first"
            )
        if len(k) == 1 and depth > self.target.rows:
            raise CodegenError(
                f"tensorize: K={depth} exceeds the {self.target.rows} rows of the array; split first"
            )
        acc_v, a_v, b_v = pick(acc, *ms, n), pick(a, *ms, None), pick(b, None, n)
        for lo in range(0, depth, self.target.rows):
            rows = min(self.target.rows, depth - lo)
            a_part = View(
                a_v.mem,
                a_v.dtype,
                a_v.base + lo * a_k * ITEMSIZE[a_v.dtype],
                a_v.shape[:-1] + (rows,),
                a_v.strides[:-1] + (a_k,),
            )
            b_part = View(
                b_v.mem,
                b_v.dtype,
                b_v.base + lo * b_k * ITEMSIZE[b_v.dtype],
                (rows,) + b_v.shape[1:],
                (b_k,) + b_v.strides[1:],
            )
            # a block that holds the first update of all it writes overwrites with its first MATMUL
            self.em.emit(
                isa.make(
                    "MATMUL",
                    acc=acc_v,
                    a=a_part,
                    b=b_part,
                    accumulate=int(lo > 0 or accumulate),
                    a_zp=mp.a_zp,
                    b_zp=mp.b_zp,
                )
            )


def _coalesced_k(a: View, b: View, k: list[int | None]) -> tuple[int, int, int | None]:
    """The element strides in `a` and `b` of the run of addresses the K slots `k` make together,
    and its length; length None when they do not make one run in both (a slot's stride must be
    the next inner slot's stride times its extent, in both operands)."""
    slots = [x for x in k if x is not None]
    if not slots:
        return 0, 0, 1
    order = sorted(slots, key=lambda x: (abs(a.strides[x]), abs(b.strides[x])))
    inner = order[0]
    sa, sb, depth = a.strides[inner], b.strides[inner], a.shape[inner]
    for x in order[1:]:
        if a.strides[x] != sa * depth or b.strides[x] != sb * depth:
            return sa, sb, None
        depth *= a.shape[x]
    return sa, sb, depth


def _uniform_pieces(points: isl.Set, positions: list[int]) -> tuple[list[isl.Set], isl.Set | None]:
    """Split `points` (schedule points of one statement) into pieces where each band dimension
    takes every value of a constant range for every value of the outer dimensions."""
    pieces, rest = [points], None
    n = points.dim(isl.dim_type.set)
    for p in positions:
        done = []
        for piece in pieces:
            todo = piece
            for _ in range(8):  # full tiles, then each kind of partial tile
                if todo.is_empty():
                    break
                upto = todo.project_out(isl.dim_type.set, p + 1, n - p - 1)
                lo, hi = upto.dim_min(p), upto.dim_max(p)
                if not (lo.is_cst() and hi.is_cst()):
                    break
                prefixes = upto.project_out(isl.dim_type.set, p, 1)
                cube = prefixes.add_dims(isl.dim_type.set, 1).intersect(
                    isl.Set(
                        f"{{ [{', '.join(f'd{i}' for i in range(p + 1))}] : {_cst(lo)} <= d{p} <= {_cst(hi)} }}"
                    )
                )
                bad = cube.subtract(upto).project_out(isl.dim_type.set, p, 1)
                good = todo.intersect(prefixes.subtract(bad).add_dims(isl.dim_type.set, n - p))
                if good.is_empty():
                    break
                done.append(good)
                todo = todo.subtract(good)
            if not todo.is_empty():
                rest = todo if rest is None else rest.union(todo)
        pieces = done
    return pieces, rest


def _block_children(node) -> list:
    """The children of a block, with nested blocks flattened (they run in sequence all the same)."""
    children = node.block_get_children()
    out = []
    for i in range(children.n_ast_node()):
        child = children.get_at(i)
        out += _block_children(child) if child.get_type() == isl.ast_node_type.block else [child]
    return out


def _points_under(node, points: list) -> list:
    """The schedule points of the AST statements under `node` (noted as their annotations)."""
    t = node.get_type()
    if t == isl.ast_node_type.user:
        return [points[int(node.get_annotation().get_name()[len("points") :])]]
    if t == isl.ast_node_type.for_:
        return _points_under(node.for_get_body(), points)
    if t == isl.ast_node_type.if_:
        out = _points_under(node.if_get_then_node(), points)
        return (
            out + _points_under(node.if_get_else_node(), points) if node.if_has_else_node() else out
        )
    if t == isl.ast_node_type.block:
        return [p for child in _block_children(node) for p in _points_under(child, points)]
    if t == isl.ast_node_type.mark:
        return _points_under(node.mark_get_node(), points)
    return []


def _statements_under(node) -> frozenset[str]:
    t = node.get_type()
    if t == isl.ast_node_type.user:
        return frozenset({node.user_get_expr().get_op_arg(0).get_id().get_name()})
    if t == isl.ast_node_type.for_:
        return _statements_under(node.for_get_body())
    if t == isl.ast_node_type.if_:
        out = _statements_under(node.if_get_then_node())
        return out | _statements_under(node.if_get_else_node()) if node.if_has_else_node() else out
    if t == isl.ast_node_type.block:
        children = node.block_get_children()
        return frozenset().union(
            *(_statements_under(children.get_at(i)) for i in range(children.n_ast_node()))
        )
    if t == isl.ast_node_type.mark:
        return _statements_under(node.mark_get_node())
    return frozenset()


def _cst(pa: isl.PwAff) -> int:
    if not pa.is_cst():
        raise CodegenError("a tensor's footprint is unbounded")
    return int(pa.get_pieces()[0][1].get_constant_val().to_python())


def _const_int(e) -> int:
    if e.get_type() != isl.ast_expr_type.int:
        raise CodegenError(f"expected a constant, got {e.to_C_str()}")
    return int(e.get_val().to_python())


def _floor_affine(e, env) -> tuple[LoopAffine, int]:
    """`e` as floor(numerator / divisor) with an affine numerator over the loop iterators."""
    terms = floor_terms(e, env, "max")
    if len(terms) != 1:
        raise CodegenError(
            f"unsupported expression '{e.to_C_str()}' in the schedule's loop nest "
            f"(a maximum where one term is needed)"
        )
    return terms[0]


def _bound_terms(e, env, combine: str) -> list[tuple[LoopAffine, int]]:
    return floor_terms(e, env, combine)  # exact rewriting of isl's bound expressions (emitter.py)


def _conditions(e, env) -> list[tuple[LoopAffine, int]]:
    """Terms that must all be >= 0 for the AST condition `e` to hold."""
    t = isl.ast_expr_op_type
    op = e.get_op_type()
    if op in (t.and_, t.and_then):
        return _conditions(e.get_op_arg(0), env) + _conditions(e.get_op_arg(1), env)
    if op in (t.ge, t.le, t.eq, t.gt, t.lt):
        (na, da), (nb, db) = (
            _floor_affine(e.get_op_arg(0), env),
            _floor_affine(e.get_op_arg(1), env),
        )
        if da != 1 and db != 1:
            raise CodegenError(f"unsupported guard '{e.to_C_str()}' in the schedule's loop nest")
        # floor(n/d) - b >= 0  <=>  n - d*b >= 0 (d > 0)
        # a - b >= 0, scaled by da when b is whole
        diff = na + nb.scale(-da) if db == 1 else na.scale(db) + nb.scale(-1)
        if op == t.ge:
            return [(diff, 1)]
        if op == t.gt:
            return [(diff + (-1), 1)]
        if op == t.le:
            return [(diff.scale(-1), 1)]
        if op == t.lt:
            return [(diff.scale(-1) + (-1), 1)]
        return [(diff, 1), (diff.scale(-1), 1)]
    raise CodegenError(f"unsupported guard '{e.to_C_str()}' in the schedule's loop nest")
