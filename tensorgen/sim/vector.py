"""Runs of VMUL/VMAC executed at once by the simulator, with every counter as stepping gives it.

A depthwise convolution's tap loop is a token-free VMUL (or VMAC) followed by a LOOP/LOOPB nest
around one token-free VMAC into the same destination, which the nest does not move: stepping
it costs a Python step per tap. Here its values are one strided int32 product over the nest's
box (int32 wraps modulo 2**32, so the order of the additions does not matter, and a box with
one point missing is the box's sum minus that point's product, exactly); its timing, counters,
trace events and hazard bookkeeping are the per-instruction ones of `runs.MatmulRuns`' runs
(`_timing`, and the run's accesses in flight as one entry standing for its parts in order).
Whatever could make stepping behave differently (an access out of bounds, a source
overlapping the destination, an access of another queue in flight nearby, a limit reached, a
mark inside it) makes the run decline, and the simulator steps those instructions instead.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from tensorgen.sim import products, taps
from tensorgen.sim.batch import MAX_BATCH_ELEMENTS, Decoded, Nest, VectorOp
from tensorgen.sim.runs import MAX_PLANS, Access, RunParts, Segment, _spans, count_segments


@dataclass(frozen=True)
class _Operands:
    """A `VectorOp` with its operands named as a run's segments name them (acc, a, b), in
    the order its semantics touch them, so that `runs.RunParts` expands a run's accesses
    exactly as stepping records them."""

    vop: VectorOp

    def operands(self) -> tuple[tuple[str, Decoded, bool], ...]:
        rename = {"dst": "acc", "a": "a", "b": "b"}
        return tuple((rename[n], d, w) for n, d, w in self.vop.operands())


@dataclass(frozen=True)
class Form:
    """An optional VMUL/VMAC at `single` and the nest after it (or at the run's pc)."""

    single: int | None
    nest: Nest
    after: int  # the pc after the run


@dataclass(frozen=True)
class Plan:
    segments: list  # runs.Segment per instruction of the run, bases (steps, 3): dst, a, b
    spans: dict
    steps: int
    iterations: int
    box: tuple | None  # (corner bases, dims, levels, missing bases or None) of the nest
    taps: tuple | None = None  # (taps.Taps, b base or None per tap): one sum (`taps`)


def _same(x: Decoded, y: Decoded) -> bool:
    return (x.mem, x.dtype, x.shape, x.strides, x.const, x.coefs) == (
        y.mem,
        y.dtype,
        y.shape,
        y.strides,
        y.const,
        y.coefs,
    )


class VectorRuns:
    def __init__(self, sim) -> None:
        self.sim = sim
        known = sim.static.runs.setdefault("vector", {})  # kept across runs of the binary
        self.forms: dict = known.setdefault("forms", {})
        self.plans: dict = known.setdefault("plans", {})
        self.ops: dict = known.setdefault("ops", {})
        # the tap sums' buffers (`taps.tap_sum`), kept from run to run of the binary
        self.scratch = known.setdefault("scratch", products.Scratch())

    def op(self, pc: int) -> VectorOp | None:
        if pc not in self.ops:
            ins = self.sim.binary.code[pc]
            op = VectorOp.of(ins) if not (ins.wait or ins.signal) else None
            self.ops[pc] = op
        return self.ops[pc]

    def form(self, pc: int, depth: int) -> Form | None:
        key = (pc, depth)
        if key not in self.forms:
            self.forms[key] = self._form(pc, depth)
        return self.forms[key]

    def _form(self, pc: int, depth: int) -> Form | None:
        code = self.sim.binary.code
        single = None
        if code[pc].mnemonic in ("VMUL", "VMAC"):
            if self.op(pc) is None:
                return None
            single, pc = pc, pc + 1
        nest = Nest.at(code, pc, depth) if pc < len(code) else None
        if nest is None or code[nest.body].mnemonic != "VMAC":
            return None
        body = self.op(nest.body)
        if body is None or body.b is None or any(body.dst.coefs[depth:]):
            return None  # the nest moves its destination: each tap its own
        if single is not None and not _same(self.op(single).dst, body.dst):
            return None
        return Form(single, nest, nest.body + 1)

    def run(self, pc: int, end: int, counters: tuple[int, ...]) -> int | None:
        """Run the VMUL/VMAC run at `pc` at once; the pc after it, or None (nothing changed)
        when it is to be stepped."""
        sim = self.sim
        form = self.form(pc, len(counters))
        if form is None or form.after > end:
            return None
        if not counters and any(q in sim.mark_pcs for q in range(pc + 1, form.after)):
            return None  # a mark inside: stepping records it
        key = (pc, counters)
        plan = self.plans.get(key, False)
        if plan is False:  # a pure function of the binary
            plan = self._plan(form, counters)
            if len(self.plans) < MAX_PLANS:
                self.plans[key] = plan
        if plan is None:
            return None
        lim = sim.limits
        if (
            sim.stats.instructions + plan.steps > lim.max_steps
            or sim.iterations + plan.iterations > lim.max_iterations
        ):
            return None
        steps = sim.runs._timing(plan.segments, plan.spans)
        if steps is None:
            return None
        sim.iterations += plan.iterations
        if sim.machine.values:  # else stepped for its timing only (`replay.whole_plan`)
            self._compute(form, plan)
        self._commit(plan, steps)
        return form.after

    def _plan(self, form: Form, counters: tuple[int, ...]) -> Plan | None:
        runs = self.sim.runs
        shape = runs.shape(form.nest, counters)
        if not len(shape.points):
            return None
        body = self.op(form.nest.body)
        levels = len(counters) + shape.points.shape[1]
        ds = (body.dst, body.a, body.b)
        if any(d is not None and len(d.coefs) > levels for d in ds):
            return None
        rows = np.empty((len(shape.points), levels), np.int64)
        rows[:, : len(counters)] = counters
        rows[:, len(counters) :] = shape.points
        coefs = np.stack([_coefs(d, levels) for d in ds], axis=1)
        consts = np.array([d.const if d is not None else 0 for d in ds], np.int64)
        segments = []
        if form.single is not None:
            op = self.op(form.single)
            if any(d is not None and len(d.coefs) > len(counters) for d in (op.dst, op.a, op.b)):
                return None
            row = [d.base(counters) if d is not None else 0 for d in (op.dst, op.a, op.b)]
            segments.append(Segment.of(form.single, _Operands(op), np.array([row], np.int64)))
        segments.append(Segment.of(form.nest.body, _Operands(body), rows @ coefs + consts))
        if segments[0].low[0] != segments[-1].low[0] or segments[-1].low[0] != segments[-1].high[0]:
            return None
        mem = self.sim.machine.mem
        for seg in segments:
            for name, d, _ in seg.op.operands():
                col = {"acc": 0, "a": 1, "b": 2}[name]
                if seg.low[col] + d.lo < 0 or seg.high[col] + d.hi > mem[d.mem].size:
                    return None
        spans = _spans(segments)
        d_mem, d_lo, d_hi = spans[("acc", True)]
        for (name, _), (m, lo, hi) in spans.items():
            if name != "acc" and m == d_mem and lo < d_hi and d_lo < hi:
                return None  # a source overlapping the destination: stepped
        n = len(shape.points)
        box = None
        if shape.box is not None and n * math.prod(body.dst.shape) <= MAX_BATCH_ELEMENTS:
            corner, dims, missing = shape.box
            at = counters + tuple(int(c) for c in corner)
            lv = tuple(range(len(counters), len(counters) + len(dims)))
            gap = None
            if missing is not None:
                g = counters + tuple(int(c) for c in missing)
                gap = (body.a.base(g), body.b.base(g))
            box = ((body.a.base(at), body.b.base(at)), dims, lv, gap)
            if not all(
                _inside(d, base, dims, lv, mem) for d, base in zip(ds[1:], box[0], strict=True)
            ):
                box = None  # the missing point out of bounds: tap by tap
        steps = n + (form.single is not None)
        return Plan(segments, spans, steps, shape.iterations, box, _taps(segments))

    def _compute(self, form: Form, plan: Plan) -> None:
        mem = self.sim.machine.mem
        segs = plan.segments
        body = segs[-1].op.vop
        dst = body.dst.array(mem[body.dst.mem], int(segs[-1].bases[0, 0]))
        if plan.taps is not None and self._tap_sum(plan, dst):
            return
        if form.single is not None:
            row = segs[0].bases[0].tolist()
            segs[0].op.vop.run(mem, {"dst": row[0], "a": row[1], "b": row[2]})
        if plan.box is None:  # tap by tap
            for row in segs[-1].bases.tolist():
                body.run(mem, {"dst": row[0], "a": row[1], "b": row[2]})
            return
        (a0, b0), dims, levels, gap = plan.box
        a = _stacked(body.a, mem, a0, dims, levels)
        b = _stacked(body.b, mem, b0, dims, levels, narrow=True).astype(np.int32)
        prod = np.multiply(a, b, dtype=np.int32)  # in int32: wraps, as each tap's does
        total = prod.reshape(-1, *dst.shape).sum(axis=0, dtype=np.int32)
        if gap is not None:  # the box's one missing point: its product taken off again
            ga = body.a.array(mem[body.a.mem], gap[0])
            gb = _narrow(body.b).array(mem[body.b.mem], gap[1]).astype(np.int32)
            total -= np.multiply(ga, gb, dtype=np.int32)
        dst += total

    def _tap_sum(self, plan: Plan, dst: np.ndarray) -> bool:
        """The run's values as one cast and a fused multiply-add per tap (`taps`): False,
        nothing written, when a weight could make a partial sum overflow."""
        mem = self.sim.machine.mem
        t, bs = plan.taps
        ops = [s.op.vop for s in plan.segments for _ in range(len(s.bases))]
        weights = [
            np.int64(op.imm).astype(np.int32)  # wrapped, as `VectorOp.run`
            if base is None
            else op.b_narrow.array(mem[op.b.mem], base)
            for op, base in zip(ops, bs, strict=True)
        ]
        if not taps.bound(t, weights):
            return False
        weights = [w[None] for w in weights]
        out = taps.tap_sum(t, mem[ops[0].a.mem], t.low, 1, 0, weights, self.scratch)
        if out is None:
            return False
        if ops[0].mnemonic == "VMAC":
            np.add(dst, out[0], out=dst)  # int32: wraps
        else:
            dst[...] = out[0]
        return True

    def _commit(self, plan: Plan, steps) -> None:
        """`runs.MatmulRuns._commit` of this run: one entry in flight for its accesses, the
        counters and trace events of its instructions."""
        sim = self.sim
        st, segs = sim.stats, plan.segments
        starts, ends = steps
        end = ends[-1]
        parts = RunParts(segs, ends)
        sim.inflight["EX"].append(
            Access(None, 0, 0, end, "EX", True, segs[0].pc, parts, plan.spans)
        )
        if sim.recorder is not None:
            pcs = [(s.pc, s.op.vop.mnemonic) for s in segs for _ in range(len(s.bases))]
            for (pc, name), start, stop in zip(pcs, starts, ends, strict=True):
                sim.recorder.events.append(("EX", start, start, stop, pc, name))
        st.busy["EX"] += end - starts[0]
        sim.queue_time["EX"] = end
        count_segments(sim, segs)


def _taps(segments) -> tuple | None:
    """(taps, each tap's b base or None for an immediate) when the run's taps are one sum of
    shifted products (`taps`): one source view at shifted bases (the plan has checked that
    no source meets the destination)."""
    a = segments[-1].op.vop.a
    bases, bs = [], []
    for seg in segments:
        op = seg.op.vop
        if (op.a.mem, op.a.dtype, op.a.shape, op.a.strides) != (a.mem, a.dtype, a.shape, a.strides):
            return None
        for row in seg.bases.tolist():
            bases.append(row[1])
            bs.append(row[2] if op.b is not None else None)
    t = taps.plan(a.shape, a.strides, bases, a.dtype)
    return None if t is None else (t, tuple(bs))


def _coefs(d: Decoded | None, levels: int) -> np.ndarray:
    out = np.zeros(levels, np.int64)
    if d is not None:
        out[: len(d.coefs)] = d.coefs
    return out


def _inside(d: Decoded, base: int, dims, levels, mem) -> bool:
    """Whether the view at every point of the box lies in its memory."""
    lo, hi = base + d.lo, base + d.hi
    for n, lv in zip(dims, levels, strict=True):
        c = (n - 1) * (d.coefs[lv] if lv < len(d.coefs) else 0)
        lo, hi = lo + min(0, c), hi + max(0, c)
    return lo >= 0 and hi <= mem[d.mem].size


def _narrow(d: Decoded) -> Decoded:
    """`d` with the axes it broadcasts along (stride 0) cut to 1."""
    shape = tuple(1 if st == 0 else n for n, st in zip(d.shape, d.strides, strict=True))
    return Decoded(d.mem, d.dtype, shape, d.strides, d.const, d.coefs, d.lo, d.hi)


def _stacked(d: Decoded, mem, base: int, dims, levels, narrow: bool = False) -> np.ndarray:
    """The view at every point of the box (`dims` over loop `levels`, from its corner's
    `base`): shape (*dims, *view shape), a strided view of the memory (bounds checked by the
    plan: the box's points are the nest's, but for at most its one missing point, whose
    addresses lie between the corners')."""
    v = _narrow(d) if narrow else d
    lead = tuple(d.coefs[lv] if lv < len(d.coefs) else 0 for lv in levels)
    lead = tuple(0 if n == 1 else c for n, c in zip(dims, lead, strict=True))
    return np.ndarray(
        (*dims, *v.shape), v.dtype, buffer=mem[d.mem], offset=base, strides=(*lead, *v.strides)
    )
