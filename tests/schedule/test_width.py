"""state.width (what Schedule.trips takes the widest of) is remembered per schedule map; it
gives what isl's dim_min/dim_max of the map's range give, for every loop of the search's
skeletons and of a hand-made schedule."""

from __future__ import annotations

from pathlib import Path

import islpy as isl

from tensorgen.autosched.layer import recognise
from tensorgen.autosched.search import Space
from tensorgen.schedule import state
from tensorgen.spec.loader import load_program
from tensorgen.target import load_target

ROOT = Path(__file__).parents[2]


def _isl_width(sched: isl.Map, pos: int) -> int:
    rng = sched.range()
    lo, hi = rng.dim_min(pos).min_val(), rng.dim_max(pos).max_val()
    return int(hi.to_python() - lo.to_python()) + 1


def test_width_matches_isl_on_the_skeletons() -> None:
    program = load_program(ROOT / "examples" / "conv1x1.yaml")
    space = Space.of(program, load_target("tg1"), recognise(program))
    for shape, order in space.nests():
        space.probed(shape, order)
    checked = 0
    for sk in space.skeletons.values():
        s = sk.schedule
        for stmt, m in s.state.maps.items():
            for pos in range(m.dim(isl.dim_type.out)):
                assert state.width(s.state, stmt, pos) == _isl_width(m, pos)
                assert state.width(s.state, stmt, pos) == _isl_width(m, pos)  # a hit
                checked += 1
        for loop in sk.loops.values():
            stmts = s.statements_of(loop)
            pos = s.position(loop)
            assert s.trips(loop) == max(_isl_width(s.state.maps[n], pos) for n in stmts)
    assert checked > 0


def test_width_of_a_ragged_map() -> None:
    m = isl.Map("{ S[i, j] -> [i, j] : 0 <= i < 5 and 0 <= j <= i }")
    st = state.State({"S": m}, ({"S": 1}, {"S": 2}), {})
    assert [state.width(st, "S", p) for p in range(2)] == [5, 5]
