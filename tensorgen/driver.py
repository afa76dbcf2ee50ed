"""The pipeline as one short function per job, shared by the CLI, tests and benchmarks."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tensorgen.autosched.search import Plan, auto_schedule
from tensorgen.codegen.lower import Compiled, compile_program
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
from tensorgen.mc.verify import SimLimits, verify_compiled
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
) -> Job:
    """op.yaml -> IR -> schedule -> microcode.

    The schedule is `schedule` (a schedule file), else the op.yaml's `schedule:` key (a path
    relative to the op.yaml), else the automatic one; `default` names the kernel default.
    """
    program = verify_program(load_program(path, target))
    tgt = load_target(program.target)
    choice = schedule or program.schedule
    if choice == "auto":
        result = compile_auto(program, tgt)
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


def compile_auto(program: Program, target: Target) -> AutoResult:
    """The automatic scheduler's choice. Outside its search space (recurrences under shared
    loops, chained reductions, ...) the candidates are the schedules built from the primitives
    (schedule.default.primitive_default) and the kernel default, and the fastest on the
    simulator wins: their cycles do not depend on the data, so the choice is deterministic."""
    plan = auto_schedule(program, target)
    if plan.schedule is not None:
        try:
            compiled = compile_scheduled(program, target, plan.schedule)
            verify_compiled(compiled.binary, target)
            return AutoResult(compiled, plan)
        except (CodegenError, ScheduleError) as err:  # a gap in the general backend
            plan.reason = f"the chosen schedule did not lower ({err})"
            plan.schedule = None
    best = _fastest_fallback(program, target)
    if best.schedule is not None:
        plan.schedule = best.schedule
        plan.reason = f"outside the layer search ({plan.reason}): {best.note}"
    verify_compiled(best.compiled.binary, target)
    return AutoResult(best.compiled, plan)


@dataclass(frozen=True)
class _Measured:
    compiled: Compiled
    cycles: float  # math.inf: past FALLBACK_STEPS
    schedule: Schedule | None  # None: the kernel default
    note: str = ""


# Instructions a fallback candidate may run while it is measured: a count, so the choice is the
# same on any machine, and small enough that a program asking for absurd work (a shared loop of
# 100,000 steps) is not simulated at compile time.
FALLBACK_STEPS = 1_000_000


def _measured_cycles(compiled: Compiled, zeros: dict[str, np.ndarray], target: Target) -> float:
    """Simulated cycles, or infinity past FALLBACK_STEPS (then the primitive-built one wins)."""
    try:
        limits = SimLimits(max_steps=FALLBACK_STEPS)
        return simulate(compiled.binary, zeros, target, limits=limits).stats.cycles
    except (SimulatorError, BinaryError):  # BinaryError: over the limit, known before it runs
        return math.inf


def _fastest_fallback(program: Program, target: Target) -> _Measured:
    """The fastest on the simulator of the primitive-built schedules (MAC array and vectors,
    vectors alone) and the kernel default; the primitive-built ones win ties."""
    zeros = {t.name: np.zeros(t.shape, t.np_dtype) for t in program.inputs}
    found: list[_Measured] = []
    for tensorize in (True, False):
        for s, compiled in _primitive_built(program, target, tensorize):
            if all(str(s) != str(m.schedule) for m in found):
                found.append(_Measured(compiled, _measured_cycles(compiled, zeros, target), s))
    for m_block in FUSED_BLOCKS:
        try:
            s = fused_default(program, target, m_block)
            compiled = compile_scheduled(program, target, s)
        except (CodegenError, ScheduleError):
            continue
        found.append(_Measured(compiled, _measured_cycles(compiled, zeros, target), s))
    default = compile_default(program, target)
    cycles = _measured_cycles(default, zeros, target)
    best = min(found, key=lambda m: m.cycles, default=None)
    if best is None or best.cycles > cycles:
        return _Measured(default, cycles, None)
    note = (
        f"the schedule built from the primitives takes {best.cycles} cycles on the simulator, "
        f"the kernel default {cycles}"
    )
    return _Measured(best.compiled, best.cycles, best.schedule, note)


# Blocks of the streamed M (MAC array) and of the vectorized loop tried when the tensors do not
# fit whole: staging inside a loop of blocks keeps the footprints small.
FUSED_BLOCKS = (16, 32, 64)  # rows per block of schedule.default.fused_default
FALLBACK_BLOCKS = ((None, None), (None, 256), (None, 64), (None, 16), (16, 64), (16, 16))


def _primitive_built(program: Program, target: Target, tensorize: bool):
    """The primitive-built schedules and their binaries: the tensors staged whole, else (over
    capacity) staged inside loops of each size of FALLBACK_BLOCKS."""
    try:
        s = primitive_default(program, target, tensorize)
        yield s, compile_scheduled(program, target, s)
        return
    except CapacityError:
        pass
    except (CodegenError, ScheduleError):
        return  # a form the lowering does not take
    for m_block, v_block in FALLBACK_BLOCKS:
        try:
            s = primitive_default(program, target, tensorize, True, m_block, v_block)
            yield s, compile_scheduled(program, target, s)
        except (CodegenError, ScheduleError):
            continue  # over capacity even so, or a form the lowering does not take


def compile_default(program: Program, target: Target) -> Compiled:
    """The default schedule: fused kernels tiled for the target; programs the kernel lowering
    cannot take (scans, triangular domains) run in their original order on the general backend."""
    try:
        compiled = compile_program(program, target)
    except CodegenError:
        compiled = compile_scheduled(program, target, Schedule(program, target))
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
