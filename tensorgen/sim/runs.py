"""Runs of MATMULs executed at once by the simulator, with every counter as stepping gives it.

A run is a token-free MATMUL (optionally) followed by a LOOP/LOOPB nest around one
accumulating MATMUL into the same accumulator -- the compiler peels the first `accumulate=0`
product of every reduction -- or such a nest alone. Its values come from one BLAS call when
its iterations fill a box (`batch.matmul_box`), MATMUL by MATMUL otherwise; its timing,
counters, trace events and DRAM-free hazard bookkeeping are computed per MATMUL in program
order. Whatever could make stepping behave differently (an access out of bounds, an operand
overlapping the accumulator, a possible hazard, a limit reached) makes the run decline, and
the simulator steps those instructions instead, so errors are the same as stepping's too.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from tensorgen.sim.batch import (
    MAX_BATCH_ELEMENTS,
    Decoded,
    MatmulOp,
    Nest,
    VectorOp,
    box_of,
    box_piece,
    piece,
    reduce_into,
)


@dataclass(frozen=True)
class Shape:
    """The iterations of one nest at some outer counters: cached, they repeat."""

    points: np.ndarray  # (n, levels) inner counters, in program order
    iterations: int  # hardware-loop iterations, as stepping counts them
    box: tuple | None  # batch.box_of(points)


class Access:
    """An access in flight on a queue; `parts`, when set, stands for the accesses of the
    MATMULs of a run, in order (`RunParts`), and `spans` for their extent per operand, so that
    other queues check against exactly what stepping would have recorded."""

    __slots__ = ("mem", "lo", "hi", "end", "queue", "write", "pc", "parts", "spans")

    def __init__(self, mem, lo, hi, end, queue, write, pc, parts=None, spans=None):
        self.mem, self.lo, self.hi, self.end = mem, lo, hi, end
        self.queue, self.write, self.pc = queue, write, pc
        self.parts, self.spans = parts, spans


class RunParts:
    """The accesses of a run's MATMULs, built only when another queue's access overlaps the
    run's spans (rarely: a hazard, or a near miss)."""

    def __init__(self, segments, ends: list[int]) -> None:
        self.segments, self.ends = segments, ends
        self.first_end = ends[0]
        self._parts: list[Access] | None = None

    def shift(self, s: int) -> None:
        """Every end `s` cycles later (`replay.shift`); the parts are built again if needed."""
        self.ends = [e + s for e in self.ends]
        self.first_end += s
        self._parts = None

    def expand(self) -> list[Access]:
        if self._parts is None:
            parts, i = [], 0
            for seg in self.segments:
                for row in seg.bases.tolist():
                    for name, d, write in seg.op.operands():
                        base = row[_COLUMN[name]]
                        parts.append(
                            Access(
                                d.mem, base + d.lo, base + d.hi, self.ends[i], "EX", write, seg.pc
                            )
                        )
                    i += 1
            self._parts = parts
        return self._parts


@dataclass(frozen=True)
class Segment:
    """Consecutive MATMULs of a run of one static instruction: its (acc, a, b) byte bases."""

    pc: int
    op: MatmulOp
    bases: np.ndarray  # (steps, 3)
    low: tuple[int, int, int]  # the least base of each column
    high: tuple[int, int, int]  # the greatest

    @staticmethod
    def of(pc: int, op: MatmulOp, bases: np.ndarray) -> Segment:
        if len(bases) == 1:
            row = tuple(bases[0].tolist())
            return Segment(pc, op, bases, row, row)
        low, high = np.minimum.reduce(bases), np.maximum.reduce(bases)  # no axis wrappers
        return Segment(pc, op, bases, tuple(low.tolist()), tuple(high.tolist()))


_COLUMN = {"acc": 0, "a": 1, "b": 2}
# plans kept per binary (`tensorgen.sim.static`): beyond this many, new ones are not kept
MAX_PLANS = 4096


def _same_view(x: Decoded, y: Decoded) -> bool:
    return (x.mem, x.dtype, x.shape, x.strides) == (y.mem, y.dtype, y.shape, y.strides)


class MatmulRuns:
    def __init__(self, sim) -> None:
        self.sim = sim
        known = sim.static.runs  # decoded once per binary (`static`), shared by its runs
        names = ("ops", "nests", "shapes", "vectors", "coefs", "loops", "loop_plans", "run_plans")
        for name in names:
            known.setdefault(name, {})
        self.ops: dict[int, MatmulOp | None] = known["ops"]
        self.nests: dict[tuple[int, int], Nest | None] = known["nests"]
        self.shapes: dict[tuple, Shape] = known["shapes"]
        self.vectors: dict[int, VectorOp | None] = known["vectors"]
        self.coefs: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]] = known["coefs"]
        self.loops: dict[tuple[int, int], object] = known["loops"]  # loops.LoopForm or None
        self.loop_plans: dict[tuple, object] = known["loop_plans"]  # loops.LoopPlan or None
        self.run_plans: dict[tuple, tuple] = known["run_plans"]  # (shape, `_plan`) of `run`
        # `_timing`'s steps relative to the run's start, per (signature, streaming state)
        self.timings: dict[tuple, tuple] = known.setdefault("timings", {})
        self.counts: dict[tuple, tuple] = known.setdefault("counts", {})  # `count_segments`'
        # per segment list of a kept plan: (the list, its signature), the list held so that
        # its id stays its own
        self.signatures: dict[int, tuple] = known.setdefault("signatures", {})

    def op(self, pc: int) -> MatmulOp | None:
        if pc not in self.ops:
            ins = self.sim.binary.code[pc]
            self.ops[pc] = MatmulOp.of(ins) if ins.mnemonic == "MATMUL" else None
        return self.ops[pc]

    def once(self, pc: int, m) -> bool:
        """Execute the MATMUL at `pc` on machine `m` with the fast kernel, recording what it
        touches as its semantics would; False (nothing done) for anything else, or when an
        operand is out of bounds (its semantics then report it)."""
        op = self.op(pc)
        if op is None:
            return False
        try:
            bases = (op.acc.base(m.counters), op.a.base(m.counters), op.b.base(m.counters))
        except IndexError:
            return False
        touched = []
        for name, d, write in op.operands():
            base = bases[_COLUMN[name]]
            if base + d.lo < 0 or base + d.hi > m.mem[d.mem].size:
                return False
            touched.append((d.mem, base + d.lo, base + d.hi, write))
        if m.values:
            acc = op.acc.array(m.mem[op.acc.mem], bases[0])
            reduce_into(acc, [piece(op, m.mem, bases)], op.accumulate)
        m.touched = touched
        return True

    def vector_once(self, pc: int, m) -> bool:
        """Execute a VMUL or VMAC at `pc` on machine `m` in int32 in place (`batch.VectorOp`),
        recording what it touches as its semantics would; False (nothing done) for anything
        else, out of bounds, or when a source overlaps the destination."""
        if pc not in self.vectors:
            self.vectors[pc] = VectorOp.of(self.sim.binary.code[pc])
        op = self.vectors[pc]
        if op is None:
            return False
        try:
            views = [(name, d, write, d.base(m.counters)) for name, d, write in op.operands()]
        except IndexError:
            return False
        touched, bases = [], {}
        for name, d, write, base in views:
            lo, hi = base + d.lo, base + d.hi
            if lo < 0 or hi > m.mem[d.mem].size:
                return False
            touched.append((d.mem, lo, hi, write))
            bases[name] = base
        dmem, dlo, dhi, _ = touched[-1]
        if any(
            t[0] == dmem and t[1] < dhi and dlo < t[2] for t in touched[:-1] if t[1:3] != (dlo, dhi)
        ):
            return False  # a source overlapping the destination: its semantics run
        if m.values:
            op.run(m.mem, bases)
        m.touched = touched
        return True

    def nest(self, pc: int, depth: int) -> Nest | None:
        """The nest at `pc` if it is one around an accumulating, token-free fast MATMUL whose
        accumulator the loops do not move."""
        key = (pc, depth)
        if key not in self.nests:
            code, n = self.sim.binary.code, Nest.at(self.sim.binary.code, pc, depth)
            op = self.op(n.body) if n is not None else None
            ok = (
                op is not None
                and op.accumulate
                and not code[n.body].wait
                and not code[n.body].signal
                and all(c == 0 for c in op.acc.coefs[depth:])
            )
            self.nests[key] = n if ok else None
        return self.nests[key]

    def loop(self, pc: int, counters: tuple[int, ...]) -> bool:
        """Run every iteration of the LOOP at `pc` at once if its body is one run
        (`tensorgen.sim.loops`); False, with nothing changed, otherwise."""
        from tensorgen.sim import loops  # it builds on this module

        key = (pc, len(counters))
        if key not in self.loops:
            self.loops[key] = loops.loop_form(self, pc, len(counters))
        form = self.loops[key]
        return form is not None and loops.run_loop(self, form, counters)

    def shape(self, nest: Nest, counters: tuple[int, ...]) -> Shape:
        key = (nest.head, nest.depth, tuple(counters[lv] for lv in nest.outer_levels))
        if key not in self.shapes:
            points, iterations = nest.points(self.sim.binary.code, counters)
            self.shapes[key] = Shape(points, iterations, box_of(points))
        return self.shapes[key]

    def run(self, singles: list[int], nest: Nest | None, counters: tuple[int, ...]) -> bool:
        """Execute the run (the MATMULs at `singles`, in order, then `nest`); False, with
        nothing changed, when it must be stepped instead."""
        key = (tuple(singles), nest, counters)
        known = self.run_plans.get(key, False)
        if known is False:  # a pure function of the binary: kept across runs, as the decode
            shape = self.shape(nest, counters) if nest is not None else None
            known = (shape, self._plan(singles, nest, shape, counters))
            if len(self.run_plans) < MAX_PLANS:
                self.run_plans[key] = known
        shape, plan = known
        if plan is None:
            return False
        segments, spans = plan
        sim = self.sim
        n = sum(len(seg.bases) for seg in segments)
        iterations = shape.iterations if shape is not None else 0
        if (
            sim.stats.instructions + n > sim.limits.max_steps
            or sim.iterations + iterations > sim.limits.max_iterations
        ):
            return False
        steps = self._timing(segments, spans)
        if steps is None:
            return False
        sim.iterations += iterations
        if sim.machine.values:
            self._compute(len(singles), nest, shape, segments, counters)
        self._commit(segments, spans, steps)
        return True

    def _plan(self, singles, nest, shape, counters):
        """(the run's segments, their spans) when all is in bounds and no operand overlaps
        the accumulator; None otherwise."""
        segments = []
        for pc in singles:
            op = self.op(pc)
            if max(len(d.coefs) for d in (op.acc, op.a, op.b)) > len(counters):
                return None
            row = [(op.acc.base(counters), op.a.base(counters), op.b.base(counters))]
            segments.append(Segment.of(pc, op, np.array(row, np.int64)))
        if nest is not None and len(shape.points):
            op = self.op(nest.body)
            levels = len(counters) + shape.points.shape[1]
            if max(len(d.coefs) for d in (op.acc, op.a, op.b)) > levels:
                return None
            rows = np.empty((len(shape.points), levels), np.int64)
            rows[:, : len(counters)] = counters
            rows[:, len(counters) :] = shape.points
            coefs, consts = self._coefs(nest.body, levels)
            segments.append(Segment.of(nest.body, op, rows @ coefs + consts))
        if not segments:
            return None
        first = segments[0]
        for seg in segments[1:]:  # one accumulator throughout
            if not _same_view(first.op.acc, seg.op.acc) or seg.low[0] != first.low[0]:
                return None
        mem = self.sim.machine.mem
        for seg in segments:
            for name, d, _ in seg.op.operands():
                col = _COLUMN[name]
                if seg.low[col] + d.lo < 0 or seg.high[col] + d.hi > mem[d.mem].size:
                    return None
        spans = _spans(segments)
        acc_mem, acc_lo, acc_hi = spans[("acc", True)]
        for key in (("a", False), ("b", False)):
            m, lo, hi = spans[key]
            if m == acc_mem and lo < acc_hi and acc_lo < hi:
                return None  # it would read what the run writes: step it
        return segments, spans

    def _coefs(self, pc: int, levels: int) -> tuple[np.ndarray, np.ndarray]:
        """The (levels, 3) address coefficients and (3,) constants of the MATMUL at `pc`'s
        (acc, a, b) bases: one product gives a nest's bases."""
        key = (pc, levels)
        if key not in self.coefs:
            ds = (self.op(pc).acc, self.op(pc).a, self.op(pc).b)
            self.coefs[key] = (
                np.stack([_coefs(d, levels) for d in ds], axis=1),
                np.array([d.const for d in ds], np.int64),
            )
        return self.coefs[key]

    def signature(self, segments) -> tuple[tuple[int, int], ...]:
        """(pc, MATMULs) per segment: with the state on EX when it starts, all a run's
        timing and counters depend on."""
        known = self.signatures.get(id(segments))
        if known is not None and known[0] is segments:
            return known[1]
        sig = tuple((seg.pc, len(seg.bases)) for seg in segments)
        if len(self.signatures) < MAX_PLANS:
            self.signatures[id(segments)] = (segments, sig)
        return sig

    def _timing(self, segments, spans) -> tuple[list[int], list[int]] | None:
        """Per-step starts and ends on EX (two lists, no tuple per step), or None if another
        queue might touch the run's memory meanwhile (then stepping finds the exact hazard, or
        none). The steps are a function of the segments and of EX's state relative to its
        time (`_steps`), computed once per such state: every time in them shifts with it."""
        sim = self.sim
        t, saved = sim.queue_time["EX"], sim.streaming
        state = None if saved is None else (t - saved[0], saved[1])
        key = (self.signature(segments), state)
        known = self.timings.get(key)
        if known is not None and t + known[5] >= 0:
            starts, ends, rf, after, rows, _ = known
            steps = ((starts + t).tolist(), (ends + t).tolist())
            reads_from = rf + t
            sim.streaming = None if after is None else (after + t, rows)
        else:
            steps, reads_from, clamped = self._steps(segments)
            if steps[0] and clamped >= 0 and len(self.timings) < MAX_PLANS:
                after = sim.streaming
                self.timings[key] = (  # shifted back in C: runs are long
                    np.array(steps[0], np.int64) - t,
                    np.array(steps[1], np.int64) - t,
                    reads_from - t,
                    None if after is None else after[0] - t,
                    None if after is None else after[1],
                    clamped - t,
                )
        for other, accesses in sim.inflight.items():
            if other == "EX":
                continue
            for (_, write), (mem, lo, hi) in spans.items():
                for a in reversed(accesses):
                    if a.end <= reads_from:
                        break
                    if a.mem == mem and a.lo < hi and lo < a.hi and (a.write or write):
                        sim.streaming = saved
                        return None
        return steps

    def _steps(self, segments) -> tuple[tuple[list[int], list[int]], int | None, int]:
        """(per-step starts and ends, the first cycle the run reads, the least of EX's time and
        the streaming starts clamped at 0 on the way) from EX's state now; the MAC array's
        streaming state updated. While that least is >= 0 no clamp changed anything, so the
        steps from the same state shifted by s are these shifted by s, as long as it stays
        >= 0 (`_timing`)."""
        sim = self.sim
        t = clamped = sim.queue_time["EX"]
        starts, stops, reads_from = [], [], None
        target = sim.target
        fill, double = target.fill_cycles, target.weight_buffers > 1
        for seg in segments:
            cost = sim.costs[seg.pc]
            k = len(seg.bases)
            if not k:
                continue
            if not cost.fill:
                for _ in range(k):
                    if sim.streaming is not None:
                        clamped = min(clamped, sim.streaming[0])
                    end, rf = sim._execute_timing(cost, 1, t, 0)
                    starts.append(t)
                    stops.append(end)
                    reads_from = rf if reads_from is None else min(reads_from, rf)
                    t = end
                continue
            # `_execute_timing` of token-free MATMULs, inlined: with two weight buffers each
            # loads its weights from when the one before began to stream, else from its start
            # (`matmul_stream_start`); the first MATMUL of a segment depends on the one before
            rows = cost.cycles - cost.fill
            streaming = sim.streaming
            if streaming is not None and double:
                clamped = min(clamped, streaming[0])
            begin = t if streaming is None or not double else max(streaming[0], 0)
            end = max(t, begin + fill) + rows
            rf = min(begin, t)
            reads_from = rf if reads_from is None else min(reads_from, rf)
            # the others follow it at a fixed pace: each begins to load when the one before
            # began to stream (end - rows >= 0), or at its own start with one buffer; their
            # first reads come later than this one's
            pace = max(rows, fill) if double else max(fill, 0) + rows
            ends = list(range(end, end + k * pace, pace)) if pace > 0 else [end] * k
            starts += [t, *ends[:-1]]
            stops += ends
            t = ends[-1]
            sim.streaming = (t - rows, rows)
        return (starts, stops), reads_from, clamped

    def _compute(self, n_singles, nest, shape, segments, counters) -> None:
        """The run's values: its products summed into the accumulator as one BLAS product
        over their concatenated K (a box-shaped nest as one strided piece, absorbing a first
        MATMUL that is its missing corner)."""
        mem = self.sim.machine.mem
        first = segments[0]
        steps = sum(len(seg.bases) for seg in segments)
        body = segments[-1].op
        if steps * max(math.prod(body.a.shape), math.prod(body.b.shape)) > MAX_BATCH_ELEMENTS:
            for seg in segments:  # bounded memory: product by product
                for i, row in enumerate(seg.bases.tolist()):
                    acc = seg.op.acc.array(mem[seg.op.acc.mem], row[0])
                    step_acc = seg.op.accumulate if (seg is first and i == 0) else 1
                    reduce_into(acc, [piece(seg.op, mem, tuple(row))], step_acc)
            return
        singles = segments[:n_singles]
        pieces = [piece(seg.op, mem, tuple(seg.bases[0].tolist())) for seg in singles]
        if len(segments) > n_singles:
            seg = segments[-1]
            box = self._box(nest, shape, singles, counters)
            if box is None:
                pieces += [piece(seg.op, mem, tuple(row)) for row in seg.bases.tolist()]
            else:
                drop_first, bases, dims, levels = box
                if drop_first:
                    pieces = pieces[1:]
                pieces.append(box_piece(seg.op, mem, bases, dims, levels))
        acc = first.op.acc.array(mem[first.op.acc.mem], int(first.bases[0, 0]))
        reduce_into(acc, pieces, first.op.accumulate)

    def _box(self, nest, shape, singles, counters):
        """(whether it absorbs the first MATMUL, corner bases, dims, levels) when the nest's
        iterations fill a box, or all of one but the corner the first MATMUL computes."""
        if shape.box is None:
            return None
        corner, dims, missing = shape.box
        body = self.op(nest.body)
        levels = tuple(range(len(counters), len(counters) + len(dims)))
        at = counters + tuple(int(c) for c in corner)
        bases = (body.acc.base(at), body.a.base(at), body.b.base(at))
        if missing is None:
            return False, bases, dims, levels
        if len(singles) != 1:
            return None  # the missing corner must be the one MATMUL just before the nest
        first = singles[0].op
        gap = counters + tuple(int(c) for c in missing)
        if (
            _same_view(first.a, body.a)
            and _same_view(first.b, body.b)
            and (first.a_zp, first.b_zp) == (body.a_zp, body.b_zp)
            and tuple(singles[0].bases[0, 1:].tolist()) == (body.a.base(gap), body.b.base(gap))
        ):
            return True, bases, dims, levels
        return None

    def _commit(self, segments, spans, steps) -> None:
        sim = self.sim
        st = sim.stats
        starts, ends = steps
        end = ends[-1]
        parts = RunParts(segments, ends)
        sim.inflight["EX"].append(Access(None, 0, 0, end, "EX", True, segments[0].pc, parts, spans))
        if sim.recorder is not None:
            pcs = [seg.pc for seg in segments for _ in range(len(seg.bases))]
            for pc, start, stop in zip(pcs, starts, ends, strict=True):
                sim.recorder.events.append(("EX", start, start, stop, pc, "MATMUL"))
        st.busy["EX"] += end - starts[0]
        sim.queue_time["EX"] = end
        count_segments(sim, segments)


def _coefs(d: Decoded, levels: int) -> np.ndarray:
    out = np.zeros(levels, np.int64)
    out[: len(d.coefs)] = d.coefs
    return out


def _spans(segments) -> dict[tuple[str, bool], tuple[str, int, int]]:
    """(field, written) -> (memory, first byte, end) over all the run's MATMULs."""
    spans: dict[tuple[str, bool], tuple[str, int, int]] = {}
    for seg in segments:
        for name, d, write in seg.op.operands():
            col = _COLUMN[name]
            lo, hi = seg.low[col] + d.lo, seg.high[col] + d.hi
            old = spans.get((name, write))
            spans[(name, write)] = (
                (d.mem, lo, hi) if old is None else (d.mem, min(old[1], lo), max(old[2], hi))
            )
    return spans


def hazard(accesses: list[Access], mem: str, lo: int, hi: int, write: bool, start: int):
    """The newest access in flight after `start` that overlaps [lo, hi) of `mem`, one of the two
    writing, or None. Accesses end in nondecreasing time; a run's entry stands for its parts in
    order (`runs.Access`), scanned as if they were in the list themselves."""
    for a in reversed(accesses):
        if a.end <= start:
            return None
        if a.parts is None:
            if a.mem == mem and a.lo < hi and lo < a.hi and (a.write or write):
                return a
            continue
        if any(
            m == mem and s_lo < hi and lo < s_hi and (w or write)
            for (_, w), (m, s_lo, s_hi) in a.spans.items()
        ):
            for p in reversed(a.parts.expand()):
                if p.end <= start:
                    return None
                if p.mem == mem and p.lo < hi and lo < p.hi and (p.write or write):
                    return p
        if a.parts.first_end <= start:
            return None  # stepping's scan would have stopped inside the run
    return None


def count_segments(sim, segments) -> None:
    """Add the counters of every instruction a run's segments stand for (each `k` times),
    summed once per signature (`MatmulRuns.signature`)."""
    runs = sim.runs
    sig = runs.signature(segments)
    known = runs.counts.get(sig)
    if known is None:
        instructions = macs = vector_ops = 0
        onchip: dict[str, int] = {}
        written: dict[str, int] = {}
        for pc, k in sig:
            cost = sim.costs[pc]
            instructions += k
            macs += cost.macs * k
            vector_ops += cost.vector_ops * k
            for m, b in cost.bytes:
                onchip[m] = onchip.get(m, 0) + b * k
            for m, b in cost.written:
                written[m] = written.get(m, 0) + b * k
        known = (instructions, macs, vector_ops, tuple(onchip.items()), tuple(written.items()))
        if len(runs.counts) < MAX_PLANS:
            runs.counts[sig] = known
    st = sim.stats
    st.instructions += known[0]
    st.macs += known[1]
    st.vector_ops += known[2]
    for m, b in known[3]:
        st.onchip_bytes[m] += b
    for m, b in known[4]:
        st.onchip_write_bytes[m] += b
