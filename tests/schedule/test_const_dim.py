"""state._const_dim reads an explicit equality `d<pos> = c` off isl's equality matrix; whatever
path it takes, it agrees with isl's dim_max of the range (the definition it replaces)."""

from __future__ import annotations

import islpy as isl
import pytest

from tensorgen.schedule import state

MAPS = (
    "{ S0[n = 0, k, h, w] -> [0, 0, h, k, w, 0, 0, 0] : 0 <= k <= 63 and 0 <= h <= 111 and 0 <= w <= 111 }",
    "{ S1[i, j] -> [1, i, 7, j, -3] : 0 <= i < 4 and 0 <= j < 5 }",
    "{ S2[i] -> [i, 2, i + 1] : 0 <= i < 8 }",
    "[p] -> { S3[i] -> [p, i, 4] : 0 <= i < p and p <= 10 }",
    "{ S4[i] -> [0, i] : 0 <= i < 4; S4[i] -> [1, i] : 4 <= i < 8 }",  # two basic maps
)


def _isl_const_dim(sched: isl.Map, pos: int) -> int | None:
    v = sched.range().dim_max(pos)
    return int(v.get_pieces()[0][1].get_constant_val().to_python()) if v.is_cst() else None


@pytest.mark.parametrize("text", MAPS)
def test_const_dim_agrees_with_isl_dim_max(text: str) -> None:
    sched = isl.Map(text)
    for pos in range(sched.dim(isl.dim_type.out)):
        assert state._const_dim(sched, pos) == _isl_const_dim(sched, pos), (text, pos)


def test_equalities_are_read_without_isl_dim_max() -> None:
    sched = isl.Map(MAPS[1])
    assert [state.fixed_by_equality(sched, p) for p in range(5)] == [1, None, 7, None, -3]
    assert state.fixed_by_equality(isl.Map(MAPS[4]), 0) is None  # left to isl
