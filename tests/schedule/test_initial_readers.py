"""boxes._written_first answers "no initial value is read" without isl's dataflow analysis;
wherever it does, the dataflow analysis agrees, and it declines where it cannot tell."""

from __future__ import annotations

from pathlib import Path

import pytest

from tensorgen.errors import TensorgenError
from tensorgen.schedule import boxes
from tensorgen.spec.loader import load_program, parse_program

ROOT = Path(__file__).parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))


def _programs():
    for path in EXAMPLES:
        try:
            yield path.name, load_program(path)
        except TensorgenError:
            continue


def test_fast_answer_agrees_with_the_dataflow_analysis() -> None:
    answered = 0
    for name, program in _programs():
        for t in program.tensors:
            flow = boxes._initial_readers_by_flow(program, t.name)
            if boxes._written_first(program, t.name):
                assert flow.is_empty(), (name, t.name)
                answered += 1
            assert boxes._initial_readers(program, t.name).is_empty() == flow.is_empty()
    assert answered > 0


HEAD = """
tensorgen: 1
name: t
tensors:
  A: {shape: [8], dtype: int32, role: input}
  T: {shape: [8], dtype: int32}
  Y: {shape: [8], dtype: int32, role: output}
statements:
"""


@pytest.mark.parametrize(
    ("statements", "fast", "empty"),
    [
        (["T[i] = A[i]", "Y[i] = T[i]"], True, True),
        (["T[i] = A[i]", "T[i] += A[i]", "Y[i] = T[i]"], True, True),
        (["T[i] += A[i]", "Y[i] = T[i]"], False, False),  # reads its zeros
        (["Y[i] = T[i]", "T[i] = A[i]"], False, False),  # read before written
        (["T[i] = A[i] + T[i]", "Y[i] = T[i]"], False, False),
    ],
)
def test_cases(statements: list[str], fast: bool, empty: bool) -> None:
    program = parse_program(HEAD + "".join(f"  - {s}\n" for s in statements))
    assert boxes._written_first(program, "T") is fast
    assert boxes._initial_readers_by_flow(program, "T").is_empty() is empty
    assert boxes._initial_readers(program, "T").is_empty() is empty


def test_a_partial_write_declines() -> None:
    text = HEAD + '  - {stmt: "T[i] = A[i]", where: "i < 4"}\n  - Y[i] = T[i]\n'
    program = parse_program(text)
    assert not boxes._written_first(program, "T")
    assert not boxes._initial_readers(program, "T").is_empty()


def test_shared_loops_decline() -> None:
    text = (
        HEAD.replace("statements:", "loops: {t: 2}\nstatements:")
        + "  - T[i] = A[i]\n  - Y[i] = T[i]\n"
    )
    try:
        program = parse_program(text)
    except TensorgenError:
        pytest.skip("shared loops spelled otherwise")
    assert program.shared_loops
    assert not boxes._written_first(program, "T")
