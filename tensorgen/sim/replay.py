"""Bulk replay of a LOOP's iterations once its timing reaches a steady state.

A pipelined loop (double-buffered LOADs, MATMULs and STOREs ordered by SYNC tokens) is stepped
iteration by iteration until the simulator's whole timing state after an iteration is the
state after the one before, shifted by a constant number of cycles: queue times, tokens in
flight, DRAM channel bookings, accesses in flight, the MAC array's streaming. The timing is a
function of that state and of the instructions only, and it does not change when every time
shifts, so each later iteration with the same instructions (IF outcomes) does exactly what the
last stepped one did, shifted: its counters, trace events and hazard checks are that
iteration's, and the state after k of them is the state shifted k times. Their values are
computed at once (`tensorgen.sim.stacked`).

Only loops whose on-chip operands do not move with the loop's counter are replayed (DRAM
accesses are checked as whole tensors, so their boxes may move), whose inner control flow does
not read the counter (top-level IFs may: their outcomes are evaluated per iteration), and
only while the step and iteration limits are not reached: stepping then reports them.
"""

from __future__ import annotations

from dataclasses import dataclass

from tensorgen.mc.operands import View
from tensorgen.sim import stacked
from tensorgen.sim.runs import Access, RunParts

# replay is tried for loops of at least this many iterations
MIN_COUNT = 3


@dataclass(frozen=True)
class Form:
    """A LOOP that may be replayed: the IFs of its body whose outcome reads its counter."""

    ifs: tuple[int, ...]


def form(sim, pc: int, depth: int) -> Form | None:
    code = sim.binary.code
    ins = code[pc]
    if ins.wait or ins.signal or ins.arg("count") < MIN_COUNT:
        return None
    after = pc + 1 + ins.arg("body")
    ifs, q, inner_end = [], pc + 1, pc + 1  # inner_end: the end of the inner loop q is in
    while q < after:
        i = code[q]
        top = q >= inner_end
        for name, value in i.args:
            if isinstance(value, View) and _moves(value.base, depth):
                return None
            if name in ("cond", "lower", "upper") and any(_moves(a, depth) for a, _ in value.terms):
                if not (top and i.mnemonic == "IF"):
                    return None
                ifs.append(q)
        if top and i.mnemonic in ("LOOP", "LOOPB"):
            inner_end = q + 1 + i.arg("body")
        q += 1
    return Form(tuple(ifs))


def _moves(aff, level: int) -> bool:
    return level < len(aff.coefs) and aff.coefs[level] != 0


def signatures(sim, f: Form, counters: tuple[int, ...], count: int) -> list[tuple]:
    code = sim.binary.code
    return [
        tuple(all(v >= 0 for v in code[q].arg("cond").values(counters + (c,))) for q in f.ifs)
        for c in range(count)
    ]


def _horizon(sim) -> int:
    """No instruction from now on starts, reads or ends before it."""
    t = min(sim.queue_time.values())
    return min(t, sim.streaming[0]) if sim.streaming is not None else t


def state_key(sim):
    """The timing state, times relative to `_horizon`: (key, horizon)."""
    t = _horizon(sim)
    qs = tuple(v - t for v in sim.queue_time.values())
    tokens = tuple(tuple(x - t for x in fifo) for fifo in sim.tokens.values())
    channel = tuple((a - t, b - t) for a, b in sim.channel.busy if b > t)
    inflight = tuple(
        tuple(_access_key(a, t) for a in acc if a.end > t) for acc in sim.inflight.values()
    )
    streaming = None if sim.streaming is None else (sim.streaming[0] - t, sim.streaming[1])
    return (qs, tokens, channel, inflight, streaming), t


def _access_key(a: Access, t: int):
    if a.parts is None:
        return (a.mem, a.lo, a.hi, a.end - t, a.write, a.pc)
    parts = a.parts
    return (
        a.end - t,
        a.pc,
        tuple(sorted(a.spans.items())),
        tuple(e - t for e in parts.ends),
        tuple((s.pc, s.bases.tobytes()) for s in parts.segments),
    )


def shift(sim, s: int) -> None:
    """Every time of the timing state `s` cycles later (dropping what is no longer live)."""
    t = _horizon(sim)
    for q in sim.queue_time:
        sim.queue_time[q] += s
    for fifo in sim.tokens.values():
        for i in range(len(fifo)):
            fifo[i] += s
    sim.channel.busy[:] = [(a + s, b + s) for a, b in sim.channel.busy if b > t]
    for q, acc in sim.inflight.items():
        sim.inflight[q] = [_shifted(a, s) for a in acc if a.end > t]
    if sim.streaming is not None:
        sim.streaming = (sim.streaming[0] + s, sim.streaming[1])


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
    sigs = signatures(sim, f, counters, count)
    c, previous, failed = 0, None, set()
    while c < count:
        before = _counters(sim)
        marks = _record_marks(sim)
        sim._block(pc + 1, pc + 1 + body, counters + (c,))
        key, t = state_key(sim)
        c += 1
        if previous is not None and key == previous[0] and sigs[c - 1] not in failed:
            e = c
            while e < count and sigs[e] == sigs[c - 1]:
                e += 1
            if e > c and _replay(sim, pc, counters, c, e, before, marks, t - previous[1]):
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


def _replay(sim, pc, counters, c0, c1, before, marks, d) -> bool:
    """Iterations [c0, c1) as copies of the one just stepped (`before` its counters), `d`
    cycles apart; False, with nothing changed, when they must be stepped."""
    inc = [b - a for a, b in zip(before, _counters(sim), strict=True)]
    k = c1 - c0
    lim = sim.limits
    if d < 0 or sim.stats.instructions + inc[0] * k > lim.max_steps:
        return False
    if sim.iterations + inc[-1] * k > lim.max_iterations:
        return False
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
    shift(sim, k * d)
    return True
