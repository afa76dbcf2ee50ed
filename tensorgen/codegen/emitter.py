"""Instruction stream builder: hardware loops from isl's AST, and dependency tokens.

Token discipline of the default lowering: every change of queue in dynamic
program order is a token (the earlier instruction signals, the later waits).
Each loop body starts and ends on the queue that was current when the loop
was entered, so every iteration pushes and pops the same tokens and none
leaks. This is fully serialising and always correct; overlapping DMA with
compute (double buffering) relaxes it where the schedule asks for it.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass

import islpy as isl

from tensorgen.errors import CodegenError
from tensorgen.mc import isa
from tensorgen.mc.operands import MAX_LOOP_DEPTH, LoopAffine

QUEUE_INDEX = {q: i for i, q in enumerate(isa.QUEUES)}


class Emitter:
    def __init__(self) -> None:
        self.code: list[isa.Instruction] = []
        self.depth = 0
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
        self.fresh_block = True
        yield self.depth - 1 if opens_level else None
        if self.queue != entry:
            self.emit(isa.make("SYNC", queue=QUEUE_INDEX[entry]))
        self.depth -= opens_level
        body = len(self.code) - head - 1
        if body == 0:
            self.code.pop()
        else:
            self.code[head] = isa.make(mnemonic, **fields, body=body)
        self.fresh_block = True

    def finish(self) -> list[isa.Instruction]:
        return list(self.code)


@dataclass(frozen=True)
class Dim:
    """One dimension of a loop nest: index `name` over [lo, lo + extent) in tiles of `tile`."""

    name: str
    lo: int
    extent: int
    tile: int


def tile_nest(
    em: Emitter,
    dims: list[Dim],
    body: Callable[[dict[str, tuple[LoopAffine, int]]], None],
    queue: str | None = None,
) -> None:
    """Emit the loops over the tiles of `dims`, full tiles and partial ones separated.

    The loop structure comes from isl's AST generator: each combination of full
    and partial tiles is one isl statement over tile counters, so isl emits the
    loops over full tiles and the partial tiles after them, with no guards.
    `body` gets, per index, the tile origin (affine in loop counters) and size.
    """
    if not dims:
        body({})
        return
    if queue is not None and em.queue != queue:
        # enter the nest on the queue its body runs on, so iterations need no token round trip
        em.emit(isa.make("SYNC", queue=QUEUE_INDEX[queue]))
    variants = _variants(dims)
    names = [f"c{i}" for i in range(len(dims))]
    parts = []
    for key, cons in variants.items():
        parts.append(f"{key}[{', '.join(names)}] -> [{', '.join(names)}] : {' and '.join(cons)}")
    build = isl.AstBuild.from_context(isl.Set("{ : }"))
    ast = build.node_from_schedule_map(isl.UnionMap("{ " + "; ".join(parts) + " }"))
    _walk(em, ast, {}, dims, body)


def _variants(dims: list[Dim]) -> dict[str, list[str]]:
    """isl statement name (one letter per dim: f = full tile, r = remainder) -> constraints."""
    out: dict[str, list[str]] = {"V": []}
    for i, d in enumerate(dims):
        full, rem = d.extent // d.tile, d.extent % d.tile
        nxt: dict[str, list[str]] = {}
        for key, cons in out.items():
            if full:
                nxt[key + "f"] = cons + [f"0 <= c{i} < {full}"]
            if rem:
                nxt[key + "r"] = cons + [f"c{i} = {full}"]
        out = nxt
    return out


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


def _const(e: isl.AstExpr) -> int:
    if e.get_type() != isl.ast_expr_type.int:
        raise CodegenError(
            f"loop bound '{e.to_C_str()}' is not a constant; only rectangular nests are supported"
        )
    return int(e.get_val().to_python())


def _walk(
    em: Emitter, node: isl.AstNode, env: dict[str, LoopAffine], dims: list[Dim], body
) -> None:
    t = node.get_type()
    if t == isl.ast_node_type.block:
        children = node.block_get_children()
        for i in range(children.n_ast_node()):
            _walk(em, children.get_at(i), env, dims, body)
    elif t == isl.ast_node_type.for_:
        name = node.for_get_iterator().get_id().get_name()
        init = _const(node.for_get_init())
        cond = node.for_get_cond()
        if _const(node.for_get_inc()) != 1 or cond.get_op_type() not in (
            isl.ast_expr_op_type.le,
            isl.ast_expr_op_type.lt,
        ):
            raise CodegenError(f"unexpected loop in the generated nest: {node.to_C_str()}")
        bound = _const(cond.get_op_arg(1))
        count = bound - init + (1 if cond.get_op_type() == isl.ast_expr_op_type.le else 0)
        with em.loop(count) as level:
            _walk(
                em,
                node.for_get_body(),
                {**env, name: LoopAffine.make(init, {level: 1})},
                dims,
                body,
            )
    elif t == isl.ast_node_type.user:
        call = node.user_get_expr()
        key = call.get_op_arg(0).get_id().get_name()
        tiles = {}
        for i, d in enumerate(dims):
            counter = _expr(call.get_op_arg(i + 1), env)
            size = d.tile if key[1 + i] == "f" else d.extent % d.tile
            tiles[d.name] = (counter.scale(d.tile) + d.lo, size)
        body(tiles)
    else:
        raise CodegenError(f"unexpected node in the generated loop nest: {node.to_C_str()}")
