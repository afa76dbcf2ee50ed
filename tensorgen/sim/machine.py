"""The vectorised numpy simulator: runs a .tgb, returns outputs and counters.

Values are computed in program order with numpy, one numpy operation per
instruction (a whole tile), or per run of MATMULs into one accumulator and per
reduction nest (`tensorgen.sim.runs`), per VMUL/VMAC and the nest of VMACs after it (a
depthwise tap loop, `tensorgen.sim.vector`), and a steady pipelined loop's remaining
iterations at once (`tensorgen.sim.replay`; all its iterations' values at once, after timing
them, when its body allows it); a LOAD or STORE as a copy decoded once (`state.Transfer`); a
SYNC is stepped without the memory-access bookkeeping. `vectorize_loops=False` steps every
instruction instead, with the same values, counters, trace events and errors;
BLAS runs on one thread meanwhile. `values=False` computes no value at all (the fast paths
record what they touch without computing, as a replayed loop's timed iterations do) for the
same counters, marks, trace and errors: nothing in the timing reads a value. Timing follows per-queue timelines (LD, EX, ST)
that honour dependency tokens, with DRAM bandwidth shared by all DMAs in
flight. Every access is bounds-checked, and an access that overlaps an
in-flight access of another queue without a token between them is reported
as a hazard, not computed silently.
"""

from __future__ import annotations

import bisect
import functools
import math
from collections import deque

import numpy as np

from tensorgen.errors import SimulatorError
from tensorgen.inputs import one_line
from tensorgen.mc import isa
from tensorgen.mc.binary import Binary
from tensorgen.mc.operands import View
from tensorgen.mc.verify import SimLimits, binary_target, step_limit_message
from tensorgen.sim import products, replay
from tensorgen.sim.blas import one_blas_thread
from tensorgen.sim.results import Mark, NoOutputs, Recorder, SimResult, Stats
from tensorgen.sim.runs import Access, MatmulRuns, hazard
from tensorgen.sim.state import Machine, access_pattern
from tensorgen.sim.static import static
from tensorgen.sim.vector import VectorRuns
from tensorgen.target import Target
from tensorgen.target.energy import energy_breakdown

__all__ = ["SimLimits", "SimResult", "Simulator", "Stats", "simulate"]

# A reduction nest is run as one numpy call only while its arrays stay this small; a larger one
# runs iteration by iteration (same values), so its memory is bounded by one iteration's.
MAX_NEST_ELEMENTS = 1 << 22
# the instructions a run executed at once may begin with
_RUN_HEADS = frozenset(("MATMUL", "LOOP", "LOOPB", "VMUL", "VMAC"))
# per queue, the other queues, each with the two queues other than it (`_check_hazards`:
# three queues, so a horizon is the lesser of two times, without a list per check)
assert len(isa.QUEUES) == 3
_PEERS = {
    q: tuple((o, *(k for k in isa.QUEUES if k != o)) for o in isa.QUEUES if o != q)
    for q in isa.QUEUES
}


class Simulator:
    def __init__(
        self,
        binary: Binary,
        target: Target | None = None,
        vectorize_loops: bool = True,
        limits: SimLimits | None = None,
        record: bool = False,
        values: bool = True,
    ) -> None:
        target = target or binary_target(binary)
        self.limits = limits or SimLimits()
        self.max_steps = self.limits.max_steps  # read by every step
        known = static(binary, target, self.limits)  # verified, before anything is allocated
        self.static = known
        self.iterations = 0  # of hardware loops run one by one, bounded by limits.max_iterations
        self.binary, self.target = binary, target
        # a values-free run (`values` False) touches few pages of fresh (lazily zeroed) memories:
        # it leaves the spare ones to a run that computes
        spare = None
        if values:
            spare, known.spare = known.spare, None  # taken: a second live Simulator maps its own
        self.values = values
        self.machine = Machine(binary, target, spare, values)
        self.machine.decoded = known.decoded
        self.stats = Stats()
        self.queue_time = {q: 0 for q in isa.QUEUES}
        self.channel = isa.Channel()  # the DRAM channel's bookings
        self.tokens = {(a, b): deque() for a in isa.QUEUES for b in isa.QUEUES if a != b}
        self.inflight: dict[str, list[Access]] = {q: [] for q in isa.QUEUES}
        # per static instruction, once: its fields by name, its cost, and (for a LOOP) whether it
        # heads a reduction nest the simulator runs as one numpy call
        self.fields, self.queues, self.costs = known.fields, known.queues, known.costs
        self.executes = known.executes  # `ins.defn.execute`, without a property a step
        self.nests: dict[tuple[int, int], list[tuple[int, int]] | None] = known.nests
        self.vectorize_loops = vectorize_loops
        # per pc: a SYNC, stepped without the memory-access bookkeeping (`_sync`), unless every
        # instruction is stepped (the reference)
        self.syncs = known.syncs if vectorize_loops else [False] * len(binary.code)
        # (cycle its streaming began, rows) of the last instruction on EX if it was a MATMUL: with
        # two weight buffers the next MATMUL's weights load while it streams (isa.matmul_fill)
        self.streaming: tuple[int, int] | None = None
        self.recorder = Recorder() if record else None  # None: no recording cost at all
        self.runs = MatmulRuns(self)  # runs of MATMULs executed at once (vectorize_loops)
        self.vector_runs = VectorRuns(self)  # and of VMUL/VMAC (a depthwise tap loop)
        self.replays: dict[tuple[int, int], replay.Form | None] = known.replays  # (replay)

    def run(self, inputs: dict[str, np.ndarray], marks: tuple[int, ...] = ()) -> SimResult:
        self.machine.set_inputs(inputs)
        self.mark_pcs, self.marks = set(marks), []
        # float overflow in a crafted scale: wrong, not a warning; entered once, not per
        # instruction (it cost ~20 us an instruction)
        with np.errstate(all="ignore"):
            self._block(0, len(self.binary.code), ())
        self._mark(len(self.binary.code))
        self.stats.cycles = max(self.queue_time.values())
        for (a, b), q in self.tokens.items():
            if q:
                raise SimulatorError(
                    f"{len(q)} token(s) from {a} to {b} were signalled but never awaited"
                )
        s = self.stats
        # a function of the target and the counters, which are the same on every run of a
        # binary (its timing reads no value): computed once per target and counters
        key = (id(self.target), s.cycles, s.macs, s.vector_ops, s.dram_bytes)
        key += (tuple(s.onchip_bytes.items()), tuple(s.onchip_write_bytes.items()))
        known = self.static.energy
        if known is None or known[0] != key or known[1] is not self.target:
            known = self.static.energy = (key, self.target, energy_breakdown(self.target, s))
        s.energy_breakdown = dict(known[2])
        s.energy_pj = sum(s.energy_breakdown.values())
        if not self.values:
            return SimResult(NoOutputs(), s, self.marks, self.recorder)
        outputs = {}
        for t in self.binary.tensors:
            if t.role in ("output", "inout"):
                outputs[t.name] = np.ndarray(
                    t.shape,
                    np.dtype(t.dtype),
                    buffer=self.machine.mem["dram"],
                    offset=t.dram_offset,
                ).copy()
        return SimResult(outputs, s, self.marks, self.recorder)

    def _mark(self, pc: int) -> None:
        if pc in self.mark_pcs:
            self.marks.append(
                Mark(
                    pc,
                    max(self.queue_time.values()),
                    self.stats.macs,
                    self.stats.dram_bytes,
                    self.stats.as_dict(),
                )
            )

    def _block(self, start: int, end: int, counters: tuple[int, ...]) -> None:
        code = self.binary.code
        syncs = self.syncs
        pc = start
        while pc < end:
            if not counters and pc in self.mark_pcs:
                self._mark(pc)
            ins = code[pc]
            if self.vectorize_loops and ins.mnemonic in _RUN_HEADS:
                after = self._run_at_once(pc, end, counters)
                if after is not None:
                    pc = after
                    continue
            if ins.mnemonic == "LOOP":
                body = ins.arg("body")
                if pc + 1 + body > end or len(counters) >= 8:
                    raise SimulatorError(
                        f"instruction {pc}: LOOP body leaves its block or nests deeper than 8"
                    )
                nest = None
                if self.vectorize_loops:
                    if self.runs.loop(pc, counters):
                        pc += 1 + body
                        continue
                    key = (pc, len(counters))
                    if key not in self.nests:
                        self.nests[key] = self._reduction_nest(pc, len(counters))
                    nest = self.nests[key]
                if nest is not None:
                    self._step(
                        pc + body, self.binary.code[pc + body], counters + (0,) * len(nest), nest
                    )
                    pc += 1 + body
                    continue
                self._loop(pc, ins.arg("count"), body, counters)
                pc += 1 + body
            elif ins.mnemonic in ("LOOPB", "IF"):
                body = ins.arg("body")
                if pc + 1 + body > end or len(counters) >= 8:
                    raise SimulatorError(
                        f"instruction {pc}: {ins.mnemonic} body leaves its block or nests deeper than 8"
                    )
                if ins.mnemonic == "IF":
                    if all(v >= 0 for v in ins.arg("cond").values(counters)):
                        self._block(pc + 1, pc + 1 + body, counters)
                else:
                    lo, hi = (
                        max(ins.arg("lower").values(counters)),
                        min(ins.arg("upper").values(counters)),
                    )
                    self._iterate(hi - lo + 1)
                    for c in range(lo, hi + 1):
                        self._block(pc + 1, pc + 1 + body, counters + (c,))
                pc += 1 + body
            elif syncs[pc]:
                self._sync(pc, ins, counters)
                pc += 1
            else:
                self._step(pc, ins, counters)
                pc += 1

    def _run_at_once(self, pc: int, end: int, counters: tuple[int, ...]) -> int | None:
        """A run of MATMULs (`_matmul_run`) or of VMUL/VMACs (`vector.VectorRuns`) at `pc`
        executed at once: the pc after it, or None when it is to be stepped."""
        if self.binary.code[pc].mnemonic in ("MATMUL", "LOOP", "LOOPB"):
            after = self._matmul_run(pc, end, counters)
            if after is not None:
                return after
        return self.vector_runs.run(pc, end, counters)

    def _matmul_run(self, pc: int, end: int, counters: tuple[int, ...]) -> int | None:
        """Run the MATMULs starting at `pc` at once (`runs.MatmulRuns`): token-free MATMULs
        in a row into one accumulator, all but the first accumulating, and the nest after
        them that accumulates into it too, or such a nest alone; the pc after them, or None
        when they are to be stepped."""
        code, depth = self.binary.code, len(counters)
        singles: list[int] = []
        while pc < end and code[pc].mnemonic == "MATMUL":
            op = self.runs.op(pc)
            if code[pc].wait or code[pc].signal or op is None or (singles and not op.accumulate):
                break
            if singles and self.runs.op(singles[0]).acc != op.acc:
                break
            singles.append(pc)
            pc += 1
        nest = self.runs.nest(pc, depth) if pc < end and depth < 8 else None
        if nest is not None and nest.body >= end:
            nest = None
        if (nest is None and len(singles) < 2) or (not singles and code[pc].mnemonic == "MATMUL"):
            return None  # one MATMUL: `_step` runs it (through `_once`)
        if self.runs.run(singles, nest, counters):
            return nest.body + 1 if nest is not None else pc
        if len(singles) > 1 and self.runs.run(singles, None, counters):
            return pc  # the nest after them is tried on its own
        return None

    def _once(self, pc: int) -> bool:
        """A LOAD or STORE decoded once (`state.Transfer`), or a MATMUL, VMUL or VMAC through
        its fast kernel (`runs.MatmulRuns`); False if not."""
        if not self.vectorize_loops:
            return False
        transfer = self.static.transfers[pc]
        if transfer is not None:
            return self.machine.transfer(transfer)
        return self.runs.once(pc, self.machine) or self.runs.vector_once(pc, self.machine)

    def _loop(self, pc: int, count: int, body: int, counters: tuple[int, ...]) -> None:
        """The iterations of the LOOP at `pc`, one by one, or replayed once steady (`replay`)."""
        self._iterate(count)
        form = None
        if self.vectorize_loops:
            key = (pc, len(counters))
            if key not in self.replays:
                self.replays[key] = replay.form(self, pc, len(counters))
            form = self.replays[key]
        if form is not None:
            replay.run_loop(self, pc, counters, form)
            return
        for c in range(count):
            self._block(pc + 1, pc + 1 + body, counters + (c,))

    def _iterate(self, n: int) -> None:
        # Loops whose bodies execute nothing (an IF that is never taken) cost time too: their
        # iterations are bounded by the same budget as the instructions.
        self.iterations += max(n, 0)
        if self.iterations > self.limits.max_iterations:
            raise SimulatorError(
                f"the program's loops run more than {self.limits.max_iterations:,} iterations, "
                "the simulator's limit (SimLimits.max_iterations)"
            )

    def _reduction_nest(self, pc: int, depth: int) -> list[tuple[int, int]] | None:
        """(level, count) of a perfect loop nest at `pc` around one token-free instruction that
        reduces into a destination the loops do not move, or None."""
        code, nest = self.binary.code, []
        while pc < len(code) and code[pc].mnemonic == "LOOP":
            nest.append((depth + len(nest), code[pc].arg("count")))
            pc += 1
        # a perfect nest: the i-th LOOP's body is exactly the inner LOOPs and the instruction
        if pc >= len(code) or any(
            code[pc - len(nest) + i].arg("body") != len(nest) - i for i in range(len(nest))
        ):
            return None
        ins = code[pc]
        defn = ins.defn
        if (
            ins.mnemonic == "MATMUL"  # its runs are `runs.MatmulRuns`'; declined ones are stepped
            or self.vector_runs.op(pc) is not None  # and `vector.VectorRuns`' (errors: stepping's)
            or defn.execute_reduction_loop is None
            or ins.wait
            or ins.signal
            or not self.fields[pc].get("accumulate", 1)
        ):
            return None
        dest = ins.arg(defn.fields[0][0])
        if any(lvl < len(dest.base.coefs) and dest.base.coefs[lvl] for lvl, _ in nest):
            return None
        largest = max(v.size for v in self.fields[pc].values() if isinstance(v, View))
        if math.prod(n for _, n in nest) * largest > MAX_NEST_ELEMENTS:
            return None  # too big for one numpy call: run it iteration by iteration
        return nest

    def _step(
        self,
        pc: int,
        ins: isa.Instruction,
        counters: tuple[int, ...],
        nest: list[tuple[int, int]] | None = None,
    ) -> None:
        # a SYNC is `_sync`'s (`_block` sends it there), unless every instruction is stepped
        m, st = self.machine, self.stats
        m.pc, m.counters, m.loop = pc, counters, nest or []
        reps = math.prod(n for _, n in nest) if nest else 1
        if st.instructions + reps > self.max_steps:  # LOOPB and IF nests: bounded up front only
            raise SimulatorError(step_limit_message(None, self.limits))
        q = self.queues[pc]
        tokens = self._await(pc, ins, q, counters) if ins.wait else 0
        before = self.queue_time[q]
        start = before if before >= tokens else tokens
        cost = self.costs[pc]
        m.touched = []
        if nest:
            cost = self._reduction(pc, ins, cost, reps)
        else:
            execute = self.executes[pc]
            if execute is not None and not self._once(pc):
                self._execute(pc, ins, execute)
        reads_from = start
        if cost.dram_bytes:
            end = self._transfer(
                start + cost.cycles, isa.dma_channel_cycles(self.target, cost.dram_bytes)
            )
            if ins.mnemonic == "LOAD":
                st.dram_read_bytes += cost.dram_bytes
            else:
                st.dram_write_bytes += cost.dram_bytes
        elif q == "EX":
            end, reads_from = self._execute_timing(cost, reps, start, tokens)
        else:
            end = start + cost.cycles
        if m.touched:  # a SYNC touches nothing: no hazard to look for
            self._check_hazards(pc, ins, q, reads_from, end)
        st.stalled[q] += start - before
        if self.recorder is not None:
            # a nest run at once (token-free, no fill) records each of its instructions
            one = self.costs[pc].cycles if reps > 1 else end - start
            self.recorder.events += [
                (q, before if i == 0 else start + i * one, start + i * one)
                + (start + (i + 1) * one, pc, ins.mnemonic)
                for i in range(reps)
            ]
        st.busy[q] += end - start
        self.queue_time[q] = end
        for dst in ins.signal:
            self.tokens[(q, dst)].append(end)
        st.instructions += reps
        self._count(cost)

    def _sync(self, pc: int, ins: isa.Instruction, counters: tuple[int, ...]) -> None:
        """`_step` of an instruction that computes and touches nothing (a SYNC): its tokens,
        time and counters only, without the bookkeeping of memory accesses."""
        st = self.stats
        if st.instructions + 1 > self.max_steps:
            raise SimulatorError(step_limit_message(None, self.limits))
        q = self.queues[pc]
        tokens = self._await(pc, ins, q, counters) if ins.wait else 0
        before = self.queue_time[q]
        start = before if before >= tokens else tokens
        cost = self.costs[pc]
        ex = q == "EX"  # EX: the MAC array's streaming state too (`_execute_timing`)
        end = self._execute_timing(cost, 1, start, tokens)[0] if ex else start + cost.cycles
        st.stalled[q] += start - before
        if self.recorder is not None:
            self.recorder.events.append((q, before, start, end, pc, ins.mnemonic))
        st.busy[q] += end - start
        self.queue_time[q] = end
        for dst in ins.signal:
            self.tokens[(q, dst)].append(end)
        st.instructions += 1
        if cost.macs or cost.vector_ops or cost.bytes or cost.written:  # a SYNC's are none
            self._count(cost)

    def _await(self, pc: int, ins: isa.Instruction, q: str, counters: tuple[int, ...]) -> int:
        """Take the tokens instruction `pc` waits for; when the last of them arrives."""
        tokens = 0
        for src in ins.wait:
            fifo = self.tokens.get((src, q))
            if not fifo:
                raise SimulatorError(
                    f"instruction {pc} ({ins.mnemonic}) on {q} waits for a token from {src} "
                    f"that was never signalled (at loop counters {list(counters)})"
                )
            tokens = max(tokens, fifo.popleft())
        return tokens

    def _reduction(self, pc: int, ins: isa.Instruction, cost: isa.Cost, reps: int) -> isa.Cost:
        """Run the reduction nest around `pc` as one call; its cost, `reps` times the one's."""
        m = self.machine
        dest = ins.arg(ins.defn.fields[0][0])
        self._execute(pc, ins, ins.defn.execute_reduction_loop)
        dmem, dlo, dhi, _ = m.touched[-1]
        for mem, lo, hi, _write in m.touched[:-1]:
            if (
                mem == dmem
                and lo < dhi
                and dlo < hi
                and not (lo == dlo and hi == dhi and mem == dest.mem)
            ):
                raise SimulatorError(
                    f"instruction {pc}: a reduction loop reads memory its destination overlaps"
                )
        return isa.Cost(
            cost.cycles * reps,
            cost.dram_bytes * reps,
            cost.macs * reps,
            cost.vector_ops * reps,
            tuple((mem, n * reps) for mem, n in cost.bytes),
            tuple((mem, n * reps) for mem, n in cost.written),
            cost.fill,
        )

    def _count(self, cost: isa.Cost) -> None:
        st = self.stats
        st.macs += cost.macs
        st.vector_ops += cost.vector_ops
        for mem, n in cost.bytes:
            st.onchip_bytes[mem] += n
        for mem, n in cost.written:
            st.onchip_write_bytes[mem] += n

    def _execute_timing(
        self, cost: isa.Cost, reps: int, start: int, tokens: int
    ) -> tuple[int, int]:
        """(end, first cycle it reads memory) of an instruction on EX starting at `start`, the
        last token it waits for arriving at `tokens`: `cost.cycles`, except that a MATMUL's fill
        overlaps the streaming of a MATMUL right before it (SYNCs between them aside) as
        isa.matmul_fill defines, its weights loading no earlier than its tokens and those of the
        SYNCs (a nest of `reps` runs them back to back)."""
        if not cost.fill:
            if cost.cycles or self.streaming is None:
                self.streaming = None
            else:  # a SYNC between two MATMULs: the next one's weights wait for its tokens too
                self.streaming = (max(self.streaming[0], tokens), self.streaming[1])
            return start + cost.cycles, start
        rows = cost.cycles // reps - cost.fill
        previous = self.streaming if self.target.weight_buffers > 1 else None
        begin, stream = isa.matmul_stream_start(
            self.target, start, tokens, previous and previous[0]
        )
        end = stream + rows + (reps - 1) * isa.matmul_cycles(self.target, rows, rows)
        self.streaming = (end - rows, rows)
        return end, min(begin, start)

    def _execute(self, pc: int, ins: isa.Instruction, semantics) -> None:
        # The verifier checks what can be known statically; operands whose shapes do not fit
        # the instruction's semantics (a crafted binary) end here, named, not in a traceback.
        if not self.machine.values:  # stepped for its timing: only what it touches
            patterns = replay.access_patterns(self)
            if not self.values and pc not in patterns:
                patterns[pc] = access_pattern(ins)
            pattern = patterns.get(pc)
            if pattern is not None and semantics is ins.defn.execute:
                semantics = functools.partial(_touch, pattern=pattern)
            elif self.values:  # `replay.whole_plan` admits only instructions with a pattern
                raise SimulatorError(
                    f"instruction {pc} ({ins.mnemonic}): internal error: its semantics were "
                    "to run in a loop stepped for its timing only"
                )
            # else a values-free run: the semantics run on whatever the memories hold, for
            # what they touch and the errors they raise (neither depends on the values)
        try:
            semantics(self.machine, self.fields[pc])  # under `run`'s np.errstate
        except (ValueError, IndexError, TypeError, KeyError) as err:
            raise SimulatorError(
                f"instruction {pc} ({ins.mnemonic}): operands do not fit its semantics "
                f"({one_line(err, 120)}) at loop counters {list(self.machine.counters)}"
            ) from None

    def _transfer(self, ready: int, cycles: int) -> int:
        """Give a DMA the DRAM channel at the first time >= `ready` when it is free for `cycles`
        (first come, first served in time, not in program order); returns the transfer's end."""
        # no DMA can start before both DMA queues' current times
        self.channel.forget(min(self.queue_time["LD"], self.queue_time["ST"]))
        end = self.channel.book(ready, cycles)
        if self.recorder is not None:
            self.recorder.channel.append((end - cycles, end))
        return end

    def _check_hazards(self, pc: int, ins: isa.Instruction, q: str, start: int, end: int) -> None:
        # Each queue's accesses end in nondecreasing time, so scanning another queue's list from
        # its newest entry stops at the first access that ended before this one starts.
        store = ins.mnemonic == "STORE"
        touched = self.machine.touched
        qt, inflight = self.queue_time, self.inflight
        for other, p1, p2 in _PEERS[q]:
            accesses = inflight[other]
            if not accesses:
                continue
            # its horizon: the earliest time of the other queues (no other queue can start
            # earlier again), which every access that ended by then is forgotten at
            h1, h2 = qt[p1], qt[p2]
            horizon = h1 if h1 < h2 else h2
            if accesses[0].end <= horizon:
                del accesses[: bisect.bisect_right(accesses, horizon, key=_end)]
            if not accesses or accesses[-1].end <= start:
                continue  # all ended before this one starts: `hazard` would find none
            for mem, lo, hi, write in touched:
                a = hazard(accesses, mem, lo, hi, store if write is None else write, start)
                if a is not None:
                    raise SimulatorError(
                        f"hazard: instruction {pc} ({ins.mnemonic} on {q}) touches {mem}[{lo}, {hi}) at cycle "
                        f"{start} while instruction {a.pc} on {a.queue} still {'writes' if a.write else 'reads'} "
                        f"it (until cycle {a.end}) and no token orders them"
                    )
        mine = inflight[q]
        for mem, lo, hi, w in touched:
            mine.append(Access(mem, lo, hi, end, q, store if w is None else w, pc))


def _touch(machine: Machine, fields, pattern) -> None:
    machine.touch(pattern)


def _end(a: Access) -> int:
    return a.end


def simulate(
    binary: Binary,
    inputs: dict[str, np.ndarray],
    target: Target | None = None,
    vectorize_loops: bool = True,
    marks: tuple[int, ...] = (),
    limits: SimLimits | None = None,
    record: bool = False,
    values: bool = True,
) -> SimResult:
    """Run `binary`; `vectorize_loops=False` executes every loop iteration on its own (for testing
    that the vectorised path computes the same values and counters). `marks`: top-level
    instruction indices (or the code length, for the end) at which to record the counters, e.g.
    the boundaries of a model's layers. The binary is verified against the target first
    (`tensorgen.mc.verify.verify_binary`), within `limits`. `record`: keep a `Recorder` (traces,
    timelines).

    `values=False`: a values-free run, for callers that want only counters: it computes no
    value (no product, vector operation, requantization or copy of data, where the simulator
    knows what an instruction touches without computing it) and returns the same stats,
    marks, trace and errors as the run that computes them -- the timing never reads a value,
    and bounds and hazards follow the addresses only. Its `outputs` are a `NoOutputs`, which
    raises when read. `inputs` are checked as ever; a dict of zeros will do."""
    with one_blas_thread(), products.one_thread():  # restored on return
        sim = Simulator(binary, target, vectorize_loops, limits, record, values)
        result = sim.run(inputs, marks)
    if values:
        # nothing refers to its memories any more (the outputs are copies): the next run of
        # this binary zeroes them instead of mapping fresh pages
        sim.static.spare = sim.machine.mem
    return result
