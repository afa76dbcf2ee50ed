"""isl AST bound expressions as the max/min of floor(affine / d) terms the hardware loops take:
exact at every point, or refused with one line."""

from __future__ import annotations

import itertools

import islpy as isl
import pytest

from tensorgen.codegen.emitter import floor_terms
from tensorgen.errors import CodegenError
from tensorgen.mc.operands import LoopAffine

CTX = isl.DEFAULT_CONTEXT
C0, C1 = isl.AstExpr.from_id(isl.Id("c0")), isl.AstExpr.from_id(isl.Id("c1"))
ENV = {"c0": LoopAffine.make(0, {0: 1}), "c1": LoopAffine.make(0, {1: 1})}


def n(v: int) -> isl.AstExpr:
    return isl.AstExpr.from_val(isl.Val.int_from_si(CTX, v))


# (expression, its value in Python: isl's `/` and pdiv_q are floors where isl emits them)
CASES = [
    (C0.add(n(3)).pdiv_q(n(4)).neg(), lambda a, b: -((a + 3) // 4)),  # the issue's -((c4 + 3) / 4)
    (C0.neg().sub(C0.neg().add(n(3)).pdiv_q(n(3))), lambda a, b: -a - (-a + 3) // 3),
    (n(3).mul(C0).add(n(6)).div(n(7)).neg(), lambda a, b: -((3 * a + 6) // 7)),
    (C1.sub(C0.add(n(1)).pdiv_q(n(2))), lambda a, b: b - (a + 1) // 2),
    (n(-2).mul(C0.sub(C1)).add(n(5)), lambda a, b: -2 * (a - b) + 5),
    (C0.add(C1.mul(n(2))).pdiv_q(n(3)).pdiv_q(n(2)), lambda a, b: (a + 2 * b) // 3 // 2),
    (C0.pdiv_q(n(5)).add(C1).neg().add(n(1)), lambda a, b: -(a // 5 + b) + 1),
]


@pytest.mark.parametrize("index", range(len(CASES)))
def test_bounds_are_rewritten_exactly(index: int) -> None:
    expr, value = CASES[index]
    for combine in ("max", "min"):
        terms = floor_terms(expr, ENV, combine)
        assert len(terms) == 1 and all(d > 0 for _, d in terms)
        for a, b in itertools.product(range(-9, 10), repeat=2):
            ((num, d),) = terms
            assert num.eval((a, b)) // d == value(a, b), (expr.to_C_str(), a, b)


@pytest.mark.parametrize(
    "expr",
    [
        C0.pdiv_q(n(2)).add(C1.pdiv_q(n(3))),  # a sum of two divisions
        n(3).mul(C0.pdiv_q(n(2))),  # a multiple of a division
        C0.pdiv_r(n(4)),  # a remainder
    ],
)
def test_bounds_without_that_form_are_refused_in_one_line(expr) -> None:
    with pytest.raises(
        CodegenError,
        match=r"^the schedule's loop nest has a bound '.*' that the hardware loops "
        r"cannot take \(",
    ) as err:
        floor_terms(expr, ENV, "max")
    assert "\n" not in str(err.value)
