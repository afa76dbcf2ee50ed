"""The automatic scheduler: a small, explainable search over schedules, costed analytically.

For a contraction `Y += A * B` that maps onto the MAC array it builds the schedule skeleton
(N and K blocked by the array, M streamed), then searches the loop order of the outer loops and
the staging level of every tensor (which memory holds which footprint at which loop) under the
target's capacities, minimising a cost model of the generated microcode: DMA setup plus bytes
over DRAM bandwidth for every staged footprint load and store, and M + fill cycles for every
MATMUL. The lowering serialises its queues, so the model adds these up. A contraction on the
vector unit (depthwise) gets the same search with a vectorized output row. Anything else falls
back to the always-legal default schedule, with the reason.
"""

from __future__ import annotations

import itertools
import math
import time
from dataclasses import dataclass, field

from tensorgen.errors import CapacityError, ScheduleError
from tensorgen.ir.core import BinOp, Program, Read, Statement
from tensorgen.schedule.api import Schedule
from tensorgen.schedule.kernel import mac_mapping, out_indices
from tensorgen.target import Target

TIME_BUDGET_S = 0.8


@dataclass(frozen=True)
class Candidate:
    order: tuple[str, ...]  # outer loops (outside the band), outermost first
    stages: tuple[tuple[str, str | None], ...]  # tensor -> loop name or None (whole program)
    dma_cycles: int
    compute_cycles: int
    dram_bytes: int
    spad_bytes: int
    acc_bytes: int
    pipelined: bool = False  # the innermost staging loop double-buffers its inputs

    @property
    def cycles(self) -> int:
        return self.dma_cycles + self.compute_cycles


@dataclass
class Plan:
    schedule: Schedule | None
    chosen: Candidate | None
    considered: list[Candidate] = field(default_factory=list)
    reason: str = ""  # why the default schedule is used instead, if it is
    search_s: float = 0.0

    def explain(self, target: Target) -> str:
        from tensorgen.schedule.files import render

        if self.schedule is None or self.chosen is None:
            return f"auto: {self.reason}; using the default schedule"
        c = self.chosen
        lines = ["# the schedule chosen by `schedule: auto`, as a replayable schedule file", "",
                 render(self.schedule, f"Chosen by tensorgen's automatic scheduler for {self.schedule.program.name}."),
                 f"model: {c.cycles} cycles = {c.compute_cycles} MAC/vector + {c.dma_cycles} exposed DMA "
                 f"({'inner loads overlapped' if c.pipelined else 'queues serialized'}); DRAM {c.dram_bytes} B; "
                 f"searched {len(self.considered)} candidates "
                 f"in {self.search_s * 1e3:.0f} ms",
                 f"bottleneck: {'compute' if c.compute_cycles >= c.dma_cycles else 'DMA'}",
                 f"capacity: spad {c.spad_bytes} / {target.spad.bytes} B, acc {c.acc_bytes} / {target.acc.bytes} B",
                 "staging (tensor: the loop whose iterations each hold one footprint):"]
        for tensor, loop in c.stages:
            lines.append(f"  {tensor} at {loop or 'the program'}")
        if c.pipelined:
            lines.append("  the innermost staging loop double-buffers its inputs: their loads overlap compute")
        lines.append("neighbours (one choice changed):")
        for other in self._neighbours():
            diff = [f"{t}: {a or 'program'} -> {b or 'program'}" for (t, a), (_, b) in zip(c.stages, other.stages)
                    if a != b]
            if other.order != c.order:
                diff.append(f"order {' '.join(other.order)}")
            if other.pipelined != c.pipelined:
                diff.append("double-buffered" if other.pipelined else "single-buffered")
            cost = "over capacity" if other.cycles == math.inf else \
                f"{other.cycles} cycles ({other.cycles / c.cycles:.2f}x)"
            lines.append(f"  {', '.join(diff)}: {cost}")
        return "\n".join(lines)

    def _neighbours(self) -> list[Candidate]:
        c = self.chosen
        out = []
        for other in self.considered:
            changes = sum(a != b for a, b in zip(c.stages, other.stages)) + (other.order != c.order) + \
                (other.pipelined != c.pipelined)
            if changes == 1:
                out.append(other)
        return sorted(out, key=lambda o: o.cycles)[:6]


def auto_schedule(program: Program, target: Target) -> Plan:
    t0 = time.perf_counter()
    if len(program.statements) != 1 or program.shared_loops:
        return Plan(None, None, reason="the automatic scheduler handles single-statement contractions only")
    stmt = program.statements[0]
    try:
        plan = _search(program, target, stmt, t0)
    except (ScheduleError, CapacityError) as err:
        return Plan(None, None, reason=f"no schedule in the search space fits ({err})")
    plan.search_s = time.perf_counter() - t0
    return plan


def _search(program: Program, target: Target, stmt: Statement, t0: float) -> Plan:
    mp = mac_mapping(program, stmt)
    if mp is not None and (mp.n is None or mp.m is None):
        mp = None  # a matrix-vector shape (depthwise): one array column is slower than the vector unit
    out = out_indices(program, stmt)
    reds = [i for i in stmt.indices if i not in out]
    if mp is not None:
        band_kind = "array"
        m = mp.m
        blocks = [(mp.n, target.cols), (mp.k, target.rows)]
    elif stmt.op == "+=" and isinstance(stmt.rhs, BinOp) and stmt.rhs.op == "*" and \
            all(isinstance(x, Read) for x in (stmt.rhs.lhs, stmt.rhs.rhs)):
        band_kind = "vector"
        m = max(out, key=lambda i: (stmt.extent(i), stmt.indices.index(i)))
        blocks = []
    else:
        return Plan(None, None, reason="not a contraction the MAC array or the vector unit takes")

    tensors = list(dict.fromkeys([stmt.lhs.tensor] + [a.tensor for a in stmt.reads]))
    considered: list[Candidate] = []
    best: tuple[Candidate, tuple] | None = None
    for shape in _shapes(stmt, out, reds, mp, m, blocks, band_kind):
        blocks_f, order_options, m_loops, band = shape
        for order in order_options:
            if time.perf_counter() - t0 > TIME_BUDGET_S and best is not None:
                break
            s = _skeleton(program, target, blocks_f, order + tuple(band), checked=False)
            trips = {name: _trips(s, name) for name in order}
            levels = [None] + list(order)
            boxes = {(t, lv): s.staged_box(t, lv) for t in tensors for lv in levels}
            sizes = {key: (math.prod(b.size) * program.tensor(key[0]).itemsize if b else 0, bool(b and b.fresh))
                     for key, b in boxes.items()}
            rows = math.prod(_trips(s, x) for x in m_loops)
            per_band = rows + target.fill_cycles if band_kind == "array" else \
                target.vector_setup_cycles + -(-rows // target.lanes)
            compute = per_band * math.prod(trips.values())
            ragged = _ragged(stmt, blocks_f)
            for choice in itertools.product(levels, repeat=len(tensors)):
                for pipeline in (False, True):
                    cand = _cost(program, target, tensors, choice, order, trips, sizes, compute, band_kind,
                                 pipeline, ragged)
                    considered.append(cand)
                    if cand.cycles != math.inf and (best is None or (cand.cycles, cand.dram_bytes) <
                                                    (best[0].cycles, best[0].dram_bytes)):
                        best = (cand, shape)
    if best is None:
        raise CapacityError("every staging choice overflows a memory")
    cand, (blocks_f, _, m_loops, band) = best
    final = _skeleton(program, target, blocks_f, cand.order + tuple(band))
    for tensor, level in cand.stages:
        mem = "acc" if (band_kind == "array" and tensor == stmt.lhs.tensor) else "spad"
        final.stage(tensor, final.loop(level) if level else None, mem)
    if cand.pipelined:
        inner = max((lv for _, lv in cand.stages if lv), key=cand.order.index)
        for tensor, level in cand.stages:
            if level == inner:
                final.double_buffer(tensor)
    if band_kind == "array":
        final.tensorize(tuple(final.loop(x) for x in m_loops), *(final.loop(x) for x in band[len(m_loops):]))
    else:
        final.vectorize(final.loop(m))
    return Plan(final, cand, considered)


def _shapes(stmt: Statement, out, reds, mp, m: str, blocks, kind: str):
    """(blocks to split, loop orders outside the band, the band's M loops, the band) to try.

    On the MAC array, N and K are blocked by the array; M streams: the M index alone, or with
    a block of a second output index (image rows) so that more rows share one fill."""
    def split_name(name: str, size: int, part: str) -> str:
        return f"{name}_{part}" if stmt.extent(name) > size else name

    inner = [split_name(n, size, "i") for n, size in blocks]
    n_outer = [f"{n}_o" for n, size in blocks[:1] if stmt.extent(n) > size]
    k_outer = [f"{n}_o" for n, size in blocks[1:] if stmt.extent(n) > size]
    others_red = [i for i in reds if i not in (mp.k if mp else ())]
    base_out = [i for i in out if i not in (m, mp.n if mp else None)]
    if kind == "vector":
        yield blocks, [tuple(base_out + others_red)], [m], [m]
        return
    m2 = max((i for i in base_out if stmt.extent(i) > 1), key=lambda i: (stmt.extent(i), stmt.indices.index(i)),
             default=None)
    factors = {1}
    if m2 is not None and stmt.extent(m) < 256:
        # rows of M up to 256 per fill; half as many when the accumulators or the budget are tight
        widest = max(1, min(stmt.extent(m2), 256 // stmt.extent(m)))
        factors = {widest, max(1, widest // 2)}
    n, cols = blocks[0]
    if m2 is None and stmt.extent(n) > 2 * cols:
        # a super-block of N columns whose accumulators stay on chip, so that each block of A
        # (M x K) is loaded once per super-block instead of once per column block
        yield from _super_blocks(stmt, blocks, base_out, others_red, m, k_outer)
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
        orders = list(dict.fromkeys([tuple(others_out + n_outer + k_outer + others_red),
                                     tuple(n_outer + others_out + k_outer + others_red)]))
        yield blocks_f, orders, m_loops, m_loops + inner


def _super_blocks(stmt: Statement, blocks, others_out, others_red, m: str, k_outer):
    (n, cols), (k, rows) = blocks
    for columns in (4 * cols, 8 * cols):
        if columns >= stmt.extent(n):
            continue
        split = [(n, columns), (f"{n}_i", cols), (k, rows)]
        inner = [f"{n}_i_i" if columns > cols else f"{n}_i", f"{k}_i" if stmt.extent(k) > rows else k]
        head = [f"{n}_o"]
        orders = [tuple(head + others_out + k_outer + [f"{n}_i_o"] + others_red),
                  tuple(others_out + head + k_outer + [f"{n}_i_o"] + others_red)]
        yield split, list(dict.fromkeys(orders)), [m], [m] + inner


def _skeleton(program: Program, target: Target, blocks, order: tuple[str, ...], checked: bool = True) -> Schedule:
    s = Schedule(program, target, checked)
    for name, size in blocks:
        if _trips(s, name) > size:
            s.split(s.loop(name), size)
    s.reorder(*(s.loop(x) for x in order))
    return s


def _trips(s: Schedule, loop: str) -> int:
    """Iterations of `loop` (the widest, for loops with varying bounds)."""
    lid, pos, stmts = s._resolve(s.loop(loop), "auto", False)
    rng = s._state.maps[next(iter(stmts))].range()
    return int(rng.dim_max(pos).max_val().to_python() - rng.dim_min(pos).min_val().to_python()) + 1


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


def _cost(program, target, tensors, choice, order, trips, sizes, compute, kind, pipeline=False,
          ragged=frozenset()) -> Candidate:
    """The cycles of the microcode the lowering emits for this choice. Serialized: every DMA and
    every band instruction adds up. With `pipeline`, the innermost staging loop holds only
    inputs, with two buffers each, and its loads overlap its compute: per pass of the loop,
    l + e + (n - 1) * max(l, e) for loads l and compute e per iteration over n iterations."""
    spad = acc = 0
    dma = dram = 0
    lhs = program.statements[0].lhs.tensor
    depth = {lv: order.index(lv) for lv in order}
    inner = max((lv for lv in choice if lv), key=depth.get, default=None)
    at_inner = [t for t, lv in zip(tensors, choice) if lv == inner and lv is not None]
    if pipeline and (inner is None or trips[inner] < 2 or any(o in ragged for o in order[: depth[inner] + 1])):
        return Candidate(tuple(order), tuple(zip(tensors, choice)), math.inf, compute, 0, 0, 0, pipelined=True)
    overlapped = 0  # cycles of the pipelined loads, per iteration of the staging loop
    stored = fill = channel = 0  # the same for a pipelined output: store, zero fill, DRAM transfers
    for tensor, level in zip(tensors, choice):
        nbytes, fresh = sizes[(tensor, level)]
        count = math.prod(trips[o] for o in order[: order.index(level) + 1]) if level else 1
        transfers = 1
        piped = pipeline and tensor in at_inner
        if tensor == lhs:  # outputs are stored, and loaded (partial sums) unless they start as zeros
            if piped and not fresh:
                return Candidate(tuple(order), tuple(zip(tensors, choice)), math.inf, compute, 0, 0, 0,
                                 pipelined=True)
            if fresh:
                elements = nbytes // program.tensor(tensor).itemsize
                cost = target.vector_setup_cycles + -(-elements // target.lanes)
                if piped:
                    fill += cost
                else:
                    dma += count * cost
            else:
                transfers = 2
        one = target.dma_setup_cycles + -(-nbytes // target.dram_bytes_per_cycle)
        if piped:
            channel += -(-nbytes // target.dram_bytes_per_cycle)
            if tensor == lhs:
                stored += one
            else:
                overlapped += one
        else:
            dma += count * transfers * one
        dram += count * transfers * nbytes
        copies = 2 if pipeline and tensor in at_inner else 1
        if kind == "array" and tensor == lhs:
            acc += copies * nbytes
        else:
            spad += copies * (-(-nbytes // 16) * 16)
    if pipeline:
        outer = math.prod(trips[o] for o in order[: depth[inner]])
        n = trips[inner]
        e = compute / (outer * n) + fill
        step = max(overlapped, e, stored, channel)
        total = outer * (overlapped + e + stored + (n - 1) * step)
        dma += int(round(total - compute))
    fits = spad <= target.spad.bytes and acc <= target.acc.bytes
    return Candidate(tuple(order), tuple(zip(tensors, choice)), dma if fits else math.inf, compute, dram,
                     spad, acc, pipelined=pipeline)
