"""`schedule: auto` for every program the loader accepts, deterministically.

An op.yaml without `schedule:` gets the automatic schedule; programs outside the layer search
(recurrences under shared loops, chained reductions) get the fastest on the simulator of the
schedules built from the primitives, with no fallback warning. The search is
bounded by counts, never by time: the same bytes however slow the machine.
"""

from __future__ import annotations

import time
import warnings
from pathlib import Path

import pytest

from tensorgen.autosched import search as auto
from tensorgen.driver import compile_file, random_inputs, run_and_compare
from tensorgen.mc.binary import encode

EXAMPLES = Path(__file__).parents[2] / "examples"


def test_no_schedule_key_means_auto() -> None:
    job = compile_file(EXAMPLES / "matmul_256.yaml")
    assert job.program.schedule == "auto"
    assert job.plan is not None and job.plan.chosen is not None


@pytest.mark.parametrize("name", ["rnn_cell", "jacobi1d", "prefix_sum", "matmul_chain"])
def test_outside_the_layer_search_scheduled_automatically(name: str) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        job = compile_file(EXAMPLES / f"{name}.yaml", "tg1")
    assert job.plan is not None and job.plan.schedule is not None, job.plan.reason
    assert "built from the primitives" in job.plan.reason
    assert "Built from the primitives" in job.plan.explain(job.target)
    # the plan's note names how many were measured and the cycles of the fastest
    count, ours = (int(w) for w in job.plan.reason.split() if w.isdigit())
    assert count >= 1
    for seed in (0, 1):
        cmp, result = run_and_compare(job, random_inputs(job.program, seed))
        assert cmp.exact, cmp.message
        assert result.stats.cycles == ours


# cycles of the kernel default (the second lowering, removed) on tiny, where it won until the
# primitive-built schedules learned blocks (jacobi1d) and fusion over rows (matmul_chain)
KERNEL_DEFAULT_TINY = {"jacobi1d": 36864, "matmul_chain": 224688}


@pytest.mark.parametrize("name", sorted(KERNEL_DEFAULT_TINY))
def test_on_tiny_no_slower_than_the_removed_kernel_default(name: str) -> None:
    job = compile_file(EXAMPLES / f"{name}.yaml", "tiny")
    cmp, result = run_and_compare(job, random_inputs(job.program, 0))
    assert cmp.exact, cmp.message
    assert result.stats.cycles < KERNEL_DEFAULT_TINY[name]


def test_chain_runs_both_reductions_on_the_array() -> None:
    job = compile_file(EXAMPLES / "matmul_chain.yaml", "tg1")
    assert len(job.plan.schedule.tensorized) == 2


def _bytes(path: Path, target: str) -> bytes:
    return encode(compile_file(path, target).compiled.binary)


@pytest.mark.parametrize("name", ["conv_bias_relu_requant", "rnn_cell"])
def test_same_bytes_however_slow_the_clock(name: str, monkeypatch) -> None:
    path = EXAMPLES / f"{name}.yaml"
    first = _bytes(path, "tiny")
    assert _bytes(path, "tiny") == first
    clock = iter(range(0, 10**9, 1000))  # every reading 1000 s after the last
    monkeypatch.setattr(time, "process_time", lambda: float(next(clock)))
    monkeypatch.setattr(time, "perf_counter", lambda: float(next(clock)))
    assert _bytes(path, "tiny") == first


def test_candidate_bound_cuts_the_search(monkeypatch) -> None:
    path = EXAMPLES / "conv_bias_relu_requant.yaml"
    full = compile_file(path, "tg1").plan
    monkeypatch.setattr(auto, "MAX_CANDIDATES", 1)
    cut = compile_file(path, "tg1").plan
    assert 0 < len(cut.considered) < len(full.considered)
    assert cut.chosen.cycles >= full.chosen.cycles
