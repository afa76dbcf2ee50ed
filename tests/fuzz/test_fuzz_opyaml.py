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
# The mutators whose cases keep the contract (tensorgen/testing/fuzz.py). "many-statements" is
# left out: 100-2000 copies of a conv statement are within the loader's limits and take minutes
# to compile and check (seed 82: 921 instructions, compiled in 15 s).
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
    }
)


@SETTINGS
@given(seed=st.integers(0, 2**32 - 1))
def test_mutated_op_yaml_keeps_the_contract(fuzz_case, seed):
    outcome = fuzz_case("opyaml", seed, KINDS)

    assert outcome.cls in ("ok", "refused")
