"""The walk over isl's AST of the schedule: loops become LOOP/LOOPB, guards IF, and
statement instances go to instruction selection."""

from __future__ import annotations

import islpy as isl

from tensorgen.codegen.emitter import floor_terms
from tensorgen.errors import CodegenError
from tensorgen.mc import isa
from tensorgen.mc.operands import Bound, LoopAffine

BAND_LEVEL = 16  # pseudo loop levels standing for the lanes of a vector or array band


def _ast(schedule: isl.UnionMap, stage_dims: tuple[int, ...], piece_maps: dict) -> tuple:
    """isl's AST of `schedule`, its iterations of staging loops at `stage_dims` separated, and
    per AST statement (its annotation `points<k>`) the schedule points it runs. A function of
    the schedule's text and the pieces': layers of the same shape (replayed schedules) share
    one AST, built once."""
    key = (str(schedule), stage_dims, tuple((n, str(m)) for n, m in piece_maps.items()))
    hit = _ASTS.get(key)
    if hit is not None:
        return hit
    build = isl.AstBuild.from_context(isl.Set("{ : }"))
    schedule, kept = _without_constant_dims(schedule, stage_dims)
    if kept != tuple(range(len(kept))):  # the loops keep the names of their dimensions
        ids = isl.IdList.from_id(isl.Id(f"c{kept[0]}"))
        for k in kept[1:]:
            ids = ids.add(isl.Id(f"c{k}"))
        build = build.set_iterators(ids)
    if stage_dims:
        # the iterations of a staging loop that differ (a last, partial one) are separated from
        # it whole, every piece of every statement in them together: they are staged alone
        dims = ", ".join(f"d{i}" for i in range(len(kept)))
        build = build.set_options(
            isl.UnionMap(
                "{ "
                + "; ".join(f"[{dims}] -> separate[{kept.index(p)}]" for p in stage_dims)
                + " }"
            )
        )
    points: list[isl.Set] = []

    def note_points(node, build):
        executed = build.get_schedule().get_map_list().get_at(0)
        name = executed.get_tuple_name(isl.dim_type.in_)
        points.append(piece_maps[name].intersect_domain(executed.domain()).range())
        return node.set_annotation(isl.Id(f"points{len(points) - 1}"))

    build, handle = build.set_at_each_domain(note_points)
    ast = build.node_from_schedule_map(schedule)
    del handle
    if len(_ASTS) >= AST_CACHE:
        del _ASTS[next(iter(_ASTS))]
    _ASTS[key] = (ast, points)
    return ast, points


def _without_constant_dims(
    schedule: isl.UnionMap, keep: tuple[int, ...]
) -> tuple[isl.UnionMap, tuple[int, ...]]:
    """`schedule` without the dimensions that hold one value in every statement (but those in
    `keep`), and the positions of those it keeps. Such a dimension is no loop and no guard in
    isl's AST, its value is substituted where it is used, so the AST is the same, its loops
    named after the kept positions; but isl carries every dimension through every step of the
    build, and dropping them halves its time (ResNet-18: 6 of 21 dimensions, 1.3 s -> 0.65 s).
    A dimension is dropped only where isl reads its value off the constraints (plainly fixed):
    one it cannot is kept, which is only slower."""
    maps = [schedule.get_map_list().get_at(i) for i in range(schedule.n_map())]
    out = isl.dim_type.out
    n = maps[0].dim(out) if maps else 0
    if any(m.dim(out) != n or m.has_tuple_name(out) for m in maps):
        return schedule, tuple(range(n))
    kept = []
    for k in range(n):
        values = [m.plain_get_val_if_fixed(out, k) for m in maps]
        if (
            k in keep
            or any(v.is_nan() for v in values)
            or len({v.to_python() for v in values}) != 1
        ):
            kept.append(k)
    if len(kept) == n or not kept:
        return schedule, tuple(range(n))
    dims = ", ".join(f"d{i}" for i in range(n))
    drop = isl.Map(f"{{ [{dims}] -> [{', '.join(f'd{k}' for k in kept)}] }}")
    return schedule.apply_range(isl.UnionMap.from_map(drop)), tuple(kept)


AST_CACHE = 32  # ASTs remembered (the oldest forgotten first)
_ASTS: dict[tuple, tuple] = {}


class _AstWalk:
    """Methods of the scheduled lowering (tensorgen.codegen.scheduled._Lowering), one pass."""

    # -- program ----------------------------------------------------------------------------
    def emit(self) -> None:
        self.active = {
            name: (mem, base, tuple(LoopAffine.make(o) for o in origin), size)
            for name, (mem, base, origin, size) in self.buf.items()
        }
        schedule = self._separated()
        for name in self.buf:
            self._dma("LOAD", name)
        self.em.emit(isa.make("SYNC", queue=1))  # the nest runs on EX: enter it there
        stage_dims = tuple(sorted({p for p, *_ in self.loop_stages.values()}))
        ast, self.points = _ast(schedule, stage_dims, self.piece_maps)
        self._walk(ast, {}, {})
        for name in self.buf:
            if name in self.stored:
                self._dma("STORE", name)

    def _walk(self, node, env: dict[str, LoopAffine], band: dict[str, tuple[int, int]]) -> None:
        self._walk_nodes([node], env, band)

    def _walk_nodes(
        self, nodes: list, env: dict[str, LoopAffine], band: dict[str, tuple[int, int]]
    ) -> None:
        """Sibling nodes in order. An iteration of a staging loop that isl peeled out of its loop
        is staged around the run of siblings that make it up (isl may emit it as several, one
        per piece of a statement): one load before them, one store after."""
        i = 0
        while i < len(nodes):
            missing = self._peeled_stages(nodes[i], env)
            if not missing:
                self._walk_node(nodes[i], env, band)
                i += 1
                continue
            # the outermost level first: its iteration may span siblings that differ deeper (a
            # loop of full iterations of an inner staging loop, then that loop's peeled one)
            level = min(self.loop_stages[t][0] for t in missing)
            outer = [t for t in missing if self.loop_stages[t][0] == level]
            origins = self._peeled_origins(nodes[i], outer, env)
            j = i + 1
            while (
                j < len(nodes)
                and set(outer) <= set(self._peeled_stages(nodes[j], env))
                and self._peeled_origins(nodes[j], outer, env) == origins
            ):
                j += 1
            saved = {t: self.active.get(t) for t in outer}
            for t in outer:
                _, _, mem, base, _, size = self.loop_stages[t]
                self.active[t] = (mem, base, origins[t], size)
                self._load(t, env, nodes[i])
            self._walk_nodes(nodes[i:j], env, band)  # stages the deeper levels among them
            for t in outer:
                if t in self.stored:
                    self._dma("STORE", t)
                self.active[t] = saved[t]
            i = j

    def _peeled_origins(self, node, missing: list[str], env) -> dict[str, tuple[LoopAffine, ...]]:
        return {t: self._stage_origin(t, env, node) for t in missing}

    def _peeled_stages(self, node, env) -> list[str]:
        t = node.get_type()
        if t not in (isl.ast_node_type.for_, isl.ast_node_type.user):
            return []
        limit = (
            int(node.for_get_iterator().get_id().get_name()[1:])
            if t == isl.ast_node_type.for_
            else 10**6
        )
        under = {self.piece_of.get(n, n) for n in _statements_under(node)}
        return [
            name
            for name, (p, stmts, *_) in self.loop_stages.items()
            if self.active.get(name) is None and p < limit and f"c{p}" not in env and under <= stmts
        ]

    def _walk_node(
        self, node, env: dict[str, LoopAffine], band: dict[str, tuple[int, int]]
    ) -> None:
        t = node.get_type()
        if t == isl.ast_node_type.block:
            self._walk_nodes(_block_children(node), env, band)
        elif t == isl.ast_node_type.for_:
            self._for(node, env, band)
        elif t == isl.ast_node_type.if_:
            terms = _conditions(node.if_get_cond(), env)
            with self.em.block("IF", cond=Bound(tuple(terms))):
                self._walk(node.if_get_then_node(), env, band)
            if node.if_has_else_node():
                # not (t0 and t1 and ...) as disjoint cases: not t0 | t0 and not t1 | ...
                for i, (a, _d) in enumerate(terms):
                    negated = (a.scale(-1) + (-1), 1)  # floor(a/d) < 0  <=>  a <= -1  (d > 0)
                    with self.em.block("IF", cond=Bound(tuple(terms[:i]) + (negated,))):
                        self._walk(node.if_get_else_node(), env, band)
        elif t == isl.ast_node_type.user:
            self._user(node.user_get_expr(), env, band)
        elif t == isl.ast_node_type.mark:
            self._walk(node.mark_get_node(), env, band)
        else:
            raise CodegenError(f"unexpected node in the schedule's loop nest: {node.to_C_str()}")

    def _for(self, node, env, band) -> None:
        name = node.for_get_iterator().get_id().get_name()
        pos = int(name[1:])
        cond = node.for_get_cond()
        if _const_int(node.for_get_inc()) != 1:
            raise CodegenError(f"loop {name} has a non-unit step")
        op = cond.get_op_type()
        if op not in (isl.ast_expr_op_type.le, isl.ast_expr_op_type.lt):
            raise CodegenError(f"unexpected loop condition {cond.to_C_str()}")
        lower = _bound_terms(node.for_get_init(), env, "max")
        upper = _bound_terms(cond.get_op_arg(1), env, "min")
        if op == isl.ast_expr_op_type.lt:
            upper = [(a + (-d), d) for a, d in upper]
        constant = (
            len(lower) == 1
            and len(upper) == 1
            and lower[0][1] == upper[0][1] == 1
            and not any(lower[0][0].coefs)
            and not any(upper[0][0].coefs)
        )
        in_band = self._band_at(pos, node)
        if in_band is not None and not constant:
            raise CodegenError(
                f"loop {name} of a vectorized or tensorized band has bounds that vary "
                f"({node.to_C_str().splitlines()[0]}); split by a factor that divides its extent"
            )
        if in_band is not None:
            lo, hi = lower[0][0].const, upper[0][0].const
            lanes = {**band, name: (len(band), hi - lo + 1)}
            self._walk(
                node.for_get_body(),
                {**env, name: LoopAffine.make(lo, {BAND_LEVEL + len(band): 1})},
                lanes,
            )
            return
        if band:
            raise CodegenError(
                f"a vectorized or tensorized loop ({', '.join(band)}) has a loop with non-constant "
                f"bounds inside it; split by a factor that divides the extent"
            )
        if constant and self._pipelined(node, pos, upper[0][0].const - lower[0][0].const + 1):
            self._pipelined_loop(node, pos, name, lower[0][0].const, upper[0][0].const, env, band)
        elif constant:
            lo, hi = lower[0][0].const, upper[0][0].const
            with self.em.loop(hi - lo + 1) as level:
                self._staged_body(node, pos, {**env, name: LoopAffine.make(lo, {level: 1})}, band)
        else:
            with self.em.block(
                "LOOPB", lower=Bound(tuple(lower)), upper=Bound(tuple(upper))
            ) as level:
                self._staged_body(node, pos, {**env, name: LoopAffine.make(0, {level: 1})}, band)

    def _staged_body(self, node, pos: int, env, band) -> None:
        """The body of a loop, with the DMAs of the tensors staged at it around it."""
        under = {self.piece_of.get(n, n) for n in _statements_under(node)}
        here = [t for t, (p, stmts, *_) in self.loop_stages.items() if p == pos and under <= stmts]
        saved = {t: self.active.get(t) for t in here}
        for t in here:
            _, _, mem, base, _, size = self.loop_stages[t]
            self.active[t] = (mem, base, self._stage_origin(t, env, node), size)
            self._load(t, env, node)
        self._walk(node.for_get_body(), env, band)
        for t in here:
            if t in self.stored:
                self._dma("STORE", t)
            self.active[t] = saved[t]

    def _staged_here(self, node, pos: int) -> list[str]:
        under = {self.piece_of.get(n, n) for n in _statements_under(node)}
        return [t for t, (p, stmts, *_) in self.loop_stages.items() if p == pos and under <= stmts]

    def _dim_constant(self, node, k: int) -> int:
        """The value of schedule dimension `k` in every instance the AST `node` runs."""
        points = None
        for p in _points_under(node, self.points):
            points = p if points is None else points.union(p)
        lo, hi = points.dim_min(k), points.dim_max(k)
        if not (lo.is_cst() and hi.is_cst()) or _cst(lo) != _cst(hi):
            raise CodegenError(
                f"schedule dimension {k} is neither a loop nor a constant around a staged tensor"
            )
        return _cst(lo)


def _block_children(node) -> list:
    """The children of a block, with nested blocks flattened (they run in sequence all the same)."""
    children = node.block_get_children()
    out = []
    for i in range(children.n_ast_node()):
        child = children.get_at(i)
        out += _block_children(child) if child.get_type() == isl.ast_node_type.block else [child]
    return out


def _points_under(node, points: list) -> list:
    """The schedule points of the AST statements under `node` (noted as their annotations)."""
    t = node.get_type()
    if t == isl.ast_node_type.user:
        return [points[int(node.get_annotation().get_name()[len("points") :])]]
    if t == isl.ast_node_type.for_:
        return _points_under(node.for_get_body(), points)
    if t == isl.ast_node_type.if_:
        out = _points_under(node.if_get_then_node(), points)
        return (
            out + _points_under(node.if_get_else_node(), points) if node.if_has_else_node() else out
        )
    if t == isl.ast_node_type.block:
        return [p for child in _block_children(node) for p in _points_under(child, points)]
    if t == isl.ast_node_type.mark:
        return _points_under(node.mark_get_node(), points)
    return []


def _statements_under(node) -> frozenset[str]:
    t = node.get_type()
    if t == isl.ast_node_type.user:
        return frozenset({node.user_get_expr().get_op_arg(0).get_id().get_name()})
    if t == isl.ast_node_type.for_:
        return _statements_under(node.for_get_body())
    if t == isl.ast_node_type.if_:
        out = _statements_under(node.if_get_then_node())
        return out | _statements_under(node.if_get_else_node()) if node.if_has_else_node() else out
    if t == isl.ast_node_type.block:
        children = node.block_get_children()
        return frozenset().union(
            *(_statements_under(children.get_at(i)) for i in range(children.n_ast_node()))
        )
    if t == isl.ast_node_type.mark:
        return _statements_under(node.mark_get_node())
    return frozenset()


def _cst(pa: isl.PwAff) -> int:
    if not pa.is_cst():
        raise CodegenError("a tensor's footprint is unbounded")
    return int(pa.get_pieces()[0][1].get_constant_val().to_python())


def _const_int(e) -> int:
    if e.get_type() != isl.ast_expr_type.int:
        raise CodegenError(f"expected a constant, got {e.to_C_str()}")
    return int(e.get_val().to_python())


def _floor_affine(e, env) -> tuple[LoopAffine, int]:
    """`e` as floor(numerator / divisor) with an affine numerator over the loop iterators."""
    terms = floor_terms(e, env, "max")
    if len(terms) != 1:
        raise CodegenError(
            f"unsupported expression '{e.to_C_str()}' in the schedule's loop nest "
            f"(a maximum where one term is needed)"
        )
    return terms[0]


def _bound_terms(e, env, combine: str) -> list[tuple[LoopAffine, int]]:
    return floor_terms(e, env, combine)  # exact rewriting of isl's bound expressions (emitter.py)


def _conditions(e, env) -> list[tuple[LoopAffine, int]]:
    """Terms that must all be >= 0 for the AST condition `e` to hold."""
    t = isl.ast_expr_op_type
    op = e.get_op_type()
    if op in (t.and_, t.and_then):
        return _conditions(e.get_op_arg(0), env) + _conditions(e.get_op_arg(1), env)
    if op in (t.ge, t.le, t.eq, t.gt, t.lt):
        (na, da), (nb, db) = (
            _floor_affine(e.get_op_arg(0), env),
            _floor_affine(e.get_op_arg(1), env),
        )
        if da != 1 and db != 1:
            raise CodegenError(f"unsupported guard '{e.to_C_str()}' in the schedule's loop nest")
        # floor(n/d) - b >= 0  <=>  n - d*b >= 0 (d > 0)
        # a - b >= 0, scaled by da when b is whole
        diff = na + nb.scale(-da) if db == 1 else na.scale(db) + nb.scale(-1)
        if op == t.ge:
            return [(diff, 1)]
        if op == t.gt:
            return [(diff + (-1), 1)]
        if op == t.le:
            return [(diff.scale(-1), 1)]
        if op == t.lt:
            return [(diff.scale(-1) + (-1), 1)]
        return [(diff, 1), (diff.scale(-1), 1)]
    raise CodegenError(f"unsupported guard '{e.to_C_str()}' in the schedule's loop nest")
