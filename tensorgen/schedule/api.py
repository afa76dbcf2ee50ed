"""The schedule-authoring API.

A `Schedule` maps every statement instance to a point of one common,
multi-dimensional schedule space (an isl map per statement). Each dimension is,
per statement, either a loop (a `Loop` handle shared by the statements it
encloses) or a constant that orders sibling statements. Every primitive
rewrites these maps, then checks the result at once against the program's exact
isl dependences (flow, anti, output; integer reductions relaxed) and raises a
`ScheduleError` naming the primitive and one concrete counterexample.

The schedule is also a trace: `str(schedule)` is the Python that recreates it,
the body of a schedule file under schedules/.

Example (matmul `C[i, j] += A[i, k] * B[k, j]`)::

    s = Schedule(program)
    io, jo, ii, ji = s.tile(s.loop("i"), s.loop("j"), 16, 16)
    s.reorder(io, jo, s.loop("k"), ii, ji)
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import lru_cache

import islpy as isl

from tensorgen.errors import CapacityError, ScheduleError
from tensorgen.ir import poly
from tensorgen.ir.core import Program
from tensorgen.poly.footprint import rectangular_hull, union_aligned
from tensorgen.poly.legality import find_violation

MEMORIES = ("spad", "acc")


@dataclass(frozen=True)
class Loop:
    """A handle on one loop; it stays valid across transformations of the schedule."""

    id: int
    name: str

    def __repr__(self) -> str:
        return f"Loop({self.name!r})"


@dataclass
class _LoopInfo:
    name: str
    statements: frozenset[str]


@dataclass(frozen=True)
class FirstTouch:
    """The iterations of a staging loop whose box no earlier iteration's box meets, for a tensor
    that starts as zeros but whose boxes meet (a `+=` accumulator staged inside a loop over
    chunks of its reduction): in those the buffer starts as zeros instead of being loaded.
    `first` and `rest` (the iterations that load) are disjunctions of conjunctions of
    constraints (constant, {"d<k>": coefficient}) >= 0 over the schedule dimensions up to the
    loop, each exact within the iterations that exist."""

    first: tuple[tuple[tuple[int, dict[str, int]], ...], ...]
    rest: tuple[tuple[tuple[int, dict[str, int]], ...], ...]
    count: int  # how many iterations are first
    covered: bool  # in every iteration, every element of the box inside the tensor is written


@dataclass(frozen=True)
class StagedBox:
    offset: tuple  # per dimension: (constant, {"d<k>": coefficient}) over schedule dimensions
    size: tuple[int, ...]
    fresh: bool  # the buffer starts as zeros: no load needed
    covered: bool = False  # fresh, and every element of the box inside the tensor is written in its
    # iteration (so that the buffer need not be zeroed) by a program that reads no initial value of it
    first: FirstTouch | None = None  # not fresh, starts as zeros: the iterations that need no load
    disjoint_in_loop: bool = (
        False  # not fresh, written: no two iterations of the loop with the same
    )
    # outer iterations meet, so a double buffer may load the next box while the last one is stored
    steps: tuple[
        int, ...
    ] = ()  # per dimension, the stride of the elements accessed (2: every other row)


@dataclass(frozen=True)
class Stage:
    tensor: str
    loop: str  # loop name, or "" for the whole program
    memory: str
    double_buffered: bool = False
    layout: tuple[int, ...] | None = (
        None  # the buffer's dimension order, outermost first (None: the tensor's)
    )


@dataclass
class _State:
    maps: dict[str, isl.Map]  # statement -> { S[indices] -> [d0, ..., dn] }
    dims: list[dict[str, int | None]]  # per position: statement -> loop id, or None for a constant
    loops: dict[int, _LoopInfo]
    alias: dict[int, int] = field(default_factory=dict)  # fused-away loop id -> surviving id
    split_into: dict[int, tuple[str, str, str]] = field(
        default_factory=dict
    )  # split loop id -> names: (it, outer, inner)


class Schedule:
    """A chainable, checked schedule of one program. See the module docstring."""

    def __init__(self, program: Program, target=None, checked: bool = True) -> None:
        """`checked=False` skips the dependence checks: only for the automatic scheduler's cost
        probes of schedules it rebuilds, checked, before using them."""
        self.program = program
        self.target = target
        self.checked = checked
        self.trace: list[str] = []
        self.stages: list[Stage] = []
        self.unrolled: dict[str, int | None] = {}
        self.vectorized: list[str] = []
        self.tensorized: list[
            tuple[tuple[str, ...], str, tuple[str, ...]]
        ] = []  # (m loops, n, k loops)
        self._next_id = 0
        self._annotated: dict[int, str] = {}
        self._state = self._original()

    # -- construction ---------------------------------------------------------------------
    def _new_loop(self, name: str, statements) -> int:
        taken = (
            {info.name for info in self._state.loops.values()} if hasattr(self, "_state") else set()
        )
        base, n = name, 1
        while name in taken:
            n += 1
            name = f"{base}{n}"
        self._next_id += 1
        self._pending_loops[self._next_id] = _LoopInfo(name, frozenset(statements))
        return self._next_id

    def _original(self) -> _State:
        """Program order: shared loops, then statements in order, each with its own loop nest."""
        prog = self.program
        self._pending_loops: dict[int, _LoopInfo] = {}
        shared = prog.shared_names
        depth = max(len(s.indices) - len(shared) for s in prog.statements)
        names = [s.name for s in prog.statements]
        dims: list[dict[str, int | None]] = []
        for name in shared:
            lid = self._new_loop(name, names)
            dims.append({n: lid for n in names})
        dims.append({n: None for n in names})  # statement order
        own_names = {}
        for s in prog.statements:
            for i in s.indices[len(shared) :]:
                own_names[i] = own_names.get(i, 0) + 1
        for level in range(depth):
            row: dict[str, int | None] = {}
            for s in prog.statements:
                own = s.indices[len(shared) :]
                if level < len(own):
                    label = own[level] if own_names[own[level]] == 1 else f"{s.name}.{own[level]}"
                    row[s.name] = self._new_loop(label, [s.name])
                else:
                    row[s.name] = None
            dims.append(row)
        maps = {}
        for pos, s in enumerate(prog.statements):
            own = list(s.indices[len(shared) :])
            out = list(shared) + [str(pos)] + own + ["0"] * (depth - len(own))
            maps[s.name] = isl.Map(
                f"{{ {s.name}[{', '.join(s.indices)}] -> [{', '.join(out)}] }}"
            ).intersect_domain(poly.domain(s))
        state = _State(maps, dims, dict(self._pending_loops))
        return state

    # -- queries ----------------------------------------------------------------------------
    def loop(self, name: str) -> Loop:
        """The loop called `name` (`"k"`, or `"S1.k"` when several statements have a `k`)."""
        for lid, info in self._state.loops.items():
            if info.name == name and lid not in self._state.alias:
                return Loop(lid, name)
        known = ", ".join(
            sorted(i.name for lid, i in self._state.loops.items() if lid not in self._state.alias)
        )
        was = next(
            (
                f"; {name} was split into {o} and {i}"
                for n, o, i in self._state.split_into.values()
                if n == name
            ),
            "",
        )
        raise ScheduleError(f"loop('{name}'): no such loop (loops: {known}){was}")

    def loops(self, statement: str) -> list[Loop]:
        """The loops enclosing `statement`, outermost first."""
        if statement not in self._state.maps:
            raise ScheduleError(f"loops('{statement}'): no such statement")
        out = []
        for row in self._state.dims:
            lid = row[statement]
            if lid is not None:
                out.append(Loop(lid, self._state.loops[lid].name))
        return out

    def _resolve(
        self, loop: Loop, prim: str, modify: bool = True
    ) -> tuple[int, int, frozenset[str]]:
        """(loop id, position, statements) of a handle; `modify`: the primitive reshapes the loop."""
        if not isinstance(loop, Loop):
            raise ScheduleError(f"{prim}: expected a loop handle (s.loop(name)), got {loop!r}")
        lid = loop.id
        while lid in self._state.alias:
            lid = self._state.alias[lid]
        if lid in self._state.split_into:
            _, o, i = self._state.split_into[lid]
            raise ScheduleError(
                f"{prim}: {loop.name} was split into {o} and {i}; use the loops split returned"
            )
        if lid not in self._state.loops:
            raise ScheduleError(f"{prim}: {loop.name} is not a loop of this schedule")
        if modify and lid in self._annotated:
            raise ScheduleError(
                f"{prim}: {loop.name} is {self._annotated[lid]}; transform loops before "
                f"vectorizing, tensorizing or unrolling them"
            )
        for pos, row in enumerate(self._state.dims):
            if lid in row.values():
                return lid, pos, self._state.loops[lid].statements
        raise ScheduleError(f"{prim}: {loop.name} no longer exists")

    def union_map(self) -> isl.UnionMap:
        out = isl.UnionMap("{ }")
        for m in self._state.maps.values():
            out = out.union(isl.UnionMap.from_map(m))
        return out

    def __str__(self) -> str:
        return "\n".join(self.trace)

    # -- machinery ------------------------------------------------------------------------------
    def _commit(self, prim: str, state: _State, call: str) -> None:
        """Check `state` against the dependences; adopt it and record `call`, or raise."""
        umap = isl.UnionMap("{ }")
        for m in state.maps.values():
            umap = umap.union(isl.UnionMap.from_map(m))
        viol = find_violation(self.program, umap) if self.checked else None
        if viol is not None:
            raise ScheduleError(f"{prim}: {viol.sentence()}", detail=str(umap))
        self._state = state
        self.trace.append(call)

    def check(self) -> None:
        """Check the whole schedule against the dependences at once: for a schedule built with
        `checked=False`, whose primitives skipped their own checks (only the final order matters)."""
        viol = find_violation(self.program, self.union_map())
        if viol is not None:
            raise ScheduleError(f"the schedule: {viol.sentence()}", detail=str(self.union_map()))

    def _copy(self) -> _State:
        s = self._state
        return _State(
            dict(s.maps),
            [dict(r) for r in s.dims],
            dict(s.loops),
            dict(s.alias),
            dict(s.split_into),
        )

    def _apply(self, state: _State, statements, transform: str) -> None:
        """Apply `{ [d...] -> [e...] }` (isl text over d0..dn) to the maps of `statements`."""
        for name in statements:
            state.maps[name] = state.maps[name].apply_range(isl.Map(transform))

    def _all_statements(self) -> list[str]:
        return [s.name for s in self.program.statements]

    # -- primitives ------------------------------------------------------------------------------
    def split(self, loop: Loop, factor: int) -> tuple[Loop, Loop]:
        """Split `loop` into an outer loop over blocks of `factor` and an inner loop inside them.

        Before::                    After ``split(i, 4)``::

            for i in 0..N:              for i_o in 0..ceil(N/4):
                S(i)                        for i_i in 0..4 (and 4*i_o + i_i < N):
                                                S(4*i_o + i_i)
        """
        prim = f"split({loop.name}, {factor})"
        if not isinstance(factor, int) or isinstance(factor, bool) or factor <= 0:
            raise ScheduleError(f"{prim}: factor must be a positive integer")
        lid, pos, stmts = self._resolve(loop, prim)
        state = self._copy()
        n = len(state.dims)
        ins = [f"d{i}" for i in range(n)]
        outer = (
            ins[:pos]
            + [f"floor(d{pos}/{factor})", f"d{pos} - {factor}*floor(d{pos}/{factor})"]
            + ins[pos + 1 :]
        )
        other = ins[: pos + 1] + ["0"] + ins[pos + 1 :]
        for name in self._all_statements():
            out = outer if name in stmts else other
            state.maps[name] = state.maps[name].apply_range(
                isl.Map(f"{{ [{', '.join(ins)}] -> [{', '.join(out)}] }}")
            )
        self._pending_loops = {}
        name = state.loops[lid].name
        o, i = self._new_loop(f"{name}_o", stmts), self._new_loop(f"{name}_i", stmts)
        del state.loops[lid]
        state.loops.update(self._pending_loops)
        state.split_into[lid] = (name, state.loops[o].name, state.loops[i].name)
        row = state.dims[pos]
        state.dims[pos] = {k: (o if v == lid else v) for k, v in row.items()}
        state.dims.insert(pos + 1, {k: (i if v == lid else None) for k, v in row.items()})
        self._commit(prim, state, f"s.split(s.loop({name!r}), {factor})")
        # a tensor staged at the split loop keeps its footprint: one iteration of the old loop is
        # one iteration of the inner loop (within one of the outer)
        self._restage(name, state.loops[i].name)
        return Loop(o, state.loops[o].name), Loop(i, state.loops[i].name)

    def _restage(self, old: str, new: str) -> None:
        """Stages at the loop called `old` move to the loop called `new`, which replaces it."""
        self.stages = [replace(st, loop=new) if st.loop == old else st for st in self.stages]

    def reorder(self, *loops: Loop) -> None:
        """Permute loops that enclose the same statements into the given order (outermost first).

        Before::                    After ``reorder(j, i)``::

            for i: for j: S(i, j)       for j: for i: S(i, j)
        """
        prim = f"reorder({', '.join(getattr(l, 'name', repr(l)) for l in loops)})"
        if len(loops) < 2:
            raise ScheduleError(f"{prim}: give at least two loops")
        found = [self._resolve(l, prim) for l in loops]
        stmts = found[0][2]
        for (lid, _, st), l in zip(found, loops, strict=False):
            if st != stmts:
                raise ScheduleError(
                    f"{prim}: {l.name} and {loops[0].name} do not enclose the same statements "
                    f"({', '.join(sorted(st))} vs {', '.join(sorted(stmts))}); fuse or distribute first"
                )
        positions = sorted(p for _, p, _ in found)
        if len(set(positions)) != len(positions):
            raise ScheduleError(f"{prim}: a loop is named twice")
        state = self._copy()
        n = len(state.dims)
        ins = [f"d{i}" for i in range(n)]
        out = list(ins)
        for target_pos, (_, src_pos, _) in zip(positions, found, strict=False):
            out[target_pos] = f"d{src_pos}"
        self._apply(state, stmts, f"{{ [{', '.join(ins)}] -> [{', '.join(out)}] }}")
        for name in stmts:
            olds = [state.dims[p][name] for p in range(n)]
            for target_pos, (_, src_pos, _) in zip(positions, found, strict=False):
                state.dims[target_pos][name] = olds[src_pos]
        self._commit(prim, state, f"s.reorder({', '.join(f's.loop({l.name!r})' for l in loops)})")

    def tile(
        self, outer: Loop, inner: Loop, f_outer: int, f_inner: int
    ) -> tuple[Loop, Loop, Loop, Loop]:
        """Split two nested loops and reorder to (outer_o, inner_o, outer_i, inner_i).

        Before::                    After ``tile(i, j, 4, 8)``::

            for i: for j: S             for i_o: for j_o: for i_i in 0..4: for j_i in 0..8: S
        """
        prim = f"tile({getattr(outer, 'name', outer)}, {getattr(inner, 'name', inner)}, {f_outer}, {f_inner})"
        saved = (self._copy(), list(self.trace))
        try:
            oo, oi = self.split(outer, f_outer)
            io, ii = self.split(inner, f_inner)
            self.reorder(oo, io, oi, ii)
        except ScheduleError as err:
            self._state, self.trace = saved
            reason = str(err).split(": ", 1)[1]
            raise ScheduleError(f"{prim}: {reason}", detail=err.detail) from None
        return oo, io, oi, ii

    def skew(self, loop: Loop, by: Loop, factor: int = 1) -> None:
        """Replace `loop`'s iterator i by i + factor * (iterator of the outer loop `by`).

        Before::                        After ``skew(i, t, 1)``::

            for t: for i: S(t, i)           for t: for i' in t..t+N: S(t, i' - t)

        Skewing makes the dependences of a stencil point forward in both loops, so that a
        following tile (or reorder) is legal.
        """
        prim = f"skew({getattr(loop, 'name', loop)}, {getattr(by, 'name', by)}, {factor})"
        if not isinstance(factor, int) or isinstance(factor, bool):
            raise ScheduleError(f"{prim}: factor must be an integer")
        lid, pos, stmts = self._resolve(loop, prim)
        bid, bpos, bstmts = self._resolve(by, prim, modify=False)
        if bpos >= pos or not stmts <= bstmts:
            raise ScheduleError(f"{prim}: {by.name} must be a loop enclosing {loop.name}")
        state = self._copy()
        ins = [f"d{i}" for i in range(len(state.dims))]
        out = list(ins)
        out[pos] = f"d{pos} + {factor}*d{bpos}"
        self._apply(state, stmts, f"{{ [{', '.join(ins)}] -> [{', '.join(out)}] }}")
        self._commit(prim, state, f"s.skew(s.loop({loop.name!r}), s.loop({by.name!r}), {factor})")

    def fuse(self, first: Loop, second: Loop) -> Loop:
        """Fuse two sibling loops: the body of `second` runs inside `first`, after its body.

        Before::                    After ``fuse(i, i2)``::

            for i: S0(i)                for i: S0(i); S1(i)
            for i2: S1(i2)
        """
        prim = f"fuse({getattr(first, 'name', first)}, {getattr(second, 'name', second)})"
        a, pa, sa = self._resolve(first, prim)
        b, pb, sb = self._resolve(second, prim)
        if pa != pb or a == b:
            raise ScheduleError(f"{prim}: the loops are not siblings at the same depth")
        state = self._copy()
        # the constant dimension that orders the two loops: the last one where they differ, before them
        q = next(
            (
                p
                for p in range(pa - 1, -1, -1)
                if all(state.dims[p][s] is None for s in sa | sb)
                and _const_at(state, sa, p) != _const_at(state, sb, p)
            ),
            None,
        )
        if q is None or any(
            state.dims[p][s] != state.dims[p][next(iter(sa))]
            for p in range(q + 1, pa)
            for s in sa | sb
        ):
            raise ScheduleError(f"{prim}: the loops are not siblings under the same parent loop")
        va, vb = _const_at(state, sa, q), _const_at(state, sb, q)
        if va is None or vb is None:
            raise ScheduleError(
                f"{prim}: the statements of each loop must be ordered by one constant"
            )
        if va > vb:
            raise ScheduleError(f"{prim}: {first.name} must come before {second.name}")
        n = len(state.dims)
        ins = [f"d{i}" for i in range(n)]
        for name, v in [(s, va) for s in sa] + [(s, vb) for s in sb]:
            out = list(ins)
            out[q] = str(va)
            out.insert(pa + 1, str(v))
            state.maps[name] = state.maps[name].apply_range(
                isl.Map(f"{{ [{', '.join(ins)}] -> [{', '.join(out)}] }}")
            )
        for name in self._all_statements():
            if name not in sa | sb:
                ins2 = list(ins)
                out = ins2[: pa + 1] + ["0"] + ins2[pa + 1 :]
                state.maps[name] = state.maps[name].apply_range(
                    isl.Map(f"{{ [{', '.join(ins)}] -> [{', '.join(out)}] }}")
                )
        state.dims.insert(pa + 1, {name: None for name in self._all_statements()})
        for name in sb:
            state.dims[pa][name] = a
        state.loops[a] = _LoopInfo(state.loops[a].name, sa | sb)
        gone = state.loops.pop(b).name
        state.alias[b] = a
        saved = (self._state, list(self.trace), list(self.stages))
        self._commit(prim, state, f"s.fuse(s.loop({first.name!r}), s.loop({second.name!r}))")
        self._restage(gone, state.loops[a].name)  # the fused loop's iterations hold both bodies
        try:
            self._check_capacity(prim)
        except CapacityError:
            self._state, self.trace, self.stages = saved
            raise
        return Loop(a, state.loops[a].name)

    def distribute(self, loop: Loop, *statements: str) -> Loop:
        """Split `loop` in two: `statements` move to a copy of the loop that runs after it.

        Before::                        After ``distribute(i, "S1")``::

            for i: S0(i); S1(i)             for i: S0(i)
                                            for i': S1(i')
        Returns the new loop of `statements`.
        """
        prim = f"distribute({getattr(loop, 'name', loop)}, {', '.join(statements)})"
        lid, pos, stmts = self._resolve(loop, prim)
        moved = frozenset(statements)
        if not moved or not moved < stmts:
            raise ScheduleError(
                f"{prim}: name some but not all of the statements in {loop.name}: "
                f"{', '.join(sorted(stmts))}"
            )
        state = self._copy()
        n = len(state.dims)
        ins = [f"d{i}" for i in range(n)]
        for name in self._all_statements():
            v = "1" if name in moved else "0"
            out = ins[:pos] + [v] + ins[pos:]
            state.maps[name] = state.maps[name].apply_range(
                isl.Map(f"{{ [{', '.join(ins)}] -> [{', '.join(out)}] }}")
            )
        state.dims.insert(pos, {name: None for name in self._all_statements()})
        self._pending_loops = {}
        new = self._new_loop(f"{state.loops[lid].name}_d", moved)
        state.loops.update(self._pending_loops)
        state.loops[lid] = _LoopInfo(state.loops[lid].name, stmts - moved)
        for name in moved:
            state.dims[pos + 1][name] = new
        self._commit(
            prim, state, f"s.distribute(s.loop({loop.name!r}), {', '.join(map(repr, statements))})"
        )
        return Loop(new, state.loops[new].name)

    def unroll(self, loop: Loop, factor: int | None = None) -> None:
        """Unroll `loop` (fully, or by `factor`); a code-generation hint that keeps the order.

        Before::                    After ``unroll(j)`` (j over 0..2)::

            for j in 0..2: S(j)         S(0); S(1)
        """
        prim = f"unroll({getattr(loop, 'name', loop)})"
        if factor is not None and (not isinstance(factor, int) or factor <= 0):
            raise ScheduleError(f"{prim}: factor must be a positive integer")
        lid = self._resolve(loop, prim, modify=False)[0]
        self.unrolled[loop.name] = factor
        self._annotated[lid] = "unrolled"
        self.trace.append(
            f"s.unroll(s.loop({loop.name!r}){'' if factor is None else f', {factor}'})"
        )

    def _innermost_band(self, loops: tuple[Loop, ...], prim: str) -> tuple[int, int]:
        found = [self._resolve(l, prim, modify=False) for l in loops]
        positions = [p for _, p, _ in found]
        stmts = found[0][2]
        for name in stmts:
            deeper = [
                p
                for p, row in enumerate(self._state.dims)
                if row[name] is not None and p > max(positions)
            ]
            if deeper:
                raise ScheduleError(
                    f"{prim}: {name} has loops inside the band; the band must be innermost"
                )
        return min(positions), max(positions) + 1

    def vectorize(self, loop: Loop, *more: Loop) -> None:
        """Run the iterations of the innermost `loop` at once on the vector unit; with `more`
        (the loops nested inside `loop`, in order, innermost last), the iterations of all of
        them as one multi-dimensional vector, which pays the vector unit's setup once.

        Before::                        After ``vectorize(w)``::

            for h: for w in 0..56:          for h:
                Y[h, w] = f(X[h, w])            Y[h, 0:56] = f(X[h, 0:56])   # one vector op

                                        After ``vectorize(h, w)``::

                                            Y[0:H, 0:56] = f(X[0:H, 0:56])   # one vector op
        """
        loops = (loop, *more)
        prim = f"vectorize({', '.join(str(getattr(l, 'name', l)) for l in loops)})"
        found = [self._resolve(l, prim, modify=False) for l in loops]
        if more:
            stmts = found[0][2]
            nest = [
                p for p, row in enumerate(self._state.dims) if row[next(iter(stmts))] is not None
            ]
            ranks = [nest.index(p) if p in nest else -1 for _, p, _ in found]
            if any(st != stmts for _, _, st in found) or ranks != list(
                range(ranks[0], ranks[0] + len(loops))
            ):
                raise ScheduleError(
                    f"{prim}: give distinct loops of the same statements, each directly "
                    f"inside the one before"
                )
        lo, hi = self._innermost_band(loops, prim)
        stmts = found[0][2]
        viol = find_violation(self.program, self.union_map(), lo, hi, stmts)
        if viol is not None:
            raise ScheduleError(f"{prim}: {viol.sentence(parallel=True)}")
        for (lid, _, _), l in zip(found, loops, strict=False):
            self.vectorized.append(l.name)
            self._annotated[lid] = "vectorized"
        self.trace.append(f"s.vectorize({', '.join(f's.loop({l.name!r})' for l in loops)})")

    def tensorize(self, m: Loop | tuple[Loop, ...], n: Loop, k: Loop | tuple[Loop, ...]) -> None:
        """Map the innermost band (m, n, k) onto the MAC array: acc[m, n] += a[m, k] * b[k, n].
        `m` may be several adjacent loops (outer first): all of them stream through the array as
        one long M, which amortises its fill (a 7x7 image is M = 49, not 7 rows of 7).
        `k` may be several loops too (outer first), when the staged layouts of both operands make
        them one run of addresses (a 7x7 kernel's columns and 3 channels, channels innermost, are
        21 consecutive bytes: `stage(..., layout=...)`); the lowering then cuts that run into
        MATMULs of at most the array's rows each, so 21 taps fill 16 + 5 rows instead of 7 + 7 + 7.

        Before::                                    After ``tensorize(i, j_i, k_i)``::

            for j_o: for k_o: for i: for j_i: for k_i:      for j_o: for k_o:
                C[i, j] += A[i, k] * B[k, j]                    MATMUL C[:, j_o] += A[:, k_o] @ B[k_o, j_o]
        """
        ms = tuple(m) if isinstance(m, (tuple, list)) else (m,)
        ks = tuple(k) if isinstance(k, (tuple, list)) else (k,)
        loops = (*ms, n, *ks)
        prim = f"tensorize({', '.join(getattr(l, 'name', str(l)) for l in loops)})"
        found = [self._resolve(l, prim, modify=False) for l in loops]
        stmt = next(iter(found[0][2]))
        nest = [p for p, row in enumerate(self._state.dims) if row[stmt] is not None]
        ranks = sorted(nest.index(p) for _, p, _ in found if p in nest)
        if len(set(ranks)) != len(loops) or ranks[-1] - ranks[0] != len(loops) - 1:
            raise ScheduleError(f"{prim}: give distinct loops that are adjacent in the nest")
        lo, hi = self._innermost_band(loops, prim)
        viol = find_violation(self.program, self.union_map(), lo, hi, found[0][2])
        if viol is not None:
            raise ScheduleError(f"{prim}: {viol.sentence(parallel=True)}")
        self.tensorized.append((tuple(l.name for l in ms), n.name, tuple(l.name for l in ks)))
        for lid, _, _ in found:
            self._annotated[lid] = "tensorized"

        def group(xs: tuple[Loop, ...]) -> str:
            return (
                f"s.loop({xs[0].name!r})"
                if len(xs) == 1
                else f"({', '.join(f's.loop({l.name!r})' for l in xs)})"
            )

        self.trace.append(f"s.tensorize({group(ms)}, s.loop({n.name!r}), {group(ks)})")

    def stage(
        self,
        tensor: str,
        at: Loop | None,
        memory: str = "spad",
        layout: tuple[int, ...] | None = None,
    ) -> None:
        """Keep the footprint of `tensor` that the iterations of `at` touch in `memory` (the DMAs
        in and out are implied); `at=None` stages what the whole program touches. `layout` orders
        the buffer's dimensions, outermost first (a permutation of the tensor's; default: the
        tensor's own order): the DMA transposes on the way, e.g. `(0, 2, 3, 1)` keeps an NCHW
        tile channels-last on chip.

        Before::                        After ``stage("B", k_o, "spad")``::

            for k_o: for i: for k_i:        for k_o:
                ... B[k, j] ...                 LOAD B[16*k_o : 16*k_o + 16, :] -> spad
                                                for i: for k_i: ... (reads the spad copy)
        """
        where = getattr(at, "name", "the program")
        prim = f"stage({tensor}, {where}, {memory})"
        try:
            self.program.tensor(tensor)
        except KeyError:
            raise ScheduleError(f"{prim}: no tensor {tensor}") from None
        if memory not in MEMORIES:
            raise ScheduleError(f"{prim}: memory must be one of {', '.join(MEMORIES)}")
        rank = len(self.program.tensor(tensor).shape)
        if layout is not None:
            layout = tuple(int(d) for d in layout)
            if sorted(layout) != list(range(rank)):
                raise ScheduleError(
                    f"{prim}: layout must order the {rank} dimensions of {tensor} "
                    f"(a permutation of 0..{rank - 1}), got {layout}"
                )
            if layout == tuple(range(rank)):
                layout = None
        if at is not None:
            self._resolve(at, prim, modify=False)
        self.stages.append(Stage(tensor, "" if at is None else at.name, memory, layout=layout))
        try:
            self._check_capacity(prim)
        except CapacityError:
            self.stages.pop()
            raise
        more = f", layout={layout}" if layout is not None else ""
        self.trace.append(
            f"s.stage({tensor!r}, {'None' if at is None else f's.loop({at.name!r})'}, {memory!r}{more})"
        )

    def double_buffer(self, tensor: str) -> None:
        """Give a staged tensor two buffers so the DMA of the next block can overlap this one's
        compute; capacity counts it twice. The lowering overlaps them when every tensor staged at
        the loop is double-buffered and the loop's body is pure compute.

        Before::                        After ``double_buffer("B")``::

            for k_o: LOAD B -> buf              for k_o: LOAD B[k_o + 1] -> buf[(k_o + 1) % 2]
                     compute(buf)                        compute(buf[k_o % 2])
        """
        prim = f"double_buffer({tensor})"
        idx = next((i for i, s in enumerate(self.stages) if s.tensor == tensor), None)
        if idx is None:
            raise ScheduleError(f"{prim}: stage {tensor} first")
        st = self.stages[idx]
        self.stages[idx] = replace(st, double_buffered=True)
        try:
            self._check_capacity(prim)
        except CapacityError:
            self.stages[idx] = st
            raise
        self.trace.append(f"s.double_buffer({tensor!r})")

    # -- capacity -----------------------------------------------------------------------------------
    def footprint_bytes(self, stage: Stage) -> int:
        """Bytes of the largest per-iteration footprint of `stage.tensor` under its loop (isl),
        padding halo included."""
        box = self.staged_box(stage.tensor, stage.loop or None, overlaps=False)
        if box is None:
            return 0
        elements = 1
        for n in box.size:
            elements *= n
        return (
            elements
            * self.program.tensor(stage.tensor).itemsize
            * (2 if stage.double_buffered else 1)
        )

    def staged_box(self, tensor: str, loop: str | None, overlaps: bool = True) -> StagedBox | None:
        """The box a buffer of `tensor` staged at `loop` (None: the program) holds in one iteration.

        Its origin is affine in the schedule dimensions d0..dp up to the loop (one piece, or
        CodegenError-worthy None offsets), its size the largest over the iterations; `fresh` says
        that no iteration's box meets another's and the tensor starts as zeros (an output or a
        temporary), so a buffer needs no load: zeros are its correct initial contents. Boxes that
        meet are analysed further (`first`, `disjoint_in_loop`) unless `overlaps` is False.
        """
        t = self.program.tensor(tensor)
        pos, stmts = -1, frozenset(self._all_statements())
        if loop:
            _, pos, stmts = self._resolve(self.loop(loop), "stage", False)
        image = written = None
        for st in self.program.statements:
            if st.name not in stmts:
                continue
            prefix = self._prefix(st.name, pos)
            for acc in [st.lhs] + st.reads:
                if acc.tensor != tensor:
                    continue
                # the staged box includes the padding halo: the DMA fills it, so it takes space
                rel = prefix.reverse().apply_range(poly.access_map(st, acc))
                part = rel.move_dims(isl.dim_type.param, 0, isl.dim_type.in_, 0, pos + 1).range()
                image = union_aligned(image, part)
                if acc is st.lhs:
                    written = union_aligned(written, part)
        if image is None or image.is_empty():
            return None
        offset, size = rectangular_hull(image)
        fresh = (
            None not in offset
            and t.role in ("output", "none")
            and self._boxes_disjoint(tensor, pos, offset, size, image)
        )
        # (only asked where it decides something: a stored buffer whose initial zeros nothing reads)
        covered = (
            fresh
            and written is not None
            and t.role != "none"
            and not self.zeros_read(tensor)
            and self._box_covered(t, pos, offset, size, image, written)
        )
        first, disjoint = None, False
        if overlaps and not fresh and written is not None and None not in offset and pos >= 0:
            first, disjoint = self._overlaps(t, pos, offset, size, image, written)
        steps = tuple(
            max(1, int(image.get_stride(d).to_python())) if n > 1 else 1 for d, n in enumerate(size)
        )
        return StagedBox(tuple(offset), tuple(size), fresh, covered, first, disjoint, steps)

    def initial_value_read(self, tensor: str) -> bool:
        """Whether some instance reads an element of `tensor` before any statement writes it
        (a `+=` of a tensor that starts as zeros): only then must a fresh buffer be zeroed."""
        return _reads_initial_value(self.program, tensor)

    def zeros_read(self, tensor: str) -> bool:
        """Whether a fresh buffer of `tensor` must be zeroed: some instance reads an initial value
        of it, and the first `+=` to each element cannot simply overwrite it instead (see
        `overwrites_first`)."""
        return self.initial_value_read(tensor) and not self.overwrites_first(tensor)

    def overwrites_first(self, tensor: str) -> bool:
        """Whether the lowering may run the first update of each element of a fresh `tensor` as
        an overwrite (`Y = rhs` for `Y += rhs`: VMUL for VMAC, a MATMUL that does not accumulate),
        so that its buffer need not be zeroed: one `+=` statement writes it and nothing else
        reads it."""
        accessing = [
            s
            for s in self.program.statements
            if s.lhs.tensor == tensor or any(a.tensor == tensor for a in s.reads)
        ]
        if len(accessing) != 1:
            return False
        (stmt,) = accessing
        return (
            stmt.lhs.tensor == tensor
            and stmt.op == "+="
            and not any(a.tensor == tensor for a in stmt.reads)
        )

    def first_writes(self, statement: str, depth: int | None = None) -> isl.Set:
        """The schedule points of `statement` that write an element of its left-hand side in the
        earliest value of the schedule dimensions d0..d<depth-1> (all of them by default) that
        writes it: with a band below `depth`, every instance of the band's first block."""
        stmt = next(s for s in self.program.statements if s.name == statement)
        sched = self._state.maps[statement]
        n = sched.dim(isl.dim_type.out)
        prefix = (
            sched.project_out(isl.dim_type.out, depth, n - depth) if depth is not None else sched
        )
        writes = poly.access_map(stmt, stmt.lhs)  # instance -> element
        first = writes.reverse().apply_range(prefix).lexmin()  # element -> its first prefix
        instances = writes.range_product(prefix).intersect_range(first.wrap()).domain()
        return instances.apply(sched)

    def _box_covered(self, t, pos: int, offset, size, image: isl.Set, written: isl.Set) -> bool:
        """Whether, in every iteration, the writes cover the box (within the tensor's bounds)."""
        dims = [f"d{k}" for k in range(pos + 1)]
        cons = []
        for d, ((const, coefs), n) in enumerate(zip(offset, size, strict=False)):
            lo = " + ".join([str(const)] + [f"{c}*{k}" for k, c in coefs.items()])
            cons.append(f"{lo} <= e{d} < {lo} + {n} and 0 <= e{d} < {t.shape[d]}")
        elems = ", ".join(f"e{d}" for d in range(len(size)))
        box = isl.Set(f"[{', '.join(dims)}] -> {{ {t.name}[{elems}] : {' and '.join(cons)} }}")
        box = box.align_params(image.get_space()).intersect_params(image.params())
        return box.is_subset(written.align_params(box.get_space()))

    def _boxes_disjoint(self, tensor: str, pos: int, offset, size, image: isl.Set) -> bool:
        if pos < 0:
            return True
        box, iterations = _box_map(tensor, pos, offset, size, image)
        return box.intersect_domain(iterations).reverse().is_single_valued()

    def _overlaps(
        self, t, pos: int, offset, size, image: isl.Set, written: isl.Set
    ) -> tuple[FirstTouch | None, bool]:
        """For boxes that meet across iterations: the iterations whose box no earlier one meets
        (for a tensor that starts as zeros), and whether the boxes of one pass of the loop (its
        outer iterations fixed) are disjoint."""
        box, iterations = _box_map(t.name, pos, offset, size, image)
        box = box.intersect_domain(iterations)
        meets = box.apply_range(
            box.reverse()
        )  # iteration -> the iterations whose boxes share an element
        dims = [f"d{k}" for k in range(pos + 1)]
        other = [f"{d}'" for d in dims]
        same = " and ".join(
            [f"{a} = {b}" for a, b in zip(dims[:-1], other[:-1], strict=False)] + [f"{dims[-1]} != {other[-1]}"]
        )
        in_pass = isl.Map(f"{{ [{', '.join(dims)}] -> [{', '.join(other)}] : {same} }}")
        disjoint = meets.intersect(in_pass).is_empty()
        if t.role not in ("output", "none"):
            return None, disjoint
        first = iterations.subtract(
            meets.intersect(isl.Map.lex_gt(iterations.get_space())).domain()
        )
        if first.is_empty():
            return None, disjoint
        pieces = (
            _constraint_pieces(first, iterations),
            _constraint_pieces(iterations.subtract(first), iterations),
        )
        if None in pieces:
            return None, disjoint
        covered = self._box_covered(t, pos, offset, size, image, written)
        return FirstTouch(
            pieces[0], pieces[1], int(first.count_val().to_python()), covered
        ), disjoint

    def _prefix(self, statement: str, pos: int) -> isl.Map:
        """{ S[i] -> [d0..d<pos>] }: the schedule of `statement` up to dimension `pos`."""
        sched = self._state.maps[statement]
        prefix = sched.project_out(isl.dim_type.out, pos + 1, sched.dim(isl.dim_type.out) - pos - 1)
        for k in range(pos + 1):
            prefix = prefix.set_dim_name(isl.dim_type.out, k, f"d{k}")
        return prefix

    def overwriting_blocks(self, statement: str, depth: int) -> isl.Set | None:
        """For a `+=` statement that alone accesses its tensor, which starts as zeros: the
        schedule points of its blocks (instances that share the schedule dimensions before
        `depth`: one MATMUL of a band that starts there) that update only elements whose first
        update they hold, provided every instance that reads an initial value lies in such a
        block. Such a block may overwrite its elements instead of adding to them, and a buffer
        need not be zeroed for it. None when some initial value is read elsewhere."""
        stmt = next(st for st in self.program.statements if st.name == statement)
        tensor = self.program.tensor(stmt.lhs.tensor)
        if (
            stmt.op != "+="
            or tensor.role not in ("output", "none")
            or depth < 1
            or any(
                a.tensor == tensor.name
                for st in self.program.statements
                for a in [st.lhs] + st.reads
                if st is not stmt
            )
            or any(a.tensor == tensor.name for a in stmt.reads)
        ):
            return None
        initial = (
            _initial_readers(self.program, tensor.name)
            .intersect(isl.UnionSet.from_set(poly.domain(stmt)))
            .extract_set(poly.domain(stmt).get_space())
        )
        if initial.is_empty():
            return None
        block = self._prefix(statement, depth - 1)  # { S[i] -> [d0..d<depth-1>] }
        lhs = poly.access_map(stmt, stmt.lhs).intersect_domain(poly.domain(stmt))
        updates = block.reverse().apply_range(lhs)  # block -> the elements it updates
        firsts = (
            block.intersect_domain(initial).reverse().apply_range(lhs)
        )  # ... whose first update it holds
        overwriting = updates.domain().subtract(updates.subtract(firsts).domain())
        instances = block.intersect_range(overwriting).domain()
        if not initial.is_subset(instances):
            return None
        return self._state.maps[statement].intersect_domain(instances).range()

    def _check_capacity(self, prim: str) -> None:
        if self.target is None:
            return
        caps = {"spad": self.target.spad.bytes, "acc": self.target.acc.bytes}
        for mem in MEMORIES:
            live = [(st, self.footprint_bytes(st)) for st in self.stages if st.memory == mem]
            total = sum(b for _, b in live)
            if total > caps[mem]:
                what = ", ".join(
                    f"{st.tensor} at {st.loop or 'the program'} ({b} B"
                    f"{', double-buffered' if st.double_buffered else ''})"
                    for st, b in live
                )
                raise CapacityError(
                    f"{prim}: {mem} holds {total} B but has {caps[mem]} B "
                    f"({total - caps[mem]} B over): {what}"
                )


def _box_map(tensor: str, pos: int, offset, size, image: isl.Set) -> tuple[isl.Map, isl.Set]:
    """{ [d0..dp] -> tensor[box] } of a staged box, and the iterations (prefix values d0..dp, the
    parameters of `image`) as a set over [d0..dp]."""
    dims = [f"d{k}" for k in range(pos + 1)]
    elems = [f"e{d}" for d in range(len(size))]
    cons = []
    for d, ((const, coefs), n) in enumerate(zip(offset, size, strict=False)):
        lo = " + ".join([str(const)] + [f"{c}*{k}" for k, c in coefs.items()])
        cons.append(f"{lo} <= e{d} < {lo} + {n}")
    box = isl.Map(
        f"{{ [{', '.join(dims)}] -> {tensor}[{', '.join(elems)}] : {' and '.join(cons)} }}"
    )
    ordered = image.params().align_params(isl.Set(f"[{', '.join(dims)}] -> {{ : }}").get_space())
    iterations = isl.Set.from_params(ordered).move_dims(
        isl.dim_type.set, 0, isl.dim_type.param, 0, len(dims)
    )
    return box, iterations


def _constraint_pieces(points: isl.Set, context: isl.Set):
    """`points` as disjoint conjunctions of constraints (constant, {"d<k>": coefficient}) >= 0,
    simplified within `context`; None if a piece needs an existential variable."""
    pieces = []
    for part in points.make_disjoint().get_basic_sets():
        for bset in isl.Set.from_basic_set(part).gist(context).get_basic_sets():
            if bset.dim(isl.dim_type.div):
                return None
            cons = []
            for c in bset.get_constraints():
                const = int(c.get_constant_val().to_python())
                coefs = {
                    f"d{k}": int(c.get_coefficient_val(isl.dim_type.set, k).to_python())
                    for k in range(bset.dim(isl.dim_type.set))
                }
                coefs = {k: v for k, v in coefs.items() if v}
                cons.append((const, coefs))
                if c.is_equality():
                    cons.append((-const, {k: -v for k, v in coefs.items()}))
            pieces.append(tuple(cons))
    return tuple(pieces)


def _reads_initial_value(program: Program, tensor: str) -> bool:
    return not _initial_readers(program, tensor).is_empty()


@lru_cache(maxsize=256)
def _initial_readers(program: Program, tensor: str) -> isl.UnionSet:
    """The instances that read an element of `tensor` before any statement writes it."""
    reads = isl.UnionMap("{ }")
    for stmt in program.statements:
        # `+=` and `max=` read the element they update
        accs = stmt.reads + ([stmt.lhs] if stmt.op != "=" else [])
        for acc in accs:
            if acc.tensor == tensor:
                m = poly.access_map(stmt, acc).intersect_range(
                    poly.tensor_box(program.tensor(tensor))
                )
                reads = reads.union(isl.UnionMap.from_map(m))
    if reads.is_empty():
        return isl.UnionSet("{ }")
    flow = (
        isl.UnionAccessInfo.from_sink(reads)
        .set_must_source(poly.accesses(program, "write"))
        .set_schedule_map(poly.schedule_map(program))
        .compute_flow()
    )
    return flow.get_may_no_source().domain()


def _const_at(state: _State, statements, pos: int) -> int | None:
    """The constant value of dimension `pos` shared by `statements`, or None."""
    values = set()
    for name in statements:
        m = state.maps[name]
        v = m.range().dim_max(pos)
        if not v.is_cst():
            return None
        values.add(int(v.get_pieces()[0][1].get_constant_val().to_python()))
    return values.pop() if len(values) == 1 else None
