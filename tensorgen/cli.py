"""The `tensorgen` command line.

Exit codes: 0 success, 1 a check found a mismatch, 2 bad input (one line, no
traceback), 3 an internal error (a bug: please report it with the traceback).
"""

from __future__ import annotations

import argparse
import io
import sys
import time
import traceback
from pathlib import Path

import numpy as np

from tensorgen.errors import BinaryError, TensorgenError


def _read_binary(path: str):
    from tensorgen.mc.binary import decode

    try:
        data = Path(path).read_bytes()
    except OSError as err:
        raise BinaryError(f"{path}: cannot read ({err.strerror})") from None
    try:
        return decode(data)
    except BinaryError as err:
        raise BinaryError(f"{path}: {err}") from None


def _write(path: str | Path, data: bytes) -> None:
    from tensorgen.driver import write_atomic

    try:
        write_atomic(path, data)
    except OSError as err:  # a missing directory or no permission is the user's to fix, not a bug
        raise TensorgenError(f"{path}: cannot write ({err.strerror})") from None


def cmd_emit(args) -> int:
    from tensorgen.driver import compile_file
    from tensorgen.mc.binary import disassemble, encode

    job = compile_file(args.op, args.target, args.schedule)
    binary = job.compiled.binary
    data = encode(binary)
    if args.asm:
        _write(args.asm, disassemble(binary).encode())
    _write(args.output, data)
    print(f"{args.output}: {len(binary.code)} instructions, {len(data)} bytes, target {job.target.name}")
    return 0


def cmd_check(args) -> int:
    from tensorgen.driver import compile_file, random_inputs, run_and_compare

    t0 = time.perf_counter()
    job = compile_file(args.op, args.target, args.schedule)
    compile_s = time.perf_counter() - t0
    prog, tgt = job.program, job.target
    choice = args.schedule or prog.schedule
    which = {"default": "default schedule", "auto": "automatic schedule"}.get(choice, f"schedule {choice}")
    if job.plan is not None:
        if job.plan.schedule is None:
            print(f"warning: {job.plan.explain(tgt)}", file=sys.stderr)
        if args.explain:
            print(job.plan.explain(tgt))
    print(f"{prog.name} on {tgt.name} ({which}): {len(job.compiled.binary.code)} instructions, "
          f"compiled in {compile_s:.2f} s")
    status = 0
    for trial in range(args.trials):
        seed = args.seed + trial
        cmp, result = run_and_compare(job, random_inputs(prog, seed))
        print(f"trial {trial + 1} (seed {seed}): {cmp.message}")
        if not cmp.exact:
            status = 1
            break
    s = result.stats
    util = job.compiled.macs / (s.cycles * tgt.peak_macs_per_cycle) if s.cycles else 0.0
    print(f"cycles {s.cycles}  MACs {job.compiled.macs}  MAC utilization {util:.1%}  "
          f"DRAM {s.dram_bytes} B  energy {s.energy_pj / 1e6:.3f} uJ")
    if choice != "default" and status == 0:
        from tensorgen.driver import compile_default
        from tensorgen.sim.machine import simulate

        default = compile_default(prog, tgt)
        base = simulate(default.binary, random_inputs(prog, args.seed), tgt).stats.cycles
        print(f"default schedule: cycles {base}  ({base / s.cycles:.2f}x the cycles of this schedule)")
    return status


def cmd_run(args) -> int:
    from tensorgen.sim.machine import simulate

    binary = _read_binary(args.binary)
    inputs = {}
    for item in args.inputs or []:
        name, sep, path = item.partition("=")
        if not sep:
            raise TensorgenError(f"--in {item}: expected NAME=FILE.npy")
        try:
            inputs[name] = np.load(path, allow_pickle=False)
        except (OSError, ValueError, EOFError) as err:  # np.load raises EOFError on an empty file
            raise TensorgenError(f"--in {item}: cannot load {path} ({err})") from None
    result = simulate(binary, inputs)
    out = Path(args.out)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise TensorgenError(f"--out {out}: cannot create the output directory ({err.strerror})") from None
    for name, value in result.outputs.items():
        buf = io.BytesIO()
        np.save(buf, value)
        _write(out / f"{name}.npy", buf.getvalue())
        print(f"{out / (name + '.npy')}: {value.dtype} {list(value.shape)}")
    print(f"cycles {result.stats.cycles}  MACs {result.stats.macs}  DRAM {result.stats.dram_bytes} B")
    return 0


def cmd_disasm(args) -> int:
    from tensorgen.mc.binary import disassemble

    sys.stdout.write(disassemble(_read_binary(args.binary)))
    return 0


def cmd_isa_doc(args) -> int:
    from tensorgen.mc.doc import isa_markdown

    sys.stdout.write(isa_markdown())
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tensorgen", description="Compile tensor operators to accelerator microcode.")
    sub = p.add_subparsers(dest="command", required=True)

    e = sub.add_parser("emit", help="compile an op.yaml to a .tgb binary")
    e.add_argument("op")
    e.add_argument("-o", "--output", required=True)
    e.add_argument("--asm", help="also write readable microcode here")
    e.add_argument("--target", help="target name under isa/ or a path (default: the op.yaml's)")
    e.add_argument("--schedule", help="a schedule file, 'auto' or 'default' (default: the op.yaml's schedule: key)")
    e.set_defaults(func=cmd_emit)

    c = sub.add_parser("check", help="compile, simulate on random inputs, compare with PyTorch bit for bit")
    c.add_argument("op")
    c.add_argument("--target")
    c.add_argument("--schedule", help="a schedule file, 'auto' or 'default' (default: the op.yaml's schedule: key); "
                                      "with a schedule other than the default, also prints the default's cycles")
    c.add_argument("--explain", action="store_true",
                   help="with the automatic scheduler: print its choice as a schedule file, its bottleneck and "
                        "how it beat its neighbours")
    c.add_argument("--seed", type=int, default=0)
    c.add_argument("--trials", type=int, default=1)
    c.set_defaults(func=cmd_check)

    r = sub.add_parser("run", help="simulate a .tgb on given inputs")
    r.add_argument("binary")
    r.add_argument("--in", dest="inputs", action="append", metavar="NAME=FILE.npy")
    r.add_argument("--out", required=True, help="directory for the output .npy files")
    r.set_defaults(func=cmd_run)

    d = sub.add_parser("disasm", help="print a .tgb as assembly text")
    d.add_argument("binary")
    d.set_defaults(func=cmd_disasm)

    i = sub.add_parser("isa-doc", help="print the instruction set reference (Markdown)")
    i.set_defaults(func=cmd_isa_doc)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except TensorgenError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except Exception:  # a bug in tensorgen, not in the input
        traceback.print_exc()
        print("internal error: this is a tensorgen bug; please report it with the traceback above", file=sys.stderr)
        return 3


if __name__ == "__main__":
    sys.exit(main())
