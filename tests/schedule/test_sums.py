"""product_sums (every choice of a staging product at once, numpy) agrees with memory_of (one
choice at a time, the definition) on random products: every field, and which choices fit."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st

from tensorgen.schedule.sums import memory_of, product_sums


@dataclass(frozen=True)
class Staged:  # the fields of cost.py's _Staged that the sums read
    footprint: int
    in_acc: bool
    serial: int
    refills: int
    traffic: int


staged = st.none() | st.builds(
    Staged,
    st.integers(0, 5000),
    st.booleans(),
    st.integers(0, 10**7),
    st.integers(0, 10**5),
    st.integers(0, 10**6),
)


@st.composite
def products(draw):
    order = ["a", "b", "c", "d"]
    rank = {lv: k for k, lv in enumerate(order)}
    n = draw(st.integers(1, 4))
    levels = [
        draw(st.lists(st.sampled_from([None, *order]), min_size=1, max_size=4, unique=True))
        for _ in range(n)
    ]
    plain = [{lv: draw(staged) for lv in lvs} for lvs in levels]
    return plain, levels, rank, draw(st.integers(0, 12000)), draw(st.integers(0, 8000))


@settings(max_examples=200, deadline=None)
@given(products())
def test_product_sums_are_memory_of_each_choice(product) -> None:
    plain, levels, rank, spad_room, acc_room = product
    sums = product_sums(plain, levels, rank, spad_room, acc_room)
    assert sums is not None
    choices = list(itertools.product(*levels))
    assert len(sums.fits) == len(choices)
    for k, choice in enumerate(choices):
        stages = tuple(zip("TUVW", choice, strict=False))
        inner = max((lv for lv in choice if lv), key=rank.__getitem__, default=None)
        memory = memory_of([at[lv] for at, lv in zip(plain, choice, strict=True)], stages, inner)
        fits = memory is not None and memory.acc <= acc_room and memory.spad <= spad_room
        assert sums.fits[k] == fits
        if memory is not None:
            assert sums.memory(k) == tuple(memory)
            assert all(type(v) is int for v in sums.memory(k))


def test_product_sums_leave_non_integers_to_the_caller() -> None:
    plain = [{None: Staged(16, False, 2.5, 0, 16)}]
    assert product_sums(plain, [[None]], {}, 100, 100) is None
