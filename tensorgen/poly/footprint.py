"""Footprints of accesses over a tile, as boxes whose origin is affine in the tile origins.

A tile of statement S is `{ S[i] : o_i <= i < o_i + size_i }` with the tile
origins `o_i` as isl parameters; the footprint of an access is the image of the
tile, and its rectangular hull (`dim_min`/`dim_max`) gives the DMA box: an
offset affine in the origins and a constant size.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import islpy as isl

from tensorgen.errors import CodegenError
from tensorgen.ir.core import Access, Statement
from tensorgen.ir.poly import access_text


@dataclass(frozen=True)
class FootprintBox:
    """offset[d] = const[d] + sum(coef * origin[name]); size[d] constant."""

    offset: tuple[tuple[int, tuple[tuple[str, int], ...]], ...]
    size: tuple[int, ...]

    @property
    def elements(self) -> int:
        n = 1
        for s in self.size:
            n *= s
        return n


def _origin_prefix(names: set[str]) -> str:
    """A prefix `p` such that no `p + name` is itself one of `names`: the origin parameter of
    index `i` must not be the index `o_i` of the same statement (isl would read one name twice)."""
    prefix = "o_"
    while any(prefix + n in names for n in names):
        prefix = "o" + prefix
    return prefix


def _tile_map(
    stmt: Statement, access: Access, sizes: tuple[tuple[str, int], ...], prefix: str
) -> isl.Map:
    params = ", ".join(prefix + n for n in stmt.indices)
    cons = [f"{prefix}{n} <= {n} < {prefix}{n} + {dict(sizes)[n]}" for n in stmt.indices]
    idx, table = access_text(access, stmt.indices)
    return isl.Map(
        f"[{params}] -> {{ [{', '.join(stmt.indices)}] -> {access.tensor}[{idx}] : {' and '.join([*cons, table])} }}"
    )


@lru_cache(maxsize=4096)
def footprint(
    uses: tuple[tuple[Statement, Access, tuple[tuple[str, int], ...]], ...],
) -> FootprintBox:
    """Rectangular hull of the union of `uses` (statement, access, tile sizes per index)."""
    prefix = _origin_prefix({n for stmt, _, _ in uses for n in stmt.indices})
    union = None
    for stmt, access, sizes in uses:
        union = union_aligned(union, _tile_map(stmt, access, sizes, prefix).range())
    assert union is not None
    offset, size = rectangular_hull(union)
    if None in offset:
        raise CodegenError(
            f"the footprint of {uses[0][1].tensor} over a tile is not a box of fixed size"
        )
    return FootprintBox(
        tuple(
            (const, tuple(sorted((n[len(prefix) :], c) for n, c in coefs.items())))
            for const, coefs in offset
        ),
        tuple(size),
    )


def union_aligned(a: isl.Set | None, b: isl.Set) -> isl.Set:
    """a ∪ b for sets whose parameters may differ (None: the empty start of a union)."""
    return b if a is None else a.align_params(b.get_space()).union(b.align_params(a.get_space()))


def rectangular_hull(image: isl.Set) -> tuple[list[tuple[int, dict[str, int]] | None], list[int]]:
    """The box around `image` (a set over parameters): per dimension, its lower bound as
    (constant, {parameter: coefficient}) when that is one affine function of the parameters
    (else None), and its largest extent over the parameters (a CodegenError when unbounded)."""
    offset, size, _ = hull_and_range(image, False)
    return offset, size


def hull_and_range(
    image: isl.Set, ranges: bool = True
) -> tuple[list[tuple[int, dict[str, int]] | None], list[int], list[tuple[int, int]]]:
    """rectangular_hull of `image`, and with `ranges` per dimension the least and the greatest
    value it takes over all parameters (from the same bounds: isl computes them once)."""
    spans: list[tuple[int, int]] = []
    offset, size = [], []
    constant = constant_bounds(image)
    n = image.dim(isl.dim_type.set)
    for d in range(n):
        if d in constant:  # what isl's dim_min and dim_max give such a dimension
            lo_c, hi_c = constant[d]
            size.append(hi_c - lo_c + 1)
            spans.append((lo_c, hi_c))
            offset.append((lo_c, {}))
            continue
        # the set of dimension d alone: its bounds are those of d in `image`
        alone = image.project_out(isl.dim_type.set, d + 1, n - d - 1).project_out(
            isl.dim_type.set, 0, d
        )
        bounds = _bounds(alone)
        if bounds is None:
            raise CodegenError(
                f"the footprint of {image.get_tuple_name() or 'a tensor'} has no bounded box"
            )
        size.append(bounds.size)
        if ranges:
            spans.append(bounds.span())
        offset.append(None if bounds.offset is None else (bounds.offset[0], dict(bounds.offset[1])))
    return offset, size, (spans if ranges else [])


@dataclass
class _Bounds:
    """The bounds of a set of one dimension over parameters (`_bounds`)."""

    size: int  # its largest extent over the parameters
    offset: tuple[int, dict[str, int]] | None  # its least value, if one affine function of them
    alone: isl.Set  # the set
    lo_hi: tuple[isl.PwAff, isl.PwAff] | None = None  # isl's dim_min and dim_max, if asked
    least_greatest: tuple[int, int] | None = None

    def span(self) -> tuple[int, int]:
        """Its least and greatest value over all parameters (asked of isl once): of the
        dim_min and dim_max when isl gave them, else of the set."""
        if self.least_greatest is None:
            if self.lo_hi is None:
                least, greatest = self.alone.dim_min_val(0), self.alone.dim_max_val(0)
            else:
                least, greatest = self.lo_hi[0].min_val(), self.lo_hi[1].max_val()
            self.least_greatest = (least.to_python(), greatest.to_python())
        return self.least_greatest


def _bounds(alone: isl.Set) -> _Bounds | None:
    """The bounds of the one dimension of `alone` (None: unbounded or empty), remembered by the
    set's text: a probe's footprints ask for the same few (a tile's channels, its rows) in
    many images, and isl's dim_min and dim_max took most of the search (ResNet-18's 1,774
    dimensions have 1,209 distinct sets, and of one dimension isl bounds them 3x faster).
    Most of them bound the dimension by unit constraints: one each way (`_read_bounds`), or
    a tile clipped to its tensor (`_clipped_bounds`), whose bounds take a fraction of isl's."""
    key = str(alone)
    hit = _BOUNDS.get(key, _UNKNOWN)
    if hit is not _UNKNOWN:
        return hit
    unit = _unit_constraints(alone)
    bounds = _UNKNOWN if unit is None else _read_bounds(alone, *unit)
    if bounds is _UNKNOWN and unit is not None:
        bounds = _clipped_bounds(alone, unit[1])
    if bounds is _UNKNOWN:
        bounds = _isl_bounds(alone)
    if len(_BOUNDS) >= BOUNDS_CACHE:
        del _BOUNDS[next(iter(_BOUNDS))]
    _BOUNDS[key] = bounds
    return bounds


def _unit_constraints(alone: isl.Set) -> tuple[list, list, list] | None:
    """The constraints of a set of one basic set without existential variables, if each one
    on its dimension x is unit in x: (lower bounds, upper bounds, the constraints without x),
    a bound as (k, {parameter index: coefficient}) for `x >= g(p) + k` or `x <= g(p) + k` (an
    equality is both); None for any other set."""
    bsets = alone.get_basic_sets()
    if len(bsets) != 1 or bsets[0].dim(isl.dim_type.div):
        return None
    t, n_par = isl.dim_type, alone.dim(isl.dim_type.param)
    lows, highs, others = [], [], []
    for c in bsets[0].get_constraints():
        if not c.involves_dims(t.set, 0, 1):
            others.append(c)
            continue
        a = c.get_coefficient_val(t.set, 0).to_python()
        if a not in (1, -1):
            return None
        # a*x + g(p) + k >= 0 (or == 0): x >= -g(p) - k for a = 1, x <= g(p) + k for a = -1
        k = -a * int(c.get_constant_val().to_python())
        g = {
            i: -a * int(c.get_coefficient_val(t.param, i).to_python())
            for i in range(n_par)
            if c.involves_dims(t.param, i, 1)
        }
        if c.is_equality() or a == 1:
            lows.append((k, g))
        if c.is_equality() or a == -1:
            highs.append((k, g))
    return lows, highs, others


def _read_bounds(alone: isl.Set, lows: list, highs: list, others: list):
    """_bounds of a nonempty set whose dimension x has one lower bound `x >= f(p) + a` and one
    upper bound `x <= f(p) + b` (or one equality `x = f(p) + a`), with the same affine f of the
    parameters (_unit_constraints): then x ranges over b - a + 1 values at every point of the
    parameters where the set is nonempty, from f(p) + a, which is what isl's dim_min and dim_max
    give, as long as no other constraint relates a parameter of f to another one (d2 = d1: isl
    may write f in terms of either). Any other set: _UNKNOWN."""
    if len(lows) != 1 or len(highs) != 1 or lows[0][1] != highs[0][1]:
        return _UNKNOWN
    (lo, coefs), (hi, _) = lows[0], highs[0]
    t, n_par = isl.dim_type, alone.dim(isl.dim_type.param)
    for c in others:
        for i in coefs:
            if c.involves_dims(t.param, i, 1) and (
                c.involves_dims(t.param, 0, i) or c.involves_dims(t.param, i + 1, n_par - i - 1)
            ):
                return _UNKNOWN
    if alone.is_empty():
        return _UNKNOWN
    names = {i: alone.get_dim_name(t.param, i) for i in coefs}
    return _Bounds(hi - lo + 1, (lo, {names[i]: c for i, c in coefs.items()}), alone)


def _clipped_bounds(alone: isl.Set, highs: list):
    """_bounds of a set whose dimension x is bounded above by unit constraints (_unit_constraints)
    of which at most one, `x <= f(p) + b`, is not a constant `x <= c` (a tile clipped to its
    tensor), and whose least value is one affine piece `f(p) + a` (isl's dim_min): at a point p
    of the parameters where the set is nonempty, x's greatest value is min(f(p) + b, c), so its
    extent, min(b - a, c - f(p) - a), is largest where f(p) + a is least (min_val); its greatest
    value over all p is min(max_val - a + b, c). Without isl's dim_max and the maximum of the
    difference, which took most of the time. Any other set: _UNKNOWN."""
    tiled = [(k, g) for k, g in highs if g]
    if len(tiled) > 1 or len(tiled) == len(highs):
        return _UNKNOWN  # no constant upper bound: _read_bounds, or isl
    try:
        lo = alone.dim_min(0)
    except isl.Error:
        return _UNKNOWN
    pieces = lo.get_pieces()
    if len(pieces) != 1 or _has_division(pieces[0][1]):
        return _UNKNOWN
    aff, t = pieces[0][1], isl.dim_type
    coefs = {i: aff.get_coefficient_val(t.param, i).to_python() for i in range(aff.dim(t.param))}
    coefs = {i: c for i, c in coefs.items() if c}
    least, most, a = lo.min_val(), lo.max_val(), aff.get_constant_val()
    if not (least.is_int() and most.is_int() and a.is_int()) or (tiled and tiled[0][1] != coefs):
        return _UNKNOWN
    least, most, a = least.to_python(), most.to_python(), a.to_python()
    c = min(k for k, g in highs if not g)
    extent, greatest = c - least, c
    if tiled:
        b = tiled[0][0]
        extent, greatest = min(b - a, extent), min(most - a + b, c)
    names = {i: alone.get_dim_name(t.param, i) for i in coefs}
    offset = (a, {names[i]: v for i, v in coefs.items()})
    return _Bounds(extent + 1, offset, alone, None, (least, greatest))


def _isl_bounds(alone: isl.Set) -> _Bounds | None:
    """_bounds by isl's dim_min and dim_max."""
    try:  # isl reports an unbounded dimension as an error, not as a value
        lo, hi = alone.dim_min(0), alone.dim_max(0)
        extent = hi.sub(lo).max_val()
    except isl.Error:
        return None
    if not extent.is_int():  # unbounded or empty: infinity or NaN
        return None
    pieces = lo.get_pieces()
    offset = None
    # one affine piece without integer divisions (floor(o/2) is not an offset the DMA takes)
    if (
        len(pieces) == 1
        and pieces[0][1].get_constant_val().is_int()
        and not _has_division(pieces[0][1])
    ):
        aff = pieces[0][1]
        names = [
            alone.get_dim_name(isl.dim_type.param, i) for i in range(alone.dim(isl.dim_type.param))
        ]
        coefs = {
            n: int(aff.get_coefficient_val(isl.dim_type.param, i).to_python())
            for i, n in enumerate(names)
        }
        offset = (int(aff.get_constant_val().to_python()), {n: c for n, c in coefs.items() if c})
    return _Bounds(int(extent.to_python()) + 1, offset, alone, (lo, hi))


BOUNDS_CACHE = 1 << 13  # sets of one dimension remembered (the oldest forgotten first)
_BOUNDS: dict[str, _Bounds | None] = {}
_UNKNOWN = object()


def constant_bounds(image: isl.Set) -> dict[int, tuple[int, int]]:
    """The dimensions of `image` whose bounds are constants, read off its constraints: those
    of a nonempty set of one basic set without existential variables where no constraint
    relates the dimension to another one or to a parameter. Such a dimension ranges over
    its least to its greatest value whatever the parameters (the others do not constrain it),
    so isl's dim_min and dim_max of it are those constants; -> {dimension: (least, greatest)}.
    The dimensions it cannot decide so cheaply (and every one of any other set) are left to isl."""
    bsets = image.get_basic_sets()
    if len(bsets) != 1 or bsets[0].dim(isl.dim_type.div) or image.is_empty():
        return {}
    n, n_par = image.dim(isl.dim_type.set), image.dim(isl.dim_type.param)
    lows: dict[int, list[int]] = {}
    highs: dict[int, list[int]] = {}
    related: set[int] = set()
    for c in bsets[0].get_constraints():
        # one involves_dims per dimension and one for all parameters: reading every coefficient
        # (17 parameters in a deep schedule) took most of the time of this function
        on = [d for d in range(n) if c.involves_dims(isl.dim_type.set, d, 1)]
        if len(on) != 1 or (n_par and c.involves_dims(isl.dim_type.param, 0, n_par)):
            related.update(on)
            continue
        (d,) = on
        a = int(c.get_coefficient_val(isl.dim_type.set, d).to_python())
        k = int(c.get_constant_val().to_python())  # a*x + k >= 0 (or == 0)
        if c.is_equality() or a > 0:
            lows.setdefault(d, []).append(-(k // a) if a > 0 else k // -a)
        if c.is_equality() or a < 0:
            highs.setdefault(d, []).append(k // -a if a < 0 else -(k // a))
    return {
        d: (max(lows[d]), min(highs[d]))
        for d in range(n)
        if d not in related and d in lows and d in highs
    }


def _has_division(aff: isl.Aff) -> bool:
    """Whether `aff` uses an integer division (`2*floor(o/2)`): reading its parameter
    coefficients alone would give a wrong offset."""
    return any(
        not aff.get_coefficient_val(isl.dim_type.div, k).is_zero()
        for k in range(aff.dim(isl.dim_type.div))
    )
