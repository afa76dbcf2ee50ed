"""The schedule-authoring API.

A `Schedule` maps every statement instance to a point of one common,
multi-dimensional schedule space (an isl map per statement). Each dimension is,
per statement, either a loop (a `Loop` handle shared by the statements it
encloses) or a constant that orders sibling statements. Every primitive
rewrites these maps, then checks the result at once against the program's exact
isl dependences (flow, anti, output; integer reductions relaxed) and raises a
`ScheduleError` naming the primitive and one concrete counterexample.

The rewrites themselves are functions over a frozen `State` (state.py), grouped by
family: loop rewrites (loops.py), annotations (annotate.py), memory (memory.py, and
boxes.py for what a staged buffer holds). The methods here are thin wrappers: they run a
rewrite, check what it returns, adopt it and record a `Step` (steps.py).

The schedule is also a trace: `schedule.trace` is its list of steps, `str(schedule)` the
Python that recreates it (the body of a schedule file under schedules/), and
`steps.dumps(schedule.trace)` the same as JSON.

Example (matmul `C[i, j] += A[i, k] * B[k, j]`)::

    s = Schedule(program)
    io, jo, ii, ji = s.tile(s.loop("i"), s.loop("j"), 16, 16)
    s.reorder(io, jo, s.loop("k"), ii, ji)
"""

from __future__ import annotations

import islpy as isl

from tensorgen.errors import ScheduleError
from tensorgen.ir.core import Program
from tensorgen.poly.legality import find_violation
from tensorgen.schedule import annotate, boxes, computeat, loops
from tensorgen.schedule import memory as mem
from tensorgen.schedule import state as st
from tensorgen.schedule.boxes import FirstTouch, StagedBox
from tensorgen.schedule.state import MEMORIES, Loop, Stage, State
from tensorgen.schedule.steps import LoopRef, Step

__all__ = ["MEMORIES", "FirstTouch", "Loop", "Schedule", "Stage", "StagedBox", "State", "Step"]

UNROLL_REMOVED = (
    "unroll was removed: the code generator never unrolled (it was a hint nothing read); "
    "delete the call"
)


def _name(x) -> str:
    return str(getattr(x, "name", x))


def _ref(state: State, x):
    """A primitive's argument as a step records it: loops by their current name."""
    if isinstance(x, Loop):
        return LoopRef(st.name_of(state, x))
    if isinstance(x, (tuple, list)):
        return tuple(_ref(state, v) for v in x)
    return x


class Schedule:
    """A chainable, checked schedule of one program. See the module docstring."""

    def __init__(
        self, program: Program, target=None, checked: bool = True, bands: bool = True
    ) -> None:
        """`checked=False` skips the dependence checks: only for the automatic scheduler's cost
        probes of schedules it rebuilds, checked, before using them. `bands=False` (with
        `checked=False`) skips the parallel check of every vectorized and tensorized band too,
        for a schedule that is either lowered, whose verify_schedule checks each band, or
        refused whole: fusion's replays of its layers' schedules."""
        self.program = program
        self.target = target
        self.checked = checked
        self.bands = bands or checked
        self.trace: list[Step] = []
        self._state: State = st.original(program)

    def fork(self) -> Schedule:
        """A copy whose primitives leave this schedule as it is: the state is a frozen value,
        shared; the trace is copied. (The search stages its winner on a fork of the skeleton it
        probed rather than rebuilding that skeleton.)"""
        copy = Schedule.__new__(Schedule)
        copy.__dict__.update(self.__dict__)
        copy.trace = list(self.trace)
        return copy

    # -- what the lowering and the search read ----------------------------------------------
    @property
    def state(self) -> State:
        """The schedule as one frozen record (read-only: the primitives replace it)."""
        return self._state

    @property
    def stages(self) -> list[Stage]:
        return list(self._state.stages)

    @property
    def vectorized(self) -> list[str]:
        return list(self._state.vectorized)

    @property
    def tensorized(self) -> list[tuple[tuple[str, ...], str, tuple[str, ...]]]:
        """The tensorized bands: (m loops, n loop, k loops), by name."""
        return list(self._state.tensorized)

    # -- queries ----------------------------------------------------------------------------
    def loop(self, name: str) -> Loop:
        """The loop called `name` (`"k"`, or `"S1.k"` when several statements have a `k`)."""
        return st.find(self._state, name)

    def loops(self, statement: str) -> list[Loop]:
        """The loops enclosing `statement`, outermost first."""
        if statement not in self._state.maps:
            raise ScheduleError(f"loops('{statement}'): no such statement")
        return [
            Loop(row[statement], self._state.loops[row[statement]].name)
            for row in self._state.dims
            if row[statement] is not None
        ]

    def loop_names(self) -> list[str]:
        """The names of the loops there are now, sorted."""
        return st.live_loops(self._state)

    def _handle(self, loop: Loop | str) -> Loop:
        return self.loop(loop) if isinstance(loop, str) else loop

    def position(self, loop: Loop | str) -> int:
        """The schedule dimension (d<k>) that `loop` (a handle or a name) iterates."""
        return st.resolve(self._state, self._handle(loop), "position", False)[1]

    def statements_of(self, loop: Loop | str) -> frozenset[str]:
        """The statements that `loop` (a handle or a name) encloses."""
        return st.resolve(self._state, self._handle(loop), "statements_of", False)[2]

    def statement_map(self, statement: str) -> isl.Map:
        """`{ S[indices] -> [d0, ..., dn] }`: where the instances of `statement` run."""
        if statement not in self._state.maps:
            raise ScheduleError(f"statement_map('{statement}'): no such statement")
        return self._state.maps[statement]

    def trips(self, loop: Loop | str) -> int:
        """Iterations of `loop` (the widest, for loops with varying bounds)."""
        pos, stmts = self.position(loop), self.statements_of(loop)
        return max(st.width(self._state, name, pos) for name in sorted(stmts))

    def union_map(self) -> isl.UnionMap:
        return st.union_map(self._state)

    def __str__(self) -> str:
        return "\n".join(str(step) for step in self.trace)

    # -- machinery ------------------------------------------------------------------------------
    def _resolve(self, loop: Loop, prim: str, modify: bool = True):
        """(loop id, position, statements): kept for callers not yet on position/statements_of."""
        return st.resolve(self._state, loop, prim, modify)

    def _commit(
        self, prim: str, state: State, step: Step, deps: bool = True, capacity: bool = False
    ) -> None:
        """Check `state` (dependences, then capacity); adopt it and record `step`, or raise."""
        if deps and self.checked:
            umap = st.union_map(state)
            viol = find_violation(self.program, umap)
            if viol is not None:
                raise ScheduleError(f"{prim}: {viol.sentence()}", detail=str(umap))
        if capacity:
            mem.check_capacity(self.program, state, self.target, prim)
        self._state = state
        self.trace.append(step)

    def _step(self, primitive: str, *args, **kwargs) -> Step:
        items = tuple((k, _ref(self._state, v)) for k, v in kwargs.items() if v is not None)
        return Step(primitive, tuple(_ref(self._state, a) for a in args), items)

    def check(self) -> None:
        """Check the whole schedule against the dependences at once: for a schedule built with
        `checked=False`, whose primitives skipped their own checks (only the final order matters)."""
        viol = find_violation(self.program, self.union_map())
        if viol is not None:
            raise ScheduleError(f"the schedule: {viol.sentence()}", detail=str(self.union_map()))

    # -- loop rewrites ----------------------------------------------------------------------------
    def split(self, loop: Loop, factor: int) -> tuple[Loop, Loop]:
        """Split `loop` into an outer loop over blocks of `factor` and an inner loop inside them.

        Before::                    After ``split(i, 4)``::

            for i in 0..N:              for i_o in 0..ceil(N/4):
                S(i)                        for i_i in 0..4 (and 4*i_o + i_i < N):
                                                S(4*i_o + i_i)
        """
        prim = f"split({_name(loop)}, {factor})"
        step = self._step("split", loop, factor)
        state, outer, inner = loops.split(self._state, loop, factor, prim)
        self._commit(prim, state, step)
        return outer, inner

    def reorder(self, *loop_list: Loop) -> None:
        """Permute loops that enclose the same statements into the given order (outermost first).

        Before::                    After ``reorder(j, i)``::

            for i: for j: S(i, j)       for j: for i: S(i, j)
        """
        prim = f"reorder({', '.join(map(_name, loop_list))})"
        step = self._step("reorder", *loop_list)
        self._commit(prim, loops.reorder(self._state, loop_list, prim), step)

    def tile(
        self, outer: Loop, inner: Loop, f_outer: int, f_inner: int
    ) -> tuple[Loop, Loop, Loop, Loop]:
        """Split two nested loops and reorder to (outer_o, inner_o, outer_i, inner_i).

        Before::                    After ``tile(i, j, 4, 8)``::

            for i: for j: S             for i_o: for j_o: for i_i in 0..4: for j_i in 0..8: S
        """
        prim = f"tile({_name(outer)}, {_name(inner)}, {f_outer}, {f_inner})"
        step = self._step("tile", outer, inner, f_outer, f_inner)
        state, made = loops.tile(self._state, outer, inner, f_outer, f_inner, prim)
        self._commit(prim, state, step)
        return made

    def skew(self, loop: Loop, by: Loop, factor: int = 1) -> None:
        """Replace `loop`'s iterator i by i + factor * (iterator of the outer loop `by`).

        Before::                        After ``skew(i, t, 1)``::

            for t: for i: S(t, i)           for t: for i' in t..t+N: S(t, i' - t)

        Skewing makes the dependences of a stencil point forward in both loops, so that a
        following tile (or reorder) is legal.
        """
        prim = f"skew({_name(loop)}, {_name(by)}, {factor})"
        step = self._step("skew", loop, by, factor)
        self._commit(prim, loops.skew(self._state, loop, by, factor, prim), step)

    def fuse(self, first: Loop, second: Loop) -> Loop:
        """Fuse two sibling loops: the body of `second` runs inside `first`, after its body.

        Before::                    After ``fuse(i, i2)``::

            for i: S0(i)                for i: S0(i); S1(i)
            for i2: S1(i2)
        """
        prim = f"fuse({_name(first)}, {_name(second)})"
        step = self._step("fuse", first, second)
        state, fused = loops.fuse(self._state, first, second, prim)
        self._commit(prim, state, step, capacity=True)
        return fused

    def distribute(self, loop: Loop, *statements: str) -> Loop:
        """Split `loop` in two: `statements` move to a copy of the loop that runs after it.

        Before::                        After ``distribute(i, "S1")``::

            for i: S0(i); S1(i)             for i: S0(i)
                                            for i': S1(i')
        Returns the new loop of `statements`.
        """
        prim = f"distribute({_name(loop)}, {', '.join(statements)})"
        step = self._step("distribute", loop, *statements)
        state, new = loops.distribute(self._state, loop, statements, prim)
        self._commit(prim, state, step)
        return new

    def pack(self) -> None:
        """Drop the rows that order nothing (loops.pack): the same order in fewer dimensions,
        for a program of several nests one after another (a fused group of layers)."""
        self._commit("pack()", loops.pack(self._state), self._step("pack"), deps=False)

    def compute_at(self, loop: Loop, *statements: str) -> None:
        """Run `statements` (producers) inside `loop` of their consumers: each instance in the
        first iteration of `loop` that reads what it writes (isl: the consumers' reads applied
        backwards to the iterations), before the loop's body; their own loops go inside, their
        bounds narrowed to that iteration's region (computeat.py).

        Before::                            After ``compute_at(h2, "S0")``::

            for h: H[h] = f(X[h])               for h2:
            for h2: Y[h2] = g(H[h2])                for h in h2..h2: H[h] = f(X[h])
                                                    Y[h2] = g(H[h2])
        """
        prim = f"compute_at({_name(loop)}, {', '.join(statements)})"
        step = self._step("compute_at", loop, *statements)
        state = computeat.compute_at(self.program, self._state, loop, statements, prim)
        self._commit(prim, state, step, capacity=True)

    def unroll(self, *args, **kwargs) -> None:
        """Removed: the code generator never unrolled. A schedule that calls it gets one line."""
        raise ScheduleError(UNROLL_REMOVED)

    # -- annotations ---------------------------------------------------------------------------
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
        band = (loop, *more)
        prim = f"vectorize({', '.join(map(_name, band))})"
        step = self._step("vectorize", *band)
        state = annotate.vectorize(self.program, self._state, band, prim, self.bands)
        self._commit(prim, state, step, deps=False)

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
        prim = f"tensorize({', '.join(map(_name, (*ms, n, *ks)))})"
        group = lambda xs: xs[0] if len(xs) == 1 else xs  # noqa: E731 - as the caller wrote it
        step = self._step("tensorize", group(ms), n, group(ks))
        state = annotate.tensorize(self.program, self._state, ms, n, ks, prim, self.bands)
        self._commit(prim, state, step, deps=False)

    # -- memory --------------------------------------------------------------------------------
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
        prim = f"stage({tensor}, {getattr(at, 'name', 'the program')}, {memory})"
        state = mem.stage(self.program, self._state, tensor, at, memory, layout, prim)
        layout = state.stages[-1].layout
        step = self._step("stage", tensor, at, memory, layout=layout)
        self._commit(prim, state, step, deps=False, capacity=True)

    def double_buffer(self, tensor: str) -> None:
        """Give a staged tensor two buffers so the DMA of the next block can overlap this one's
        compute; capacity counts it twice. The lowering overlaps them when every tensor staged at
        the loop is double-buffered and the loop's body is pure compute.

        Before::                        After ``double_buffer("B")``::

            for k_o: LOAD B -> buf              for k_o: LOAD B[k_o + 1] -> buf[(k_o + 1) % 2]
                     compute(buf)                        compute(buf[k_o % 2])
        """
        prim = f"double_buffer({tensor})"
        state = mem.double_buffer(self._state, tensor, prim)
        self._commit(prim, state, Step("double_buffer", (tensor,)), deps=False, capacity=True)

    def footprint_bytes(self, stage: Stage) -> int:
        """Bytes of the largest per-iteration footprint of `stage.tensor` under its loop (isl),
        padding halo included."""
        return mem.footprint_bytes(self.program, self._state, stage)

    # -- what staged buffers hold (boxes.py) -----------------------------------------------------
    def staged_box(self, tensor: str, loop: str | None, overlaps: bool = True) -> StagedBox | None:
        """The box a buffer of `tensor` staged at `loop` (None: the program) holds in one
        iteration: see `boxes.staged_box`."""
        return boxes.staged_box(self.program, self._state, tensor, loop, overlaps)

    def initial_value_read(self, tensor: str) -> bool:
        """Whether some instance reads an element of `tensor` before any statement writes it."""
        return boxes.initial_value_read(self.program, tensor)

    def zeros_read(self, tensor: str) -> bool:
        """Whether a fresh buffer of `tensor` must be zeroed (see `boxes.zeros_read`)."""
        return boxes.zeros_read(self.program, tensor)

    def overwrites_first(self, tensor: str) -> bool:
        """Whether the first update of each element of a fresh `tensor` may overwrite it."""
        return boxes.overwrites_first(self.program, tensor)

    def first_writes(self, statement: str, depth: int | None = None) -> isl.Set:
        """The schedule points of `statement` that first write an element (`boxes.first_writes`)."""
        return boxes.first_writes(self.program, self._state, statement, depth)

    def overwriting_blocks(self, statement: str, depth: int) -> isl.Set | None:
        """The blocks of a `+=` that may overwrite instead of add (`boxes.overwriting_blocks`)."""
        return boxes.overwriting_blocks(self.program, self._state, statement, depth)

    def _check_capacity(self, prim: str) -> None:
        mem.check_capacity(self.program, self._state, self.target, prim)
