"""compute_at: run producer statements inside a consumer's loop, per iteration of that loop.

Every instance of a producer is placed in the first iteration of the loop (lexicographically,
with the loops around it) that reads what the instance writes, directly or through the other
producers moved with it (an accumulator's init and reduction, read by the requantization that
writes the tensor the consumer reads). isl computes that iteration: the consumer's read
relation applied backwards to the loop's iterations (`{ tile -> element }`), composed with the
producer's writes and lexmin'd. So a producer computes, per consumer tile, exactly the region the
tile reads that no earlier tile has read: a halo read by two tiles is computed in the first
and kept (recomputing it would schedule an instance twice, which a schedule cannot).

The producers keep their own loops, inside the consumer's loop and before its body, with
their bounds narrowed by isl to the region of the iteration. Like every rewrite here, this one
checks nothing: `Schedule.compute_at` checks the dependences (a consumer statement inside the
loop that reads a value some later iteration writes is refused with a counterexample) and the
capacities.
"""

from __future__ import annotations

from dataclasses import replace

import islpy as isl

from tensorgen.errors import ScheduleError
from tensorgen.ir import poly
from tensorgen.ir.core import Program
from tensorgen.schedule.state import Loop, LoopInfo, State, prefix, resolve, transform


def _reads(program: Program, name: str, tensor: str) -> isl.Map | None:
    """{ S[i] -> T[e] }: the in-bounds elements of `tensor` that `name` reads (None: none)."""
    stmt = next(s for s in program.statements if s.name == name)
    out = None
    for acc in (a for a in stmt.reads if a.tensor == tensor):
        m = poly.access_map(stmt, acc).intersect_range(poly.tensor_box(program.tensor(acc.tensor)))
        out = m if out is None else out.union(m)
    return out


def _writes(program: Program, name: str) -> isl.Map:
    stmt = next(s for s in program.statements if s.name == name)
    return poly.access_map(stmt, stmt.lhs)


def _tiles(
    program: Program, state: State, moved: list[str], consumers: frozenset[str], pos: int, prim: str
) -> dict[str, isl.Map]:
    """Per moved statement, { S[i] -> [d0..d<pos>] }: the first iteration that needs it."""
    tiles = {c: prefix(state, c, pos) for c in consumers}
    order = [s.name for s in program.statements]
    for name in sorted(moved, key=order.index, reverse=True):
        written = _writes(program, name)
        tensor = next(s for s in program.statements if s.name == name).lhs.tensor
        need = None
        for reader, tile in tiles.items():
            if reader == name:
                continue
            reads = _reads(program, reader, tensor)
            if reads is None:
                continue
            via = written.apply_range(reads.reverse()).apply_range(tile)
            need = via if need is None else need.union(via)
        dom = poly.domain(next(s for s in program.statements if s.name == name))
        if need is None or not need.domain().is_equal(dom):
            missing = dom if need is None else dom.subtract(need.domain())
            point = missing.sample_point()
            raise ScheduleError(
                f"{prim}: {point} writes nothing that an iteration of the loop reads; "
                f"compute it elsewhere"
            )
        tiles[name] = need.lexmin()
    return {name: tiles[name] for name in moved}


def compute_at(
    program: Program, state: State, loop: Loop, statements: tuple[str, ...], prim: str
) -> State:
    lid, pos, consumers = resolve(state, loop, prim, modify=False)
    moved = list(dict.fromkeys(statements))
    unknown = [s for s in moved if s not in state.maps]
    if not moved or unknown:
        raise ScheduleError(f"{prim}: name the statements to move ({', '.join(unknown) or 'none'})")
    if set(moved) & consumers:
        raise ScheduleError(
            f"{prim}: {', '.join(sorted(set(moved) & consumers))} already run inside {loop.name}"
        )
    n = len(state.dims)
    here = next(iter(consumers))
    tile_rows = [state.dims[p][here] for p in range(pos + 1)]
    own: dict[int, set[str]] = {}  # the moved statements' loops, which they take along
    for name in moved:
        for p in range(n):
            loop_id = state.dims[p][name]
            if loop_id is not None and (p > pos or loop_id != tile_rows[p]):
                own.setdefault(loop_id, set()).add(name)
    for loop_id in own:
        if not state.loops[loop_id].statements <= set(moved):
            others = sorted(state.loops[loop_id].statements - set(moved))
            raise ScheduleError(
                f"{prim}: loop {state.loops[loop_id].name} also encloses {', '.join(others)}; "
                f"distribute it first"
            )
    tiles = _tiles(program, state, moved, consumers, pos, prim)
    ins = [f"d{i}" for i in range(n)]
    maps, dims = {}, [dict() for _ in range(pos + 2 + n)]
    for name, m in state.maps.items():
        if name in tiles:
            inner = ["0"] + [
                "0" if (p <= pos and state.dims[p][name] == tile_rows[p]) else ins[p]
                for p in range(n)
            ]
            maps[name] = tiles[name].flat_range_product(m.apply_range(transform(n, inner)))
            rows = (
                tile_rows
                + [None]
                + [
                    None
                    if (p <= pos and state.dims[p][name] == tile_rows[p])
                    else state.dims[p][name]
                    for p in range(n)
                ]
            )
        else:
            out = ins[: pos + 1] + ["1"] + ins[pos + 1 :] + ["0"] * (pos + 1)
            maps[name] = m.apply_range(transform(n, out))
            rows = [state.dims[p][name] for p in range(pos + 1)] + [None]
            rows += [state.dims[p][name] for p in range(pos + 1, n)] + [None] * (pos + 1)
        for p, v in enumerate(rows):
            dims[p][name] = v
    loops = dict(state.loops)
    for loop_id in {r for r in tile_rows if r is not None}:
        info = loops[loop_id]
        loops[loop_id] = LoopInfo(info.name, info.statements | set(moved))
    return replace(state, maps=maps, dims=tuple(dims), loops=loops)
