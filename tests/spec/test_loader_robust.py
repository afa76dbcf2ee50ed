"""Mutated op.yaml files either load or get one `file:line:col: ...` SpecError line, never
another exception, a hang or a second line.

The mutations start from the texts of examples/*.yaml: characters and tokens inserted, deleted
or replaced, huge or odd numbers, YAML tags, deep nesting, control characters.
"""

from __future__ import annotations

import re
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tensorgen.errors import SpecError
from tensorgen.ir.core import Program
from tensorgen.spec.loader import parse_program

EXAMPLES = sorted((Path(__file__).parents[2] / "examples").glob("*.yaml"))
TEXTS = [p.read_text(encoding="utf-8") for p in EXAMPLES]
PATH = "fuzz/op.yaml"

TOKENS = [
    "0",
    "1",
    "-1",
    "2147483647",
    "2147483648",
    "-2147483649",
    "99999999999999999999",
    "4611686018427387904",
    "9223372036854775807",
    "1e999",
    "-1e999",
    ".inf",
    "-.inf",
    ".nan",
    "0x",
    "0x1F",
    "0o17",
    "1_0",
    "1:30",
    "true",
    "false",
    "null",
    "~",
    "yes",
    "!!int",
    "!!float",
    "!!str",
    "!!bool",
    "!!timestamp",
    "!!binary",
    "!!python/object:os.system",
    "!foo",
    "&a",
    "*a",
    "<<",
    "[",
    "]",
    "{",
    "}",
    ",",
    ":",
    "- ",
    "'",
    '"',
    "#",
    "\t",
    "\n",
    "\x00",
    "\x07",
    "\x1b",
    "\x85",
    "\u2028",
    "\ufeff",
    "Ä",
    "i",
    "j",
    "k",
    "t",
    "o_i",
    "max",
    "mod",
    "exists",
    "S0",
    "A",
    "B",
    "C",
    "[i]",
    "[i, j]",
    "[i + 1]",
    "i*j",
    "+",
    "-",
    "*",
    ">>",
    "<<",
    "100000",
    " >> 100000",
    "relu(",
    "requant(",
    "clamp(",
    "rshift_round(",
    "int8(",
    ")",
    "(",
    "+=",
    "max=",
    "**=",
    "=",
    "where: ",
    "stmt: ",
    "loops: {t: 4}",
    "shape: [",
    "dtype: int8",
    "role: output",
    "pad: 1",
]


@st.composite
def mutated(draw) -> str:
    text = draw(st.sampled_from(TEXTS))
    for _ in range(draw(st.integers(1, 4))):
        pos = draw(st.integers(0, len(text)))
        kind = draw(
            st.sampled_from(["insert", "delete", "replace", "number", "nest", "swap-number"])
        )
        if kind == "insert":
            text = text[:pos] + draw(st.sampled_from(TOKENS) | st.text(max_size=3)) + text[pos:]
        elif kind == "delete":
            text = text[:pos] + text[pos + draw(st.integers(1, 8)) :]
        elif kind == "replace":
            text = (
                text[:pos] + draw(st.sampled_from(TOKENS)) + text[pos + draw(st.integers(1, 4)) :]
            )
        elif kind == "number":
            text = text[:pos] + str(draw(st.integers(-(2**70), 2**70))) + text[pos:]
        elif kind == "nest":
            depth = draw(st.integers(1, 400))
            opener, closer = draw(
                st.sampled_from([("[", "]"), ("{a: ", "}"), ("(", ")"), ("relu(", ")"), ("-", "")])
            )
            text = text[:pos] + opener * depth + "x" + closer * depth + text[pos:]
        else:  # a number of the file replaced by one at a boundary
            numbers = list(re.finditer(r"\d+", text))
            if numbers:
                m = draw(st.sampled_from(numbers))
                big = draw(
                    st.sampled_from(
                        [
                            "0",
                            "-1",
                            "2147483648",
                            "4294967296",
                            "99999999999999999999",
                            "9223372036854775807",
                            "1" + "0" * 5000,
                        ]
                    )
                )
                text = text[: m.start()] + big + text[m.end() :]
    return text


def assert_loads_or_one_line(text: str) -> None:
    try:
        program = parse_program(text, PATH)
    except SpecError as err:
        message = str(err)
        assert message.splitlines() == [message] and message.isprintable(), repr(message)
        assert message.startswith(f"{PATH}:"), message
        assert len(message) < 2000, message[:200]
        return
    assert isinstance(program, Program)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated())
def test_mutated_examples_load_or_give_one_line(text):
    assert_loads_or_one_line(text)


def test_the_examples_load():
    """The starting points load: the mutations above are what make a file bad."""
    for text in TEXTS:
        assert isinstance(parse_program(text, PATH), Program)
