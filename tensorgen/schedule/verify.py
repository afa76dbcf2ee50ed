"""The schedule verifier: re-check a finished schedule from its state alone.

The primitives check each step as they take it; `verify_schedule` checks the result again
without trusting how it was built (a schedule rebuilt unchecked, a state edited by hand, a
bug in a rewrite): every statement instance scheduled exactly once, loops that nest (one
row per loop, the statements under a loop sharing everything above it), the order legal
against the program's dependences (poly/legality), vector and MAC bands innermost and
parallel, stages at loops that exist, and the memories' capacities. A failure is one
`ScheduleError` line naming what is at fault: the statement, the loop, the band's primitive,
or the step of the trace that first makes the order illegal.
"""

from __future__ import annotations

import islpy as isl

from tensorgen.errors import CapacityError, ScheduleError
from tensorgen.ir import poly
from tensorgen.ir.core import Program
from tensorgen.poly.legality import find_violation
from tensorgen.schedule.memory import check_capacity
from tensorgen.schedule.state import MEMORIES, State, fixed_by_equality, union_map

WHO = "verify_schedule"


def verify_schedule(schedule) -> None:
    """Raise a one-line ScheduleError (CapacityError for capacities) if `schedule` is wrong."""
    program, state = schedule.program, schedule.state
    _check_statements(program, state)
    _check_nesting(state)
    _check_stages(program, state)
    _check_order(schedule)
    _check_bands(program, state)
    try:
        check_capacity(program, state, schedule.target, WHO)
    except CapacityError as err:
        raise CapacityError(str(err)) from None


def _check_statements(program: Program, state: State) -> None:
    """Every instance of every statement is at exactly one point, and no two share one."""
    names = [s.name for s in program.statements]
    extra = sorted(set(state.maps) - set(names))
    if extra:
        raise ScheduleError(f"{WHO}: {extra[0]} is not a statement of {program.name}")
    for stmt in program.statements:
        m = state.maps.get(stmt.name)
        if m is None:
            raise ScheduleError(f"{WHO}: statement {stmt.name} is not scheduled")
        missing = poly.domain(stmt).subtract(m.domain())
        if not missing.is_empty():
            raise ScheduleError(f"{WHO}: {_point(missing)} is not scheduled")
        if not m.domain().is_subset(poly.domain(stmt)):
            raise ScheduleError(
                f"{WHO}: statement {stmt.name} schedules instances it does not have"
            )
        if not m.is_single_valued():
            raise ScheduleError(f"{WHO}: statement {stmt.name}: an instance is scheduled twice")
    if not _injective(list(state.maps.values())):
        raise ScheduleError(f"{WHO}: two statement instances are scheduled at the same point")


def _injective(maps: list[isl.Map]) -> bool:
    """Whether the union of the statements' schedules (one map each, of distinct domains) is
    injective: each map is, and no two ranges meet (ranges of different spaces never do).
    isl's `is_injective` on the union map answers the same, some three times slower."""
    if not all(m.is_injective() for m in maps):
        return False
    ranges = [m.range() for m in maps]
    return all(
        a.get_space() != b.get_space() or a.is_disjoint(b)
        for k, a in enumerate(ranges)
        for b in ranges[:k]
    )


def _point(points: isl.Set) -> str:
    """One point of `points` as `S[i=0, j=3]`."""
    p = points.sample_point()
    space = points.get_space()
    coords = [
        f"{space.get_dim_name(isl.dim_type.set, k)}="
        f"{p.get_coordinate_val(isl.dim_type.set, k).to_python()}"
        for k in range(points.dim(isl.dim_type.set))
    ]
    return f"{points.get_tuple_name()}[{', '.join(coords)}]"


def _constants(state: State) -> dict[tuple[str, int], int | None]:
    """(statement, position) -> the value of each constant row (None: the row is no constant)."""
    out = {}
    for name, m in state.maps.items():
        rng = m.range()
        n = rng.dim(isl.dim_type.set)
        nonempty = None
        for pos, row in enumerate(state.dims):
            if row.get(name, 0) is None:
                # an explicit equality d<pos> = c of a map that is not empty fixes the row at c
                # in every point: the singleton isl's projection gives, read off the
                # constraints in microseconds; otherwise isl decides
                fixed = fixed_by_equality(m, pos)
                if fixed is not None and nonempty is None:
                    nonempty = not m.is_empty()
                if fixed is not None and nonempty:
                    out[name, pos] = fixed
                    continue
                one = rng.project_out(isl.dim_type.set, pos + 1, n - pos - 1).project_out(
                    isl.dim_type.set, 0, pos
                )
                point = one.sample_point() if one.is_singleton() else None
                out[name, pos] = (
                    None
                    if point is None
                    else int(point.get_coordinate_val(isl.dim_type.set, 0).to_python())
                )
    return out


def _check_nesting(state: State) -> None:
    """One row per loop, with the statements the loop says; constants in constant rows; the
    statements under a loop share every row above it (loop and constant alike)."""
    n = len(state.dims)
    rows: dict[int, int] = {}
    for name, m in state.maps.items():
        if m.dim(isl.dim_type.out) != n:
            raise ScheduleError(
                f"{WHO}: statement {name} has {m.dim(isl.dim_type.out)} schedule dimensions, "
                f"the loop nest {n}"
            )
    consts = _constants(state)
    for pos, row in enumerate(state.dims):
        if set(row) != set(state.maps):
            raise ScheduleError(f"{WHO}: row d{pos} does not place every statement")
        for name, lid in row.items():
            if lid is None:
                if consts[name, pos] is None:
                    raise ScheduleError(f"{WHO}: statement {name}: d{pos} is no constant")
                continue
            info = state.loops.get(lid)
            if info is None:
                raise ScheduleError(f"{WHO}: statement {name}: d{pos} is a loop that is gone")
            if rows.setdefault(lid, pos) != pos:
                raise ScheduleError(f"{WHO}: loop {info.name} is at d{rows[lid]} and d{pos}")
            if name not in info.statements:
                raise ScheduleError(f"{WHO}: loop {info.name} encloses {name} but does not say so")
    for lid, info in state.loops.items():
        if lid not in rows:
            raise ScheduleError(f"{WHO}: loop {info.name} encloses no statement")
        _check_loop(state, consts, info.name, rows[lid], lid)


def _check_loop(state: State, consts, name: str, pos: int, lid: int) -> None:
    stmts = state.loops[lid].statements
    under = {s for s, v in state.dims[pos].items() if v == lid}
    if under != set(stmts):
        raise ScheduleError(
            f"{WHO}: loop {name} says it encloses {', '.join(sorted(stmts))} "
            f"but d{pos} places {', '.join(sorted(under))} in it"
        )
    first = min(stmts)
    for q in range(pos):
        above = {state.dims[q][s] for s in stmts}
        values = {consts[s, q] for s in stmts} if above == {None} else {0}
        if len(above) != 1 or len(values) != 1:
            raise ScheduleError(
                f"{WHO}: loop {name} encloses {first} and statements outside its parent at d{q}"
            )


def _check_stages(program: Program, state: State) -> None:
    live = {i.name for lid, i in state.loops.items() if lid not in state.alias}
    tensors = {t.name for t in program.tensors}
    for stage in state.stages:
        where = f"stage({stage.tensor}, {stage.loop or 'the program'}, {stage.memory})"
        if stage.tensor not in tensors:
            raise ScheduleError(f"{WHO}: {where}: no tensor {stage.tensor}")
        if stage.memory not in MEMORIES:
            raise ScheduleError(f"{WHO}: {where}: no memory {stage.memory}")
        if stage.loop and stage.loop not in live:
            raise ScheduleError(f"{WHO}: {where}: no loop {stage.loop}")


def _check_order(schedule) -> None:
    """The order against the dependences; a violation names the step that first makes it."""
    viol = find_violation(schedule.program, schedule.union_map())
    if viol is None:
        return
    raise ScheduleError(f"{WHO}: {_culprit(schedule)}: {viol.sentence()}")


def _culprit(schedule) -> str:
    """The first step of the trace after which the order (rebuilt unchecked) is illegal."""
    from tensorgen.schedule.api import Schedule  # api is above this module
    from tensorgen.schedule.steps import apply

    again = Schedule(schedule.program, schedule.target, checked=False)
    for step in schedule.trace:
        try:
            apply(again, step)
        except ScheduleError:
            return str(step)
        if find_violation(schedule.program, again.union_map()) is not None:
            return str(step)
    return "the schedule (no step of its trace makes this order)"


def _loop_row(state: State, name: str, prim: str) -> tuple[int, frozenset[str]]:
    for lid, info in state.loops.items():
        if info.name == name and lid not in state.alias:
            for pos, row in enumerate(state.dims):
                if lid in row.values():
                    if state.annotated.get(lid) is None:
                        raise ScheduleError(f"{WHO}: {prim}: {name} is not marked as annotated")
                    return pos, info.statements
    raise ScheduleError(f"{WHO}: {prim}: no loop {name}")


def _check_bands(program: Program, state: State) -> None:
    """Vectorized and tensorized bands: innermost, adjacent and parallel."""
    bands: list[tuple[str, tuple[str, ...]]] = []
    groups: dict[frozenset[str], list[str]] = {}
    for name in state.vectorized:
        _, stmts = _loop_row(state, name, f"vectorize({name})")
        groups.setdefault(stmts, []).append(name)
    bands += [(f"vectorize({', '.join(names)})", tuple(names)) for names in groups.values()]
    for ms, n, ks in state.tensorized:
        names = (*ms, n, *ks)
        bands.append((f"tensorize({', '.join(names)})", names))
    umap = union_map(state)
    for prim, names in bands:
        found = [_loop_row(state, x, prim) for x in names]
        stmts = found[0][1]
        positions = sorted(p for p, _ in found)
        if prim.startswith("vectorize") and any(st != stmts for _, st in found):
            raise ScheduleError(f"{WHO}: {prim}: the loops enclose different statements")
        for s in sorted(stmts):
            if any(row[s] is not None for row in state.dims[positions[-1] + 1 :]):
                raise ScheduleError(f"{WHO}: {prim}: {s} has loops inside the band")
        viol = find_violation(program, umap, positions[0], positions[-1] + 1, stmts)
        if viol is not None:
            raise ScheduleError(f"{WHO}: {prim}: {viol.sentence(parallel=True)}")
