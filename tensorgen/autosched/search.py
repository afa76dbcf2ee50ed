"""The automatic scheduler: a small, explainable search over schedules, costed analytically.

It takes a layer (layer.py): one contraction `ACC += A * B`, on the MAC array or the vector unit
(depthwise), optionally with the init of its accumulator before it and element-wise statements
after it (bias, requantization, ReLU, clamps). For the contraction it builds the schedule
skeleton (N and K blocked by the array, M streamed), and the init and epilogue are fused with
each output tile: the accumulator tile lives on chip ('acc' for the MAC array) from its init
before the reduction loops to its epilogue after them, and only the (int8) output is stored.
It then searches the loop order of the outer loops and the staging level of every tensor
(which memory holds which footprint at which loop) under the target's capacities, with double
buffering of the innermost staging loop, minimising a cost model (cost.py) of the generated
microcode. Anything else falls back to the always-legal default schedule, with the reason.

When no candidate fits the target's memories (a small target: M rows that fill the
accumulators leave no room for the operands' blocks, or a vector band's temporaries), the search
is retried with M blocks and vector bands half as large, down to one row, until one fits.

The search is bounded twice, both by counts, so that the same input gives the same schedule
(and the same bytes) on any machine however busy: by MAX_CANDIDATES costed candidates, checked
between loop nests (the best candidate found by then is taken), and by ISL_MAX_OPERATIONS, isl's
operation limit (isl_ctx_set_max_operations), which stops a single isl computation that explodes
(a footprint, a dependence check) where the candidate count cannot. Reaching the isl limit
falls back to the default schedule with a warning and the reason in `Plan.reason`; the limit is
removed (and isl's operation count reset) when auto_schedule returns, so the lowering that
follows is not bounded by it.

The loop nests tried come from shapes.py, what the cost model needs of each from probe.py, and
the plan's explanation (`check --explain`) from explain.py.
"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from functools import partial

import islpy as isl

from tensorgen.autosched.bound import Bound, Considered
from tensorgen.autosched.explain import explain
from tensorgen.autosched.layer import (
    Layer,
    Skeleton,
    accumulator_levels,
    build_skeleton,
    recognise,
)
from tensorgen.autosched.objective import TIE, bound_tie, check_objective, choose
from tensorgen.autosched.probe import probe_nest, staging_levels
from tensorgen.autosched.shapes import tile_shapes
from tensorgen.codegen.scheduled import vector_profile
from tensorgen.errors import CapacityError, CodegenError, ScheduleError
from tensorgen.ir.core import Program
from tensorgen.ir.queries import MacMapping, mac_mapping, out_indices
from tensorgen.schedule import cost as cost_model
from tensorgen.schedule.api import Schedule
from tensorgen.schedule.cost import Candidate
from tensorgen.schedule.fold import KFold, window_shape
from tensorgen.target import Target

# costed candidates, checked between loop nests: more than twice the largest search of examples/
# (conv_bias_relu_requant on tiny: 12,672); `benchmarks/suite.py --all` gives the same figures as
# under the CPU-time budget this replaces. A count, not seconds: the choice never depends on the
# machine's speed or load
MAX_CANDIDATES = 30_000
# isl operations (isl_ctx_set_max_operations) one auto_schedule may spend: about 20 times what
# the suite's largest searches take on tg1 and tiny (about a million), more than MAX_CANDIDATES
# candidates spend (see the module docstring)
ISL_MAX_OPERATIONS = 20_000_000

__all__ = ["TIE", "Candidate", "Plan", "Space", "auto_schedule"]


@dataclass
class Plan:
    """What auto_schedule chose for one program: the schedule and the candidate it is built
    from, with every candidate costed; or no schedule, and the reason the default is used."""

    schedule: Schedule | None
    chosen: Candidate | None
    considered: Sequence[Candidate] = field(default_factory=list)  # bound.Considered, searched
    reason: str = ""  # why the default schedule is used instead, if it is
    search_s: float = 0.0
    layer: Layer | None = None
    fused_at: str | None = None  # the innermost tile loop the init and epilogue are fused at
    loop_names: dict[str, str] = field(
        default_factory=dict
    )  # the search's loop names -> the schedule's
    fold: str = ""  # what the MAC array's K folds, if more than one index
    objective: str = "cycles"  # what the search minimised (objective.py)

    def explain(self, target: Target) -> str:
        """What the plan chose and why (explain.py), or why it uses the default schedule."""
        return explain(self, target)


def auto_schedule(
    program: Program,
    target: Target,
    max_operations: int | None = None,
    objective: str = "cycles",
) -> Plan:
    """The automatic scheduler's plan for `program`: a schedule, or the reason why the default
    schedule is used. isl may spend at most `max_operations` operations on it (default
    ISL_MAX_OPERATIONS; 0: no limit). `objective`: what it minimises (objective.py)."""
    check_objective(objective)
    t0 = time.perf_counter()
    limit = ISL_MAX_OPERATIONS if max_operations is None else max_operations
    with _isl_operation_limit(limit) as exhausted:
        try:
            plan = _plan(program, target, objective)
        except Exception:  # noqa: BLE001 - a call that fails at the limit may raise anything (TypeError, ...)
            if not exhausted():
                raise
            plan = None
        # a failure at the limit may also look like one of the search's own refusals (an
        # unbounded footprint where isl gave up on its bounds)
        if plan is not None and plan.schedule is None and exhausted():
            plan = None
    if plan is None:
        reason = (
            f"the search exceeded isl's operation limit ({limit:,} operations, ISL_MAX_OPERATIONS)"
        )
        warnings.warn(f"auto: {reason}; using the default schedule", stacklevel=2)
        return Plan(None, None, reason=reason, search_s=time.perf_counter() - t0)
    plan.search_s = time.perf_counter() - t0
    return plan


def _plan(program: Program, target: Target, objective: str) -> Plan:
    layer = recognise(program)
    if isinstance(layer, str):
        return Plan(None, None, reason=layer)
    try:
        return _search(program, target, layer, objective)
    except (ScheduleError, CapacityError, CodegenError) as err:
        return Plan(None, None, reason=f"no schedule in the search space fits ({err})")


@contextmanager
def _isl_operation_limit(limit: int):
    """isl's operation limit (0: none) on its default context, which tensorgen's sets and maps
    live in, counted from zero, for the duration of the block; the previous limit and a fresh
    count after it. Yields a test of whether the limit was reached: once it is, every isl call
    fails, with whatever error the function that failed reports (often not the limit's, and not
    always an isl.Error: islpy turns some failed calls into None)."""
    ctx = isl.DEFAULT_CONTEXT
    previous = ctx.get_max_operations()

    def exhausted() -> bool:
        try:
            isl.Set("{ [i] : 0 <= i < 2 }").lexmax()
        except isl.Error:
            return limit > 0
        return False

    ctx.reset_operations()
    ctx.set_max_operations(limit)
    try:
        yield exhausted
    finally:
        ctx.set_max_operations(previous)
        ctx.reset_operations()


@dataclass
class Space:
    """The automatic scheduler's search space for one layer: loop nests (a shape: the splits, the
    band and its M loops; and a loop order outside the band), each with a choice of staging level
    per tensor and of double buffering. `nests` lists the loop nests, `costed` costs every choice
    of one nest, `schedule` builds the schedule of a candidate; the search and the exhaustive
    benchmark (benchmarks/exhaustive.py) both go through these."""

    program: Program
    target: Target
    layer: Layer
    band_kind: str  # "array" (the MAC array) or "vector" (the vector unit)
    mapping: MacMapping | None  # the contraction's MAC-array mapping, on the array
    shapes: list[tuple]  # (blocks, loop orders outside the band, the band's M loops, the band)
    profiles: dict
    folds: dict[tuple[str, ...], KFold] = field(
        default_factory=dict
    )  # band -> the reduction indices it folds into K
    # (blocks, order, band) -> the unchecked skeleton its probe was built on, which `schedule`
    # forks instead of building it again (a fifth of the search's skeletons were such rebuilds)
    skeletons: dict[tuple, Skeleton] = field(default_factory=dict, repr=False, compare=False)

    def fold(self, band) -> KFold | None:
        return self.folds.get(tuple(band))

    @staticmethod
    def of(program: Program, target: Target, layer: Layer, shrink: int = 0) -> Space:
        """The space of `layer`; with `shrink`, M blocks and vector bands 2**shrink times smaller
        than the accumulators and the scratchpad would hold (for targets where those leave no
        room for the rest)."""
        stmt = layer.contraction
        mp = mac_mapping(program, stmt)
        if mp is not None and (mp.n is None or mp.m is None):
            mp = None  # a matrix-vector shape (depthwise): one array column is slower than the vector unit
        out = out_indices(program, stmt)
        reds = [i for i in stmt.indices if i not in out]
        fold = window = None
        if mp is not None:
            band_kind = "array"
            m = mp.m
            blocks = [(mp.n, target.cols), (mp.k, target.rows)]
            fold = KFold.of(program, stmt, mp, target)
            window = KFold.window(program, stmt, mp, target, fold)
        else:
            band_kind = "vector"
            m = max(out, key=lambda i: (stmt.extent(i), stmt.indices.index(i)))
            blocks = []
        profiles = {
            s.name: vector_profile(program, s)
            for s in layer.statements
            if s is not stmt or band_kind == "vector"
        }
        acc_rows = max(1, target.acc.bytes // (4 * target.cols) >> shrink)
        # eight int32 buffers of a vector band fit
        vector_elements = max(target.lanes, target.spad.bytes // 32 >> shrink)
        shapes = list(
            tile_shapes(
                stmt,
                out,
                reds,
                mp,
                m,
                blocks,
                band_kind,
                acc_rows,
                bool(layer.others),
                vector_elements,
                [i for i in fold.indices if i != mp.k] if fold else [],
                target.spad.bytes,
            )
        )
        folds = {tuple(shape[3]): fold for shape in shapes} if fold else {}
        if window is not None and stmt.extent(window.m) <= acc_rows:
            shape = window_shape(stmt, out, reds, mp, window, target)
            shapes.append(shape)
            folds[tuple(shape[3])] = window
        return Space(program, target, layer, band_kind, mp, shapes, profiles, folds)

    def peak_macs_per_cycle(self) -> float:
        """The most useful MACs per cycle the contraction's unit can do: the vector unit's lanes,
        or the array's rows x cols times the share of them that the extents of the contraction's
        K and N indices fill (7 taps on 16 rows fill 7/16 of them). Fills are not counted."""
        target = self.target
        if self.band_kind == "vector":
            return float(target.lanes)
        stmt = self.layer.contraction

        def share(extent: int, size: int) -> float:
            return extent / (-(-extent // size) * size)

        depth = max([stmt.extent(self.mapping.k)] + [f.depth(stmt) for f in self.folds.values()])
        return (
            target.rows
            * target.cols
            * share(depth, target.rows)
            * share(stmt.extent(self.mapping.n), target.cols)
        )

    def nests(self):
        """(shape, order) of every loop nest, in the order the search visits them."""
        for shape in self.shapes:
            for order in shape[1]:
                yield shape, order

    def costed(self, shape, order) -> list[Candidate]:
        """Every staging and double-buffer choice of one loop nest, costed; those that overflow
        a memory or cannot double-buffer cost math.inf cycles."""
        return cost_model.cost_product(*self.probed(shape, order))

    def probed(self, shape, order) -> tuple:
        """The arguments of cost_product for one loop nest: its probe, the target, the tensors
        and each one's staging levels."""
        blocks_f, _, m_loops, band = shape
        program, target, layer = self.program, self.target, self.layer
        tensors = layer.tensors()
        sk = build_skeleton(program, target, layer, blocks_f, order, band, checked=False)
        self.skeletons[_nest_key(blocks_f, order, band)] = sk
        fold = self.fold(band)
        probe = probe_nest(
            program,
            target,
            layer,
            sk,
            blocks_f,
            order,
            m_loops,
            band,
            self.band_kind,
            self.profiles,
            fold,
        )
        levels = [staging_levels(program, layer, sk, order, t, fold) for t in tensors]
        levels = accumulator_levels(program, layer, blocks_f, order, tensors, levels)
        return probe, target, tensors, levels

    def schedule(self, cand: Candidate, shape) -> tuple[Schedule, Skeleton]:
        """The schedule of `cand` (a candidate of `shape`): its skeleton, built unchecked like the
        probes and then checked once against the dependences; its stages and double buffers; its
        vector and MAC bands."""
        blocks_f, _, m_loops, band = shape
        layer = self.layer
        stmt = layer.contraction
        final = self.skeletons.get(_nest_key(blocks_f, cand.order, band))
        if final is None:
            final = build_skeleton(
                self.program, self.target, layer, blocks_f, cand.order, band, checked=False
            )
        else:  # the probe's, whose schedule only queries read: staged on a fork of it
            final = replace(final, schedule=final.schedule.fork())
        s = final.schedule
        s.check()
        fold = self.fold(band)
        layouts = fold.layouts if fold else {}
        for tensor, level in cand.stages:
            mem = "acc" if (self.band_kind == "array" and tensor == stmt.lhs.tensor) else "spad"
            s.stage(tensor, final.loops[level] if level else None, mem, layout=layouts.get(tensor))
        if cand.pipelined:
            inner = max((lv for _, lv in cand.stages if lv), key=cand.order.index)
            for tensor, level in cand.stages:
                if level == inner:
                    s.double_buffer(tensor)
        for other in layer.others:
            own = final.own[other.name]
            if cand.vector_loops:
                s.vectorize(*own[len(own) - cand.vector_loops :])
        if self.band_kind == "array":
            n, *ks = (final.loops[x] for x in band[len(m_loops) :])
            s.tensorize(tuple(final.loops[x] for x in m_loops), n, tuple(ks))
        else:
            s.vectorize(*(final.loops[x] for x in band))
        return s, final


def _nest_key(blocks, order, band) -> tuple:
    """A loop nest of one Space by what build_skeleton builds it from."""
    return tuple(map(tuple, blocks)), tuple(order), tuple(band)


def _search(program: Program, target: Target, layer: Layer, objective: str) -> Plan:
    considered = Considered()
    fitting: list[tuple[Candidate, tuple]] = []
    # skips what cannot beat the fastest so far (bound.py): the same choice
    bound = Bound(bound_tie(objective))
    shapes = None
    # while nothing fits: M blocks and vector bands half as large, until they are one row
    for shrink in range(
        max(target.acc.bytes // (4 * target.cols), target.spad.bytes // 32).bit_length() + 1
    ):
        space = Space.of(program, target, layer, shrink)
        if space.shapes == shapes:
            continue
        shapes = space.shapes
        for shape, order in space.nests():
            if len(considered) >= MAX_CANDIDATES and fitting:
                break
            args = space.probed(shape, order)
            cands = cost_model.cost_product(*args, bound)
            considered.extend(cands, partial(cost_model.cost_product, *args))
            fitting += ((c, shape) for c in cands if c is not None and c.cycles != math.inf)
        if fitting:
            break
    if not fitting:
        raise CapacityError(
            "every staging choice overflows a memory, even with the smallest blocks"
        )
    cand, shape = choose(fitting, target, objective)
    s, final = space.schedule(cand, shape)
    fused_at = final.loops[final.fused[-1]].name if final.fused else None
    names = {x: loop.name for x, loop in final.loops.items()}
    fold = space.fold(shape[3])
    note = (
        ""
        if fold is None
        else (
            f"K folds {', '.join(names.get(x, x) for x in fold.indices)}: {fold.depth(layer.contraction)} rows in "
            f"{fold.matmuls} MATMULs of at most {target.rows}, "
            f"{' and '.join(f'{t} staged with layout {lay}' for t, lay in fold.layouts.items())}"
            + (
                f", {fold.streamed} one {names.get(fold.column, fold.column)} at a time"
                if fold.column
                else ""
            )
        )
    )
    return Plan(
        s,
        cand,
        considered,
        layer=layer,
        fused_at=fused_at,
        loop_names=names,
        fold=note,
        objective=objective,
    )
