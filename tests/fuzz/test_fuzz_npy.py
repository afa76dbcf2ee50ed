"""`tensorgen run --in` with mutated arrays (wrong dtype or shape, object arrays, pickles, truncated
or empty files, headers that lie, .npz archives, FIFOs, directories) and mutated --in lists."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

SETTINGS = settings(
    max_examples=50,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
# Every mutator (tensorgen/testing/fuzzbin.py): all keep the contract since the binary branch.
KINDS = frozenset(
    {
        "dtype",
        "shape",
        "header-lie",
        "npz",
        "fifo",
        "fortran",
        "object",
        "pickle",
        "truncate",
        "empty",
        "random-bytes",
        "dir",
        "strided",
        "missing-input",
        "unknown-name",
        "duplicate",
        "no-equals",
    }
)


@SETTINGS
@given(seed=st.integers(0, 2**32 - 1))
def test_mutated_inputs_keep_the_contract(fuzz_case, seed):
    outcome = fuzz_case("npy", seed, KINDS)

    assert outcome.cls in ("ok", "refused")
