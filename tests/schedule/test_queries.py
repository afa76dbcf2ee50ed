"""The public queries of a Schedule (what codegen and the automatic scheduler read instead of
its private state) agree with the state and follow the loops through rewrites."""

from __future__ import annotations

import islpy as isl
import pytest

from tensorgen.errors import ScheduleError
from tensorgen.schedule.api import Schedule
from tensorgen.spec.loader import parse_program

TWO = """tensorgen: 1
tensors:
  A: {shape: [10, 6], dtype: int32, role: input}
  B: {shape: [10, 6], dtype: int32}
  C: {shape: [10, 6], dtype: int32, role: output}
statements:
  - B[i, j] = A[i, j] * 3
  - C[i, j] = B[i, j] - 1
"""


def test_position_statements_and_map_follow_the_rewrites() -> None:
    s = Schedule(parse_program(TWO))
    assert s.loop_names() == ["S0.i", "S0.j", "S1.i", "S1.j"]
    assert [s.position(x) for x in ("S0.i", "S0.j")] == [1, 2]
    fused = s.fuse(s.loop("S0.i"), s.loop("S1.i"))
    assert s.statements_of(fused) == s.statements_of("S0.i") == frozenset({"S0", "S1"})
    io, ii = s.split(fused, 4)
    assert (s.position(io), s.position("S0.i_i"), s.position(s.loop("S1.j"))) == (1, 2, 4)
    assert s.trips(io) == 3 and s.trips(ii) == 4 and s.trips("S0.j") == 6
    # the map of a statement is where its instances run: S1[9, 5] after S0[9, 5]
    point = s.statement_map("S1").intersect_domain(isl.Set("{ S1[9, 5] }")).range()
    assert point.is_equal(isl.Set("{ [0, 2, 1, 1, 5] }"))
    # the private names still answer the same, until their callers switch
    assert s._resolve(io, "x", False)[1:] == (s.position(io), s.statements_of(io))
    assert s._state.maps["S1"].is_equal(s.statement_map("S1"))


def test_queries_refuse_what_is_not_there() -> None:
    s = Schedule(parse_program(TWO))
    s.split(s.loop("S0.j"), 2)
    with pytest.raises(ScheduleError, match=r"^loop\('S0.j'\): no such loop .*split into"):
        s.position("S0.j")
    with pytest.raises(ScheduleError, match=r"^statement_map\('S9'\): no such statement$"):
        s.statement_map("S9")
