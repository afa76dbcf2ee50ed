"""The simulator's limits and its last line of defence against crafted microcode.

The instruction budget (`SimLimits.max_steps`) is checked up front from the loop nest where
the count is exact, and while running where it is not (LOOPB, IF); operands that pass the
verifier but do not fit an instruction's semantics end in one line naming the instruction.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tensorgen.driver import compile_file, random_inputs
from tensorgen.errors import BinaryError, SimulatorError
from tensorgen.mc.binary import assemble, decode, encode
from tensorgen.mc.verify import SimLimits, verify_binary
from tensorgen.sim import machine, vector
from tensorgen.sim.machine import simulate
from tensorgen.target import load_target

TINY = load_target("tiny")
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
HEAD = f""".target tiny {TINY.hash.hex()}
.dram 64
.tensor X int32 4 input dram=0 pad=0
.tensor Y int32 4 output dram=16 pad=0
"""
X = {"X": np.arange(4, dtype=np.int32)}
LIMIT = r"\(SimLimits\.max_steps; raise it with `tensorgen run --max-steps N`\)$"


def test_an_exact_count_over_the_limit_is_refused_before_running():
    b = assemble(HEAD + "LOOP count=1000000 body=1\n    VFILL dst=spad:int32@0[4:1] imm=1\n")
    with pytest.raises(
        BinaryError,
        match=rf"^the program executes 1,000,000 instructions, over the simulator's "
        rf"limit of 999,999 {LIMIT}",
    ):
        simulate(b, X, TINY, limits=SimLimits(max_steps=999_999))


def test_the_default_limit_refuses_256_cubed_element_by_element_at_once(tmp_path):
    """`C[i, j] += A[i, k] * B[k, j] * -1` at 256^3 on tiny: not a MAC-array product, so its
    default lowering runs vector instructions, 5,586,945 of them (minutes of simulation)."""
    text = (
        (EXAMPLES / "matmul_256.yaml")
        .read_text()
        .replace("A[i, k] * B[k, j]", "A[i, k] * B[k, j] * -1")
    )
    path = tmp_path / "neg256.yaml"
    path.write_text(text)
    job = compile_file(path, "tiny", "default")
    binary = decode(encode(job.compiled.binary))
    with pytest.raises(
        BinaryError,
        match=rf"^the program executes [\d,]+ instructions, over the simulator's "
        rf"limit of 2,000,000 {LIMIT}",
    ):
        simulate(binary, random_inputs(job.program, 0), TINY)


def test_an_inexact_count_is_bounded_before_running():
    """trmm's hand schedule keeps a triangular LOOPB nest: it executes 142 instructions; the
    static bound says 262. A limit below the bound refuses before anything runs (running to the
    limit cost minutes on unbatched programs); the run itself still counts, as a last defence."""
    job = compile_file(
        EXAMPLES / "trmm_triangular.yaml",
        "tiny",
        str(EXAMPLES.parent / "schedules" / "trmm_triangular.py"),
    )
    b, inputs = job.compiled.binary, random_inputs(job.program, 0)
    assert verify_binary(b, TINY) == 262
    assert simulate(b, inputs, TINY, limits=SimLimits(max_steps=262)).stats.instructions == 142
    with pytest.raises(
        BinaryError,
        match=rf"^the program may execute up to 262 instructions \(a bound: its loops or IFs "
        rf"depend on counters\), over the simulator's limit of 261 {LIMIT}",
    ):
        simulate(b, inputs, TINY, limits=SimLimits(max_steps=261))


NEST = (
    HEAD
    + """LOAD dst=spad:int32@0[4:1] src=X(0)[4] signal=EX
SYNC queue=1 wait=LD
LOOP count=10 body=1
    VMAC dst=acc:int32@0[4:1] a=spad:int32@0[4:1] b=spad:int32@0[4:1]
SYNC queue=1 signal=ST
STORE dst=Y(0)[4] src=acc:int32@0[4:1] wait=EX
"""
)


@pytest.mark.parametrize("limit, vectorised", [(40, True), (39, False)])
def test_a_big_reduction_nest_runs_iteration_by_iteration(monkeypatch, limit, vectorised):
    """A nest the vectoriser would turn into arrays of more than MAX_BATCH_ELEMENTS elements
    runs one iteration at a time instead: the same values, memory bounded by one iteration.
    (A VMAC nest is `sim.vector`'s run: its box, or tap by tap.)"""
    monkeypatch.setattr(vector, "MAX_BATCH_ELEMENTS", limit)
    sim = machine.Simulator(assemble(NEST), TINY)
    out = sim.run(X).outputs["Y"]
    np.testing.assert_array_equal(out, np.arange(4) ** 2 * 10)
    assert (sim.vector_runs.plans[(2, ())].box is not None) == vectorised


@pytest.mark.parametrize(
    "line, reason",
    [
        pytest.param(
            "LOAD dst=spad:int32@0[2:1] src=X(0)[4]",
            r"^instruction 0 \(LOAD\): operands do not fit its "
            r"semantics \(.*\) at loop counters \[\]$",
            id="load",
        ),
        pytest.param(
            "STORE dst=Y(0)[4] src=spad:int32@0[2:1]",
            r"^instruction 0 \(STORE\): operands do not fit",
            id="store",
        ),
        pytest.param(
            "VADD dst=spad:int32@0[4:1] a=spad:int32@0[3:1] b=spad:int32@16[2:1] imm=0",
            r"^instruction 0 \(VADD\): operands do not fit",
            id="vadd",
        ),
    ],
)
def test_operands_that_do_not_fit_the_semantics(line, reason):
    with pytest.raises(SimulatorError, match=reason):
        simulate(assemble(HEAD + line + "\n"), X, TINY)


def test_loops_that_execute_nothing_are_bounded_too():
    """A loop around an IF that is never taken executes no instruction, but takes time."""
    b = assemble(
        HEAD + "LOOP count=4000000000 body=2\n    IF cond=B(-1/1) body=1\n"
        "        VFILL dst=spad:int32@0[4:1] imm=1\n"
    )
    with pytest.raises(
        SimulatorError,
        match=r"^the program's loops run more than 1,000 iterations, the "
        r"simulator's limit \(SimLimits\.max_iterations\)$",
    ):
        # a step budget above the bound (8e9: the IF and its body, 4e9 times), so that the
        # iterations are what stops it
        simulate(b, X, TINY, limits=SimLimits(max_iterations=1000, max_steps=10**10))
