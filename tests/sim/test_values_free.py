"""Values-free runs (`simulate(values=False)`) against runs that compute the values: over the
random programs of the simulator's equivalence tests (pipelined replayed loops, MATMUL and
VMUL/VMAC runs, a queue idle), stepped or vectorised, the same counters, trace events, DRAM
channel and marks -- or the same error, hazards and out-of-bounds accesses included; the same
for two example models' whole binaries; and a values-free run's outputs refuse to be read."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tensorgen.errors import BinaryError, SimulatorError
from tensorgen.frontend.load import load_model
from tensorgen.mc.binary import assemble
from tensorgen.model import compile_model
from tensorgen.sim.machine import simulate
from tensorgen.target import load_target

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]


def _module(name: str):
    """A sibling test module, for its program generators (tests run with
    --import-mode=importlib: no package to import them from)."""
    spec = importlib.util.spec_from_file_location(f"_values_free_{name}", HERE / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


REPLAY, STEPS, FAST = _module("test_replay"), _module("test_step_paths"), _module("test_fast_paths")


def _counters(binary, inputs, target, values: bool, fast: bool = True, marks: bool = True):
    """Every counter, trace event, DRAM channel booking and mark (at every top-level pc) of
    one run, or ("error", its message)."""
    at = tuple(range(len(binary.code) + 1)) if marks else ()
    try:
        r = simulate(
            binary, inputs, target, vectorize_loops=fast, record=True, marks=at, values=values
        )
    except (SimulatorError, BinaryError) as err:
        return ("error", str(err))
    return (
        r.stats.as_dict(),
        r.recorder.events,
        r.recorder.channel,
        [(m.pc, m.cycles, m.macs, m.dram_bytes, m.counters) for m in r.marks],
    )


def _same_either_way(binary, inputs, target, fast: bool, marks: bool) -> tuple:
    """The values-free run's outcome, asserted equal to the computing run's, and a computing
    run after it (on the plans both keep with the binary) computing what a fresh one does."""
    full = _counters(binary, inputs, target, True, fast, marks)
    free = _counters(binary, inputs, target, False, fast, marks)
    assert free == full
    if full[0] != "error":
        fresh = simulate(binary, inputs, target, vectorize_loops=fast).outputs
        again = simulate(binary, inputs, target, vectorize_loops=fast)
        assert set(again.outputs) == set(fresh)
        for name, value in fresh.items():
            np.testing.assert_array_equal(again.outputs[name], value)
    return free


@settings(max_examples=150, deadline=None)
@given(case=REPLAY.CASES, seed=st.integers(0, 2**16), fast=st.booleans(), marks=st.booleans())
def test_replayed_loops_count_the_same_values_free(case, seed: int, fast: bool, marks: bool):
    binary = assemble(REPLAY._program(case))
    _same_either_way(binary, REPLAY._inputs(case, seed), REPLAY.TARGETS[case.buffers], fast, marks)


@settings(max_examples=150, deadline=None)
@given(case=STEPS.CASES, seed=st.integers(0, 2**16), fast=st.booleans())
def test_vector_runs_count_the_same_values_free(case, seed: int, fast: bool) -> None:
    binary = assemble(STEPS._program(case))
    out = _same_either_way(binary, STEPS._inputs(case.xd, seed), STEPS.TARGET, fast, case.marks)
    if case.fault == "oob":  # an access out of bounds is reported values-free too
        assert out[0] == "error" and ("outside" in out[1] or "reaches bytes" in out[1])


@settings(max_examples=150, deadline=None)
@given(case=FAST.CASES, seed=st.integers(0, 2**16), fast=st.booleans(), marks=st.booleans())
def test_matmul_runs_count_the_same_values_free(case, seed: int, fast: bool, marks: bool):
    binary = assemble(FAST._program(case))
    rng = np.random.default_rng(seed)
    lo, hi = (-128, 128) if case.xd == "int8" else (0, 256)
    inputs = {
        "X": rng.integers(lo, hi, (8, 16)).astype(case.xd),
        "W": rng.integers(-128, 128, (16, 4)).astype(np.int8),
    }
    _same_either_way(binary, inputs, FAST.TARGETS[case.buffers], fast, marks)


@settings(max_examples=40, deadline=None)
@given(
    p=st.builds(
        STEPS.Pipe,
        count=st.sampled_from([3, 4, 6, 20]),
        after=st.sampled_from(["none", "token", "race", "ex_race"]),
        outer=st.booleans(),
        buffers=st.sampled_from([1, 2]),
    ),
    fast=st.booleans(),
)
def test_a_loop_with_a_queue_idle_counts_the_same_values_free(p, fast: bool) -> None:
    binary = assemble(STEPS._pipe(p))
    rng = np.random.default_rng(7)
    inputs = {
        "X": rng.integers(-128, 128, (8 * p.count, 16)).astype(np.int8),
        "W": rng.integers(-128, 128, (16, 4)).astype(np.int8),
    }
    out = _same_either_way(binary, inputs, STEPS.TARGETS[p.buffers], fast, False)
    if p.after == "race":
        assert out[0] == "error" and "hazard" in out[1]


RESIDENT = REPLAY.Case(2, "int8", 3, -2, 9, 1, "none", 0, False, "none", False, False, "yes")


def _resident_program(guard: bool, reach: int) -> str:
    """test_replay's loop reading X at addresses that move with it (replayed: LD idle), its
    moving MATMUL source `reach` bytes further per iteration; with `guard`, under an IF taken
    in every iteration (the verifier then leaves its bounds to the run)."""
    lines = REPLAY._program(RESIDENT).splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("MATMUL"))
    lines[at] = lines[at].replace("+64*L0[", f"+{reach}*L0[")
    if guard:  # its token taken by a SYNC before the IF: the IF's body must balance
        loop = next(i for i, line in enumerate(lines) if line.startswith("LOOP count=9"))
        body = int(lines[loop].split("body=")[1])
        lines[loop] = f"LOOP count=9 body={body + 2}"
        lines[at] = lines[at].replace(" wait=ST", "")
        lines[at:at] = ["SYNC queue=1 wait=ST", "IF cond=B(0+L0/1) body=1"]
    return "\n".join(lines) + "\n"


def test_a_moving_source_leaving_its_memory_late_fails_values_free_too(monkeypatch) -> None:
    """A replayed loop whose moving MATMUL source, under an IF always taken (the verifier
    leaves its bounds to the run), leaves the scratchpad at the last iteration: with values
    the replayed iterations' plan declines and stepping reports it; values-free, where no
    plan is made, the run reports the same (`replay.run_loop`)."""
    target = REPLAY.TARGETS[2]
    extent = 3 * 16 + 4  # the bytes of a 4x4 tile of rows 16 apart
    reach = -(-(target.spad.bytes - extent + 1) // 8)  # iteration 8 ends past it, 7 does not
    binary = assemble(_resident_program(True, reach))
    inputs = REPLAY._inputs(RESIDENT, 0)
    full = _counters(binary, inputs, target, True, marks=False)
    assert full[0] == "error" and "outside spad" in full[1] and "[8]" in full[1]
    assert _counters(binary, inputs, target, False, marks=False) == full
    # unguarded, the verifier refuses it before it runs, in both modes
    binary = assemble(_resident_program(False, reach))
    full = _counters(binary, inputs, target, True, marks=False)
    assert full[0] == "error" and _counters(binary, inputs, target, False, marks=False) == full


def test_input_errors_are_the_same_values_free() -> None:
    """The inputs are checked as ever: missing, misshapen, of the wrong dtype, unknown."""
    case = REPLAY.Case(2, "int8", 3, -2, 5, 1, "loop", 0, False, "none", False)
    binary, target = assemble(REPLAY._program(case)), REPLAY.TARGETS[2]
    good = REPLAY._inputs(case, 0)
    bad = [
        {"X": good["X"]},
        {**good, "W": good["W"][:3]},
        {**good, "W": good["W"].astype(np.float32)},
        {**good, "X": good["X"].astype(np.int64) + 200},
        {**good, "Y": good["X"]},
    ]
    for inputs in bad:
        full = _counters(binary, inputs, target, True)
        assert full[0] == "error"
        assert _counters(binary, inputs, target, False) == full


def test_a_values_free_run_has_no_outputs_to_read() -> None:
    case = REPLAY.Case(2, "int8", 3, -2, 5, 1, "loop", 0, False, "none", False)
    binary, target = assemble(REPLAY._program(case)), REPLAY.TARGETS[2]
    r = simulate(binary, REPLAY._inputs(case, 0), target, values=False)
    assert r.stats.macs > 0
    for look in (
        lambda o: o["C"],
        lambda o: dict(o),
        lambda o: len(o),
        lambda o: "C" in o,
        lambda o: o.get("C"),
        lambda o: list(o.values()),
    ):
        with pytest.raises(SimulatorError, match="values=False"):
            look(r.outputs)


@pytest.mark.parametrize(
    "name",
    ["small_cnn", pytest.param("resnet18", marks=pytest.mark.slow)],  # 25 s to compile
)
def test_a_model_binary_counts_the_same_values_free(name: str) -> None:
    """A whole model's binary (its layers' marks too) values-free and computing."""
    model, inputs = load_model(str(ROOT / "examples" / "models" / f"{name}.py:build"), {"size": 32})
    target = load_target("tg1")
    cm = compile_model(model, inputs, target)
    feed = {n: x.numpy().astype(np.float32) for n, x in zip(cm.input_names, inputs, strict=True)}
    marks = tuple(end for _, end in cm.linked.layer_ranges)
    runs = [
        simulate(cm.binary, feed, target, marks=marks, record=True, values=v) for v in (1, 0, 1)
    ]
    full, free, again = runs
    assert free.stats == full.stats and free.recorder == full.recorder
    assert [(m, m.counters) for m in free.marks] == [(m, m.counters) for m in full.marks]
    assert len(free.marks) == len(marks) and free.stats.cycles > 0
    for out in cm.output_names:  # a run after a values-free one computes as before
        np.testing.assert_array_equal(again.outputs[out], full.outputs[out])
