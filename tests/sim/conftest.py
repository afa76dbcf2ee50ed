"""Fixtures of the simulator tests: a run's whole outcome, to compare the fast paths with
stepping (tests run with --import-mode=importlib, so a fixture, not a shared module)."""

from __future__ import annotations

import pytest

from tensorgen.errors import BinaryError, SimulatorError
from tensorgen.sim.machine import simulate


def _outcome(binary, inputs, target, fast: bool, limits=None, marks: bool = False):
    """Outputs, counters, trace events, DRAM channel bookings and marks (with `marks`: at
    every top-level pc) of one run, or ("error", its message); `fast`: `vectorize_loops`."""
    at = tuple(range(len(binary.code) + 1)) if marks else ()
    try:
        r = simulate(
            binary, inputs, target, vectorize_loops=fast, record=True, limits=limits, marks=at
        )
    except (SimulatorError, BinaryError) as err:  # BinaryError: the verifier refuses it first
        return ("error", str(err))
    return (
        {k: v.tolist() for k, v in r.outputs.items()},
        r.stats.as_dict(),
        r.recorder.events,
        r.recorder.channel,
        [(m.pc, m.cycles, m.macs, m.counters) for m in r.marks],
    )


@pytest.fixture(scope="session")  # not per test: hypothesis's tests take it too
def outcome():
    return _outcome
