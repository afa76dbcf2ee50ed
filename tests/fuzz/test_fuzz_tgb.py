"""Mutated .tgb binaries (bytes flipped, truncated, extended; header fields, tensor table entries,
operand pool and instruction fields rewritten with the checksum recomputed, as a crafted file
would be): `run` and `disasm` keep the CLI's contract and write nothing outside --out."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

SETTINGS = settings(
    max_examples=40,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
# Every mutator (tensorgen/testing/fuzzbin.py): all keep the contract since the binary branch.
KINDS = frozenset(
    {"flip", "flip-crc", "truncate", "extend", "header", "tensor", "pool", "code", "shuffle"}
)


@SETTINGS
@given(seed=st.integers(0, 2**32 - 1))
def test_mutated_binaries_keep_the_contract(fuzz_case, seed):
    outcome = fuzz_case("tgb", seed, KINDS)

    assert outcome.cls in ("ok", "refused")
