"""Loop rewrites: split, reorder, tile, skew, fuse, distribute.

Each is a function from a `State` to a new one (and the handles of the loops it makes); none
checks dependences: `Schedule` (api.py) checks the state a rewrite returns before adopting it.
The pictures of what each does are in the docstrings of `Schedule`'s methods.
"""

from __future__ import annotations

from dataclasses import replace

import islpy as isl

from tensorgen.errors import ScheduleError
from tensorgen.schedule.state import (
    Loop,
    LoopInfo,
    State,
    add_loop,
    const_at,
    remap,
    resolve,
    transform,
)


def restage(state: State, old: str, new: str) -> State:
    """Stages at the loop called `old` move to the loop called `new`, which replaces it."""
    stages = tuple(replace(st, loop=new) if st.loop == old else st for st in state.stages)
    return replace(state, stages=stages)


def split(state: State, loop: Loop, factor: int, prim: str) -> tuple[State, Loop, Loop]:
    if not isinstance(factor, int) or isinstance(factor, bool) or factor <= 0:
        raise ScheduleError(f"{prim}: factor must be a positive integer")
    lid, pos, stmts = resolve(state, loop, prim)
    n = len(state.dims)
    ins = [f"d{i}" for i in range(n)]
    split_dims = [f"floor(d{pos}/{factor})", f"d{pos} - {factor}*floor(d{pos}/{factor})"]
    inside = transform(n, ins[:pos] + split_dims + ins[pos + 1 :])
    outside = transform(n, ins[: pos + 1] + ["0"] + ins[pos + 1 :])
    maps = remap(state.maps, {s: inside if s in stmts else outside for s in state.maps})
    name = state.loops[lid].name
    loops, o = add_loop(state.loops, state.next_id, f"{name}_o", stmts)
    loops, i = add_loop(loops, o, f"{name}_i", stmts)
    del loops[lid]
    row = state.dims[pos]
    dims = (
        *state.dims[:pos],
        {k: (o if v == lid else v) for k, v in row.items()},
        {k: (i if v == lid else None) for k, v in row.items()},
        *state.dims[pos + 1 :],
    )
    split_into = {**state.split_into, lid: (name, loops[o].name, loops[i].name)}
    new = replace(state, maps=maps, dims=dims, loops=loops, split_into=split_into, next_id=i)
    # a tensor staged at the split loop keeps its footprint: one iteration of the old loop is
    # one iteration of the inner loop (within one of the outer)
    new = restage(new, name, loops[i].name)
    return new, Loop(o, loops[o].name), Loop(i, loops[i].name)


def reorder(state: State, loops: tuple[Loop, ...], prim: str) -> State:
    if len(loops) < 2:
        raise ScheduleError(f"{prim}: give at least two loops")
    found = [resolve(state, lp, prim) for lp in loops]
    stmts = found[0][2]
    for (_, _, st), lp in zip(found, loops, strict=True):
        if st != stmts:
            raise ScheduleError(
                f"{prim}: {lp.name} and {loops[0].name} do not enclose the same statements "
                f"({', '.join(sorted(st))} vs {', '.join(sorted(stmts))}); fuse or distribute first"
            )
    positions = sorted(p for _, p, _ in found)
    if len(set(positions)) != len(positions):
        raise ScheduleError(f"{prim}: a loop is named twice")
    n = len(state.dims)
    out = [f"d{i}" for i in range(n)]
    source = dict(zip(positions, (p for _, p, _ in found), strict=True))  # target <- source
    for target_pos, src_pos in source.items():
        out[target_pos] = f"d{src_pos}"
    perm = transform(n, out)
    maps = remap(state.maps, {s: perm for s in stmts})
    dims = tuple(
        {s: (state.dims[source.get(p, p)][s] if s in stmts else v) for s, v in row.items()}
        for p, row in enumerate(state.dims)
    )
    return replace(state, maps=maps, dims=dims)


def tile(
    state: State, outer: Loop, inner: Loop, f_outer: int, f_inner: int, prim: str
) -> tuple[State, tuple[Loop, Loop, Loop, Loop]]:
    """Split both loops and reorder to (outer_o, inner_o, outer_i, inner_i): one step."""
    try:
        state, oo, oi = split(state, outer, f_outer, f"split({getattr(outer, 'name', outer)})")
        state, io, ii = split(state, inner, f_inner, f"split({getattr(inner, 'name', inner)})")
        names = ", ".join(x.name for x in (oo, io, oi, ii))
        state = reorder(state, (oo, io, oi, ii), f"reorder({names})")
    except ScheduleError as err:
        reason = str(err).split(": ", 1)[1]
        raise ScheduleError(f"{prim}: {reason}", detail=err.detail) from None
    return state, (oo, io, oi, ii)


def skew(state: State, loop: Loop, by: Loop, factor: int, prim: str) -> State:
    if not isinstance(factor, int) or isinstance(factor, bool):
        raise ScheduleError(f"{prim}: factor must be an integer")
    _, pos, stmts = resolve(state, loop, prim)
    _, bpos, bstmts = resolve(state, by, prim, modify=False)
    if bpos >= pos or not stmts <= bstmts:
        raise ScheduleError(f"{prim}: {by.name} must be a loop enclosing {loop.name}")
    n = len(state.dims)
    out = [f"d{i}" for i in range(n)]
    out[pos] = f"d{pos} + {factor}*d{bpos}"
    skewed = transform(n, out)
    return replace(state, maps=remap(state.maps, {s: skewed for s in stmts}))


def _ordering_dim(state: State, sa, sb, pa: int, prim: str) -> tuple[list[int], int, int]:
    """The constant dimensions between the loops' common parent and `pa` where the two loops'
    statements differ (the first orders them), and the constants of each at the first.

    Every such dimension, not only one, must become the first loop's: a loop whose statements
    were fused before carries the constants of those fuses, and a constant left to differ
    above the fused loop would keep the bodies apart (they would not be fused at all)."""
    first = next(iter(sa))
    if any(state.dims[p][s] != state.dims[p][first] for p in range(pa) for s in sa | sb):
        raise ScheduleError(f"{prim}: the loops are not siblings under the same parent loop")
    differ = [
        p
        for p in range(pa)
        if all(state.dims[p][s] is None for s in sa | sb)
        and const_at(state, sa, p) != const_at(state, sb, p)
    ]
    if not differ:
        raise ScheduleError(f"{prim}: the loops are not siblings under the same parent loop")
    q = differ[0]
    va, vb = const_at(state, sa, q), const_at(state, sb, q)
    if va is None or vb is None or any(const_at(state, sa, p) is None for p in differ):
        raise ScheduleError(f"{prim}: the statements of each loop must be ordered by one constant")
    return differ, va, vb


def fuse(state: State, first: Loop, second: Loop, prim: str) -> tuple[State, Loop]:
    a, pa, sa = resolve(state, first, prim)
    b, pb, sb = resolve(state, second, prim)
    if pa != pb or a == b:
        raise ScheduleError(f"{prim}: the loops are not siblings at the same depth")
    differ, va, vb = _ordering_dim(state, sa, sb, pa, prim)
    if va > vb:
        raise ScheduleError(f"{prim}: {first.name} must come before {second.name}")
    n = len(state.dims)
    ins = [f"d{i}" for i in range(n)]
    changes = {}
    for name in state.maps:
        out = list(ins)
        if name in sa | sb:
            for p in differ:
                out[p] = str(const_at(state, sa, p))
            out.insert(pa + 1, str(va if name in sa else vb))
        else:
            out.insert(pa + 1, "0")
        changes[name] = transform(n, out)
    dims = [dict(r) for r in state.dims]
    dims.insert(pa + 1, {name: None for name in state.maps})
    for name in sb:
        dims[pa][name] = a
    loops = {k: v for k, v in state.loops.items() if k != b}
    loops[a] = LoopInfo(state.loops[a].name, sa | sb)
    new = replace(
        state,
        maps=remap(state.maps, changes),
        dims=tuple(dims),
        loops=loops,
        alias={**state.alias, b: a},
    )
    # the fused loop's iterations hold both bodies
    return restage(new, state.loops[b].name, loops[a].name), Loop(a, loops[a].name)


def distribute(
    state: State, loop: Loop, statements: tuple[str, ...], prim: str
) -> tuple[State, Loop]:
    lid, pos, stmts = resolve(state, loop, prim)
    moved = frozenset(statements)
    if not moved or not moved < stmts:
        raise ScheduleError(
            f"{prim}: name some but not all of the statements in {loop.name}: "
            f"{', '.join(sorted(stmts))}"
        )
    n = len(state.dims)
    ins = [f"d{i}" for i in range(n)]
    changes = {
        name: transform(n, ins[:pos] + ["1" if name in moved else "0"] + ins[pos:])
        for name in state.maps
    }
    name = state.loops[lid].name
    loops, new = add_loop(state.loops, state.next_id, f"{name}_d", moved)
    loops[lid] = LoopInfo(name, stmts - moved)
    dims = [dict(r) for r in state.dims]
    dims.insert(pos, {s: None for s in state.maps})
    for s in moved:
        dims[pos + 1][s] = new
    new_state = replace(
        state, maps=remap(state.maps, changes), dims=tuple(dims), loops=loops, next_id=new
    )
    return new_state, Loop(new, loops[new].name)


def pack(state: State) -> State:
    """The rows that order nothing dropped, per class of statements: the statements with one
    value at a constant d0 are a class, ordered against the others by d0 alone; in each, a row
    that is a constant equal for all of the class orders nothing inside it, and goes. Each
    class's remaining rows move up to d1, d2, ... (the rows of several classes shared, each
    statement padded with 0s): the order of every two instances is unchanged. A model's layers
    fused one after another (one class each) keep their own few rows, not all of each other's."""
    n = len(state.dims)
    if n < 2 or any(v is not None for v in state.dims[0].values()):
        return state

    def value(name: str, pos: int) -> int | None:  # a constant row's value, syntactic first
        v = state.maps[name].plain_get_val_if_fixed(isl.dim_type.out, pos)
        return const_at(state, [name], pos) if v.is_nan() else int(v.to_python())

    classes: dict[int, list[str]] = {}
    for name in state.maps:
        first = value(name, 0)
        if first is None:
            return state
        classes.setdefault(first, []).append(name)
    keep: dict[str, list[int]] = {}
    for names in classes.values():
        rows = [
            p
            for p in range(1, n)
            if any(state.dims[p][s] is not None for s in names)
            or len(values := {value(s, p) for s in names}) > 1
            or None in values
        ]
        keep.update({s: rows for s in names})
    width = 1 + max(len(rows) for rows in keep.values())
    if width == n:
        return state
    ins = [f"d{i}" for i in range(n)]
    changes = {
        s: transform(n, ["d0"] + [ins[p] for p in rows] + ["0"] * (width - 1 - len(rows)))
        for s, rows in keep.items()
    }
    dims = [dict(state.dims[0])] + [
        {s: state.dims[rows[k]][s] if k < len(rows) else None for s, rows in keep.items()}
        for k in range(width - 1)
    ]
    return replace(state, maps=remap(state.maps, changes), dims=tuple(dims))
