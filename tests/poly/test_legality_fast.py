"""The verdict of the legality check carried through the dependences (`_breaks_any`) is the
verdict of the order between all pairs of statements (`_counterexample`, which names the
broken dependence): on random two- and three-statement schedules, with and without a
parallel band and a restriction to some statements."""

from __future__ import annotations

import islpy as isl
from hypothesis import given, settings
from hypothesis import strategies as st

from tensorgen.poly import legality
from tensorgen.spec.loader import parse_program

CHAIN = """tensorgen: 1
tensors:
  A: {shape: [6], dtype: int8, role: input}
  B: {shape: [6], dtype: int32}
  C: {shape: [6], dtype: int32, role: output}
statements:
  - B[i] = A[i]
  - B[i] += A[5 - i]
  - C[i] = B[i] + B[5 - i]
"""
PROGRAM = parse_program(CHAIN)


@st.composite
def schedules(draw) -> isl.UnionMap:
    """`S_k[i] -> [c_k, a_k*i + b_k, e_k]`: a statement position, a (reversed or shifted)
    loop, and an inner constant; two statements may share a position."""
    parts = []
    for k in range(3):
        pos = draw(st.integers(0, 2))
        a, b = draw(st.sampled_from([1, -1])), draw(st.integers(-2, 2))
        e = draw(st.integers(0, 1))
        parts.append(f"S{k}[i] -> [{pos}, {a}i + {b}, {e}] : 0 <= i < 6")
    return isl.UnionMap("{ " + "; ".join(parts) + " }")


@settings(max_examples=200, deadline=None)
@given(
    schedules(),
    st.sampled_from([(None, None), (0, 1), (1, 2), (1, 3), (0, 3)]),
    st.sampled_from([None, frozenset({"S0", "S1"}), frozenset({"S1", "S2"})]),
)
def test_fast_verdict_is_the_pairwise_one(schedule, band, among) -> None:
    lo, hi = band
    fast = legality._breaks_any(PROGRAM, schedule, lo, hi, among)
    slow = legality._counterexample(PROGRAM, schedule, lo, hi, among)
    assert fast == (slow is not None)


def test_a_broken_schedule_is_named() -> None:
    backwards = isl.UnionMap(
        "{ S0[i] -> [2, i, 0] : 0 <= i < 6; S1[i] -> [1, i, 0] : 0 <= i < 6;"
        " S2[i] -> [0, i, 0] : 0 <= i < 6 }"
    )
    assert legality._breaks_any(PROGRAM, backwards, None, None, None)
    viol = legality._find_violation(PROGRAM, backwards, None, None, None)
    assert viol is not None and viol.kind in ("flow", "output")
