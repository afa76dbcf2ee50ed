"""Mutated op.yaml files (examples/*.yaml with characters, tokens, numbers, YAML tags, nesting,
control characters and non-UTF-8 bytes changed) checked or emitted: the CLI's contract holds."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

SETTINGS = settings(
    max_examples=25,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
# Every mutator (tensorgen/testing/fuzz.py). "many-statements" (100 to 20,000 copies of a
# statement) is refused by the loader's statement limit (64) before any compile work.
KINDS = frozenset(
    {
        "tok-insert",
        "tok-delete",
        "tok-replace",
        "char",
        "yaml-tag",
        "control-char",
        "non-utf8",
        "line",
        "billion-laughs",
        "deep-nesting",
        "deep-expression",
        "huge-loop",
        "huge-number",
        "where",
        "many-statements",
    }
)


@SETTINGS
@given(seed=st.integers(0, 2**32 - 1))
def test_mutated_op_yaml_keeps_the_contract(fuzz_case, seed):
    outcome = fuzz_case("opyaml", seed, KINDS)

    assert outcome.cls in ("ok", "refused")
