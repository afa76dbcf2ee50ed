"""How the loops of a nest really run after ragged splits, for the cost model
(tensorgen/schedule/cost.py): how often each loop is entered with each trip count
(`loop_passes`), and, for a double-buffered loop, the kinds of its passes by the compute of
their iterations (`pass_kinds`): a ragged split outside the loop makes the passes in its last
iteration run fewer iterations of the loops inside, or smaller blocks of the band."""

from __future__ import annotations

import itertools
import math
import operator
from collections import Counter
from collections.abc import Callable
from functools import lru_cache


@lru_cache(maxsize=1 << 8)
def _split_values(extents: tuple, blocks: tuple) -> tuple[dict, dict, list]:
    """The loops' base index, and the values of the loops of each base index at each of its
    points, after the splits `blocks` (as Geometry.of: a split no larger than the extent is not
    made); the splits made. Shared by the callers (a nest's loop_passes and each pass_kinds
    of it): read only."""
    base = {i: i for i, _ in extents}
    size = dict(extents)
    splits = []
    for name, block in blocks:
        if size[name] <= block:
            continue
        size[f"{name}_o"], size[f"{name}_i"] = -(-size[name] // block), block
        base[f"{name}_o"] = base[f"{name}_i"] = base[name]
        splits.append((name, block))
    values: dict[str, list[dict[str, int]]] = {}
    for index, extent in extents:
        points = []
        for v in range(extent):
            at = {index: v}
            for name, block in splits:
                if base[name] == index:
                    at[f"{name}_o"], at[f"{name}_i"] = divmod(at[name], block)
            points.append(at)
        values[index] = points
    return base, values, splits


@lru_cache(maxsize=1 << 10)
def _loop_passes(extents: tuple, blocks: tuple, order: tuple) -> dict:
    base, values, _ = _split_values(extents, blocks)
    out = {}
    distinct: dict[tuple, int] = {}  # (base index, its loops) -> distinct values of those loops

    def points(b: str, loops: tuple) -> int:
        if (b, loops) not in distinct:
            distinct[(b, loops)] = len(set(map(_values_of(loops), values[b])))
        return distinct[(b, loops)]

    for k, loop in enumerate(order):
        if loop not in base:
            continue
        mine = base[loop]
        around = _values_of([x for x in order[:k] if base.get(x) == mine])
        groups: dict[tuple, set[int]] = {}
        for at in values[mine]:
            groups.setdefault(around(at), set()).add(at[loop])
        others = math.prod(
            points(b, tuple(x for x in order[:k] if base.get(x) == b))
            for b in {base[x] for x in order[:k] if x in base} - {mine}
        )
        counted: dict[int, int] = {}
        for trips in map(len, groups.values()):
            counted[trips] = counted.get(trips, 0) + others
        out[loop] = tuple(sorted(counted.items()))
    return out


def _values_of(loops) -> Callable[[dict], object]:
    """A point's values of `loops`, as a key that two points share exactly when those values
    are equal (one loop: the value itself): what _loop_passes groups and counts points by,
    read by operator.itemgetter rather than a generator per point (most of its time)."""
    if not loops:
        return lambda at: ()
    return operator.itemgetter(*loops)


def loop_passes(extents: dict[str, int], blocks, order) -> dict[str, tuple[tuple[int, int], ...]]:
    """Per loop of `order` (outer loops, outermost first) after the splits `blocks` of the
    indices of `extents`: ((trips, passes), ...), how many times the loop is entered with each
    trip count over the whole program. A ragged split makes the loops inside it shorter in its
    last iteration (96 columns in blocks of 64, then of 16: 4 blocks of 16, then 2)."""
    return _loop_passes(tuple(extents.items()), tuple(map(tuple, blocks)), tuple(order))


def _profiles(base_values: list, loops: list, depth: dict, d: int, last: dict, shrink) -> Counter:
    """Of one base index, whose loops of the nest are `loops`: per distinct value of those
    outside the loop at depth `d`, what runs in each iteration of that loop (its value if the
    loop is of this index, else None) -> Counter of (the loops at their last iteration that
    shrink the band -> distinct values of the loops inside); those values counted by profile.
    A point's loops are read by position, worked out once (a dict per point, and generators
    over the loops per point, took most of the search's pass_kinds); the points, prefixes and
    frozensets are built in the same order as reading them by name would, so every Counter is
    filled in the same order and the float sums over them add up alike."""
    if len(loops) == 1:
        (only,) = loops
        points = {(at[only],) for at in base_values}
    else:
        points = set(map(operator.itemgetter(*loops), base_values))
    outer = [k for k, x in enumerate(loops) if depth[x] < d]
    here = next((k for k, x in enumerate(loops) if depth[x] == d), None)
    lows = [(k, x, last[x]) for k, x in enumerate(loops) if x in shrink]
    by_prefix: dict[tuple, Counter] = {}
    for p in points:
        prefix = tuple([p[k] for k in outer])
        mine = None if here is None else p[here]
        low = frozenset([x for k, x, end in lows if p[k] == end])
        by_prefix.setdefault(prefix, Counter())[(mine, low)] += 1
    return Counter(tuple(sorted(c.items(), key=repr)) for c in by_prefix.values())


def pass_kinds(
    extents: dict[str, int], blocks, order, inner: str, band_parts: dict
) -> tuple[tuple[tuple[float, ...], int], ...]:
    """The passes of the loop `inner` of `order` by the compute of their iterations:
    ((compute of each iteration, in order), passes), the compute of an iteration being the
    band's cycles summed over the points of the loops inside it. `band_parts`: frozenset of
    outer loops of ragged splits at their last iteration -> the band's cycles at one point
    (the keys' loops shrink the band's blocks there); {}: the same at every point."""
    key = (tuple(extents.items()), tuple(map(tuple, blocks)), tuple(order), inner)
    return _pass_kinds(*key, tuple(sorted(band_parts.items(), key=lambda kv: sorted(kv[0]))))


@lru_cache(maxsize=1 << 12)
def _pass_kinds(extents, blocks, order, inner, band_parts) -> tuple:
    base, values, _ = _split_values(extents, blocks)
    parts = dict(band_parts) or {frozenset(): 1.0}
    shrink = set().union(*parts)
    depth = {x: k for k, x in enumerate(order)}
    d = depth[inner]
    last = {}
    for b in {base[x] for x in order if x in base}:
        for x in (x for x in order if base.get(x) == b):
            last[x] = max(at[x] for at in values[b])
    per_base = []
    for b in dict.fromkeys(base[x] for x in order if x in base):
        loops = [x for x in order if base.get(x) == b]
        per_base.append(list(_profiles(values[b], loops, depth, d, last, shrink).items()))
    kinds: Counter = Counter()
    for combo in itertools.product(*per_base):
        passes = math.prod(n for _, n in combo)
        work: dict[int, float] = {}
        for entries in itertools.product(*(profile for profile, _ in combo)):
            mine = next((v for (v, _), _ in entries if v is not None), 0)
            low = frozenset().union(*(s for (_, s), _ in entries))
            count = math.prod(c for _, c in entries)
            work[mine] = work.get(mine, 0.0) + count * parts.get(low, parts[frozenset()])
        kinds[tuple(work[v] for v in sorted(work))] += passes
    return tuple(sorted(kinds.items()))
