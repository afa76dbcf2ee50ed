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
"""

from __future__ import annotations

import math
import time
import warnings
from contextlib import contextmanager
from dataclasses import dataclass, field

import islpy as isl

from tensorgen.autosched.layer import (
    Geometry,
    Layer,
    Skeleton,
    accumulator_levels,
    build_skeleton,
    recognise,
)
from tensorgen.codegen.scheduled import vector_profile
from tensorgen.errors import CapacityError, CodegenError, ScheduleError
from tensorgen.ir.core import Program, Statement
from tensorgen.ir.queries import MacMapping, mac_mapping, out_indices
from tensorgen.mc import isa
from tensorgen.schedule import cost as cost_model
from tensorgen.schedule.api import Schedule
from tensorgen.schedule.compaction import compacted_size, row_compaction
from tensorgen.schedule.cost import Candidate, Footprint, Probe, loop_passes, vector_cycles
from tensorgen.schedule.fold import KFold, window_shape
from tensorgen.target import Target

# costed candidates, checked between loop nests: more than twice the largest search of examples/
# (conv_bias_relu_requant on tiny: 12,672); `benchmarks/suite.py --all` gives the same figures as
# under the CPU-time budget this replaces. A count, not seconds: the choice never depends on the
# machine's speed or load
MAX_CANDIDATES = 30_000
# candidates whose cycles are within this share of the fastest's count as ties: the one that moves
# the least DRAM wins (BERT's FFN down-projection chunked: 0.2% more cycles, 23% less DRAM)
TIE = 0.005
# isl operations (isl_ctx_set_max_operations) one auto_schedule may spend: about 20 times what
# the suite's largest searches take on tg1 and tiny (about a million), more than MAX_CANDIDATES
# candidates spend (see the module docstring)
ISL_MAX_OPERATIONS = 20_000_000

__all__ = ["Candidate", "Plan", "Space", "auto_schedule"]


@dataclass
class Plan:
    schedule: Schedule | None
    chosen: Candidate | None
    considered: list[Candidate] = field(default_factory=list)
    reason: str = ""  # why the default schedule is used instead, if it is
    search_s: float = 0.0
    layer: Layer | None = None
    fused_at: str | None = None  # the innermost tile loop the init and epilogue are fused at
    loop_names: dict[str, str] = field(
        default_factory=dict
    )  # the search's loop names -> the schedule's
    fold: str = ""  # what the MAC array's K folds, if more than one index

    def _name(self, loop: str | None) -> str:
        return self.loop_names.get(loop, loop) if loop else "the program"

    def explain(self, target: Target) -> str:
        from tensorgen.schedule.files import render

        if self.schedule is None:
            return f"auto: {self.reason}; using the default schedule"
        if self.chosen is None:  # outside the search: the primitive-built schedule, measured
            return "\n".join(
                [
                    "# the schedule chosen by `schedule: auto`, as a replayable schedule file",
                    "",
                    render(
                        self.schedule,
                        f"Built from the primitives for {self.schedule.program.name}.",
                    ),
                    f"auto: {self.reason}",
                ]
            )
        c = self.chosen
        lines = [
            "# the schedule chosen by `schedule: auto`, as a replayable schedule file",
            "",
            render(
                self.schedule,
                f"Chosen by tensorgen's automatic scheduler for {self.schedule.program.name}.",
            ),
            f"model: {c.cycles} cycles = {c.compute_cycles} MAC/vector + {c.dma_cycles} exposed DMA "
            f"({'inner loads overlapped' if c.pipelined else 'queues serialized'}); DRAM {c.dram_bytes} B; "
            f"searched {len(self.considered)} candidates "
            f"in {self.search_s * 1e3:.0f} ms",
            f"bottleneck: {'compute' if c.compute_cycles >= c.dma_cycles else 'DMA'}",
            f"capacity: spad {c.spad_bytes} / {target.spad.bytes} B, acc {c.acc_bytes} / {target.acc.bytes} B",
        ]
        if self.fold:
            lines.append(self.fold)
        if self.layer is not None and self.layer.others:
            lines += self._fusion_lines()
        lines.append("staging (tensor: the loop whose iterations each hold one footprint):")
        for tensor, loop in c.stages:
            lines.append(f"  {tensor} at {self._name(loop)}")
        if c.pipelined:
            lines.append(
                "  the innermost staging loop double-buffers its tensors: their loads and stores overlap "
                "compute"
            )
        lines.append("neighbours (one choice changed):")
        for other in self._neighbours():
            diff = [
                f"{t}: {self._name(a)} -> {self._name(b)}"
                for (t, a), (_, b) in zip(c.stages, other.stages, strict=False)
                if a != b
            ]
            if other.order != c.order:
                diff.append(f"order {' '.join(self._name(x) for x in other.order)}")
            if other.pipelined != c.pipelined:
                diff.append("double-buffered" if other.pipelined else "single-buffered")
            cost_text = (
                "over capacity"
                if other.cycles == math.inf
                else f"{other.cycles} cycles ({other.cycles / c.cycles:.2f}x)"
            )
            lines.append(f"  {', '.join(diff)}: {cost_text}")
        return "\n".join(lines)

    def _fusion_lines(self) -> list[str]:
        layer, c = self.layer, self.chosen
        init = f"{layer.init.name} (init)" if layer.init else None
        epi = f"{', '.join(s.name for s in layer.epilogue)} (epilogue)" if layer.epilogue else None
        where = f"each iteration of {self.fused_at}" if self.fused_at else "the whole program"
        temps = [
            t
            for t, _ in c.stages
            if t != layer.accumulator and self.schedule.program.tensor(t).role == "none"
        ]
        return [
            f"fused: {' and '.join(x for x in (init, epi) if x)} with the contraction "
            f"{layer.contraction.name}, on {where}: {layer.accumulator}"
            f"{' and ' + ', '.join(temps) if temps else ''} never {'leave' if temps else 'leaves'} the chip",
            f"  their vector instructions: {c.vector_cycles} cycles over the {c.vector_loops} innermost loops "
            f"of a tile",
        ]

    def _neighbours(self) -> list[Candidate]:
        c = self.chosen
        out = []
        for other in self.considered:
            changes = (
                sum(a != b for a, b in zip(c.stages, other.stages, strict=False))
                + (other.order != c.order)
                + (other.pipelined != c.pipelined)
            )
            if changes == 1:
                out.append(other)
        return sorted(out, key=lambda o: o.cycles)[:6]


def auto_schedule(program: Program, target: Target, max_operations: int | None = None) -> Plan:
    """The automatic scheduler's plan for `program`: a schedule, or the reason why the default
    schedule is used. isl may spend at most `max_operations` operations on it (default
    ISL_MAX_OPERATIONS; 0: no limit)."""
    t0 = time.perf_counter()
    limit = ISL_MAX_OPERATIONS if max_operations is None else max_operations
    with _isl_operation_limit(limit) as exhausted:
        try:
            plan = _plan(program, target)
        except Exception:  # noqa: BLE001 - a call that fails at the limit may raise anything (TypeError, ...)
            if not exhausted():
                raise
            plan = None
    if plan is None:
        reason = (
            f"the search exceeded isl's operation limit ({limit:,} operations, ISL_MAX_OPERATIONS)"
        )
        warnings.warn(f"auto: {reason}; using the default schedule", stacklevel=2)
        return Plan(None, None, reason=reason, search_s=time.perf_counter() - t0)
    plan.search_s = time.perf_counter() - t0
    return plan


def _plan(program: Program, target: Target) -> Plan:
    layer = recognise(program)
    if isinstance(layer, str):
        return Plan(None, None, reason=layer)
    try:
        return _search(program, target, layer)
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
            _shapes(
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
        blocks_f, _, m_loops, band = shape
        program, target, layer = self.program, self.target, self.layer
        tensors = layer.tensors()
        sk = build_skeleton(program, target, layer, blocks_f, order, band, checked=False)
        fold = self.fold(band)
        probe = _probe(
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
        levels = [_levels(program, layer, sk, order, t, fold) for t in tensors]
        levels = accumulator_levels(program, layer, blocks_f, order, tensors, levels)
        return cost_model.cost_product(probe, target, tensors, levels)

    def schedule(self, cand: Candidate, shape) -> tuple[Schedule, Skeleton]:
        """The schedule of `cand` (a candidate of `shape`): its skeleton, built unchecked like the
        probes and then checked once against the dependences; its stages and double buffers; its
        vector and MAC bands."""
        blocks_f, _, m_loops, band = shape
        layer = self.layer
        stmt = layer.contraction
        final = build_skeleton(
            self.program, self.target, layer, blocks_f, cand.order, band, checked=False
        )
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


def _search(program: Program, target: Target, layer: Layer) -> Plan:
    considered: list[Candidate] = []
    fitting: list[tuple[Candidate, tuple]] = []
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
            for cand in space.costed(shape, order):
                considered.append(cand)
                if cand.cycles != math.inf:
                    fitting.append((cand, shape))
        if fitting:
            break
    if not fitting:
        raise CapacityError(
            "every staging choice overflows a memory, even with the smallest blocks"
        )
    # the fastest, unless one within TIE of it moves less DRAM, whose energy dominates (tensorgen/target/
    # energy.py: 64 pJ per LPDDR4 byte on tg1, under 0.4 pJ per SRAM byte; static energy differs by <= TIE)
    fastest = min(c.cycles for c, _ in fitting)
    cand, shape = min(
        (x for x in fitting if x[0].cycles <= fastest * (1 + TIE)),
        key=lambda x: (x[0].dram_bytes, x[0].cycles),
    )
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
    return Plan(s, cand, considered, layer=layer, fused_at=fused_at, loop_names=names, fold=note)


def _levels(
    program: Program, layer: Layer, sk: Skeleton, order, tensor: str, fold: KFold | None = None
) -> list[str | None]:
    """Where `tensor` may be staged: at a loop that encloses every statement accessing it.
    A temporary of a fused layer lives in the innermost tile loop: nothing is gained higher.
    A window fold's streamed operand is one kernel-wide column: staged inside its column loop."""
    if fold is not None and fold.column and tensor == fold.streamed:
        return list(order[order.index(fold.column) :])
    written = {s.lhs.tensor for s in layer.statements}
    if layer.others and tensor in written and program.tensor(tensor).role == "none":
        return [sk.fused[-1] if sk.fused else None]
    if any(s is not layer.contraction for s in layer.accessing(tensor)):
        return [None] + list(sk.fused)
    return [None] + list(order)


def _probe(
    program: Program,
    target: Target,
    layer: Layer,
    sk: Skeleton,
    blocks,
    order,
    m_loops,
    band,
    kind: str,
    profiles,
    fold: KFold | None = None,
) -> Probe:
    stmt = layer.contraction
    geo = Geometry.of(stmt, blocks)
    s = sk.schedule
    written = {x.lhs.tensor for x in layer.statements}
    stored = {t for t in written if program.tensor(t).role != "none"}
    sizes: dict[tuple[str, str | None], Footprint | None] = {}
    overwrites = (
        None  # whether the first MATMUL of each accumulator element may overwrite it (lazily)
    )
    for t in layer.tensors():
        tensor = program.tensor(t)
        for lv in _levels(program, layer, sk, order, t, fold):
            box = s.staged_box(t, sk.loops[lv].name if lv else None)
            if box is None:
                sizes[(t, lv)] = Footprint(0, 0, False, False)
                continue
            comp = row_compaction(box, tensor.itemsize, target, t in written)
            elements = math.prod(compacted_size(box.size, comp))
            fill = box.fresh and (s.zeros_read(t) or (t in stored and not box.covered))
            refill = (
                box.fresh and not fill and s.initial_value_read(t)
            )  # the first writes overwrite
            temp = t in written and tensor.role == "none"
            first = box.first.count if box.first else 0
            if (
                first
                and box.first.covered
                and kind == "array"
                and t == stmt.lhs.tensor
                and overwrites is None
            ):
                overwrites = (
                    s.overwriting_blocks(stmt.name, s.position(sk.loops[band[0]])) is not None
                )
            zeroed = bool(first) and not (
                box.first.covered and kind == "array" and t == stmt.lhs.tensor and overwrites
            )
            sizes[(t, lv)] = (
                None
                if temp and not box.fresh
                else Footprint(
                    elements * tensor.itemsize,
                    elements,
                    box.fresh,
                    fill or zeroed,
                    first,
                    box.disjoint_in_loop,
                    refill,
                    comp[2] if comp else 1,
                    math.prod(box.size) * tensor.itemsize,
                )
            )
    if kind == "array":
        band_cycles = _matmul_band_cycles(
            target, layer, geo, sk, order, m_loops, fold.matmuls if fold else 1
        )
        band_temps = 0
    else:
        instructions, slots = profiles[stmt.name]
        blocks_v = geo.blocks(list(order), band)
        band_cycles = instructions * sum(n * vector_cycles(target, e) for n, e in blocks_v)
        band_temps = slots * _align(4 * max(e for _, e in blocks_v))
    tile_work = [(0, 0)]
    if layer.others:
        own = sk.own_names
        tile_work = []
        for v in range(len(own) + 1):
            blocks_t = geo.blocks(list(sk.fused) + own[: len(own) - v], own[len(own) - v :])
            cycles = sum(
                profiles[x.name][0] * sum(n * vector_cycles(target, e) for n, e in blocks_t)
                for x in layer.others
            )
            temps = max(profiles[x.name][1] for x in layer.others) * _align(
                4 * max(e for _, e in blocks_t)
            )
            tile_work.append((cycles, temps))
    memory = {t: "spad" for t in layer.tensors()}
    if kind == "array":
        memory[stmt.lhs.tensor] = "acc"
    out = out_indices(program, stmt)
    reductions = tuple(x for x in order if geo.base[x] not in out and geo.trips[x] > 1)
    return Probe(
        tuple(order),
        sk.fused,
        {x: geo.trips[x] for x in order},
        sizes,
        band_cycles,
        band_temps,
        tile_work,
        _ragged(stmt, blocks),
        memory,
        written,
        stored,
        reductions=reductions,
        passes=loop_passes({i: stmt.extent(i) for i in stmt.indices}, blocks, order),
    )


def _matmul_band_cycles(
    target: Target, layer: Layer, geo: Geometry, sk: Skeleton, order, m_loops, per_block: int
) -> int:
    """The contraction's MATMULs (`per_block` per block of M rows), costed by isa.matmul_cycles:
    back to back on EX, each hides what it can of the next one's fill (two weight buffers),
    except the first of each tile of a fused layer, which follows the vector unit's work."""
    blocks = geo.blocks(list(order), m_loops)
    cycles = per_block * sum(n * isa.matmul_cycles(target, rows, rows) for n, rows in blocks)
    runs = math.prod(geo.trips[x] for x in sk.fused) if layer.others else 1
    rows = max(r for _, r in blocks)
    return cycles + runs * (isa.matmul_cycles(target, rows) - isa.matmul_cycles(target, rows, rows))


def _align(n: int) -> int:
    return -(-n // 16) * 16


def _shapes(
    stmt: Statement,
    out,
    reds,
    mp,
    m: str,
    blocks,
    kind: str,
    acc_rows: int,
    fused: bool,
    vector_elements: int,
    k_more: list[str],
    spad: int,
):
    """(blocks to split, loop orders outside the band, the band's M loops, the band) to try.

    On the MAC array, N and K are blocked by the array; M streams: the M index alone, or with
    a block of a second output index (image rows) so that more rows share one fill. Rows of
    M: up to 256, and no more than `acc_rows`, the rows of an accumulator tile that fit; M
    itself is blocked (equal blocks of at most `acc_rows`) if need be: in a fused layer that tile
    must stay on chip, and in any layer the accumulators must hold at least one tile of M rows;
    and blocks of a half and a quarter of `acc_rows` are tried too, whose tiles the accumulators
    can double-buffer."""

    def split_name(name: str, size: int, part: str) -> str:
        return f"{name}_{part}" if stmt.extent(name) > size else name

    inner = [
        split_name(n, size, "i") for n, size in blocks
    ] + k_more  # N, then K (and what folds into it)
    n_outer = [f"{n}_o" for n, size in blocks[:1] if stmt.extent(n) > size]
    k_outer = [f"{n}_o" for n, size in blocks[1:] if stmt.extent(n) > size]
    others_red = [i for i in reds if i not in (mp.k if mp else ()) and i not in k_more]
    base_out = [i for i in out if i not in (m, mp.n if mp else None)]
    if kind == "vector":
        yield blocks, [tuple(base_out + others_red)], [m], [m]
        yield from _vector_bands(stmt, out, others_red, vector_elements)
        return
    m2 = max(
        (i for i in base_out if stmt.extent(i) > 1),
        key=lambda i: (stmt.extent(i), stmt.indices.index(i)),
        default=None,
    )
    factors = {1}
    fill_rows = min(256, acc_rows)
    m_split = stmt.extent(m) > acc_rows
    array_blocks, array_out, m0, m_rows = blocks, base_out, m, stmt.extent(m)
    if m_split:
        blocks = blocks + [(m, _m_block(m_rows, acc_rows))]
        base_out = base_out + [f"{m}_o"]
        m, m2 = f"{m}_i", None
    elif m2 is not None and stmt.extent(m) < fill_rows:
        # rows of M up to 256 per fill; half or a quarter as many when the accumulators or the
        # budget are tight (a quarter: a tile of every output channel double-buffered in 'acc')
        widest = max(1, min(stmt.extent(m2), fill_rows // stmt.extent(m)))
        factors = {widest, max(1, widest // 2), max(1, widest // 4)}
    n, cols = blocks[0]
    if m2 is None and not m_split and stmt.extent(n) > 2 * cols:
        # a super-block of N columns whose accumulators stay on chip, so that each block of A
        # (M x K) is loaded once per super-block instead of once per column block
        yield from _super_blocks(stmt, blocks, base_out, others_red, m, k_outer, k_more)
    for f in sorted(factors):
        blocks_f, others_out, m_loops = list(blocks), list(base_out), [m]
        if f > 1:
            if f < stmt.extent(m2):
                blocks_f.append((m2, f))
                others_out[others_out.index(m2)] = f"{m2}_o"
                m_loops = [f"{m2}_i", m]
            else:
                others_out.remove(m2)
                m_loops = [m2, m]
        orders = list(
            dict.fromkeys(
                [
                    tuple(others_out + n_outer + k_outer + others_red),
                    tuple(n_outer + others_out + k_outer + others_red),
                ]
            )
        )
        yield blocks_f, orders, m_loops, m_loops + inner
    if (
        m2 is None
        and not m_split
        and not fused
        and stmt.extent(m) * stmt.extent(blocks[1][0]) > spad
    ):
        yield from _k_chunks(stmt, blocks, base_out, others_red, m)
    # M blocked by a half or a quarter of the accumulator rows, whose tiles can be double-buffered
    done = {_m_block(m_rows, acc_rows)} if m_split else set()
    for rows in (acc_rows // 2, acc_rows // 4):
        size = _m_block(m_rows, max(rows, 1))
        if rows >= 1 and m_rows > rows and size not in done:
            done.add(size)
            others_out = array_out + [f"{m0}_o"]
            orders = list(
                dict.fromkeys(
                    [
                        tuple(others_out + n_outer + k_outer + others_red),
                        tuple(n_outer + others_out + k_outer + others_red),
                    ]
                )
            )
            yield array_blocks + [(m0, size)], orders, [f"{m0}_i"], [f"{m0}_i"] + inner


def _m_block(extent: int, rows: int) -> int:
    """Rows of the blocks of M that split `extent` rows into blocks of at most `rows`, all of
    equal size as near as can be: a ragged last block is peeled out of its loop, not pipelined."""
    return -(-extent // -(-extent // rows))


def _vector_bands(stmt: Statement, out, others_red, cap: int):
    """Vector bands of two and three output indices (the widest ones), which pay the vector
    unit's setup once for many rows; the outermost of them blocked when the band would hold
    more than `cap` elements."""
    wide = sorted(
        (i for i in out if stmt.extent(i) > 1),
        key=lambda i: (stmt.extent(i), stmt.indices.index(i)),
        reverse=True,
    )
    for count in (2, 3):
        if len(wide) < count:
            return
        band = sorted(wide[:count], key=stmt.indices.index)
        rest = [i for i in out if i not in band]
        blocks = []
        inner = math.prod(stmt.extent(i) for i in band[1:])
        if inner * stmt.extent(band[0]) > cap:
            if inner > cap:
                return
            f = cap // inner
            blocks = [(band[0], f)]
            rest.append(f"{band[0]}_o")
            band = [f"{band[0]}_i"] + band[1:]
        yield blocks, [tuple(rest + others_red)], band, band


def _super_blocks(stmt: Statement, blocks, others_out, others_red, m: str, k_outer, k_more):
    (n, cols), (k, rows) = blocks
    for columns in (4 * cols, 8 * cols):
        if columns >= stmt.extent(n):
            continue
        split = [(n, columns), (f"{n}_i", cols), (k, rows)]
        inner = [
            f"{n}_i_i" if columns > cols else f"{n}_i",
            f"{k}_i" if stmt.extent(k) > rows else k,
        ] + k_more
        head = [f"{n}_o"]
        orders = [
            tuple(head + others_out + k_outer + [f"{n}_i_o"] + others_red),
            tuple(others_out + head + k_outer + [f"{n}_i_o"] + others_red),
        ]
        yield split, list(dict.fromkeys(orders)), [m], [m] + inner


def _k_chunks(stmt: Statement, blocks, others_out, others_red, m: str):
    """K split into two or three even chunks outside the column blocks of N, so that a chunk of A
    (M x K, which does not fit the scratchpad whole) staged once serves every column block,
    instead of A being loaded again for each super-block of columns whose accumulators fit: the
    accumulators of a column block are then stored after each chunk and loaded back for the
    next (not before the first)."""
    (n, cols), (k, rows) = blocks
    extent = stmt.extent(k)
    n_outer = [f"{n}_o"] if stmt.extent(n) > cols else []
    inner = [f"{n}_i" if n_outer else n, f"{k}_i_i"]
    # even chunks only: in a last, partial chunk the loops inside would vary, and not pipeline
    for chunk in [extent // count for count in (2, 3) if extent % (count * rows) == 0]:
        if rows < chunk:
            order = tuple(others_out + [f"{k}_o"] + n_outer + [f"{k}_i_o"] + others_red)
            yield [(n, cols), (k, chunk), (f"{k}_i", rows)], [order], [m], [m] + inner


def _ragged(stmt: Statement, blocks) -> set[str]:
    """Outer loops of splits whose last iteration is partial: isl peels such an iteration out
    of its loop, and a peeled iteration is not pipelined."""
    extent = {i: stmt.extent(i) for i in stmt.indices}
    varies: set[str] = set()
    ragged: set[str] = set()
    for name, size in blocks:
        e = extent.get(name, size)
        if e <= size:
            continue
        extent[f"{name}_o"], extent[f"{name}_i"] = -(-e // size), size
        if e % size or name in varies:
            ragged.add(f"{name}_o")
            varies.add(f"{name}_i")
    return ragged
