"""The value a `Schedule` holds: one frozen record per step of the schedule.

Every primitive of loops.py, annotate.py and memory.py is a function from a `State` (and its
arguments) to a new `State`; the `Schedule` of api.py checks the new one against the
dependences and adopts it. A state is never changed once built (its dicts are built fresh by
each rewrite and only read afterwards), so undoing a refused step is keeping the old one.

Per statement, `maps[S]` places its instances in the common schedule space
`[d0, ..., dn]`; `dims[p][S]` says what dimension p is for S: the id of a loop, or None for a
constant that orders siblings.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import lru_cache

import islpy as isl

from tensorgen.errors import ScheduleError
from tensorgen.ir import poly
from tensorgen.ir.core import Program

MEMORIES = ("spad", "acc")


@dataclass(frozen=True)
class Loop:
    """A handle on one loop; it stays valid across transformations of the schedule."""

    id: int
    name: str

    def __repr__(self) -> str:
        return f"Loop({self.name!r})"


@dataclass(frozen=True)
class LoopInfo:
    name: str
    statements: frozenset[str]


@dataclass(frozen=True)
class Stage:
    tensor: str
    loop: str  # loop name, or "" for the whole program
    memory: str
    double_buffered: bool = False
    # the buffer's dimension order, outermost first (None: the tensor's)
    layout: tuple[int, ...] | None = None


# a tensorized band: (m loops, n loop, k loops), by name
Band = tuple[tuple[str, ...], str, tuple[str, ...]]


@dataclass(frozen=True)
class State:
    maps: Mapping[str, isl.Map]  # statement -> { S[indices] -> [d0, ..., dn] }
    dims: tuple[Mapping[str, int | None], ...]  # per position: statement -> loop id or None
    loops: Mapping[int, LoopInfo]
    alias: Mapping[int, int] = field(default_factory=dict)  # fused-away loop id -> surviving id
    # split loop id -> names: (it, outer, inner)
    split_into: Mapping[int, tuple[str, str, str]] = field(default_factory=dict)
    next_id: int = 0
    stages: tuple[Stage, ...] = ()
    vectorized: tuple[str, ...] = ()
    tensorized: tuple[Band, ...] = ()
    annotated: Mapping[int, str] = field(default_factory=dict)  # loop id -> "vectorized", ...


def add_loop(
    loops: Mapping[int, LoopInfo], next_id: int, name: str, statements: Iterable[str]
) -> tuple[dict[int, LoopInfo], int]:
    """`loops` with one more loop called `name` (or `name2`, ... if taken), and its id."""
    taken = {info.name for info in loops.values()}
    base, n = name, 1
    while name in taken:
        n += 1
        name = f"{base}{n}"
    return {**loops, next_id + 1: LoopInfo(name, frozenset(statements))}, next_id + 1


@lru_cache(maxsize=64)
def original(program: Program) -> State:
    """Program order: shared loops, then statements in order, each with its own loop nest.
    Built once per program (the search starts a schedule of each layer from it many times; a
    State is a value: every primitive returns a new one)."""
    shared = program.shared_names
    depth = max(len(s.indices) - len(shared) for s in program.statements)
    names = [s.name for s in program.statements]
    loops: dict[int, LoopInfo] = {}
    next_id = 0
    dims: list[dict[str, int | None]] = []
    for name in shared:
        loops, next_id = add_loop(loops, next_id, name, names)
        dims.append({n: next_id for n in names})
    dims.append({n: None for n in names})  # statement order
    own_names: dict[str, int] = {}
    for s in program.statements:
        for i in s.indices[len(shared) :]:
            own_names[i] = own_names.get(i, 0) + 1
    for level in range(depth):
        row: dict[str, int | None] = {}
        for s in program.statements:
            own = s.indices[len(shared) :]
            row[s.name] = None
            if level < len(own):
                label = own[level] if own_names[own[level]] == 1 else f"{s.name}.{own[level]}"
                loops, next_id = add_loop(loops, next_id, label, [s.name])
                row[s.name] = next_id
        dims.append(row)
    maps = {}
    for pos, s in enumerate(program.statements):
        own = list(s.indices[len(shared) :])
        out = list(shared) + [str(pos)] + own + ["0"] * (depth - len(own))
        maps[s.name] = isl.Map(
            f"{{ {s.name}[{', '.join(s.indices)}] -> [{', '.join(out)}] }}"
        ).intersect_domain(poly.domain(s))
    return State(maps, tuple(dims), loops, next_id=next_id)


def live_loops(state: State) -> list[str]:
    return sorted(i.name for lid, i in state.loops.items() if lid not in state.alias)


def find(state: State, name: str) -> Loop:
    """The loop called `name`, or a ScheduleError that lists the loops there are."""
    for lid, info in state.loops.items():
        if info.name == name and lid not in state.alias:
            return Loop(lid, name)
    was = next(
        (
            f"; {name} was split into {o} and {i}"
            for n, o, i in state.split_into.values()
            if n == name
        ),
        "",
    )
    raise ScheduleError(
        f"loop('{name}'): no such loop (loops: {', '.join(live_loops(state))}){was}"
    )


def resolve(
    state: State, loop: Loop, prim: str, modify: bool = True
) -> tuple[int, int, frozenset[str]]:
    """(loop id, position, statements) of a handle; `modify`: the primitive reshapes the loop."""
    if not isinstance(loop, Loop):
        raise ScheduleError(f"{prim}: expected a loop handle (s.loop(name)), got {loop!r}")
    lid = loop.id
    while lid in state.alias:
        lid = state.alias[lid]
    if lid in state.split_into:
        _, o, i = state.split_into[lid]
        raise ScheduleError(
            f"{prim}: {loop.name} was split into {o} and {i}; use the loops split returned"
        )
    if lid not in state.loops:
        raise ScheduleError(f"{prim}: {loop.name} is not a loop of this schedule")
    if modify and lid in state.annotated:
        raise ScheduleError(
            f"{prim}: {loop.name} is {state.annotated[lid]}; transform loops before "
            f"vectorizing or tensorizing them"
        )
    for pos, row in enumerate(state.dims):
        if lid in row.values():
            return lid, pos, state.loops[lid].statements
    raise ScheduleError(f"{prim}: {loop.name} no longer exists")


def name_of(state: State, loop: Loop) -> str:
    """The name `loop` goes by now (a fused-away loop's handle: the surviving loop's)."""
    lid = loop.id
    while lid in state.alias:
        lid = state.alias[lid]
    info = state.loops.get(lid)
    return info.name if info is not None else loop.name


def union_map(state: State) -> isl.UnionMap:
    out = isl.UnionMap("{ }")
    for m in state.maps.values():
        out = out.union(isl.UnionMap.from_map(m))
    return out


def transform(n: int, out: list[str]) -> isl.Map:
    """`{ [d0..d<n-1>] -> [out...] }`."""
    key = (n, tuple(out))
    hit = _TRANSFORMS.get(key)
    if hit is None:
        ins = ", ".join(f"d{i}" for i in range(n))
        hit = isl.Map(f"{{ [{ins}] -> [{', '.join(out)}] }}")
        if isinstance(hit, isl.Map) and len(_TRANSFORMS) < TRANSFORM_CACHE:
            _TRANSFORMS[key] = hit
    return hit


# transforms parsed once: the search's skeletons ask for the same few again and again (islpy's
# maps are values: every operation on one returns a new map, so one may be shared)
TRANSFORM_CACHE = 1 << 12
_TRANSFORMS: dict[tuple, isl.Map] = {}


def remap(maps: Mapping[str, isl.Map], changes: Mapping[str, isl.Map]) -> dict[str, isl.Map]:
    """`maps` with the maps of the statements in `changes` composed with their transform."""
    return {s: applied(m, changes[s]) if s in changes else m for s, m in maps.items()}


def applied(sched: isl.Map, change: isl.Map) -> isl.Map:
    """`sched.apply_range(change)`, remembered per pair of maps by identity (`_remembered`). The
    search starts each skeleton of a layer from the same `original` state and takes the same
    first steps with the same parsed transforms (`transform` shares them), so the same
    compositions come back again and again; each result is the schedule map of the state that
    follows, so the next step's key is a hit too."""
    return _remembered(
        ("applied", id(sched), id(change)), (sched, change), lambda: sched.apply_range(change)
    )


def prefix(state: State, statement: str, pos: int) -> isl.Map:
    """{ S[i] -> [d0..d<pos>] }: the schedule of `statement` up to dimension `pos`."""
    sched = state.maps[statement]
    return _derived("prefix", sched, pos, lambda: _prefix(sched, pos))


def _prefix(sched: isl.Map, pos: int) -> isl.Map:
    out = sched.project_out(isl.dim_type.out, pos + 1, sched.dim(isl.dim_type.out) - pos - 1)
    for k in range(pos + 1):
        out = out.set_dim_name(isl.dim_type.out, k, f"d{k}")
    return out


def width(state: State, statement: str, pos: int) -> int:
    """How many values dimension `pos` of `statement`'s schedule takes, its least to its
    greatest (remembered per map: the search's skeletons ask it of the same maps again)."""
    sched = state.maps[statement]
    return _derived("width", sched, pos, lambda: _width(sched, pos))


def _width(sched: isl.Map, pos: int) -> int:
    rng = sched.range()
    lo, hi = rng.dim_min(pos).min_val(), rng.dim_max(pos).max_val()
    return int(hi.to_python() - lo.to_python()) + 1


def const_at(state: State, statements: Iterable[str], pos: int) -> int | None:
    """The constant value of dimension `pos` shared by `statements`, or None."""
    values = set()
    for name in statements:
        sched = state.maps[name]
        v = _derived("const", sched, pos, lambda m=sched: _const_dim(m, pos))
        if v is None:
            return None
        values.add(v)
    return values.pop() if len(values) == 1 else None


def _const_dim(sched: isl.Map, pos: int) -> int | None:
    fixed = fixed_by_equality(sched, pos)
    if fixed is not None:
        return fixed
    v = sched.range().dim_max(pos)
    if not v.is_cst():
        return None
    return int(v.get_pieces()[0][1].get_constant_val().to_python())


def fixed_by_equality(sched: isl.Map, pos: int) -> int | None:
    """The value c of an explicit equality `d<pos> = c` of a map of one basic map, or None (then
    isl decides). Read off isl's equality matrix (microseconds; projecting the range and
    taking its dim_max takes a hundred): every point of such a map has d<pos> = c, so that is
    the dim_max `_const_dim` would compute (a schedule map is never empty: it places the
    instances of its statement)."""
    if sched.n_basic_map() != 1:
        return None
    t = isl.dim_type
    rows = sched.get_basic_maps()[0].equalities_matrix(t.out, t.in_, t.param, t.div, t.cst)
    width = rows.cols() - 1
    for r in range(rows.rows()):
        a = rows.get_element_val(r, pos)
        if a.is_zero() or any(
            not rows.get_element_val(r, c).is_zero() for c in range(width) if c != pos
        ):
            continue
        k = rows.get_element_val(r, width)  # a * d + k = 0
        value = k.neg().div(a)
        return int(value.to_python()) if value.is_int() else None
    return None


def _derived(kind: str, sched: isl.Map, pos: int, compute):
    """`compute()`, remembered per schedule map and position (`_remembered`)."""
    return _remembered((kind, id(sched), pos), (sched,), compute)


def _remembered(key: tuple, maps: tuple[isl.Map, ...], compute):
    """`compute()`, remembered under `key` (built of the ids of `maps`): valid because a
    state's maps are shared by the states derived from it and never change (islpy's
    operations return new maps), and the entry holds `maps`, so their ids are not reused."""
    hit = _REMEMBERED.get(key)
    if hit is not None and all(a is b for a, b in zip(hit[0], maps, strict=True)):
        return hit[1]
    value = compute()
    if len(_REMEMBERED) >= REMEMBERED:
        del _REMEMBERED[next(iter(_REMEMBERED))]
    _REMEMBERED[key] = (maps, value)
    return value


# prefixes, constant dimensions, widths and compositions remembered (the oldest forgotten first)
REMEMBERED = 1 << 15
_REMEMBERED: dict[tuple, tuple[tuple[isl.Map, ...], object]] = {}
