"""Every way an op.yaml can be wrong gives one line, `path:line:col: what was expected`.

Each case is the text of a bad op.yaml with an `@` where the error must point; the
expected line and column are computed from that text. Each case is checked twice:
through the loader (SpecError) and through `tensorgen emit` (exit 2, one `error:`
line, no traceback, no output file left behind).
"""

from __future__ import annotations

import re

import pytest

from tensorgen.errors import SpecError
from tensorgen.spec.loader import load_program, parse_program

MARK = "@"

HEADER = """\
tensorgen: 1
name: bad
tensors:
  A: {shape: [4, 3], dtype: int8, role: input}
  B: {shape: [3, 5], dtype: int8, role: input}
  C: {shape: [4, 5], dtype: int32, role: output}
statements:
"""


def stmt(text: str) -> str:
    """A matmul-shaped op.yaml (A 4x3, B 3x5, C 4x5) whose one statement is `text`."""
    return HEADER + f"  - {text}\n"


def where(text: str, constraints: str) -> str:
    return HEADER + f"  - {{stmt: '{text}', where: {constraints}}}\n"


def located(marked: str) -> tuple[str, int, int]:
    """Remove the one MARK from `marked`; return (text, line, col) of where it was, 1-based."""
    assert marked.count(MARK) == 1, "mark exactly one position"
    before = marked[: marked.index(MARK)]
    line = before.count("\n") + 1
    col = len(before) - (before.rfind("\n") + 1) + 1
    return marked.replace(MARK, ""), line, col


def location_of(message: str, path: str) -> tuple[int, int]:
    """(line, col) of a one-line `path:line:col: what` message; asserts that form."""
    assert "\n" not in message, f"not one line: {message!r}"
    m = re.fullmatch(rf"{re.escape(path)}:(\d+):(\d+): (\S.*)", message)
    assert m, f"not of the form '{path}:line:col: what was expected': {message!r}"
    return int(m[1]), int(m[2])


MATMUL = "C[i, j] += A[i, k] * B[k, j]"


def case(name: str, marked: str, expected: str):
    """A bad op.yaml with MARK where the error must point, and a regex for the message."""
    return pytest.param(marked, expected, id=name)


CASES = [
    # --- malformed YAML: where the YAML parser stopped
    case(
        "yaml-unclosed-list",
        "tensorgen: 1\ntensors: {A: [1, 2@}\n",
        r"malformed YAML \(expected ',' or '\]', but got '\}'\)",
    ),
    case(
        "yaml-bad-indent",
        "tensorgen: 1\ntensors:\n  A: {shape: [4], dtype: int8}\n @bad: 1\n",
        r"malformed YAML \(expected <block end>",
    ),
    case("yaml-tab", "tensorgen: 1\n@\tname: bad\n", r"malformed YAML \(found character '\\t'"),
    case(
        "yaml-two-documents",
        "tensorgen: 1\n@---\nname: bad\n",
        r"malformed YAML \(but found another document\)",
    ),
    case("yaml-undefined-alias", stmt("@*S1"), r"malformed YAML \(found undefined alias 'S1'\)"),
    case(
        "duplicate-key",
        "tensorgen: 1\n@tensorgen: 1\n",
        r"duplicate key 'tensorgen' in the op.yaml file",
    ),
    case(
        "tagged-key",
        stmt(MATMUL).replace("dtype: int8, role: input}", "dtype: int8, @!!null role: input}", 1),
        r"expected a plain key in tensor A, got 'role' tagged tag:yaml.org,2002:null",
    ),
    # --- the file as a whole
    case("empty-file", MARK, r"empty file; expected an op.yaml mapping with 'tensorgen: 1'"),
    case("comment-only", f"{MARK}# only a comment\n", r"empty file; expected an op.yaml mapping"),
    case("not-a-mapping", f"{MARK}- C[i] = 0\n", r"expected a mapping for the op.yaml file"),
    case(
        "unknown-top-level-key",
        stmt(MATMUL).replace("name: bad", "@nmae: bad"),
        r"unknown key 'nmae' \(expected one of description, loops, name, schedule, "
        r"statements, target, tensorgen, tensors\)",
    ),
    # --- the format version
    case(
        "version-2",
        stmt(MATMUL).replace("tensorgen: 1", "tensorgen: @2"),
        r"unsupported format version 2 \(expected 1\)",
    ),
    case(
        "version-missing",
        MARK + stmt(MATMUL).replace("tensorgen: 1\n", ""),
        r"missing key 'tensorgen'",
    ),
    case(
        "version-not-a-number",
        stmt(MATMUL).replace("tensorgen: 1", "tensorgen: @one"),
        r"expected the format version 1, got 'one'",
    ),
    # --- tensor declarations
    case(
        "unknown-dtype",
        stmt(MATMUL).replace("dtype: int8", "dtype: @float16", 1),
        r"unknown dtype 'float16' \(expected int8, uint8, int32, float32\)",
    ),
    case(
        "unknown-role",
        stmt(MATMUL).replace("role: output", "role: @result"),
        r"unknown role 'result' \(expected input, output, inout, none\)",
    ),
    case(
        "zero-dimension",
        stmt(MATMUL).replace("[3, 5]", "[3, @0]"),
        r"expected a positive integer dimension, got 0",
    ),
    # --- statements: tensors, subscripts, shapes
    case(
        "unknown-tensor",
        stmt("@C[i, j] += A[i, k] * Q[k, j]"),
        r"unknown tensor 'Q' \(declared: A, B, C\)",
    ),
    case(
        "unknown-tensor-written",
        stmt("@D[i, j] = A[i, j]"),
        r"unknown tensor 'D' \(declared: A, B, C\)",
    ),
    case(
        "non-affine-i*j",
        stmt("C[i, j] += A[@i*j, k] * B[k, j]"),
        r"non-affine subscript 'i \* j': a product of two indices",
    ),
    case(
        "non-affine-i*i",
        stmt("C[i, j] += A[@i*i, k] * B[k, j]"),
        r"non-affine subscript 'i \* i': a product of two indices",
    ),
    case(
        "non-affine-parenthesized",
        stmt("C[i, j] += A[@(i + 1) * j, k] * B[k, j]"),
        r"non-affine subscript '\(i \+ 1\) \* j': a product of two indices",
    ),
    case(
        "non-affine-division",
        stmt("C[i, j] += A[@i // 2, k] * B[k, j]"),
        r"non-affine subscript 'i // 2': only \+, -, and multiplication by an integer constant",
    ),
    case(
        "non-affine-float",
        stmt("C[i, j] += A[i, @1.5] * B[k, j]"),
        r"non-affine subscript '1.5': expected an integer",
    ),
    case("non-affine-written", stmt("C[@i*j, j] = A[i, 0]"), r"non-affine subscript 'i \* j'"),
    # the column counts an opening quote, a `{stmt: '` prefix, and characters (not UTF-8 bytes)
    case(
        "non-affine-quoted",
        HEADER + '  - "C[i, j] += A[@i*j, k] * B[k, j]"\n',
        r"non-affine subscript 'i \* j'",
    ),
    case(
        "non-affine-in-stmt-mapping",
        where("C[i, j] += A[@i*i, k] * B[k, j]", "'0 <= i < 4'"),
        r"non-affine subscript 'i \* i'",
    ),
    # names reach isl and the .tgb tensor table: ASCII identifiers (columns count characters)
    case(
        "non-ascii-tensor-name",
        HEADER.replace("  A:", "  @Ä:") + f"  - {MATMUL}\n",
        r"tensor name 'Ä' is not an identifier \(ASCII letters, digits and _\)",
    ),
    case(
        "non-ascii-index-name",
        stmt("C[i, j] += A[i, k] * B[k, @ĵ]"),
        r"index name 'ĵ' is not an identifier",
    ),
    case(
        "isl-keyword-index-name",
        stmt("C[i, j] += A[i, @max] * B[max, j]"),
        r"index name 'max' is reserved \(a keyword of isl's set notation\)",
    ),
    case(
        "non-affine-after-max=", stmt("C[i, j] max= A[@i*j, 0]"), r"non-affine subscript 'i \* j'"
    ),
    case(
        "out-of-bounds-write",
        stmt("@C[i + 1, j] += A[i, k] * B[k, j]"),
        r"out-of-bounds write: C\[i \+ 1, j\] reaches C\[4, \d\] outside shape \[4, 5\]",
    ),
    case(
        "out-of-bounds-write-negative",
        stmt("@C[i - 1, j] += A[i, k] * B[k, j]"),
        r"out-of-bounds write: C\[i - 1, j\] reaches C\[-1, \d\] outside shape \[4, 5\]",
    ),
    case(
        "out-of-bounds-write-strided",
        stmt("@C[2*i, j] += A[i, k] * B[k, j]"),
        r"out-of-bounds write: C\[2\*i, j\] reaches C\[[46], \d\] outside shape \[4, 5\]",
    ),
    case(
        "out-of-bounds-write-shared-loop",
        "tensorgen: 1\ntensors:\n  X: {shape: [5], dtype: int8, role: input}\n"
        "  Y: {shape: [3], dtype: int8, role: output}\n"
        "loops: {t: 5}\nstatements:\n  - @Y[t] = X[t]\n",
        r"out-of-bounds write: Y\[t\] reaches Y\[[34]\] outside shape \[3\]",
    ),
    case(
        "too-many-subscripts",
        stmt("@C[i, j] += A[i, k, 0] * B[k, j]"),
        r"shape mismatch: A\[i, k, 0\] has 3 subscript\(s\) but A has 2 dimension\(s\)",
    ),
    case(
        "too-few-subscripts",
        stmt("@C[i] += A[i, k] * B[k, 0]"),
        r"shape mismatch: C\[i\] has 1 subscript\(s\) but C has 2 dimension\(s\)",
    ),
    case(
        "index-over-two-extents",
        stmt("@C[i, j] += A[i, k] * B[i, j]"),
        r"shape mismatch: index 'i' ranges over 4 \(C dimension 0\) but over 3 in B dimension 0",
    ),
    # --- statements: functions, operators, ranges, roles
    case(
        "unknown-function",
        stmt("C[i, j] = @sigmoid(A[i, 0])"),
        r"unknown function 'sigmoid' \(expected one of add_fbgemm, add_fbgemm_scalar, clamp, dequantize, int32, int8, lut, max, "
        r"min, quantize, relu, requant, requant_fbgemm, requant_fma, requant_onednn, rshift_round, "
        r"uint8\)",
    ),
    case("wrong-arity", stmt("C[i, j] = @relu(A[i, 0], 1)"), r"relu\(\) takes 1 argument\(s\)"),
    case(
        "unsupported-operator",
        stmt("C[i, j] += @A[i, k] / B[k, j]"),
        r"unsupported expression 'A\[i, k\] / B\[k, j\]'",
    ),
    case(
        "pow-assign-is-not-max=",
        stmt("C[i, j] @**= A[i, 0]"),
        r"expected one of '=', '\+=', 'max=', got '\*\*='",
    ),
    case(
        "syntax-error",
        stmt("C[i, j] += A[i, k] *@"),
        r"expected a statement like 'Y\[i, j\] \+= A\[i, k\] \* B\[k, j\]'",
    ),
    case(
        "range-not-inferable",
        stmt("@C[i, j] += A[i, k + r] * B[k, j]"),
        r"cannot infer the range of index 'r': it never subscripts a tensor dimension bare; "
        r"give it a bound with 'where:'",
    ),
    case(
        "range-bounded-on-one-side",
        where("@C[i, j] += A[i, k + r] * B[k, j]", "'r >= 0'"),
        r"cannot infer the range of index 'r'",
    ),
    case(
        "where-empty",
        where(MATMUL, "@'i > 10'"),
        r"where: 'i > 10' leaves the statement no iterations",
    ),
    case(
        "where-syntax",
        where(MATMUL, "@'i <<< 3'"),
        r"cannot parse where: 'i <<< 3' \(expected isl constraints like '0 <= r < 3'\)",
    ),
    case(
        "write-input",
        stmt("@A[i, k] = B[k, 0]"),
        r"A is an input and cannot be written \(make it inout\)",
    ),
    case(
        "output-never-written",
        HEADER.replace("  C:", "  D: {shape: [2], dtype: int8, role: output}\n  C:")
        + f"  {MARK}- {MATMUL}\n",
        r"output tensor D is never written",
    ),
]


@pytest.mark.parametrize("marked, expected", CASES)
def test_parse_program_names_line_and_column(marked, expected):
    text, line, col = located(marked)
    with pytest.raises(SpecError, match=expected) as info:
        parse_program(text, "ops/bad.yaml")
    assert location_of(str(info.value), "ops/bad.yaml") == (line, col)


@pytest.mark.parametrize("marked, expected", CASES)
def test_emit_exits_2_with_one_line(marked, expected, tmp_path, cli):
    text, line, col = located(marked)
    op = tmp_path / "bad.yaml"
    op.write_text(text, encoding="utf-8")
    out, asm = tmp_path / "out.tgb", tmp_path / "out.s"

    result = cli("emit", op, "-o", out, "--asm", asm, "--target", "tiny")

    message = result.one_error()
    assert location_of(message, str(op)) == (line, col)
    assert re.search(expected, message), message
    assert result.out == ""
    assert not out.exists() and not asm.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.yaml"]  # no temporary left either


def test_load_program_reads_the_file_and_reports_its_path(tmp_path):
    text, line, col = located(stmt("C[i, j] += A[@i*j, k] * B[k, j]"))
    op = tmp_path / "bad.yaml"
    op.write_text(text)
    with pytest.raises(SpecError, match=r"non-affine subscript") as info:
        load_program(op)
    assert location_of(str(info.value), str(op)) == (line, col)


@pytest.mark.parametrize("what", ["missing", "directory"])
def test_unreadable_op_yaml(tmp_path, cli, what):
    path = tmp_path / "nope.yaml"
    if what == "directory":
        path.mkdir()
    with pytest.raises(SpecError, match=rf"^{re.escape(str(path))}: cannot read \(.+\)$"):
        load_program(path)
    message = cli("emit", path, "-o", tmp_path / "out.tgb").one_error()
    assert message.startswith(f"{path}: cannot read (")
    assert not (tmp_path / "out.tgb").exists()


def test_check_exits_2_on_bad_input_too(tmp_path, cli):
    text, line, col = located(stmt("@C[i, j] += A[i, k] * Q[k, j]"))
    op = tmp_path / "bad.yaml"
    op.write_text(text)
    message = cli("check", op, "--target", "tiny").one_error()
    assert message == f"{op}:{line}:{col}: unknown tensor 'Q' (declared: A, B, C)"


def test_every_case_has_a_distinct_id():
    ids = [c.id for c in CASES]
    assert len(ids) == len(set(ids))


def test_a_good_file_loads():
    """The cases above differ from a file that loads by the one thing they test."""
    program = parse_program(stmt(MATMUL), "ops/good.yaml")
    assert [s.bounds for s in program.statements] == [((0, 3), (0, 4), (0, 2))]


def test_a_key_is_its_text_when_untagged():
    """Quoted keys, and plain keys YAML would read as a bool (`on`, `off`), are names; only an
    explicit tag (the `tagged-key` case) is refused."""
    text = stmt("on[i, j] = A[i, j] + off[i, j]").replace(
        "  C: {shape: [4, 5], dtype: int32, role: output}\n",
        "  on: {shape: [4, 3], dtype: int32, 'role': output}\n"
        '  off: {shape: [4, 3], dtype: int8, "role": input}\n',
    )
    program = parse_program(text, "ops/keys.yaml")
    roles = {t.name: t.role for t in program.tensors}
    assert (roles["on"], roles["off"]) == ("output", "input")
