"""The IR's values and their isl view stay exact and parseable for every program the loader
accepts: sizes in Python integers, names isl reads as names."""

from __future__ import annotations

import pytest

from tensorgen.ir import poly
from tensorgen.ir.core import Tensor


def test_nbytes_is_exact_beyond_int64():
    # np.prod(..., dtype=int64) wrapped here; a size check must see the true value
    t = Tensor("X", (2**40, 2**40), "int32")
    assert t.nbytes == 2**82


@pytest.mark.parametrize(
    "name",
    [
        "max",
        "min",
        "mod",
        "floor",
        "ceil",
        "floord",
        "ceild",
        "exists",
        "infty",
        "NaN",
        "nan",
        "true",
        "false",
        "False",
        "rat",
        "not",
        "and",
        "or",
        "implies",
    ],
)
def test_isl_keywords_are_not_names(name):
    assert not poly.isl_name_ok(name)


@pytest.mark.parametrize(
    "name", ["i", "A", "S0", "o_i", "e", "d0", "c1", "_", "x_1", "domain", "xor", "inf"]
)
def test_identifiers_are_names(name):
    assert poly.isl_name_ok(name)
