"""Regression tests for the op.yaml failure classes fuzzing found, and for the limits of
`InputLimits`: each input is refused by `tensorgen emit` with exit code 2, exactly one stderr
line naming the file, line and column, and no output file left (the loader refuses it before
any compile work, so none of these hangs or exhausts memory)."""

from __future__ import annotations

import re
from dataclasses import fields

import pytest

from tensorgen.errors import SpecError
from tensorgen.inputs import LIMITS, InputLimits
from tensorgen.spec.loader import parse_program

HEADER = """\
tensorgen: 1
name: limits
tensors:
  A: {shape: [4, 3], dtype: int8, role: input}
  B: {shape: [3, 5], dtype: int8, role: input}
  C: {shape: [4, 5], dtype: int32, role: output}
statements:
"""
MATMUL = "C[i, j] += A[i, k] * B[k, j]"
GOOD = HEADER + f"  - {MATMUL}\n"
BIG = "99999999999999999999"


def stmt(text: str) -> str:
    return HEADER + f"  - {text}\n"


def copy(shape: str, dtype: str = "int8") -> str:
    return (
        f"tensorgen: 1\ntensors:\n  X: {{shape: {shape}, dtype: {dtype}, role: input}}\n"
        f"  Y: {{shape: {shape}, dtype: {dtype}, role: output}}\nstatements:\n  - Y[i] = X[i]\n"
    )


CASES = {
    # YAML scalars and numeric tags: what YAML says the value is, refused unless the right type
    "int-tag-not-a-number": (
        GOOD.replace("[4, 3]", "[!!int xx, 3]"),
        r"4:15: expected a positive integer dimension, got 'xx' \(not a valid int\)",
    ),
    "float-tag-dimension": (
        GOOD.replace("[4, 3]", "[!!float 4, 3]"),
        r"4:15: expected a positive integer dimension, got '4'",
    ),
    "hex-without-digits": (
        GOOD.replace("[4, 3]", "[0x, 3]"),
        r"4:15: expected a positive integer dimension, got '0x'",
    ),
    "dimension-1e999": (
        GOOD.replace("[4, 3]", "[1e999, 3]"),
        r"expected a positive integer dimension, got '1e999'",
    ),
    "dimension-inf": (
        GOOD.replace("[4, 3]", "[.inf, 3]"),
        r"expected a positive integer dimension, got '.inf'",
    ),
    "dimension-nan": (
        GOOD.replace("[4, 3]", "[.nan, 3]"),
        r"expected a positive integer dimension, got '.nan'",
    ),
    "dimension-bool": (
        GOOD.replace("[4, 3]", "[true, 3]"),
        r"expected a positive integer dimension, got 'true'",
    ),
    "dimension-5000-digits": (
        GOOD.replace("[4, 3]", "[1" + "0" * 5000 + ", 3]"),
        r"expected a positive integer dimension",
    ),
    "version-str-tag": (
        GOOD.replace("tensorgen: 1", "tensorgen: !!str 1"),
        r"1:12: expected the format version 1, got '1'",
    ),
    "version-bad-timestamp": (
        GOOD.replace("tensorgen: 1", "tensorgen: !!timestamp xx"),
        r"not a valid timestamp",
    ),
    "loop-int-tag": (
        GOOD + "loops: {t: !!int zz}\n",
        r"expected a positive trip count, got 'zz' \(not a valid int\)",
    ),
    "pad-bool": (
        GOOD.replace("role: input}", "role: input, pad: true}", 1),
        r"expected an integer pad value, got 'true'",
    ),
    "where-bool": (
        HEADER + f"  - {{stmt: '{MATMUL}', where: true}}\n",
        r"expected isl constraints",
    ),
    "target-int": (GOOD + "target: 5\n", r"expected a target name, got '5'"),
    "scale-1e999": (
        stmt("C[i, j] = requant(A[i, 0], 1e999, 0)"),
        r"constant inf is outside the range of scales",
    ),
    "scale-1e300": (
        stmt("C[i, j] = requant(A[i, 0], 1e300, 0)"),
        r"constant 1e\+300 is outside the range of scales",
    ),
    "zero-point-float": (
        stmt("C[i, j] = requant(A[i, 0], 0.5, 1.5)"),
        r"requant\(\) needs an integer constant as argument 3",
    ),
    "clamp-float": (
        stmt("C[i, j] = clamp(A[i, 0], 0.5, 3)"),
        r"clamp\(\) needs an integer constant as argument 2",
    ),
    "rshift-round-of-a-tensor": (
        stmt("C[i, j] = rshift_round(A[i, 0], A[i, 0])"),
        r"rshift_round\(\) needs an integer constant",
    ),
    # huge subscripts, coefficients, offsets, constants, shift amounts: the ISA's i32 range
    "subscript-offset-huge": (
        stmt(f"C[i, j] += A[i + {BIG}, k] * B[k, j]"),
        r"subscript constant 99999999999999999999 is outside the i32 range",
    ),
    "subscript-coefficient-2^40": (
        stmt("C[i, j] += A[1099511627776*i, k] * B[k, j]"),
        r"is outside the i32 range",
    ),
    "subscript-product-2^62": (
        stmt("C[i, j] += A[65536*65536*65536*i, k] * B[k, j]"),
        r"subscript offset 4294967296 is outside the i32 range",
    ),
    "subscript-range-over-i32": (
        stmt("C[i, j] += A[i + 2147483647, k] * B[k, j]"),
        r"subscript 'i \+ 2147483647' of A ranges over \[2147483647, 2147483650\]",
    ),
    "shift-amount-huge": (
        stmt(f"C[i, j] = A[i, 0] >> {BIG}"),
        r"constant 99999999999999999999 is outside the i32 range",
    ),
    "constant-2^31": (
        stmt("C[i, j] = A[i, 0] + 2147483648"),
        r"constant 2147483648 is outside the i32 range",
    ),
    "double-negation-2^31": (
        stmt("C[i, j] = A[i, 0] + - - 2147483648"),
        r"constant 2147483648 is outside the i32 range",
    ),
    "where-integer-huge": (
        HEADER + f"  - {{stmt: '{MATMUL}', where: '{BIG}*i < 3'}}\n",
        r"where: integer 99999999999999999999 is outside the i32 range",
    ),
    # tensor shapes and loop extents near 2**63 (they hung), statement counts, expressions
    "shape-2^63": (
        copy("[9223372036854775807]"),
        r"X has 9,223,372,036,854,775,807 elements; at most 2,147,483,648 per tensor \(limit InputLimits.tensor_elements",
    ),
    "shape-10^12": (
        copy("[1000000, 1000000]").replace("Y[i] = X[i]", "Y[i, j] = X[i, j]"),
        r"elements; at most 2,147,483,648 per tensor",
    ),
    "dram-image": (
        copy("[1073741824]", "int32"),
        r"take 8,589,934,592 bytes of DRAM; at most 4,294,967,296 \(limit InputLimits.dram_bytes",
    ),
    "rank-7": (
        copy("[1, 1, 1, 1, 1, 1, 2]"),
        r"X has 7 dimensions; at most 6 \(limit InputLimits.tensor_rank",
    ),
    "loop-2^63": (
        GOOD + "loops: {t: 9223372036854775807}\n",
        r"trip count 9223372036854775807 is over the limit of 2,147,483,648 \(limit InputLimits.loop_extent",
    ),
    "where-extent-2^31": (
        HEADER + "  - {stmt: 'C[i, j] += A[i, k + r] * B[k, j]', where: '0 <= r <= 2147483648'}\n",
        r"index 'r' runs over \[0, 2147483648\]; at most 2,147,483,648 values",
    ),
    "instances-2^45": (
        GOOD + "loops: {t: 1000000, u: 1000000}\n",
        r"the statement has 60,000,000,000,000 instances; at most 1,099,511,627,776 \(limit InputLimits.statement_iterations",
    ),
    "statements-20000": (
        HEADER + f"  - {MATMUL}\n" * 20000,
        r"20000 statements; at most 64 \(limit InputLimits.statements",
    ),
    "expression-long": (
        stmt("C[i, j] = " + " + ".join(["A[i, 0]"] * 1000)),
        r"statement longer than 4096 characters \(limit InputLimits.statement_chars",
    ),
    "expression-deep-sum": (
        stmt("C[i, j] = " + " + ".join(["A[i, 0]"] * 100)),
        r"expression nested deeper than 32 levels \(limit InputLimits.expr_depth",
    ),
    "expression-deep-calls": (
        stmt("C[i, j] = " + "relu(" * 40 + "A[i, 0]" + ")" * 40),
        r"expression nested deeper than 32 levels",
    ),
    "expression-deep-negation": (
        stmt("C[i, j] = " + "-" * 3000 + "A[i, 0]"),
        r"expression nested deeper than 32 levels|statement longer",
    ),
    "subscript-deep": (
        stmt("C[i, j] = A[" + "-" * 3000 + "i, 0]"),
        r"expression nested deeper than 32 levels",
    ),
    # names isl and the .tgb tensor table can hold
    "tensor-name-non-ascii": (
        GOOD.replace("A:", "Ä:").replace("A[", "Ä["),
        r"tensor name 'Ä' is not an identifier",
    ),
    "tensor-name-too-long": (
        GOOD.replace("A", "A" * 40),
        r"tensor name 'A{20}...' is longer than 32 characters \(limit InputLimits.name_chars",
    ),
    "index-name-isl-keyword": (
        stmt("C[i, j] += A[i, exists] * B[exists, j]"),
        r"index name 'exists' is reserved \(a keyword of isl's set notation\)",
    ),
    "loop-name-isl-keyword": (GOOD + "loops: {mod: 2}\n", r"loop name 'mod' is reserved"),
    # float32 only at a model's edges; a statement iterates over at least one index (these ended
    # in tracebacks in the reference)
    "float32-in-arithmetic": (
        copy("[4]", "float32")
        .replace("Y: {shape: [4], dtype: float32", "Y: {shape: [4], dtype: int32")
        .replace("= X[i]", "= X[i] + 1"),
        r"X is float32: it can only be read by quantize",
    ),
    "float32-written-by-a-copy": (
        copy("[4]", "float32").replace(
            "X: {shape: [4], dtype: float32", "X: {shape: [4], dtype: int32"
        ),
        r"Y is float32: it can only be written by 'Y\[i\] = dequantize",
    ),
    "quantize-of-an-integer": (
        copy("[4]").replace("= X[i]", "= quantize(X[i], 0.5, 0)"),
        r"expected a float32 tensor in X\[i\], got int8",
    ),
    "dequantize-to-an-integer": (
        copy("[4]").replace("= X[i]", "= dequantize(X[i], 0.5, 0)"),
        r"dequantize\(\) gives float32, but Y is int8",
    ),
    "no-index": (stmt("C[0, 0] = A[1, 2]"), r"a statement needs at least one index"),
    # a control character in YAML: one line, with line and column
    "yaml-control-character": (
        "tensorgen: 1\nname: \x07bad: [x\n",
        r"2:7: malformed YAML \(unacceptable character #x0007",
    ),
    "yaml-quoted-line-separator-key": (
        GOOD.replace("A:", '"A\\u2028\\x85B":'),
        r"tensor name 'A\\u2028\\x85B' is not an identifier",
    ),
    "long-dtype-quoted-short": (
        GOOD.replace("dtype: int8", "dtype: int" + "0" * 5000, 1),
        r"unknown dtype 'int0+\.\.\.' \(expected int8",
    ),
}


@pytest.mark.parametrize("name", CASES)
def test_emit_refuses_with_one_line(name, tmp_path, cli):
    text, expected = CASES[name]
    op = tmp_path / "bad.yaml"
    op.write_text(text, encoding="utf-8")
    out, asm = tmp_path / "out.tgb", tmp_path / "out.s"
    message = cli("emit", op, "-o", out, "--asm", asm, "--target", "tiny").one_error()
    assert message.startswith(f"{op}:") and message.isprintable(), message
    assert re.search(expected, message), message
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.yaml"]  # no output, no temporary


def test_every_refusal_names_line_and_column():
    for name, (text, _) in CASES.items():
        with pytest.raises(SpecError) as info:
            parse_program(text, "ops/bad.yaml")
        assert re.match(r"ops/bad\.yaml:\d+:\d+: \S", str(info.value)), (name, str(info.value))


def test_limits_are_one_frozen_dataclass_and_the_docs_list_each():
    from pathlib import Path

    docs = (Path(__file__).parents[2] / "docs" / "op-yaml.md").read_text(encoding="utf-8")
    limits = docs[docs.index("## Limits") :]
    for f in fields(InputLimits):
        assert f"`{f.name}`" in limits, f.name
    with pytest.raises(AttributeError):
        LIMITS.statements = 10**6  # type: ignore[misc]


def test_the_limits_are_what_the_isa_encodes():
    from tensorgen.mc import isa
    from tensorgen.mc.operands import MAX_RANK

    assert LIMITS.tensor_rank == MAX_RANK
    assert isa.FIELD_FORMATS["i32"] == "i" and (LIMITS.int_min, LIMITS.int_max) == (
        -(2**31),
        2**31 - 1,
    )
    assert LIMITS.loop_extent <= 2**32 - 1  # LOOP's count is a u32
    # an element offset, a subscript value times a stride (at most the tensor's elements): int64
    assert LIMITS.tensor_elements * -LIMITS.int_min < 2**63
    assert LIMITS.statement_iterations < 2**63


def test_at_the_limits_a_program_still_loads():
    """The boundaries are inclusive: the largest tensor and constants load."""
    program = parse_program(copy(f"[{LIMITS.tensor_elements}]"), "ops/ok.yaml")
    assert program.tensors[0].nbytes == LIMITS.tensor_elements
    program = parse_program(
        stmt(f"C[i, j] = A[i, 0] + {LIMITS.int_max} + -2147483648"), "ops/ok.yaml"
    )
    assert program.statements[0].rhs.lhs.rhs.value == LIMITS.int_max
    program = parse_program(HEADER + f"  - {MATMUL}\n" * LIMITS.statements, "ops/ok.yaml")
    assert len(program.statements) == LIMITS.statements
