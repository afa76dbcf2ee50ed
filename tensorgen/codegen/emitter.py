"""Instruction stream builder: hardware loops, isl AST expressions as affine forms, and
dependency tokens.

Token discipline of the lowering: every change of queue in dynamic
program order is a token (the earlier instruction signals, the later waits).
Each loop body starts and ends on the queue that was current when the loop
was entered, so every iteration pushes and pops the same tokens and none
leaks. This is fully serialising and always correct; overlapping DMA with
compute (double buffering) relaxes it where the schedule asks for it.
"""

from __future__ import annotations

from contextlib import contextmanager

import islpy as isl

from tensorgen.errors import CodegenError
from tensorgen.mc import isa
from tensorgen.mc.operands import MAX_LOOP_DEPTH, LoopAffine

QUEUE_INDEX = {q: i for i, q in enumerate(isa.QUEUES)}


class Emitter:
    def __init__(self) -> None:
        self.code: list[isa.Instruction] = []
        self.depth = 0
        self.counts: list[int | None] = []  # per open loop level: its trip count (None: LOOPB)
        self.queue = "EX"
        self.fresh_block = True  # the previous dynamic instruction cannot carry a signal

    def _switch(self, queue: str) -> frozenset[str]:
        if queue == self.queue:
            return frozenset()
        if self.fresh_block:
            self.code.append(
                isa.make("SYNC", queue=QUEUE_INDEX[self.queue]).with_tokens(signal={queue})
            )
        else:
            last = self.code[-1]
            self.code[-1] = last.with_tokens(signal=last.signal | {queue})
        waited = frozenset({self.queue})
        self.queue = queue
        return waited

    def emit(self, ins: isa.Instruction) -> None:
        wait = self._switch(ins.queue)
        self.code.append(ins.with_tokens(wait=ins.wait | wait))
        self.fresh_block = False

    @contextmanager
    def loop(self, count: int):
        """A hardware loop; yields the level of its counter (L<level>)."""
        with self.block("LOOP", count=count) as level:
            yield level

    @contextmanager
    def block(self, mnemonic: str, **fields):
        """A LOOP, LOOPB or IF around the instructions emitted inside; yields the level of the
        loop's iterator (L<level>), or None for IF, which opens no level."""
        opens_level = mnemonic != "IF"
        if opens_level and self.depth >= MAX_LOOP_DEPTH:
            raise CodegenError(f"loop nest deeper than the {MAX_LOOP_DEPTH} hardware loop levels")
        entry = self.queue
        head = len(self.code)
        self.code.append(isa.make(mnemonic, **fields, body=0))
        self.depth += opens_level
        if opens_level:
            self.counts.append(fields.get("count"))
        self.fresh_block = True
        yield self.depth - 1 if opens_level else None
        if self.queue != entry:
            self.emit(isa.make("SYNC", queue=QUEUE_INDEX[entry]))
        self.depth -= opens_level
        if opens_level:
            self.counts.pop()
        body = len(self.code) - head - 1
        if body == 0:
            self.code.pop()
        else:
            self.code[head] = isa.make(mnemonic, **fields, body=body)
        self.fresh_block = True

    def finish(self) -> list[isa.Instruction]:
        return list(self.code)


def _expr(e: isl.AstExpr, env: dict[str, LoopAffine]) -> LoopAffine:
    t = e.get_type()
    if t == isl.ast_expr_type.int:
        return LoopAffine.make(e.get_val().to_python())
    if t == isl.ast_expr_type.id:
        return env[e.get_id().get_name()]
    if t == isl.ast_expr_type.op:
        op = e.get_op_type()
        args = [_expr(e.get_op_arg(i), env) for i in range(e.get_op_n_arg())]
        if op == isl.ast_expr_op_type.add:
            return args[0] + args[1]
        if op == isl.ast_expr_op_type.minus:
            return args[0].scale(-1)
        if op == isl.ast_expr_op_type.sub:
            return args[0] + args[1].scale(-1)
        if op == isl.ast_expr_op_type.mul and (not any(args[0].coefs) or not any(args[1].coefs)):
            k, v = (args[0], args[1]) if not any(args[0].coefs) else (args[1], args[0])
            return v.scale(k.const)
    raise CodegenError(f"unexpected expression in the generated loop nest: {e.to_C_str()}")


Term = tuple[LoopAffine, int]  # floor(affine / divisor), divisor > 0
_FLIP = {"max": "min", "min": "max"}


def floor_terms(e: isl.AstExpr, env: dict[str, LoopAffine], combine: str) -> list[Term]:
    """`e` exactly as the `combine` ("max" or "min") of terms floor(affine / d) over the loop
    counters in `env`: the form of a LOOPB bound (the max of its lower terms, the min of its
    upper ones) and, with one term, of an IF condition.

    isl's AST writes such bounds with nested max/min, negation, sums, constant multiples and
    divisions (`/` exact or of a non-negative value, pdiv_q, fdiv_q: all floors there). They
    are rewritten exactly: -floor(a/d) = floor((d - 1 - a)/d), floor(a/d) + b = floor((a + d*b)/d),
    floor(floor(a/d)/k) = floor(a/(d*k)), and sums, negations and positive multiples of maxima
    (minima) are maxima (minima) of the sums, ... of their terms. What has no such form (a sum
    of two divisions, a multiple of a division, a remainder, a select, a minimum inside a
    maximum) is a CodegenError naming the expression."""
    if e.get_type() != isl.ast_expr_type.op:
        return [(_expr(e, env), 1)]
    t, op = isl.ast_expr_op_type, e.get_op_type()
    args = [e.get_op_arg(i) for i in range(e.get_op_n_arg())]
    if op in (t.max, t.min) and op == (t.max if combine == "max" else t.min):
        return [term for a in args for term in floor_terms(a, env, combine)]
    if op == t.minus:
        return [_negate(term) for term in floor_terms(args[0], env, _FLIP[combine])]
    if op in (t.add, t.sub):
        left = floor_terms(args[0], env, combine)
        right = floor_terms(args[1], env, combine if op == t.add else _FLIP[combine])
        if op == t.sub:
            right = [_negate(term) for term in right]
        return [_sum(a, b, e) for a in left for b in right]
    if op == t.mul:
        k = next((_int(a) for a in args if _int(a) is not None), None)
        if k is not None and k != 0:
            other = args[1] if _int(args[0]) == k else args[0]
            terms = floor_terms(other, env, combine if k > 0 else _FLIP[combine])
            if all(d == 1 for _, d in terms):
                return [(a.scale(k), 1) for a, _ in terms]
    if op in (t.div, t.pdiv_q, t.fdiv_q) and (_int(args[1]) or 0) > 0:
        k = _int(args[1])
        return [(a, d * k) for a, d in floor_terms(args[0], env, combine)]
    raise CodegenError(
        f"the schedule's loop nest has a bound '{e.to_C_str()}' that the hardware loops cannot "
        f"take (a {combine} of floor(affine / constant) terms); choose other split factors or skews"
    )


def _int(e: isl.AstExpr) -> int | None:
    return int(e.get_val().to_python()) if e.get_type() == isl.ast_expr_type.int else None


def _negate(term: Term) -> Term:
    a, d = term
    return a.scale(-1) + (d - 1), d  # -floor(a/d) = ceil(-a/d) = floor((d - 1 - a)/d)


def _sum(x: Term, y: Term, e: isl.AstExpr) -> Term:
    (a, d), (b, f) = x, y
    if f == 1:
        return a + b.scale(d), d
    if d == 1:
        return b + a.scale(f), f
    raise CodegenError(
        f"the schedule's loop nest has a bound '{e.to_C_str()}' that the hardware loops cannot "
        f"take (a sum of two divisions); choose other split factors or skews"
    )
