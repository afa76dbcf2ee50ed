"""Exact legality of schedules against isl dependences, with concrete counterexamples.

A schedule maps every statement instance to a point of one common schedule
space; it is legal when every dependence source runs strictly before its sink.
Dependences between instances of one accumulating statement (`+=`, `max=`)
through its own LHS element are relaxed: integer addition and max are
associative and commutative, so any order of the reduction gives the same bits.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import islpy as isl

from tensorgen.ir import poly
from tensorgen.ir.core import Program, Statement
from tensorgen.poly.deps import dependences


@dataclass(frozen=True)
class Violation:
    """`later` would run no later than `earlier`, though it depends on it through `element`."""

    earlier: str  # e.g. "S3[t=0, j=5]"
    later: str
    element: str  # e.g. "H[1, 5]"
    kind: str  # "flow", "anti", "output"

    def sentence(self, parallel: bool = False) -> str:
        e, later = self.earlier.split("[")[0], self.later.split("[")[0]
        if self.kind == "flow":
            why = f"{later} reads {self.element} that {e} writes"
        elif self.kind == "anti":
            why = f"{later} overwrites {self.element} that {e} must read first"
        else:
            why = f"both write {self.element} and {e}'s value must be overwritten by {later}'s"
        if parallel:
            return f"{self.earlier} and {self.later} would run at once, but {why}"
        return f"{self.later} would run before {self.earlier}, but {why}"


def relaxed_dependences(program: Program) -> tuple[tuple[str, isl.UnionMap], ...]:
    """(kind, dependences) with integer reduction self-dependences removed; worked out once per
    structure: what isl's dataflow reads of a program (its statements' domains, accesses and
    order, and its tensors' shapes), not the constants of their right-hand sides, so that the
    structurally identical layers of a model (autosched/replay.py) share them."""
    key = (
        program.shared_loops,
        tuple((t.name, t.shape) for t in program.tensors),
        tuple(
            (s.name, s.op, s.lhs, tuple(s.reads), s.indices, s.bounds, s.where)
            for s in program.statements
        ),
    )
    hit = _RELAXED.get(key)
    if hit is not None:
        return hit
    deps = dependences(program)
    relax = isl.UnionMap("{ }")
    for stmt in program.statements:
        if stmt.op in ("+=", "max=") and all(a.tensor != stmt.lhs.tensor for a in stmt.reads):
            w = poly.access_map(stmt, stmt.lhs)
            relax = relax.union(isl.UnionMap.from_map(w.apply_range(w.reverse())))
    out = tuple(
        (kind, d.subtract(relax).coalesce())
        for kind, d in (("flow", deps.flow), ("anti", deps.anti), ("output", deps.output))
    )
    if len(_RELAXED) >= RELAXED_CACHE:
        del _RELAXED[next(iter(_RELAXED))]
    _RELAXED[key] = out
    return out


RELAXED_CACHE = 64  # programs' dependences remembered, by structure (the oldest forgotten first)
_RELAXED: dict[tuple, tuple[tuple[str, isl.UnionMap], ...]] = {}


def _coords(point: isl.Point, n: int, offset: int = 0) -> list[int]:
    return [
        int(point.get_coordinate_val(isl.dim_type.set, offset + i).to_python()) for i in range(n)
    ]


def instance(stmt: Statement, values: list[int]) -> str:
    return (
        f"{stmt.name}[{', '.join(f'{i}={v}' for i, v in zip(stmt.indices, values, strict=False))}]"
    )


def _linking_element(
    program: Program, kind: str, src: Statement, sv: list[int], dst: Statement, dv: list[int]
) -> str:
    """An element through which the dependence of `kind` runs: written by the source and read by
    the sink (flow), read then written (anti), or written by both (output)."""

    def touched(stmt: Statement, values: list[int], mode: str) -> isl.UnionSet:
        fix = " and ".join(f"{i} = {v}" for i, v in zip(stmt.indices, values, strict=False))
        point = isl.Set(f"{{ {stmt.name}[{', '.join(stmt.indices)}] : {fix} }}")
        out = isl.UnionSet("{ }")
        reads = stmt.reads + ([stmt.lhs] if stmt.op != "=" else [])
        for acc in [stmt.lhs] if mode == "write" else reads:
            m = (
                poly.access_map(stmt, acc)
                .intersect_domain(point)
                .intersect_range(poly.tensor_box(program.tensor(acc.tensor)))
            )
            out = out.union(isl.UnionSet.from_set(m.range()))
        return out

    modes = {"flow": ("write", "read"), "anti": ("read", "write"), "output": ("write", "write")}[
        kind
    ]
    common = touched(src, sv, modes[0]).intersect(touched(dst, dv, modes[1]))
    sets = common.get_set_list()
    if sets.n_set() == 0:
        return "an element"
    s = sets.get_at(0)
    p = s.sample_point()
    return f"{s.get_tuple_name()}[{', '.join(map(str, _coords(p, s.dim(isl.dim_type.set))))}]"


def find_violation(
    program: Program,
    schedule: isl.UnionMap,
    parallel_from: int | None = None,
    parallel_to: int | None = None,
    among: frozenset[str] | None = None,
) -> Violation | None:
    """A dependence the schedule breaks, or None.

    Without `parallel_*`, a dependence is broken when its sink is not scheduled strictly after
    its source. With them, dimensions [parallel_from, parallel_to) run at once (vector lanes,
    the MAC array): a dependence whose endpoints agree on every dimension before them and differ
    inside them is broken too; `among` limits that check to the statements of the band.
    A legal schedule is remembered by its text (the lowering checks again what the search and
    the schedule's primitives did).
    """
    key = (_structure(program), str(schedule), parallel_from, parallel_to, among)
    if key in _LEGAL:
        return None
    viol = _find_violation(program, schedule, parallel_from, parallel_to, among)
    if viol is None:
        if len(_LEGAL) >= LEGAL_CACHE:
            del _LEGAL[next(iter(_LEGAL))]
        _LEGAL[key] = None
    return viol


LEGAL_CACHE = 1024  # legal schedules remembered (the oldest forgotten first)
_LEGAL: dict[tuple, None] = {}


@lru_cache(maxsize=64)
def _structure(program: Program) -> tuple[str, ...]:
    """All that the verdict of `_find_violation` reads of `program`: the text of every statement
    domain and of the relaxed dependences. Layers that differ only in names of tensors or
    constants (structurally identical layers of a model) share it, and so their legal schedules."""
    domains = tuple(f"{s.name}:{poly.domain(s)}" for s in program.statements)
    return domains + tuple(f"{kind}:{deps}" for kind, deps in relaxed_dependences(program))


@lru_cache(maxsize=256)
def _bad_order(dims: int, parallel_from: int | None, parallel_to: int | None) -> isl.Map:
    """The pairs (a, b) of schedule points where b does not run strictly after a (or, with
    `parallel_*`, where they agree before the band and differ inside it). Parsed once per
    shape: islpy's maps are values, every operation returns a new one."""
    if parallel_from is None:
        return isl.Map.lex_ge(isl.Space.set_alloc(isl.DEFAULT_CONTEXT, 0, dims))
    eq = " and ".join(f"a{i} = b{i}" for i in range(parallel_from)) or "true"
    diff = " or ".join(f"a{i} != b{i}" for i in range(parallel_from, parallel_to))
    a = ", ".join(f"a{i}" for i in range(dims))
    b = ", ".join(f"b{i}" for i in range(dims))
    return isl.Map(f"{{ [{a}] -> [{b}] : {eq} and ({diff}) }}")


def _breaks_any(
    program: Program,
    schedule: isl.UnionMap,
    parallel_from: int | None,
    parallel_to: int | None,
    among: frozenset[str] | None,
) -> bool:
    """Whether some dependence is broken: the verdict of `_counterexample`, computed by
    carrying each dependence into the schedule space (its size follows the dependences) rather
    than building the order between all pairs of statements (quadratic in the statements)."""
    bad = isl.UnionMap.from_map(_bad_order(_n_out(schedule), parallel_from, parallel_to))
    if among is not None:
        schedule = _only(program, schedule, among)
    for _, deps in relaxed_dependences(program):
        carried = deps.apply_domain(schedule).apply_range(schedule)
        if not carried.intersect(bad).is_empty():
            return True
    return False


def _only(program: Program, schedule: isl.UnionMap, among: frozenset[str]) -> isl.UnionMap:
    """`schedule` of the statements named in `among` alone."""
    keep = isl.UnionSet("{ }")
    for stmt in program.statements:
        if stmt.name in among:
            keep = keep.union(isl.UnionSet.from_set(poly.domain(stmt)))
    return schedule.intersect_domain(keep)


def _find_violation(
    program: Program,
    schedule: isl.UnionMap,
    parallel_from: int | None,
    parallel_to: int | None,
    among: frozenset[str] | None,
) -> Violation | None:
    if not _breaks_any(program, schedule, parallel_from, parallel_to, among):
        return None
    return _counterexample(program, schedule, parallel_from, parallel_to, among)


def _counterexample(
    program: Program,
    schedule: isl.UnionMap,
    parallel_from: int | None,
    parallel_to: int | None,
    among: frozenset[str] | None,
) -> Violation | None:
    """The first broken dependence (by kind) with a sample pair of instances, from the order
    between all pairs of statements (only run once `_breaks_any` found one)."""
    bad = _bad_order(_n_out(schedule), parallel_from, parallel_to)
    if among is not None:  # only the band's statements: the order among all of them is
        # quadratic in the program's statements (a 100-statement program took a minute)
        schedule = _only(program, schedule, among)
    order = schedule.apply_range(isl.UnionMap.from_map(bad)).apply_range(schedule.reverse())
    by_name = {s.name: s for s in program.statements}
    for kind, deps in relaxed_dependences(program):
        viol = deps.intersect(order)
        if viol.is_empty():
            continue
        m = viol.get_map_list().get_at(0)
        p = m.wrap().sample_point()
        src, dst = (
            by_name[m.get_tuple_name(isl.dim_type.in_)],
            by_name[m.get_tuple_name(isl.dim_type.out)],
        )
        sv, dv = _coords(p, len(src.indices)), _coords(p, len(dst.indices), len(src.indices))
        return Violation(
            instance(src, sv),
            instance(dst, dv),
            _linking_element(program, kind, src, sv, dst, dv),
            kind,
        )
    return None


def _n_out(umap: isl.UnionMap) -> int:
    return umap.get_map_list().get_at(0).dim(isl.dim_type.out)
