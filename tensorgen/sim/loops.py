"""A LOOP whose body is one run of MATMULs (`tensorgen.sim.runs`), all its iterations at once.

The 1x1 convolutions' tiles are such loops: per output-channel block, a peeled MATMUL and a
nest accumulating into that block's own accumulator, which moves with the loop. Their values
are one stacked BLAS product over the loop's iterations; timing, counters, trace events and
the hazard bookkeeping are those of the MATMULs in program order, computed by the same code
as a single run's (`runs.MatmulRuns._timing`, `_commit`). The loop is declined (and run
iteration by iteration, through the single runs) whenever anything could differ: iterations
whose accumulators overlap, a nest whose shape follows the loop, an operand out of bounds or
overlapping an accumulator, a limit reached, an access of another queue in flight nearby.
Addresses are affine in the loop counter, so checking the first and the last iteration
bounds every one in between.
"""

from __future__ import annotations

from dataclasses import dataclass

from tensorgen.sim.batch import (
    MAX_BATCH_ELEMENTS,
    Nest,
    batched,
    batched_piece,
    box_piece,
    reduce_into,
)
from tensorgen.sim.runs import MAX_PLANS, MatmulRuns, Segment, _same_view


@dataclass(frozen=True)
class LoopForm:
    """A LOOP (`count` iterations at loop level `level`) around MATMULs `singles` in a row and
    optionally the nest after them, ending with the LOOP's body."""

    count: int
    level: int
    after: int  # the pc after the loop
    singles: tuple[int, ...]
    nest: Nest | None


def loop_form(runs: MatmulRuns, pc: int, depth: int) -> LoopForm | None:
    code = runs.sim.binary.code
    ins = code[pc]
    if ins.mnemonic != "LOOP" or ins.wait or ins.signal or depth + 1 >= 8:
        return None
    count, after = ins.arg("count"), pc + 1 + ins.arg("body")
    if count < 2 or after > len(code):
        return None
    singles, q = [], pc + 1
    while q < after and code[q].mnemonic == "MATMUL":
        op = runs.op(q)
        if code[q].wait or code[q].signal or op is None or (singles and not op.accumulate):
            return None
        if singles and not _same_acc(runs.op(singles[0]).acc, op.acc):
            return None
        singles.append(q)
        q += 1
    nest = runs.nest(q, depth + 1) if q < after else None
    if q < after and (nest is None or nest.body != after - 1):
        return None  # anything else in the body: the loop is run iteration by iteration
    if nest is not None and depth in nest.outer_levels:
        return None  # a nest whose shape follows this loop's counter
    if (
        nest is not None
        and singles
        and not _same_acc(runs.op(singles[0]).acc, runs.op(nest.body).acc)
    ):
        return None
    if not singles and nest is None:
        return None
    return LoopForm(count, depth, after, tuple(singles), nest)


def _same_acc(x, y) -> bool:
    return _same_view(x, y) and (x.const, x.coefs) == (y.const, y.coefs)


def _step(d, level: int) -> int:
    return d.coefs[level] if level < len(d.coefs) else 0


@dataclass(frozen=True)
class LoopPlan:
    """What running a loop at some outer counters needs that depends only on the binary
    (`_plan`): kept across runs, as the decode is."""

    segs0: list  # the first iteration's segments
    spans: dict
    steps: int  # MATMULs over all the iterations
    iterations: int  # hardware-loop iterations, as stepping counts them
    box: tuple | None
    deltas: list
    ordered: list  # every iteration's segments, in program order


def run_loop(runs: MatmulRuns, form: LoopForm, counters: tuple[int, ...]) -> bool:
    """Execute every iteration of the loop `form` at outer `counters`; False, with nothing
    changed, when it must be iterated instead."""
    sim = runs.sim
    plans = runs.loop_plans
    key = (form.after, form.level, counters)
    plan = plans.get(key, False)
    if plan is False:
        plan = _plan(runs, form, counters)
        if len(plans) < MAX_PLANS:
            plans[key] = plan
    if plan is None:
        return False
    if (
        sim.stats.instructions + plan.steps > sim.limits.max_steps
        or sim.iterations + plan.iterations > sim.limits.max_iterations
    ):
        return False
    steps = runs._timing(plan.ordered, plan.spans)
    if steps is None:
        return False
    sim.iterations += plan.iterations
    if sim.machine.values:
        _compute(runs, form, plan.segs0, plan.deltas, plan.box)
    runs._commit(plan.ordered, plan.spans, steps)
    return True


def _plan(runs: MatmulRuns, form: LoopForm, counters: tuple[int, ...]) -> LoopPlan | None:
    """The loop's plan at outer `counters`, or None when it must be iterated: whatever
    makes it decline that does not depend on the run's state (its limits, the accesses in
    flight: `run_loop`)."""
    count, level = form.count, form.level
    first, last = counters + (0,), counters + (count - 1,)
    shape = runs.shape(form.nest, first) if form.nest is not None else None
    if shape is not None and (shape.box is None or not len(shape.points)):
        return None
    ends = [runs._plan(list(form.singles), form.nest, shape, c) for c in (first, last)]
    if ends[0] is None or ends[1] is None:
        return None
    segs0, spans = ends[0][0], _union(ends[0][1], ends[1][1])
    acc = segs0[0].op.acc
    if abs(_step(acc, level)) < acc.hi - acc.lo:
        return None  # the iterations' accumulators overlap: each needs the one before
    m_acc, lo, hi = spans[("acc", True)]
    for key in (("a", False), ("b", False)):
        m, a_lo, a_hi = spans[key]
        if m == m_acc and a_lo < hi and lo < a_hi:
            return None  # an iteration would read what another writes
    per = sum(len(s.bases) for s in segs0)
    body = segs0[-1].op
    largest = max(body.a.hi - body.a.lo, body.b.hi - body.b.lo)  # bytes >= elements
    if count * per * largest > MAX_BATCH_ELEMENTS:
        return None
    iterations = count + count * (shape.iterations if shape is not None else 0)
    box = _box(runs, form, shape, segs0, ends[1][0], first, last)
    if box is False:
        return None
    deltas = [tuple(_step(d, level) for d in (s.op.acc, s.op.a, s.op.b)) for s in segs0]
    ordered = [
        Segment(
            s.pc,
            s.op,
            s.bases + [c * x for x in dl],
            tuple(v + c * x for v, x in zip(s.low, dl, strict=True)),
            tuple(v + c * x for v, x in zip(s.high, dl, strict=True)),
        )
        for c in range(count)
        for s, dl in zip(segs0, deltas, strict=True)
    ]
    return LoopPlan(segs0, spans, count * per, iterations, box, deltas, ordered)


def _union(x: dict, y: dict) -> dict:
    return {k: (m, min(lo, y[k][1]), max(hi, y[k][2])) for k, (m, lo, hi) in x.items()}


def _box(runs, form, shape, segs0, segs1, first, last):
    """The nest's box (`runs.MatmulRuns._box`) at the first iteration, None without a nest,
    False when it is not the same at the last (it then differs somewhere)."""
    if form.nest is None:
        return None
    n = len(form.singles)
    b0 = runs._box(form.nest, shape, segs0[:n], first)
    b1 = runs._box(form.nest, shape, segs1[:n], last)
    if b0 is None or b1 is None or b0[0] != b1[0]:
        return False
    return b0


def _compute(runs: MatmulRuns, form: LoopForm, segs0, deltas, box) -> None:
    """Every iteration's reduction as one stacked product: the first iteration's pieces
    with a leading axis over the loop (`batch.batched`)."""
    mem, count, n = runs.sim.machine.mem, form.count, len(form.singles)
    pieces = [
        batched_piece(s.op, mem, s.bases[0].tolist(), count, dl[1], dl[2])
        for s, dl in zip(segs0[:n], deltas, strict=False)
    ]
    if form.nest is not None:
        drop_first, bases, dims, levels = box
        if drop_first:
            pieces = pieces[1:]
        seg, dl = segs0[-1], deltas[-1]
        pieces.append(box_piece(seg.op, mem, bases, dims, levels, (count, dl[1], dl[2])))
    first = segs0[0].op
    acc = batched(first.acc, mem[first.acc.mem], int(segs0[0].bases[0, 0]), count, deltas[0][0])
    reduce_into(acc, pieces, first.accumulate, batch=count)
