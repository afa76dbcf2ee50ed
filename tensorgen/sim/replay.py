"""Bulk replay of a LOOP's iterations once its timing reaches a steady state.

A pipelined loop (double-buffered LOADs, MATMULs and STOREs ordered by SYNC tokens) is stepped
iteration by iteration until the simulator's whole timing state after an iteration is the
state after the one before, shifted by a constant number of cycles: queue times, tokens in
flight, DRAM channel bookings, accesses in flight, the MAC array's streaming. The timing is a
function of that state and of the instructions only, and it does not change when every time
shifts, so each later iteration with the same instructions (IF outcomes) does exactly what the
last stepped one did, shifted: its counters, trace events and hazard checks are that
iteration's, and the state after k of them is the state shifted k times. Their values are
computed at once (`tensorgen.sim.stacked`). When every instruction of the body has a fast
path that records what it touches without computing (`whole_plan`), the stepped iterations
are stepped for their timing only, and one plan computes the values of all of them, the
stepped ones too, once the loop is timed: the timing never reads a value. A values-free run
(`machine.simulate(values=False)`) steps and replays every loop so, and computes nothing.

Only loops whose on-chip operands do not move with the loop's counter are replayed (DRAM
accesses are checked as whole tensors, so their boxes may move), except MATMUL/VMUL/VMAC
sources that no LOAD during or after the loop may write (no hazard can ever involve them, so
their addresses are left out of the state), whose inner control flow does not read the counter
(top-level IFs may: their outcomes are evaluated per iteration), and only while the step and
iteration limits are not reached: stepping then reports them. A queue the loop does not use
keeps its time; its later instructions may still meet any access or DMA of the loop, so the
replayed iterations' are added, shifted copies of the stepped one's (`replicate`).
"""

from __future__ import annotations

from dataclasses import dataclass

from tensorgen.mc.operands import ITEMSIZE, View
from tensorgen.sim import stacked
from tensorgen.sim.batch import VectorOp
from tensorgen.sim.runs import MAX_PLANS, Access, RunParts
from tensorgen.sim.state import access_pattern

# replay is tried for loops of at least this many iterations
MIN_COUNT = 3


@dataclass(frozen=True)
class Form:
    """A LOOP that may be replayed: the IFs of its body whose outcome reads its counter, and
    the MATMUL/VMUL/VMAC source operands that move with it, (pc, field)."""

    ifs: tuple[int, ...]
    moving: tuple[tuple[int, str], ...] = ()
    active: frozenset[str] = frozenset()  # the queues the body runs instructions on


def form(sim, pc: int, depth: int) -> Form | None:
    code = sim.binary.code
    ins = code[pc]
    if ins.wait or ins.signal or ins.arg("count") < MIN_COUNT:
        return None
    after = pc + 1 + ins.arg("body")
    ifs, q, inner_end = [], pc + 1, pc + 1  # inner_end: the end of the inner loop q is in
    moving, active = [], set()
    while q < after:
        i = code[q]
        top = q >= inner_end
        if i.queue is not None:
            active.add(i.queue)
        for name, value in i.args:
            if isinstance(value, View) and _moves(value.base, depth):
                if i.mnemonic not in ("MATMUL", "VMUL", "VMAC") or name not in ("a", "b"):
                    return None
                moving.append((q, name))
            if name in ("cond", "lower", "upper") and any(_moves(a, depth) for a, _ in value.terms):
                if not (top and i.mnemonic == "IF"):
                    return None
                ifs.append(q)
        if top and i.mnemonic in ("LOOP", "LOOPB"):
            inner_end = q + 1 + i.arg("body")
        q += 1
    if not active:
        return None  # nothing on any queue: nothing to replay
    return Form(tuple(ifs), tuple(moving), frozenset(active))


def moving_hull(sim, pc: int, counters: tuple[int, ...], f: Form) -> dict | None:
    """The bytes the moving operands read over the whole loop, per memory, if no LOAD that
    may run during or after the loop can write them (`moving_ok` checks the LOADs in flight
    when the loop is replayed); None otherwise. (Only LOADs write on-chip memory on another
    queue than EX's, and STOREs write DRAM.)"""
    code = sim.binary.code
    enclosing = _enclosing(sim)
    hull: dict[str, tuple[int, int]] = {}
    for q, name in f.moving:
        view = code[q].arg(name)
        r = _view_range(view, _intervals(code, enclosing[q], counters))
        if r is None:
            return None
        lo, hi = hull.get(view.mem, r)
        hull[view.mem] = (min(lo, r[0]), max(hi, r[1]))
    outer = [(e[0], e[1]) for e in enclosing[pc]]
    for q, ins in enumerate(code):
        if ins.mnemonic != "LOAD" or not (q > pc or any(a < q < b for a, b in outer)):
            continue
        view = ins.arg("dst")
        if view.mem not in hull:
            continue
        r = _view_range(view, _intervals(code, enclosing[q], ()))
        lo, hi = hull[view.mem]
        if r is None or (r[0] < hi and lo < r[1]):
            return None
    return hull


def _inside(sim, hull: dict) -> bool:
    """The moving operands' bytes over the whole loop lie inside their memories."""
    mem = sim.machine.mem
    return all(lo >= 0 and hi <= mem[m].size for m, (lo, hi) in hull.items())


def moving_ok(sim, hull: dict) -> bool:
    """No LOAD in flight writes the moving operands' bytes."""
    return not any(
        a.write and a.mem in hull and a.lo < hull[a.mem][1] and hull[a.mem][0] < a.hi
        for a in sim.inflight["LD"]
    )


def _intervals(code, loops, fixed: tuple[int, ...]) -> list[tuple[int, int]]:
    """Bounds on each counter of the `loops` around an instruction (`_enclosing`), the outer
    ones `fixed`: a LOOP's from its count, a LOOPB's from its bounds' terms over the outer
    counters' bounds (each term bounds it: it is >= the greatest lower term, <= the least
    upper one)."""
    out: list[tuple[int, int]] = []
    for lv, (start, _, n) in enumerate(loops):
        if lv < len(fixed):
            out.append((fixed[lv], fixed[lv]))
        elif n is not None:
            out.append((0, n - 1))
        else:
            lows = [_term_range(a, d, out) for a, d in code[start].arg("lower").terms]
            highs = [_term_range(a, d, out) for a, d in code[start].arg("upper").terms]
            out.append((max(r[0] for r in lows), min(r[1] for r in highs)))
    return out


def _term_range(aff, d: int, levels) -> tuple[int, int]:
    lo, hi = _affine_range(aff, levels)
    return lo // d, hi // d


def _affine_range(aff, levels) -> tuple[int, int]:
    lo = hi = aff.const
    for lv, c in enumerate(aff.coefs):
        if c:
            if lv >= len(levels):
                return -(1 << 62), 1 << 62  # a counter of no loop around it: unbounded
            a, b = levels[lv]
            lo, hi = lo + min(c * a, c * b), hi + max(c * a, c * b)
    return lo, hi


def _view_range(view, levels) -> tuple[int, int] | None:
    """The bytes a view touches with each counter within its bounds `levels` (None if it
    reads a counter of no loop around it)."""
    if len(view.base.coefs) > len(levels) and any(view.base.coefs[len(levels) :]):
        return None
    isz = ITEMSIZE[view.dtype]
    lo, hi = _affine_range(view.base, levels)
    for n, st in zip(view.shape, view.strides, strict=True):
        lo, hi = lo + min(0, (n - 1) * st * isz), hi + max(0, (n - 1) * st * isz)
    return lo, hi + isz


def _enclosing(sim) -> list[tuple[tuple[int, int, int | None], ...]]:
    """Per pc, the hardware loops around it, outermost first: (its pc, the pc after its body,
    its count, or None for a LOOPB)."""
    known = sim.static.runs.setdefault("enclosing", {})
    if "map" not in known:
        code, stack, out = sim.binary.code, [], []
        for q, ins in enumerate(code):
            while stack and stack[-1][1] <= q:
                stack.pop()
            out.append(tuple((a, b, n) for a, b, n in stack if n != "if"))
            if ins.mnemonic in ("LOOP", "LOOPB", "IF"):
                n = ins.arg("count") if ins.mnemonic == "LOOP" else None
                stack.append((q, q + 1 + ins.arg("body"), "if" if ins.mnemonic == "IF" else n))
        known["map"] = out
    return known["map"]


def _moves(aff, level: int) -> bool:
    return level < len(aff.coefs) and aff.coefs[level] != 0


def signatures(sim, f: Form, counters: tuple[int, ...], count: int) -> list[tuple]:
    if not f.ifs:
        return [()] * count
    code = sim.binary.code
    return [
        tuple(all(v >= 0 for v in code[q].arg("cond").values(counters + (c,))) for q in f.ifs)
        for c in range(count)
    ]


def _horizon(sim, active) -> int:
    """No instruction of the `active` queues starts, reads or ends before it from now on."""
    t = min(v for q, v in sim.queue_time.items() if q in active)
    return min(t, sim.streaming[0]) if sim.streaming is not None else t


def state_key(sim, active, moving=frozenset()):
    """The timing state, times relative to `_horizon`: (key, horizon). The addresses of the
    accesses of instructions in `moving` are left out: no hazard can involve them
    (`moving_ok`), so they do not change what any instruction does. The queues the loop does
    not use keep their times, so they are not part of it."""
    t = _horizon(sim, active)
    qs = tuple(v - t for q, v in sim.queue_time.items() if q in active)
    tokens = tuple(tuple(x - t for x in fifo) for fifo in sim.tokens.values())
    channel = tuple((a - t, b - t) for a, b in sim.channel.busy if b > t)
    inflight = tuple(
        tuple(_access_key(a, t, moving) for a in acc if a.end > t) for acc in sim.inflight.values()
    )
    streaming = None if sim.streaming is None else (sim.streaming[0] - t, sim.streaming[1])
    return (qs, tokens, channel, inflight, streaming), t


def _access_key(a: Access, t: int, moving):
    if a.parts is None:
        if a.pc in moving:
            return (a.mem, a.end - t, a.write, a.pc)
        return (a.mem, a.lo, a.hi, a.end - t, a.write, a.pc)
    parts = a.parts
    if any(s.pc in moving for s in parts.segments):
        return (
            a.end - t,
            a.pc,
            tuple(e - t for e in parts.ends),
            tuple(s.pc for s in parts.segments),
        )
    return (
        a.end - t,
        a.pc,
        tuple(sorted(a.spans.items())),
        tuple(e - t for e in parts.ends),
        tuple((s.pc, s.bases.tobytes()) for s in parts.segments),
    )


def snapshot(sim):
    """What is in flight now, to tell what the next iteration adds (`replicate`): each
    queue's newest access (its list only grows at the end and loses its oldest ones, while a
    queue idles), and the channel's bookings."""
    return {q: acc[-1] if acc else None for q, acc in sim.inflight.items()}, set(sim.channel.busy)


def _added(accesses: list[Access], newest: Access | None) -> list[Access]:
    """The accesses appended after `newest` (all of them if it is gone)."""
    for i in range(len(accesses) - 1, -1, -1):
        if accesses[i] is newest:
            return accesses[i + 1 :]
    return list(accesses)


def replicate(sim, snap, k: int, d: int, active, later: bool = True) -> None:
    """The state after `k` more copies of the iteration just stepped (`snap` taken before
    it), `d` cycles apart, when a queue the loop does not use keeps its time: its later
    instructions may still meet every access and DMA of the loop, so those of the copies are
    added (shifted), as stepping them would have. Without `later` (no instruction of such a
    queue can run after the loop, `_idle_later`) only the copies that end after the loop's
    queues' horizon are: no later instruction can meet the others (`_horizon`)."""
    newest, busy = snap
    _advance(sim, k * d, active)
    t = -(1 << 62) if later else _horizon(sim, active)
    for q, acc in sim.inflight.items():
        new = _added(acc, newest[q])
        if not new:
            continue
        first = 1 if later or d <= 0 else max(1, (t - max(a.end for a in new)) // d)
        if any(a.parts is not None for a in new):
            acc += [_shifted(a, i * d) for i in range(first, k + 1) for a in new]
        else:  # `_shifted` inlined: this is most of a replay with a queue idle
            acc += [
                Access(a.mem, a.lo, a.hi, a.end + i * d, a.queue, a.write, a.pc, None, a.spans)
                for i in range(first, k + 1)
                for a in new
                if a.end + i * d > t
            ]
    new = [b for b in sim.channel.busy if b not in busy]
    sim.channel.busy += [
        (a + i * d, b + i * d) for i in range(1, k + 1) for a, b in new if b + i * d > t
    ]
    sim.channel.busy.sort()


def _idle_later(sim, pc: int, active) -> bool:
    """Whether an instruction on a queue the loop at `pc` does not use may run after the loop
    (anywhere after it, or in a loop around it): then its accesses in flight are kept whole."""
    known = sim.static.runs.setdefault("idle_later", {})
    key = (pc, active)
    if key not in known:
        code = sim.binary.code
        after = pc + 1 + code[pc].arg("body")
        loops = _enclosing(sim)[pc]
        first = loops[0][0] if loops else pc
        known[key] = any(
            code[q].queue is not None and code[q].queue not in active
            for q in (*range(first, pc), *range(after, len(code)))
        )
    return known[key]


def _advance(sim, s: int, active) -> None:
    for q in active:
        sim.queue_time[q] += s
    for fifo in sim.tokens.values():
        for i in range(len(fifo)):
            fifo[i] += s
    if sim.streaming is not None:
        sim.streaming = (sim.streaming[0] + s, sim.streaming[1])


def shift(sim, s: int, active) -> None:
    """Every time of the timing state `s` cycles later (dropping what is no longer live), when
    the loop uses every queue."""
    t = _horizon(sim, active)
    sim.channel.busy[:] = [(a + s, b + s) for a, b in sim.channel.busy if b > t]
    for q, acc in sim.inflight.items():
        live = [a for a in acc if a.end > t]
        for a in live:  # in place: only the in-flight lists refer to them (no `snapshot` here)
            a.end += s
            if a.parts is not None:
                a.parts.shift(s)
        sim.inflight[q] = live
    _advance(sim, s, active)


def _shifted(a: Access, s: int) -> Access:
    parts = None
    if a.parts is not None:
        parts = RunParts(a.parts.segments, [e + s for e in a.parts.ends])
    return Access(a.mem, a.lo, a.hi, a.end + s, a.queue, a.write, a.pc, parts, a.spans)


def _counters(sim) -> list[int]:
    st = sim.stats
    return [
        st.instructions,
        st.macs,
        st.vector_ops,
        st.dram_read_bytes,
        st.dram_write_bytes,
        *st.onchip_bytes.values(),
        *st.onchip_write_bytes.values(),
        *st.busy.values(),
        *st.stalled.values(),
        sim.iterations,
    ]


def _add(sim, inc: list[int], k: int) -> None:
    st = sim.stats
    st.instructions += inc[0] * k
    st.macs += inc[1] * k
    st.vector_ops += inc[2] * k
    st.dram_read_bytes += inc[3] * k
    st.dram_write_bytes += inc[4] * k
    i = 5
    for d in (st.onchip_bytes, st.onchip_write_bytes, st.busy, st.stalled):
        for key in d:
            d[key] += inc[i] * k
            i += 1
    sim.iterations += inc[i] * k


def run_loop(sim, pc: int, counters: tuple[int, ...], f: Form) -> None:
    """Every iteration of the LOOP at `pc` (its `_iterate` done by the caller): stepped, and
    replayed from the first steady one on."""
    ins = sim.binary.code[pc]
    count, body = ins.arg("count"), ins.arg("body")
    moving = frozenset(q for q, _ in f.moving)
    hull = {}
    if moving:  # a pure function of the binary (it scans the code): kept across runs
        hulls = sim.static.runs.setdefault("hulls", {})
        key = (pc, counters)
        hull = hulls.get(key, False)
        if hull is False:
            hull = moving_hull(sim, pc, counters, f)
            if len(hulls) < MAX_PLANS:
                hulls[key] = hull
        if not sim.values and hull is not None and not _inside(sim, hull):
            # a moving source may leave its memory at some iteration: with values, the plan
            # of the replayed ones declines (its bounds checks) and stepping reports it;
            # values-free, no plan is made, so stepping every iteration does
            hull = None
    sigs = signatures(sim, f, counters, count)
    whole = whole_plan(sim, pc, counters, sigs)
    if whole is not None:
        sim.machine.values = False  # the iterations' timing, then all their values at once
    try:
        if hull is None:
            for c in range(count):  # addresses that move in a way a hazard might see: stepped
                sim._block(pc + 1, pc + 1 + body, counters + (c,))
        else:
            _iterations(sim, pc, counters, f, sigs, moving, hull)
    finally:
        if whole is not None:
            sim.machine.values = True
    if whole is not None:
        whole.run(sim.machine, sim.binary)


def whole_plan(sim, pc: int, counters: tuple[int, ...], sigs: list[tuple]):
    """The values of every iteration of the LOOP at `pc` as one `stacked.Plan`, when its
    iterations may be stepped for their timing only (`state.Machine.values`): the timing
    does not read values, and each instruction of the body is one whose fast path records
    what it touches without computing (a SYNC or loop, a decoded LOAD or STORE, a MATMUL
    of the fast kernel, a VMUL/VMAC of `batch.VectorOp`, an elementwise instruction whose
    accesses `state.access_pattern` knows), with the same IF outcomes in every iteration
    (the plan resolves them once); None otherwise, and inside a loop already stepped so.
    The plan admits only equal shapes for an elementwise instruction's views, and its
    bounds checks cover every iteration, so no stepped access fails: stepping's errors are
    then those of the timing (hazards, tokens, limits), the same either way."""
    if not sim.machine.values or len(set(sigs)) > 1:
        return None
    known = sim.static.runs.setdefault("whole", {})
    key = (pc, counters)
    if key not in known:  # a pure function of the binary: kept across runs
        count = sim.binary.code[pc].arg("count")
        at = counters + (0,)
        plan = _plan(sim, pc, at, count) if _fast_body(sim, pc) else None
        if len(known) >= MAX_PLANS:
            return plan
        known[key] = plan
    return known[key]


def _fast_body(sim, pc: int) -> bool:
    code, static, runs = sim.binary.code, sim.static, sim.runs
    patterns = access_patterns(sim)
    for q in range(pc + 1, pc + 1 + code[pc].arg("body")):
        ins = code[q]
        if ins.defn.execute is None:
            continue
        if ins.mnemonic in ("LOAD", "STORE") and static.transfers[q] is not None:
            continue
        if ins.mnemonic == "MATMUL" and runs.op(q) is not None:
            continue
        if ins.mnemonic in ("VMUL", "VMAC"):
            if q not in runs.vectors:
                runs.vectors[q] = VectorOp.of(ins)
            if runs.vectors[q] is not None:
                continue  # `runs.vector_once` and `vector.VectorRuns` record what they touch
        if ins.mnemonic in stacked.ELEMENTWISE:
            if q not in patterns:
                patterns[q] = access_pattern(ins)
            if patterns[q] is not None:
                continue  # its semantics' accesses: `state.Machine.touch`
        return False
    return True


def access_patterns(sim) -> dict:
    """`state.access_pattern` per pc, kept across runs of the binary."""
    return sim.static.runs.setdefault("patterns", {})


def _iterations(sim, pc, counters, f: Form, sigs, moving, hull) -> None:
    """The loop's iterations, stepped, and replayed from the first steady one on."""
    count, body = len(sigs), sim.binary.code[pc].arg("body")
    c, previous, failed = 0, None, set()
    idle = len(f.active) < len(sim.queue_time)
    while c < count:
        before = _counters(sim)
        marks = _record_marks(sim)
        snap = snapshot(sim) if idle else None
        sim._block(pc + 1, pc + 1 + body, counters + (c,))
        key, t = state_key(sim, f.active, moving)
        c += 1
        if previous is not None and key == previous[0] and sigs[c - 1] not in failed:
            e = c
            while e < count and sigs[e] == sigs[c - 1]:
                e += 1
            d = t - previous[1]
            if e > c and moving_ok(sim, hull):  # else: a LOAD in flight, tried again later
                if _replay(sim, pc, counters, c, e, (before, marks, snap), d, f.active):
                    c, previous = e, None
                    continue
                failed.add(sigs[c - 1])
        previous = (key, t)


def _record_marks(sim):
    r = sim.recorder
    return None if r is None else (len(r.events), len(r.channel))


def _plan(sim, pc: int, at: tuple[int, ...], k: int):
    end = pc + 1 + sim.binary.code[pc].arg("body")
    items = stacked.effects_of(sim.runs, pc + 1, end, len(at), at)
    return None if items is None else stacked.plan(sim.runs, items, at, len(at) - 1, k)


def _replay(sim, pc, counters, c0, c1, stepped, d, active) -> bool:
    """Iterations [c0, c1) as copies of the one just stepped (`before` its counters), `d`
    cycles apart; False, with nothing changed, when they must be stepped."""
    before, marks, snap = stepped
    inc = [b - a for a, b in zip(before, _counters(sim), strict=True)]
    k = c1 - c0
    lim = sim.limits
    if d < 0 or sim.stats.instructions + inc[0] * k > lim.max_steps:
        return False
    if sim.iterations + inc[-1] * k > lim.max_iterations:
        return False
    p = None
    if sim.machine.values:  # else `whole_plan`'s computes them, or the run computes none
        at = counters + (c0,)
        key = (pc, at, k)
        if key not in sim.static.plans:  # a pure function of the binary: kept across runs
            sim.static.plans[key] = _plan(sim, pc, at, k)
        p = sim.static.plans[key]
        if p is None:
            return False
        p.run(sim.machine, sim.binary)
    _add(sim, inc, k)
    if marks is not None:
        r = sim.recorder
        events, channel = r.events[marks[0] :], r.channel[marks[1] :]
        for i in range(1, k + 1):
            s = i * d
            r.events += [(q, a + s, b + s, e + s, p_, m) for q, a, b, e, p_, m in events]
            r.channel += [(a + s, b + s) for a, b in channel]
    if snap is not None:
        replicate(sim, snap, k, d, active, _idle_later(sim, pc, active))
    else:
        shift(sim, k * d, active)
    return True
