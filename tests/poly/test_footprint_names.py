"""Footprints whatever the index names: a statement with indices `i` and `o_i` (the name the
origin parameter of `i` had) computed wrong results; an unbounded or divided footprint is
refused instead of read wrongly."""

from __future__ import annotations

import islpy as isl
import pytest

from tensorgen.errors import CodegenError
from tensorgen.poly.footprint import footprint, rectangular_hull
from tensorgen.spec.loader import parse_program

MATMUL = """tensorgen: 1
tensors:
  A: {{shape: [40, 24], dtype: int8, role: input}}
  B: {{shape: [24, 40], dtype: int8, role: input}}
  C: {{shape: [40, 40], dtype: int32, role: output}}
statements:
  - C[{i}, {j}] += A[{i}, k] * B[k, {j}]
"""
CONV1D = """tensorgen: 1
tensors:
  X: {shape: [20], dtype: int32, role: input}
  Y: {shape: [18], dtype: int32, role: output}
statements:
  - {stmt: 'Y[i] += X[i + o_i]', where: '0 <= o_i < 3'}
"""


def test_the_footprint_does_not_depend_on_index_names():
    plain = parse_program(MATMUL.format(i="i", j="j")).statements[0]
    clash = parse_program(MATMUL.format(i="i", j="o_i")).statements[0]
    sizes = lambda s: tuple((n, 8) for n in s.indices)  # noqa: E731
    for pos in range(2):
        a = footprint(((plain, plain.reads[pos], sizes(plain)),))
        b = footprint(((clash, clash.reads[pos], sizes(clash)),))
        rename = {"j": "o_i"}
        assert b.size == a.size
        assert b.offset == tuple(
            (c, tuple((rename.get(n, n), k) for n, k in coefs)) for c, coefs in a.offset
        )


@pytest.mark.parametrize("target", ["tiny", "tg1"])
@pytest.mark.parametrize(
    "text", [MATMUL.format(i="i", j="o_i"), CONV1D], ids=["matmul-o_i", "conv1d-o_i"]
)
def test_an_index_named_o_i_computes_the_right_result(text, target, tmp_path, cli):
    op = tmp_path / "op.yaml"
    op.write_text(text)
    result = cli("check", op, "--target", target)
    assert result.code == 0, result.err
    assert "trial 1 (seed 0): BIT-EXACT" in result.out, result.out


def test_a_lower_bound_with_a_division_is_no_offset():
    offset, size = rectangular_hull(
        isl.Set("[o] -> { A[x] : exists e: x = 2e and o <= x < o + 4 }")
    )
    assert offset == [None] and size == [3]
    assert rectangular_hull(isl.Set("[o] -> { A[x] : o <= x < o + 4 }")) == ([(0, {"o": 1})], [4])


def test_an_unbounded_footprint_is_a_codegen_error():
    with pytest.raises(CodegenError, match="the footprint of A has no bounded box"):
        rectangular_hull(isl.Set("[o] -> { A[x] : o <= x }"))
