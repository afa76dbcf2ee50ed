"""The pipeline as one short function per job, shared by the CLI, tests and benchmarks."""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tensorgen.codegen.lower import Compiled, compile_program
from tensorgen.codegen.scheduled import compile_scheduled
from tensorgen.errors import CodegenError, ScheduleError
from tensorgen.ir.core import Program, Tensor
from tensorgen.mc.binary import decode, encode
from tensorgen.mc.verify import SimLimits
from tensorgen.schedule.api import Schedule
from tensorgen.schedule.auto import Plan, auto_schedule
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
    relative to the op.yaml), else the default schedule.
    """
    program = load_program(path, target)
    tgt = load_target(program.target)
    choice = schedule or program.schedule
    if choice == "auto":
        result = compile_auto(program, tgt)
        return Job(program, tgt, result.compiled, result.plan)
    if choice == "default":
        return Job(program, tgt, compile_default(program, tgt))
    sched_path = schedule if schedule is not None else str(Path(path).parent / program.schedule)
    compiled = compile_schedule_file(sched_path, program, tgt, schedule_time_limit)
    return Job(program, tgt, compiled)


@dataclass(frozen=True)
class AutoResult:
    compiled: Compiled
    plan: Plan


def compile_auto(program: Program, target: Target) -> AutoResult:
    """The automatic scheduler's choice, or the default schedule (with the plan's reason) when
    the program is outside its search space."""
    plan = auto_schedule(program, target)
    if plan.schedule is None:
        return AutoResult(compile_default(program, target), plan)
    try:
        return AutoResult(compile_scheduled(program, target, plan.schedule), plan)
    except (
        CodegenError,
        ScheduleError,
    ) as err:  # a gap in the general backend: never worse than default
        plan.reason = f"the chosen schedule did not lower ({err})"
        plan.schedule = None
        return AutoResult(compile_default(program, target), plan)


def compile_default(program: Program, target: Target) -> Compiled:
    """The default schedule: fused kernels tiled for the target; programs the kernel lowering
    cannot take (scans, triangular domains) run in their original order on the general backend."""
    try:
        return compile_program(program, target)
    except CodegenError:
        return compile_scheduled(program, target, Schedule(program, target))


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


def write_atomic(path: str | Path, data: bytes) -> None:
    """Write `data` to `path` so that readers see the old file or the whole new one, never half."""
    write_files_atomic([(path, data)])


def _file_mode() -> int:
    # mkstemp creates 0600 files; an output should get the mode any new file gets (0666 less the
    # umask), which can only be read by setting it: set it back at once.
    umask = os.umask(0o022)
    os.umask(umask)
    return 0o666 & ~umask


def write_files_atomic(files: list[tuple[str | Path, bytes]]) -> None:
    """Write all of `files` or none: each goes to a temporary file beside it, and only when all
    are complete are they renamed into place; a failure removes the temporaries (and any file
    already renamed, so that a half-done pair is never left). An OSError names its file."""
    temps: list[tuple[Path, str]] = []
    done: list[Path] = []
    try:
        for path, data in files:
            path = Path(path)
            try:
                fd, tmp = tempfile.mkstemp(
                    dir=path.parent or ".", prefix=f".{path.name}.", suffix=".tmp"
                )
                temps.append((path, tmp))
                os.fchmod(fd, _file_mode())
                with os.fdopen(fd, "wb") as f:
                    f.write(data)
            except OSError as err:
                raise OSError(err.errno, err.strerror, str(path)) from None
        for path, tmp in temps:
            try:
                os.replace(tmp, path)
            except OSError as err:
                raise OSError(err.errno, err.strerror, str(path)) from None
            done.append(path)
    except BaseException:
        for _, tmp in temps:
            Path(tmp).unlink(missing_ok=True)
        for path in done:
            path.unlink(missing_ok=True)
        raise
