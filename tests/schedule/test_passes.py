"""The kinds of passes of a loop after ragged splits (schedule.passes), which the cost model
times a double-buffered loop by: a ragged split outside the loop makes the passes in its last
iteration compute less, by smaller blocks of the band or fewer iterations inside."""

from __future__ import annotations

import math
import random
from collections import Counter

from tensorgen.schedule.passes import (
    _loop_passes,
    _profiles,
    _split_values,
    loop_passes,
    pass_kinds,
)


def test_band_blocks_shrink_in_the_last_iteration_of_a_ragged_split() -> None:
    # h: 28 in blocks of 9 (9, 9, 9, 1), h_i in the band; k's passes in the last h_o block
    # compute blocks of 1 row instead of 9
    parts = {frozenset(): 9.0, frozenset({"h_o"}): 1.0}
    kinds = pass_kinds({"h": 28, "k": 4}, (("h", 9),), ("h_o", "k"), "k", parts)
    assert kinds == (((1.0,) * 4, 1), ((9.0,) * 4, 3))


def test_fewer_iterations_inside_in_the_last_iteration_of_a_ragged_split() -> None:
    # h_i an outer loop inside k: each iteration of k runs 9 of it, or 1 in the last h_o block
    kinds = pass_kinds({"h": 28, "k": 4}, (("h", 9),), ("h_o", "k", "h_i"), "k", {})
    assert kinds == (((1.0,) * 4, 1), ((9.0,) * 4, 3))
    # and the loop h_i itself: 3 passes of 9 iterations and one of 1, each iteration alike
    assert loop_passes({"h": 28, "k": 4}, (("h", 9),), ("h_o", "k", "h_i"))["h_i"] == (
        (1, 4),
        (9, 12),
    )


def test_even_splits_make_one_kind() -> None:
    kinds = pass_kinds({"h": 27, "k": 4}, (("h", 9),), ("h_o", "k"), "k", {frozenset(): 5.0})
    assert kinds == (((5.0,) * 4, 3),)


def _profiles_by_name(base_values, loops, depth, d, last, shrink) -> Counter:
    """The reading of schedule.passes._profiles by loop name, point by point (what it was
    before it read the points by position): the oracle of its fast path."""
    points = {tuple(at[x] for x in loops) for at in base_values}
    by_prefix: dict[tuple, Counter] = {}
    for p in points:
        at = dict(zip(loops, p, strict=True))
        prefix = tuple(at[x] for x in loops if depth[x] < d)
        mine = next((at[x] for x in loops if depth[x] == d), None)
        low = frozenset(x for x in loops if x in shrink and at[x] == last[x])
        by_prefix.setdefault(prefix, Counter())[(mine, low)] += 1
    return Counter(tuple(sorted(c.items(), key=repr)) for c in by_prefix.values())


def test_profiles_by_position_equal_profiles_by_name_in_order() -> None:
    # every nest of two indices split in two ways, each loop the inner one: the same Counter,
    # filled in the same order (pass_kinds sums floats in that order)
    rng = random.Random(7)
    for _ in range(200):
        extents = (("h", rng.randint(1, 40)), ("k", rng.randint(1, 20)))
        blocks = tuple((i, rng.randint(1, 12)) for i in ("h", "k") if rng.random() < 0.8)
        base, values, splits = _split_values(extents, blocks)
        names = [x for x in base if x not in {n for n, _ in splits}]
        order = tuple(rng.sample(names, len(names)))
        depth = {x: k for k, x in enumerate(order)}
        last = {x: max(at[x] for b in values for at in values[b] if x in at) for x in order}
        shrink = {x for x in order if rng.random() < 0.5}
        for d in range(len(order)):
            for b in ("h", "k"):
                loops = [x for x in order if base.get(x) == b]
                if not loops:
                    continue
                args = (values[b], loops, depth, d, last, shrink)
                fast, slow = _profiles(*args), _profiles_by_name(*args)
                assert list(fast.items()) == list(slow.items())


def _loop_passes_by_name(extents: tuple, blocks: tuple, order: tuple) -> dict:
    """schedule.passes._loop_passes as it read a point's loops by name, with a generator per
    point: the oracle of its fast path."""
    base, values, _ = _split_values(extents, blocks)
    out = {}
    for k, loop in enumerate(order):
        if loop not in base:
            continue
        mine = base[loop]
        around = [x for x in order[:k] if base.get(x) == mine]
        groups: dict[tuple, set[int]] = {}
        for at in values[mine]:
            groups.setdefault(tuple(at[x] for x in around), set()).add(at[loop])
        others = math.prod(
            len({tuple(at[x] for x in order[:k] if base.get(x) == b) for at in values[b]})
            for b in {base[x] for x in order[:k] if x in base} - {mine}
        )
        counted: dict[int, int] = {}
        for trips in map(len, groups.values()):
            counted[trips] = counted.get(trips, 0) + others
        out[loop] = tuple(sorted(counted.items()))
    return out


def test_loop_passes_by_position_equal_loop_passes_by_name() -> None:
    rng = random.Random(11)
    for _ in range(200):
        extents = tuple((i, rng.randint(1, 30)) for i in ("h", "w", "k"))
        blocks = tuple((i, rng.randint(1, 10)) for i, _ in extents if rng.random() < 0.7)
        base, _, splits = _split_values(extents, blocks)
        names = [x for x in base if x not in {n for n, _ in splits}]
        order = tuple(rng.sample(names, len(names)))
        assert _loop_passes(extents, blocks, order) == _loop_passes_by_name(extents, blocks, order)
