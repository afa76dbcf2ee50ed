"""Annotations: vectorize and tensorize a band of innermost loops.

They leave the order alone and mark loops for the lowering; an annotated loop is final (the
loop rewrites refuse it). Each checks that its band is parallel (`find_violation` over the
band), since the vector unit and the MAC array run the band's iterations at once.
"""

from __future__ import annotations

from dataclasses import replace

from tensorgen.errors import ScheduleError
from tensorgen.ir.core import Program
from tensorgen.poly.legality import find_violation
from tensorgen.schedule.state import Loop, State, resolve, union_map


def innermost_band(state: State, loops: tuple[Loop, ...], prim: str) -> tuple[int, int]:
    """The positions [lo, hi) of the band `loops`, which no loop of its statements is inside."""
    found = [resolve(state, lp, prim, modify=False) for lp in loops]
    positions = [p for _, p, _ in found]
    for name in found[0][2]:
        deeper = [
            p for p, row in enumerate(state.dims) if row[name] is not None and p > max(positions)
        ]
        if deeper:
            raise ScheduleError(
                f"{prim}: {name} has loops inside the band; the band must be innermost"
            )
    return min(positions), max(positions) + 1


def check_parallel(program: Program, state: State, band: tuple[Loop, ...], prim: str) -> None:
    """Refuse a band whose iterations may not run at once."""
    lo, hi = innermost_band(state, band, prim)
    stmts = resolve(state, band[0], prim, modify=False)[2]
    viol = find_violation(program, union_map(state), lo, hi, stmts)
    if viol is not None:
        raise ScheduleError(f"{prim}: {viol.sentence(parallel=True)}")


def _nest(state: State, statement: str) -> list[int]:
    """The positions of the loops around `statement`, outermost first."""
    return [p for p, row in enumerate(state.dims) if row[statement] is not None]


def vectorize(
    program: Program, state: State, loops: tuple[Loop, ...], prim: str, parallel: bool = True
) -> State:
    """`loops` marked vectorized; with `parallel`, once the band is checked parallel (without:
    verify_schedule checks it, before the schedule is lowered)."""
    found = [resolve(state, lp, prim, modify=False) for lp in loops]
    if len(loops) > 1:
        stmts = found[0][2]
        nest = _nest(state, next(iter(stmts)))
        ranks = [nest.index(p) if p in nest else -1 for _, p, _ in found]
        if any(st != stmts for _, _, st in found) or ranks != list(
            range(ranks[0], ranks[0] + len(loops))
        ):
            raise ScheduleError(
                f"{prim}: give distinct loops of the same statements, each directly "
                f"inside the one before"
            )
    if parallel:
        check_parallel(program, state, loops, prim)
    names = tuple(state.loops[lid].name for lid, _, _ in found)
    annotated = {**state.annotated, **{lid: "vectorized" for lid, _, _ in found}}
    return replace(state, vectorized=state.vectorized + names, annotated=annotated)


def tensorize(
    program: Program,
    state: State,
    ms: tuple[Loop, ...],
    n: Loop,
    ks: tuple[Loop, ...],
    prim: str,
    parallel: bool = True,
) -> State:
    """The band (ms, n, ks) marked tensorized; `parallel` as for vectorize."""
    loops = (*ms, n, *ks)
    found = [resolve(state, lp, prim, modify=False) for lp in loops]
    nest = _nest(state, next(iter(found[0][2])))
    ranks = sorted(nest.index(p) for _, p, _ in found if p in nest)
    if len(set(ranks)) != len(loops) or ranks[-1] - ranks[0] != len(loops) - 1:
        raise ScheduleError(f"{prim}: give distinct loops that are adjacent in the nest")
    if parallel:
        check_parallel(program, state, loops, prim)
    names = [state.loops[lid].name for lid, _, _ in found]
    band = (tuple(names[: len(ms)]), names[len(ms)], tuple(names[len(ms) + 1 :]))
    annotated = {**state.annotated, **{lid: "tensorized" for lid, _, _ in found}}
    return replace(state, tensorized=(*state.tensorized, band), annotated=annotated)
