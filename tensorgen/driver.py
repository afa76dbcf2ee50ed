"""The pipeline as one short function per job, shared by the CLI, tests and benchmarks."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tensorgen.autosched.search import Plan, auto_schedule
from tensorgen.codegen.compiled import Compiled
from tensorgen.codegen.scheduled import compile_scheduled
from tensorgen.errors import (
    BinaryError,
    CapacityError,
    CodegenError,
    ScheduleError,
    SimulatorError,
)
from tensorgen.ir.core import Program, Tensor
from tensorgen.ir.verify import verify_program
from tensorgen.mc.binary import decode, encode
from tensorgen.mc.verify import COMPILE_LIMITS, SimLimits, verify_binary, verify_compiled
from tensorgen.schedule.api import Schedule
from tensorgen.schedule.default import fused_default, primitive_default
from tensorgen.schedule.files import DEFAULT_TIME_LIMIT_S, compile_schedule_file
from tensorgen.sim.machine import SimResult, simulate
from tensorgen.spec.loader import load_program
from tensorgen.target import Target, load_target


@dataclass(frozen=True)
class Job:
    program: Program
    target: Target
    compiled: Compiled
    plan: Plan | None = None  # the automatic scheduler's reasoning, for `schedule: auto`


def compile_file(
    path: str | Path,
    target: str | None = None,
    schedule: str | None = None,
    schedule_time_limit: float | None = DEFAULT_TIME_LIMIT_S,
    objective: str = "cycles",
) -> Job:
    """op.yaml -> IR -> schedule -> microcode.

    The schedule is `schedule` (a schedule file), else the op.yaml's `schedule:` key (a path
    relative to the op.yaml), else the automatic one (minimising `objective`); `default` names
    the fastest of the schedules built from the primitives (`compile_default`).
    """
    program = verify_program(load_program(path, target))
    tgt = load_target(program.target)
    choice = schedule or program.schedule
    if choice == "auto":
        result = compile_auto(program, tgt, objective)
        return Job(program, tgt, result.compiled, result.plan)
    if choice == "default":
        return Job(program, tgt, compile_default(program, tgt))
    sched_path = schedule if schedule is not None else str(Path(path).parent / program.schedule)
    compiled = compile_schedule_file(
        sched_path, program, tgt, compile_scheduled, schedule_time_limit
    )
    verify_compiled(compiled.binary, tgt)
    return Job(program, tgt, compiled)


@dataclass(frozen=True)
class AutoResult:
    compiled: Compiled
    plan: Plan


def compile_auto(program: Program, target: Target, objective: str = "cycles") -> AutoResult:
    """The automatic scheduler's choice, minimising `objective` (autosched/objective.py).
    Outside its layer search (recurrences under shared loops, chained reductions, ...) its
    choice is the fastest on the simulator of the schedules built from the primitives
    (`compile_default`): their cycles do not depend on the data, so the choice is
    deterministic."""
    plan = auto_schedule(program, target, objective=objective)
    if plan.schedule is not None:
        try:
            compiled = compile_scheduled(program, target, plan.schedule)
            verify_compiled(compiled.binary, target)
            return AutoResult(compiled, plan)
        except (CodegenError, ScheduleError) as err:  # a gap in the general backend
            plan.reason = f"the chosen schedule did not lower ({err})"
            plan.schedule = None
    best = _fastest_default(program, target)
    plan.schedule = best.schedule
    plan.reason = f"outside the layer search ({plan.reason}): {best.note}"
    return AutoResult(best.compiled, plan)


@dataclass(frozen=True)
class _Measured:
    compiled: Compiled
    cycles: float  # math.inf: past FALLBACK_STEPS
    schedule: Schedule
    note: str = ""
    steps: int = 0  # an upper bound of the instructions it executes (mc.verify): breaks ties


# Instructions a candidate default may run while it is measured: a count, so the choice is the
# same on any machine, and small enough that a program asking for absurd work (a shared loop of
# 100,000 steps) is not simulated at compile time: a million MATMUL steps took minutes, and the
# examples run at most 13,184 (rnn_cell on tiny).
FALLBACK_STEPS = 30_000


def _measured_cycles(compiled: Compiled, zeros: dict[str, np.ndarray], target: Target) -> float:
    """Simulated cycles, or infinity past FALLBACK_STEPS (then the fewest instructions win);
    values-free (`simulate(values=False)`): the cycles do not depend on them."""
    try:
        limits = SimLimits(max_steps=FALLBACK_STEPS)
        return simulate(compiled.binary, zeros, target, limits=limits, values=False).stats.cycles
    except (SimulatorError, BinaryError):  # BinaryError: over the limit, known before it runs
        return math.inf


def _fastest_default(program: Program, target: Target) -> _Measured:
    """The fastest on the simulator of the schedules built from the primitives: statement by
    statement (MAC array and vectors, vectors alone; staged whole, else in blocks) and fused
    over blocks of rows. A tie (both past FALLBACK_STEPS, say) goes to the one that executes
    fewer instructions, then to the earlier. Raises the first candidate's error if none lowers."""
    zeros = {t.name: np.zeros(t.shape, t.np_dtype) for t in program.inputs}
    found: list[_Measured] = []
    errors: list[Exception] = []
    for s, compiled in _candidates(program, target, errors):
        if all(str(s) != str(m.schedule) for m in found):
            steps = verify_binary(compiled.binary, target, COMPILE_LIMITS)
            cycles = _measured_cycles(compiled, zeros, target)
            found.append(_Measured(compiled, cycles, s, steps=steps))
    if not found:
        if isinstance(errors[0], CapacityError):
            raise CapacityError(
                f"the program does not fit target {target.name}, whole or staged in blocks: "
                f"{errors[0]}"
            ) from errors[0]
        raise errors[0]
    best = min(found, key=lambda m: (m.cycles, m.steps))
    note = (
        f"the fastest of {len(found)} schedules built from the primitives: "
        f"{best.cycles} cycles on the simulator"
    )
    return _Measured(best.compiled, best.cycles, best.schedule, note)


# Blocks of the streamed M (MAC array) and of the vectorized loop tried when the tensors do not
# fit whole: staging inside a loop of blocks keeps the footprints small.
FALLBACK_BLOCKS = ((None, None), (None, 256), (None, 64), (None, 16), (16, 64), (16, 16))
FUSED_BLOCKS = (16, 32, 64)  # rows per block of schedule.default.fused_default


def _candidates(program: Program, target: Target, errors: list[Exception]):
    """The primitive-built schedules and their binaries, in order of preference: statement by
    statement with the tensors staged whole, else (over capacity) staged inside loops of each
    size of FALLBACK_BLOCKS; then fused over blocks of rows. A candidate that does not build or
    lower is skipped, its error kept in `errors`."""

    def lowered(build):
        try:
            s = build()
            return s, compile_scheduled(program, target, s)
        except (CodegenError, ScheduleError) as err:
            errors.append(err)
            return None

    for tensorize in (True, False):
        whole = lowered(lambda t=tensorize: primitive_default(program, target, t))
        if whole is not None:
            yield whole
            continue
        if not isinstance(errors[-1], CapacityError):
            continue  # a form the lowering does not take
        for m_block, v_block in FALLBACK_BLOCKS:
            got = lowered(
                lambda t=tensorize, m=m_block, v=v_block: primitive_default(
                    program, target, t, True, m, v
                )
            )
            if got is not None:
                yield got
    for m_block in FUSED_BLOCKS:
        got = lowered(lambda m=m_block: fused_default(program, target, m))
        if got is not None:
            yield got


def compile_default(program: Program, target: Target) -> Compiled:
    """The default schedule: the fastest of the schedules built from the primitives."""
    compiled = _fastest_default(program, target).compiled
    verify_compiled(compiled.binary, target)
    return compiled


def random_inputs(program: Program, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)

    def draw(t: Tensor) -> np.ndarray:
        if t.dtype == "float32":
            return (rng.standard_normal(t.shape) * 4).astype(np.float32)
        lo, hi = {"int8": (-128, 127), "uint8": (0, 255), "int32": (-(2**24), 2**24)}[t.dtype]
        return rng.integers(lo, hi, t.shape, endpoint=True).astype(t.np_dtype)

    return {t.name: draw(t) for t in program.inputs}


@dataclass(frozen=True)
class Comparison:
    exact: bool
    message: str  # "BIT-EXACT" or the first differing element with both values


def compare(expected: dict[str, np.ndarray], got: dict[str, np.ndarray]) -> Comparison:
    for name, ref in expected.items():
        out = got[name]
        if ref.shape != out.shape or not np.array_equal(ref, out):
            where = np.argwhere(ref != out)[0] if ref.shape == out.shape else None
            if where is None:
                return Comparison(
                    False, f"MISMATCH {name}: shape {list(out.shape)}, PyTorch {list(ref.shape)}"
                )
            idx = ", ".join(map(str, where))
            count = int((ref != out).sum())
            return Comparison(
                False,
                f"MISMATCH {name}[{idx}]: simulator {out[tuple(where)]}, PyTorch "
                f"{ref[tuple(where)]} ({count} of {ref.size} elements differ)",
            )
    return Comparison(True, "BIT-EXACT")


def run_and_compare(
    job: Job, inputs: dict[str, np.ndarray], limits: SimLimits | None = None
) -> tuple[Comparison, SimResult]:
    from tensorgen.reference.torch_ref import evaluate  # torch loads slowly: only when comparing

    binary = decode(encode(job.compiled.binary))  # always run what would be written to disk
    result = simulate(binary, inputs, job.target, limits=limits)
    return compare(evaluate(job.program, inputs), result.outputs), result
