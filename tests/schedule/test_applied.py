"""state.applied remembers `apply_range` per pair of maps: a hit returns a map equal to a fresh
composition, and entries are per map object, so different states never share one."""

from __future__ import annotations

import islpy as isl
from hypothesis import given, settings
from hypothesis import strategies as st

from tensorgen.schedule import state
from tensorgen.schedule.loops import split
from tensorgen.schedule.state import find
from tensorgen.spec.loader import parse_program


def _sched(n: int) -> isl.Map:
    return isl.Map(f"{{ S[i, j] -> [0, i, j] : 0 <= i < {n} and 0 <= j < 5 }}")


@settings(max_examples=30, deadline=None)
@given(
    n=st.integers(1, 12),
    perm=st.permutations(["d0", "d1", "d2"]),
    shift=st.integers(-3, 3),
)
def test_hit_equals_a_fresh_composition(n: int, perm: list[str], shift: int) -> None:
    sched = _sched(n)
    change = state.transform(3, [perm[0], f"{perm[1]} + {shift}", perm[2]])
    fresh = sched.apply_range(change)
    first = state.applied(sched, change)
    again = state.applied(sched, change)
    assert first.is_equal(fresh) and again.is_equal(fresh)
    assert again is first  # the second is the memo's


def test_equal_maps_of_different_states_do_not_share_entries() -> None:
    change = state.transform(3, ["d0", "d2", "d1"])
    a, b = _sched(4), _sched(4)  # equal, but two objects: two states' maps
    other = _sched(6)
    ra, rb, ro = (state.applied(m, change) for m in (a, b, other))
    assert ra is not rb and ra.is_equal(rb)
    assert ro.is_equal(other.apply_range(change)) and not ro.is_equal(ra)


def test_a_forgotten_map_is_not_mistaken_for_a_new_one() -> None:
    """An entry holds its maps: a key of ids is never matched by a later map at a reused id."""
    change = state.transform(3, ["d0", "d2", "d1"])
    for n in range(1, 40):
        m = _sched(n)  # the previous one is freed; its id may come back
        assert state.applied(m, change).is_equal(m.apply_range(change)), n


def test_split_through_the_memo_matches_isl(monkeypatch) -> None:
    """A primitive (split) gives the same maps with the memo and with apply_range itself."""
    text = """
tensorgen: 1
name: t
tensors:
  A: {shape: [8, 6], dtype: int32, role: input}
  B: {shape: [8, 6], dtype: int32, role: output}
statements:
  - B[i, j] = A[i, j]
"""
    start = state.original(parse_program(text))
    memo, *_ = split(start, find(start, "i"), 4, "split")
    again, *_ = split(start, find(start, "i"), 4, "split")
    assert all(again.maps[n] is memo.maps[n] for n in memo.maps)  # the memo's objects
    monkeypatch.setattr(state, "applied", lambda m, c: m.apply_range(c))
    plain, *_ = split(start, find(start, "i"), 4, "split")
    assert memo.maps.keys() == plain.maps.keys()
    for name in memo.maps:
        assert memo.maps[name].is_equal(plain.maps[name])
