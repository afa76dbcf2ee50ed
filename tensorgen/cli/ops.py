"""The op.yaml and binary subcommands: emit, check, run, disasm, isa-doc."""

from __future__ import annotations

import io
import sys
import time
from pathlib import Path

import numpy as np

from tensorgen.cli.common import is_model, read_binary, sim_limits, write_files
from tensorgen.cli.models import cmd_check_model
from tensorgen.errors import BinaryError, TensorgenError


def cmd_emit(args) -> int:
    from tensorgen.driver import compile_file
    from tensorgen.mc.binary import disassemble, encode

    job = compile_file(
        args.op, args.target, args.schedule, args.schedule_time_limit, args.objective
    )
    binary = job.compiled.binary
    data = encode(binary)
    files = [(args.asm, disassemble(binary).encode())] if args.asm else []
    write_files(files + [(args.output, data)])
    print(
        f"{args.output}: {len(binary.code)} instructions, {len(data)} bytes, target {job.target.name}"
    )
    return 0


def cmd_check(args) -> int:
    from tensorgen.driver import compile_file, random_inputs, run_and_compare
    from tensorgen.reference.torch_ref import check_work

    if is_model(args.op):
        return cmd_check_model(args)
    if args.trials < 1:
        raise TensorgenError(f"--trials {args.trials}: at least one trial")
    limits = sim_limits(args)
    t0 = time.perf_counter()
    job = compile_file(
        args.op, args.target, args.schedule, args.schedule_time_limit, args.objective
    )
    compile_s = time.perf_counter() - t0
    check_work(job.program)  # before the simulator runs: the reference's limits refuse first
    prog, tgt = job.program, job.target
    choice = args.schedule or prog.schedule
    which = {"default": "default schedule", "auto": "automatic schedule"}.get(
        choice, f"schedule {choice}"
    )
    if job.plan is not None:
        if job.plan.schedule is None:  # a note on stdout: stderr holds only an error's one line
            which = f"default schedule, auto: {job.plan.reason}"
        if args.explain:
            print(job.plan.explain(tgt))
    print(
        f"{prog.name} on {tgt.name} ({which}): {len(job.compiled.binary.code)} instructions, "
        f"compiled in {compile_s:.2f} s"
    )
    status = 0
    for trial in range(args.trials):
        seed = args.seed + trial
        cmp, result = run_and_compare(job, random_inputs(prog, seed), limits)
        print(f"trial {trial + 1} (seed {seed}): {cmp.message}")
        if not cmp.exact:
            status = 1
            break
    s = result.stats
    util = job.compiled.macs / (s.cycles * tgt.peak_macs_per_cycle) if s.cycles else 0.0
    print(
        f"cycles {s.cycles}  MACs {job.compiled.macs}  MAC utilization {util:.1%}  "
        f"DRAM {s.dram_bytes} B  energy {s.energy_pj / 1e6:.3f} uJ"
    )
    if choice != "default" and status == 0:
        print(_default_line(prog, tgt, args.seed, s.cycles, limits))
    return status


# Instructions the default schedule may execute to be simulated beside the chosen one: the
# comparison is a note, and the vector default of a convolution the MAC array schedule does not
# replay can run a million steps (1.2M for conv3x3_stride2 over channels 1..37: 18 s, where the
# chosen schedule took 1 s).
COMPARE_STEPS = 250_000


def _default_line(prog, tgt, seed: int, cycles: int, limits) -> str:
    """The default schedule's cycles beside the chosen schedule's, or why they are not shown."""
    from tensorgen.driver import compile_default, random_inputs
    from tensorgen.mc.verify import verify_binary
    from tensorgen.sim.machine import simulate

    default = compile_default(prog, tgt)
    steps = verify_binary(default.binary, tgt, limits)
    if steps > COMPARE_STEPS:
        return (
            f"default schedule: not simulated (it executes up to {steps:,} instructions, over "
            f"the comparison's {COMPARE_STEPS:,}; --schedule default runs it)"
        )
    inputs = random_inputs(prog, seed)  # the cycles do not depend on them: values-free
    base = simulate(default.binary, inputs, tgt, limits=limits, values=False).stats.cycles
    return f"default schedule: cycles {base}  ({base / cycles:.2f}x the cycles of this schedule)"


def cmd_run(args) -> int:
    from tensorgen.mc.verify import binary_target, verify_binary
    from tensorgen.sim.arrays import input_tensor, read_npy
    from tensorgen.sim.machine import simulate
    from tensorgen.target import load_target

    limits = sim_limits(args)
    binary = read_binary(args.binary)
    target = load_target(args.target) if args.target else binary_target(binary)
    try:
        verify_binary(binary, target, limits)  # before any input is read or anything runs
        if not any(t.role in ("output", "inout") for t in binary.tensors):
            raise BinaryError("the binary has no output or inout tensor: a run would write nothing")
    except BinaryError as err:
        raise BinaryError(f"{args.binary}: {err}") from None
    inputs = {}
    for item in args.inputs or []:
        name, sep, path = item.partition("=")
        if not sep:
            raise TensorgenError(f"--in {item}: expected NAME=FILE.npy")
        if name in inputs:
            raise TensorgenError(f"--in {item}: a second array for {name}")
        inputs[name] = read_npy(item, path, input_tensor(binary, name))
    with np.errstate(
        all="ignore"
    ):  # a crafted binary's float overflow is its wrong result, not a warning
        result = simulate(binary, inputs, target, limits=limits)
    files = []
    for name, value in result.outputs.items():
        buf = io.BytesIO()
        np.save(buf, value)
        files.append((output_path(args.out, name), buf.getvalue()))
    _write_outputs(Path(args.out), files)
    for name, value in result.outputs.items():
        print(f"{Path(args.out) / (name + '.npy')}: {value.dtype} {list(value.shape)}")
    print(
        f"cycles {result.stats.cycles}  MACs {result.stats.macs}  DRAM {result.stats.dram_bytes} B"
    )
    return 0


def output_path(out: str, name: str) -> Path:
    """DIR/NAME.npy, confined to DIR: tensor names are checked on decode, and checked again here
    as paths, so that no name can make `run` write anywhere else."""
    import os

    root = os.path.abspath(out)
    path = os.path.abspath(os.path.join(root, f"{name}.npy"))
    if os.path.dirname(path) != root or os.path.basename(path) != f"{name}.npy":
        raise TensorgenError(
            f"--out {out}: output tensor {name!r} would be written outside the directory"
        )
    return Path(path)


def _write_outputs(out: Path, files: list[tuple[Path, bytes]]) -> None:
    """Create `out` (only now, after the simulation succeeded) and write every file into it;
    on failure remove what was written and the directories this call created."""
    try:
        created = [d for d in (out, *out.parents) if not d.exists()]
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise TensorgenError(
            f"--out {out}: cannot create the output directory ({err.strerror})"
        ) from None
    try:
        write_files(files)
    except BaseException:
        for d in created:  # innermost first; never a directory that existed before
            try:
                d.rmdir()
            except OSError:
                break
        raise


def cmd_disasm(args) -> int:
    from tensorgen.mc.binary import disassemble

    sys.stdout.write(disassemble(read_binary(args.binary)))
    return 0


def cmd_isa_doc(args) -> int:
    from tensorgen.mc.doc import isa_markdown

    sys.stdout.write(isa_markdown())
    return 0
