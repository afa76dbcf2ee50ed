"""Shared by the fuzz property tests: run one generated case in-process and assert the contract.

The cases come from tensorgen/testing/fuzz.py (the same generators as benchmarks/fuzz.py); the
tests draw their seeds with hypothesis, derandomized, so that a run is reproducible: a failure
names the family, the seed and the mutators (`generate(family, random.Random(seed), kinds)`).
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from tensorgen.testing.fuzz import generate
from tensorgen.testing.fuzzrun import execute

LIMIT = 15.0  # seconds per case: far above what any case here needs, well below a hang
MEMORY = 6 << 30  # address space while the case runs: a runaway allocation fails, not the machine


@pytest.fixture
def fuzz_case(tmp_path):
    """run(family, seed, kinds) -> the Outcome; fails the test if the case broke the contract."""

    def run(family: str, seed: int, kinds: frozenset[str] | None = None):
        case = generate(family, random.Random(seed), kinds)
        outcome = execute(case, Path(tmp_path) / "case", LIMIT, MEMORY)
        if (
            outcome.cls == "hang"
        ):  # the CPU timer counts the whole test process: confirm in a fresh one
            outcome = execute(case, Path(tmp_path) / "case", LIMIT, MEMORY, process=True)
        assert not outcome.broken, (
            f"{outcome.cls}: {case.describe()} seed={seed}\n  argv={case.argv}\n  {outcome.detail}\n"
            f"  stderr: {outcome.err[-800:]}"
        )
        return outcome

    return run
