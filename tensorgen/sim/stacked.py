"""The values of many iterations of a LOOP at once: each instruction of the body run for every
iteration together, over a leading axis (`tensorgen.sim.replay` does the timing).

A body of LOADs, STOREs, SYNCs, MATMULs, VMUL/VMACs, elementwise vector instructions
(`ELEMENTWISE`, through their own semantics), LOOP/LOOPB nests around a MATMUL or a VMUL/VMAC,
short inner LOOPs (unrolled) and IFs whose outcome is fixed over the iterations is run
instruction by instruction, each for all the iterations at once. The on-chip bytes the body
writes are privatised: row i + 1 of a scratch copy is what iteration i leaves there, row 0 the
memory before the first, and the memory gets the last row at the end. A read of bytes the
same iteration wrote before reads its own row ("cur"); one the body writes only later reads
the row before ("prev": a software-pipelined buffer loaded for the next iteration); one of
bytes the body never writes reads the memory itself ("shared", moving with the loop if its
address does). The effects are then ordered so that every such dependence, and the order of
DRAM boxes that meet (`boxes.dram_order`), holds. Everything else declines (None from
`plan`, with nothing changed): a read of a mix of those, a recurrence (an instruction reading
what it wrote the iteration before), an operand overlapping its accumulator, a STORE meeting
itself in another iteration, no order satisfying all, an operand the fast kernels do not take.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from tensorgen.mc.operands import Box, View
from tensorgen.sim import blocks, products, taps
from tensorgen.sim.batch import (
    MAX_BATCH_ELEMENTS,
    Decoded,
    MatmulOp,
    Nest,
    VectorOp,
)
from tensorgen.sim.blocks import merge_blocks, span
from tensorgen.sim.boxes import dram_order, meetings
from tensorgen.sim.stacked_run import run_chunk


@dataclass(frozen=True)
class Ref:
    """An on-chip operand of every iteration: `shape`/`strides` (bytes) at byte `offset` of
    `mem`, in the scratch rows ("cur": the iteration's own row, "prev": the row of the one
    before) or in the memory itself ("shared": bytes the body does not write)."""

    mem: str
    offset: int
    dtype: np.dtype
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    mode: str = "cur"
    step: int = 0  # bytes it moves by from one iteration to the next (a shared source only)


@dataclass(frozen=True)
class Effect:
    kind: str  # "load", "store", "mm", "VMUL" or "VMAC"
    pc: int
    refs: tuple  # load: (dst,); store: (src,); mm: (acc, (a, b, a_zp, b_zp, term)...)
    box: tuple | None = None  # load/store: (tensor, origin at the first iteration, steps, shape)
    accumulate: int = 0
    imm: int = 0  # a VMUL's immediate


class Plan:
    """The effects of the body for `count` iterations, checked and ordered; `run` computes
    them. Row 0 of each memory's scratch holds the memory before the first iteration, row
    i + 1 what iteration i leaves there."""

    def __init__(self, effects, hulls, written, count, chunk) -> None:
        self.effects, self.hulls, self.written, self.count = effects, hulls, written, count
        self.chunk = chunk  # iterations computed together (bounded memory)
        self.taps = taps.runs_of(effects)  # first effect -> (last + 1, taps) of a tap run
        self.scratch = products.Scratch()  # the tap runs' buffers, kept from run to run

    def run(self, machine, binary) -> None:
        for c in range(0, self.count, self.chunk):
            run_chunk(self, machine, binary, min(self.chunk, self.count - c), c)


MAX_UNROLL = 32  # inner LOOPs of at most this many iterations are unrolled into effects
# vector instructions whose semantics (`tensorgen.mc.isa`) are elementwise in their views and
# scalar fields: run as they are on every iteration's views at once (`_Stacked`); VSHRR only
# with an immediate shift (`arith.rounding_shift_right` takes one shift)
ELEMENTWISE = frozenset(
    [
        "VADD",
        "VSUB",
        "VMAX",
        "VMIN",
        "VSHL",
        "VSHR",
        "VSHRR",
        "VFILL",
        "VCLAMP",
        "VREQUANT",
        "VQUANT",
        "VDEQUANT",
    ]
)


def effects_of(runs, start: int, end: int, depth: int, counters: tuple[int, ...]):
    """The body's effects as (kind, pc, nest, counters) in program order, IFs resolved at
    `counters` (the first iteration's: the caller checks their outcomes do not change), short
    inner LOOPs unrolled; None when an instruction is not one this module runs."""
    code, out, pc = runs.sim.binary.code, [], start
    while pc < end:
        ins = code[pc]
        if ins.mnemonic == "IF":
            body = ins.arg("body")
            if all(v >= 0 for v in ins.arg("cond").values(counters)):
                inner = effects_of(runs, pc + 1, pc + 1 + body, depth, counters)
                if inner is None:
                    return None
                out += inner
            pc += 1 + body
        elif ins.mnemonic in ("LOOP", "LOOPB"):
            nest = runs.nest(pc, depth) or _vector_nest(code, pc, depth)
            if nest is None and ins.mnemonic == "LOOP" and ins.arg("count") <= MAX_UNROLL:
                after = pc + 1 + ins.arg("body")
                for j in range(ins.arg("count")):
                    inner = effects_of(runs, pc + 1, after, depth + 1, counters + (j,))
                    if inner is None or after > end:
                        return None
                    out += inner
                pc = after
                continue
            if (
                nest is None
                or nest.body + 1 > end
                or any(lv >= depth - 1 for lv in nest.outer_levels)
            ):
                return None
            kind = "mm" if code[nest.body].mnemonic == "MATMUL" else "vec"
            out.append((kind, nest.body, nest, counters))
            pc = nest.body + 1
        elif ins.mnemonic in ("LOAD", "STORE"):
            out.append((ins.mnemonic.lower(), pc, None, counters))
            pc += 1
        elif ins.mnemonic == "MATMUL":
            out.append(("mm", pc, None, counters))
            pc += 1
        elif ins.mnemonic in ("VMUL", "VMAC"):
            out.append(("vec", pc, None, counters))
            pc += 1
        elif ins.mnemonic in ELEMENTWISE and (ins.mnemonic != "VSHRR" or ins.arg("b") is None):
            out.append(("sem", pc, None, counters))  # its own semantics, over the leading axis
            pc += 1
        elif ins.defn.execute is None:
            pc += 1  # SYNC: no values
        else:
            return None
    return out


def _vector_nest(code, pc: int, depth: int) -> Nest | None:
    nest = Nest.at(code, pc, depth)
    return nest if nest is not None and code[nest.body].mnemonic in ("VMUL", "VMAC") else None


def plan(runs, items, counters: tuple[int, ...], level: int, count: int) -> Plan | None:
    """The checked plan of `items` (`effects_of`) for `count` iterations of loop `level` from
    outer `counters` (the first iteration's, included); None to decline."""
    b = _Builder(runs, counters, level, count)
    for kind, pc, nest, at in items:
        b.counters = at
        if not b.add(kind, pc, nest):
            return None
    return b.finish()


class _Builder:
    """Effects with their on-chip accesses, in program order; `finish` checks and orders them."""

    def __init__(self, runs, counters, level, count) -> None:
        self.runs, self.counters, self.level, self.count = runs, counters, level, count
        self.code = runs.sim.binary.code
        self.mem = runs.sim.machine.mem
        self.refs: list[Ref] = []
        # per effect: (mem, lo, hi, written, ref index, how much earlier writes cover it)
        self.accesses: list[list[tuple]] = []
        self.done: dict[str, list[tuple[int, int]]] = {}  # written so far in an iteration
        self.effects: list[Effect] = []  # refs as indices into self.refs
        self.boxes: list[tuple[int, str, tuple]] = []  # (effect, kind, box)
        self.group: tuple | None = None  # the accumulator of the MATMUL group being built
        self.single = None  # (op, counters) of the group's last piece if a lone MATMUL
        self.elements = 0

    def ref(self, d: Decoded, base: int, shape, strides, write: bool) -> int | None:
        step = d.coefs[self.level] if self.level < len(d.coefs) else 0
        if step and write:
            return None
        r = Ref(d.mem, base, d.dtype, tuple(shape), tuple(strides), "cur", step)
        lo, hi = span(r)
        lo, hi = lo + min(0, step * (self.count - 1)), hi + max(0, step * (self.count - 1))
        if lo < 0 or hi > self.mem[d.mem].size:
            return None
        self.elements = max(self.elements, math.prod(shape))  # per iteration
        done = self.done.setdefault(d.mem, [])
        cov = "all" if _covered(done, lo, hi) else "none"
        if cov == "none" and any(a < hi and lo < b for a, b in done):
            cov = "some"
        self.refs.append(r)
        self.accesses[-1].append((d.mem, lo, hi, write, len(self.refs) - 1, cov))
        if write:
            done.append((lo, hi))
        return len(self.refs) - 1

    def add(self, kind: str, pc: int, nest) -> bool:
        if kind == "mm":
            return self.matmul(pc, nest)
        self.group = self.single = None
        if kind == "vec":
            return self.vector(pc, nest)
        if kind == "sem":
            return self.semantic(pc)
        ins = self.code[pc]
        view = ins.arg("dst" if kind == "load" else "src")
        box = ins.arg("src" if kind == "load" else "dst")
        if not isinstance(view, View) or not isinstance(box, Box):
            return False
        if len(box.shape) != len(self.runs.sim.binary.tensors[box.tensor].shape):
            return False
        if kind == "store" and tuple(view.shape) != tuple(box.shape):
            return False
        d = Decoded.of(view)
        self.accesses.append([])
        r = self.ref(d, d.base(self.counters), d.shape, d.strides, kind == "load")
        if r is None:
            return False
        origin = tuple(a.eval(self.counters) for a in box.origin)
        steps = tuple(a.coefs[self.level] if self.level < len(a.coefs) else 0 for a in box.origin)
        spec = (box.tensor, origin, steps, tuple(box.shape))
        self.boxes.append((len(self.effects), kind, spec))
        self.effects.append(Effect(kind, pc, (r,), spec))
        return True

    def matmul(self, pc: int, nest: Nest | None) -> bool:
        op: MatmulOp | None = self.runs.op(pc)
        if op is None:  # tokens are the timing's (`replay`): values do not depend on them
            return False
        pieces = [(self.counters, (), ())]
        if nest is not None:
            shape = self.runs.shape(nest, self.counters)
            if not len(shape.points):
                return False
            if shape.box is not None and (shape.box[2] is None or self._absorb(op, shape.box[2])):
                corner, dims, _ = shape.box  # a box, or a box but the corner just computed
                at = self.counters + tuple(int(c) for c in corner)
                pieces = [(at, dims, tuple(range(len(self.counters), len(at))))]
            elif len(shape.points) <= 256:  # a piece per iteration of the nest
                pieces = [(self.counters + tuple(p), (), ()) for p in shape.points.tolist()]
            else:
                return False
        return all(self._matmul(pc, op, at, dims, levels) for at, dims, levels in pieces)

    def _absorb(self, op: MatmulOp, missing) -> bool:
        """Whether the MATMUL just before the nest computed the nest's missing corner (the
        compiler's peeled first product), into the same accumulator: its piece is then
        dropped and the nest's box has it (`runs.MatmulRuns._box`)."""
        last = self.single
        if last is None or len(self.effects[-1].refs) < 2:
            return False
        first, at = last
        gap = self.counters + tuple(int(c) for c in missing)
        if (
            self.group != (op.acc.mem, op.acc.base(gap), op.acc.shape, op.acc.strides)
            or (first.a.shape, first.a.strides, first.a.dtype)
            != (op.a.shape, op.a.strides, op.a.dtype)
            or (first.b.shape, first.b.strides, first.b.dtype)
            != (op.b.shape, op.b.strides, op.b.dtype)
            or (first.a_zp, first.b_zp) != (op.a_zp, op.b_zp)
            or (first.a.base(at), first.b.base(at)) != (op.a.base(gap), op.b.base(gap))
        ):
            return False
        e = self.effects[-1]
        self.effects[-1] = Effect(e.kind, e.pc, e.refs[:-1], None, e.accumulate)
        self.single = None
        return True

    def _matmul(self, pc: int, op: MatmulOp, at, dims, levels) -> bool:
        if max(len(d.coefs) for d in (op.acc, op.a, op.b)) > len(at):
            return False
        acc_key = (op.acc.mem, op.acc.base(at), op.acc.shape, op.acc.strides)
        new = not (self.group == acc_key and op.accumulate)
        if new:
            self.accesses.append([])
        a = self._operand(op.a, at, dims, levels, split=len(op.a.shape) - 1)
        b = self._operand(op.b, at, dims, levels, split=0)
        if a is None or b is None:
            return False
        if new:
            self.group = acc_key
            base = acc_key[1]
            if (
                op.accumulate
                and self.ref(op.acc, base, op.acc.shape, op.acc.strides, False) is None
            ):
                return False
            acc = self.ref(op.acc, base, op.acc.shape, op.acc.strides, True)
            if acc is None:
                return False
            self.effects.append(Effect("mm", pc, (acc,), None, op.accumulate))
        lo, hi = span(self.refs[self.effects[-1].refs[0]])
        for r in (a, b):
            r_lo, r_hi = span(self.refs[r])
            if self.refs[r].mem == op.acc.mem and r_lo < hi and lo < r_hi:
                return False  # an operand overlapping the accumulator: stepped
        e = self.effects[-1]
        part = (a, b, op.a_zp, op.b_zp, op.term)
        self.single = (op, at) if at == self.counters else None
        self.effects[-1] = Effect(e.kind, e.pc, (*e.refs, part), None, e.accumulate)
        return True

    def semantic(self, pc: int) -> bool:
        """An elementwise vector instruction: its sources read, then its destination written."""
        views = [(n, v) for n, v in self.code[pc].args if isinstance(v, View)]
        dst = dict(views).get("dst")
        if dst is None or any(tuple(v.shape) != tuple(dst.shape) for _, v in views):
            return False  # broadcasting between shapes would differ with a leading axis
        self.accesses.append([])
        refs = []
        for name, v in [*[x for x in views if x[0] != "dst"], ("dst", dst)]:
            d = Decoded.of(v)
            r = self.ref(d, d.base(self.counters), d.shape, d.strides, name == "dst")
            if r is None:
                return False
            refs.append((name, r))
        self.effects.append(Effect("sem", pc, tuple(refs)))
        return True

    def vector(self, pc: int, nest: Nest | None) -> bool:
        """A VMUL or VMAC, or the nest around one: an effect per iteration of the nest."""
        if pc not in self.runs.vectors:
            self.runs.vectors[pc] = VectorOp.of(self.code[pc])
        op: VectorOp | None = self.runs.vectors[pc]
        if op is None:
            return False
        points = [()] if nest is None else self.runs.shape(nest, self.counters).points.tolist()
        if len(points) > 64:
            return False
        for point in points:
            at = self.counters + tuple(point)
            if max(len(d.coefs) for d in (op.dst, op.a, op.b) if d is not None) > len(at):
                return False
            self.accesses.append([])
            if op.mnemonic == "VMAC":
                self.ref(op.dst, op.dst.base(at), op.dst.shape, op.dst.strides, False)
            srcs = [
                self.ref(d, d.base(at), d.shape, d.strides, False)
                for d in (op.a, op.b)
                if d is not None
            ]
            dst = self.ref(op.dst, op.dst.base(at), op.dst.shape, op.dst.strides, True)
            if dst is None or None in srcs:
                return False
            d_ref = self.refs[dst]
            lo, hi = span(d_ref)
            for r in srcs:
                x = self.refs[r]
                r_lo, r_hi = span(x)
                same = (x.offset, x.shape, x.strides) == (d_ref.offset, d_ref.shape, d_ref.strides)
                if x.mem == d_ref.mem and r_lo < hi and lo < r_hi and not same:
                    return False
            if len(srcs) == 1:
                srcs.append(None)
            self.effects.append(Effect(op.mnemonic, pc, (dst, *srcs), None, 0, op.imm))
        return True

    def _operand(self, d: Decoded, at, dims, levels, split: int) -> int | None:
        co = tuple(d.coefs[lv] if lv < len(d.coefs) else 0 for lv in levels)
        shape = d.shape[:split] + tuple(dims) + d.shape[split:]
        strides = d.strides[:split] + co + d.strides[split:]
        return self.ref(d, d.base(at), shape, strides, False)

    def finish(self) -> Plan | None:
        if not self.effects:
            return None
        written = {m: _merge(r) for m, r in self.done.items() if r}
        modes = self._modes(written)
        if modes is None:
            return None
        hulls = {m: (r[0][0], r[-1][1]) for m, r in written.items()}
        per = max(self.elements, sum(hi - lo for lo, hi in hulls.values()), 1)
        chunk = min(self.count, MAX_BATCH_ELEMENTS // per - 1)
        if chunk < min(2, self.count):
            return None
        dram = dram_order(self.boxes, self.count, self.runs.sim.binary)
        if dram is None:
            return None
        order = self._order(modes, dram)
        if order is None:
            return None

        def ref(i: int) -> Ref:
            r = self.refs[i]
            return Ref(r.mem, r.offset, r.dtype, r.shape, r.strides, modes[i], r.step)

        effects = []
        for i in order:
            e = self.effects[i]
            if e.kind == "mm":
                parts = tuple((ref(a), ref(b), *rest) for a, b, *rest in e.refs[1:])
                effects.append(Effect(e.kind, e.pc, (ref(e.refs[0]), *parts), None, e.accumulate))
            elif e.kind == "sem":
                effects.append(Effect(e.kind, e.pc, tuple((n, ref(r)) for n, r in e.refs)))
            elif e.kind in ("VMUL", "VMAC"):
                refs = tuple(None if r is None else ref(r) for r in e.refs)
                effects.append(Effect(e.kind, e.pc, refs, None, 0, e.imm))
            else:
                effects.append(Effect(e.kind, e.pc, (ref(e.refs[0]),), e.box))
        effects = blocks.chains(merge_blocks(blocks.merge_k(effects)), chunk)
        return Plan(effects, hulls, written, self.count, chunk)

    def _modes(self, written) -> list[str] | None:
        """Per ref: "cur" (written, or read after this iteration wrote it), "prev" (read before
        this iteration writes it: the last iteration's), "shared"; None for a mix."""
        modes = ["cur"] * len(self.refs)
        for acc in self.accesses:
            for mem, lo, hi, write, i, cov in acc:
                if write:
                    continue
                ranges = written.get(mem, [])
                meets = any(a < hi and lo < b for a, b in ranges)
                if self.refs[i].step and meets:
                    return None  # a moving source must read bytes the body does not write
                if cov == "all":
                    continue
                if cov == "none" and _covered(ranges, lo, hi):
                    modes[i] = "prev"
                elif cov == "none" and not meets:
                    modes[i] = "shared"
                else:
                    return None
        return modes

    def _order(self, modes, dram) -> list[int] | None:
        """The effects in an order every iteration's dependences allow (program order where
        free), or None if there is none."""
        n = len(self.effects)
        after: list[set[int]] = [set() for _ in range(n)]
        for acc in self.accesses:
            for m1, lo1, hi1, w1, r1, _ in acc:
                if (
                    not w1
                    and modes[r1] == "prev"
                    and any(w and m == m1 and lo < hi1 and lo1 < hi for m, lo, hi, w, _, _ in acc)
                ):
                    return None  # a recurrence: it reads what it wrote the iteration before
        for i, j, back in meetings(self.accesses, modes):
            if back:
                after[j].add(i)  # i reads what j wrote the iteration before
            else:
                after[i].add(j)
        for i, j in dram:
            after[i].add(j)
        indegree = [0] * n
        for i in range(n):
            for j in after[i]:
                indegree[j] += 1
        order, ready = [], [i for i in range(n) if not indegree[i]]
        while ready:
            i = min(ready)
            ready.remove(i)
            order.append(i)
            for j in after[i]:
                indegree[j] -= 1
                if not indegree[j]:
                    ready.append(j)
        return order if len(order) == n else None


def _merge(ranges):
    out: list[list[int]] = []
    for lo, hi in sorted(ranges):
        if out and lo <= out[-1][1]:
            out[-1][1] = max(out[-1][1], hi)
        else:
            out.append([lo, hi])
    return [tuple(r) for r in out]


def _covered(ranges, lo: int, hi: int) -> bool:
    at = lo
    for a, b in _merge(ranges):
        if a <= at < b:
            at = b
        if at >= hi:
            return True
    return at >= hi
