"""The schedule verifier: every schedule under schedules/ passes; each way of corrupting a
finished state (by hand, as a bug in a rewrite would) is one line naming what is at fault."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import islpy as isl
import pytest

from tensorgen.errors import CapacityError, ScheduleError
from tensorgen.schedule.api import Schedule
from tensorgen.schedule.files import replay
from tensorgen.schedule.state import Stage
from tensorgen.schedule.verify import verify_schedule
from tensorgen.spec.loader import load_program, parse_program
from tensorgen.target import load_target

ROOT = Path(__file__).parents[2]
TG1 = load_target("tg1")
JACOBI = """tensorgen: 1
tensors:
  A: {shape: [7, 12], dtype: int32, role: inout}
loops: {t: 6}
statements:
  - A[t + 1, i] = (A[t, i - 1] + 2 * A[t, i] + A[t, i + 1]) >> 2
"""
MATMUL = """tensorgen: 1
tensors:
  A: {shape: [10, 7], dtype: int8, role: input}
  B: {shape: [7, 9], dtype: int8, role: input}
  C: {shape: [10, 9], dtype: int32, role: output}
statements:
  - C[i, j] += A[i, k] * B[k, j]
"""
TWO = """tensorgen: 1
tensors:
  A: {shape: [8], dtype: int32, role: input}
  B: {shape: [8], dtype: int32}
  C: {shape: [8], dtype: int32, role: output}
statements:
  - B[i] = A[i] * 3
  - C[i] = B[i] - 1
"""
SCAN = (ROOT / "examples" / "prefix_sum.yaml").read_text()


def _corrupt(s: Schedule, **changes) -> Schedule:
    s._state = replace(s.state, **changes)
    return s


def _fails(s: Schedule, match: str, error=ScheduleError) -> None:
    with pytest.raises(error, match=match) as info:
        verify_schedule(s)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("path", sorted((ROOT / "schedules").glob("*.py")), ids=lambda p: p.stem)
def test_every_schedule_file_verifies(path: Path) -> None:
    program = load_program(ROOT / "examples" / f"{path.stem}.yaml")
    s = replay(path.read_text(), program, TG1, str(path))
    verify_schedule(s)  # raises on any fault
    assert s.trace, "a schedule file takes steps"


def test_a_statement_not_scheduled() -> None:
    s = Schedule(parse_program(TWO))
    _fails(
        _corrupt(s, maps={"S0": s.state.maps["S0"]}), r"^verify_schedule: statement S1 is not sched"
    )


def test_an_instance_left_out() -> None:
    s = Schedule(parse_program(TWO))
    part = s.state.maps["S1"].intersect_domain(isl.Set("{ S1[i] : i < 5 }"))
    _fails(
        _corrupt(s, maps={**s.state.maps, "S1": part}),
        r"^verify_schedule: S1\[i=[5-7]\] is not scheduled$",
    )


def test_an_instance_scheduled_twice() -> None:
    s = Schedule(parse_program(TWO))
    m = s.state.maps["S0"]
    twice = m.union(m.apply_range(isl.Map("{ [d0, d1] -> [d0, d1 + 8] }")))
    _fails(
        _corrupt(s, maps={**s.state.maps, "S0": twice}),
        r"^verify_schedule: statement S0: an instance is scheduled twice$",
    )


def test_two_instances_at_one_point() -> None:
    s = Schedule(parse_program(TWO))
    same = s.state.maps["S1"].apply_range(isl.Map("{ [d0, d1] -> [0, d1] }"))
    _fails(
        _corrupt(s, maps={**s.state.maps, "S1": same}),
        r"^verify_schedule: two statement instances are scheduled at the same point$",
    )


def test_two_instances_of_one_statement_at_one_point() -> None:
    s = Schedule(parse_program(TWO))
    folded = s.state.maps["S0"].apply_range(isl.Map("{ [d0, d1] -> [d0, 0] }"))
    _fails(
        _corrupt(s, maps={**s.state.maps, "S0": folded}),
        r"^verify_schedule: two statement instances are scheduled at the same point$",
    )


def test_a_loop_in_two_rows_and_a_loop_that_lies() -> None:
    s = Schedule(parse_program(MATMUL))
    i, j = s.loop("i").id, s.loop("j").id
    dims = list(s.state.dims)
    dims[2] = {"S0": i}  # i at d1 and at d2
    _fails(_corrupt(s, dims=tuple(dims)), r"^verify_schedule: loop i is at d1 and d2$")
    t = Schedule(parse_program(TWO))
    a = t.loop("S0.i").id
    dims = list(t.state.dims)
    dims[1] = {"S0": a, "S1": a}  # S1 placed in S0's loop, which does not say so
    _fails(_corrupt(t, dims=tuple(dims)), r"^verify_schedule: loop S0.i encloses S1 but does not")
    assert j != i


def test_a_constant_row_that_varies() -> None:
    s = Schedule(parse_program(TWO))
    dims = list(s.state.dims)
    dims[1] = {"S0": None, "S1": s.state.dims[1]["S1"]}  # S0's loop row called a constant
    loops = {k: v for k, v in s.state.loops.items() if v.name != "S0.i"}
    _fails(_corrupt(s, dims=tuple(dims), loops=loops), r"^verify_schedule: statement S0: d1 is no")


def test_an_illegal_order_names_the_step_that_made_it() -> None:
    s = Schedule(parse_program(JACOBI), checked=False)
    s.reorder(s.loop("i"), s.loop("t"))
    _fails(
        s,
        r"^verify_schedule: s\.reorder\(s\.loop\('i'\), s\.loop\('t'\)\): S0\[.*would run before",
    )


def test_an_illegal_order_no_step_made() -> None:
    s = Schedule(parse_program(JACOBI))
    swapped = s.state.maps["S0"].apply_range(isl.Map("{ [d0, d1, d2] -> [d2, d1, d0] }"))
    _fails(
        _corrupt(s, maps={"S0": swapped}),
        r"^verify_schedule: the schedule \(no step of its trace makes this order\): S0\[",
    )


def test_a_vector_band_that_is_not_parallel() -> None:
    s = Schedule(parse_program(SCAN))
    lid = s.loop("S1.i").id
    _fails(
        _corrupt(s, vectorized=("S1.i",), annotated={lid: "vectorized"}),
        r"^verify_schedule: vectorize\(S1.i\): S1\[i=\d+\] and S1\[i=\d+\] would run at once",
    )
    t = Schedule(parse_program(MATMUL))
    lid = t.loop("j").id
    _fails(
        _corrupt(t, vectorized=("j",), annotated={lid: "vectorized"}),
        r"^verify_schedule: vectorize\(j\): S0 has loops inside the band$",
    )
    u = Schedule(parse_program(MATMUL))
    _fails(
        _corrupt(u, vectorized=("k",)),
        r"^verify_schedule: vectorize\(k\): k is not marked as annotated$",
    )


def test_a_tensorized_band_of_a_loop_that_is_gone() -> None:
    s = Schedule(parse_program(MATMUL))
    s.split(s.loop("k"), 4)
    marks = {s.loop(x).id: "tensorized" for x in ("i", "j")}
    _fails(
        _corrupt(s, tensorized=((("i",), "j", ("k",)),), annotated=marks),
        r"^verify_schedule: tensorize\(i, j, k\): no loop k$",
    )


def test_a_stage_at_a_loop_that_is_gone() -> None:
    s = Schedule(parse_program(MATMUL), TG1)
    s.split(s.loop("k"), 4)
    _fails(
        _corrupt(s, stages=(Stage("B", "k", "spad"),)),
        r"^verify_schedule: stage\(B, k, spad\): no loop k$",
    )


def test_over_capacity() -> None:
    s = Schedule(parse_program(MATMUL), replace(TG1, acc=replace(TG1.acc, bytes=64)))
    _fails(
        _corrupt(s, stages=(Stage("C", "", "acc"),)),
        r"^verify_schedule: acc holds 360 B but has 64 B \(296 B over\): C at the program",
        CapacityError,
    )
