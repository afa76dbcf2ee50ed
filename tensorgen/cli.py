"""The `tensorgen` command line.

Exit codes: 0 success, 1 a check found a mismatch, 2 bad input (one line, no
traceback), 3 an internal error (a bug: please report it with the traceback).
"""

from __future__ import annotations

import argparse
import io
import os
import sys
import time
import traceback
from pathlib import Path

import numpy as np

from tensorgen.errors import BinaryError, TensorgenError


def _read_binary(path: str):
    from tensorgen.inputs import read_bytes
    from tensorgen.mc.binary import decode

    data = read_bytes(path, "a .tgb binary", BinaryError)  # no FIFO or device, a size limit
    try:
        return decode(data)
    except BinaryError as err:
        raise BinaryError(f"{path}: {err}") from None


def _write(path: str | Path, data: bytes) -> None:
    _write_all([(path, data)])


def _write_all(files: list[tuple[str | Path, bytes]]) -> None:
    """Write every file or none of them (a second that fails removes the first)."""
    from tensorgen.outputs import write_files_atomic

    try:
        write_files_atomic(files)
    except OSError as err:  # a missing directory or no permission is the user's to fix, not a bug
        raise TensorgenError(f"{err.filename}: cannot write ({err.strerror})") from None


def cmd_emit(args) -> int:
    from tensorgen.driver import compile_file
    from tensorgen.mc.binary import disassemble, encode

    job = compile_file(args.op, args.target, args.schedule, args.schedule_time_limit)
    binary = job.compiled.binary
    data = encode(binary)
    files = [(args.asm, disassemble(binary).encode())] if args.asm else []
    _write_all(files + [(args.output, data)])
    print(
        f"{args.output}: {len(binary.code)} instructions, {len(data)} bytes, target {job.target.name}"
    )
    return 0


def is_model(path: str) -> bool:
    """A model is a Python file with a factory (`file.py[:build]`) or a saved torch.export program."""
    base = path.split(":", 1)[0]
    return base.endswith((".py", ".pt2"))


def _params(items: list[str] | None) -> dict[str, int]:
    out = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        try:
            out[key] = int(value)
        except ValueError:
            raise TensorgenError(f"--param {item}: expected KEY=INTEGER") from None
        if not sep or not key.isidentifier():
            raise TensorgenError(f"--param {item}: expected KEY=INTEGER")
    return out


MAX_TRIALS = (
    1000  # a check is a test, not a soak: more trials are more runs with other --seed values
)
MAX_SEED = 2**32 - 1  # numpy's and torch's generators take any seed + trial up to far beyond this


def _bounded_int(lo: int, hi: int, what: str):
    """An argparse type: an integer in [lo, hi], refused (exit 2, argparse's one error) otherwise."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if not lo <= value <= hi:
            raise argparse.ArgumentTypeError(f"{value} is outside {lo}..{hi} ({what})")
        return value

    parse.__name__ = "integer"
    return parse


def _compile_model(args):
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from tensorgen.frontend.load import load_model
    from tensorgen.model import compile_model
    from tensorgen.target import load_target

    model, example = load_model(
        args.model if hasattr(args, "model") else args.op, _params(args.param)
    )
    target = load_target(args.target or "tg1")
    with Progress(
        TextColumn("[progress.description]{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total} layers"),
        TimeElapsedColumn(),
        transient=True,
        disable=not sys.stderr.isatty(),
    ) as bar:
        task = bar.add_task("compiling", total=None)

        def progress(i, n, layer):
            bar.update(task, total=n, completed=i, description=f"{layer.op} {layer.path}"[:48])

        cm = compile_model(
            model, example, target, engine=args.engine, seed=args.seed, progress=progress
        )
    if getattr(args, "dump_layers", None):
        out = Path(args.dump_layers)
        out.mkdir(parents=True, exist_ok=True)
        for layer in cm.graph.layers:
            _write(out / f"{layer.name}.yaml", layer.text(target.name).encode())
    return cm


def _print_model_table(cm) -> None:
    from rich.console import Console
    from rich.table import Table

    tgt = cm.target
    table = Table(title=f"{len(cm.layers)} layers on {tgt.name}", title_justify="left")
    for col in ("#", "layer", "op", "output", "MACs", "cycles", "util", "DRAM B", "schedule"):
        table.add_column(
            col, justify="right" if col in ("#", "MACs", "cycles", "util", "DRAM B") else "left"
        )
    for i, r in enumerate(cm.layers):
        op = r.op + "".join(f"+{e}" for e in r.epilogue)
        table.add_row(
            str(i),
            r.path,
            op,
            "x".join(map(str, r.shape)),
            f"{r.macs:,}",
            f"{r.cycles:,}",
            f"{r.utilization(tgt):.1%}" if r.macs else "-",
            f"{r.dram_bytes:,}",
            r.schedule,
        )
    macs, cycles = sum(r.macs for r in cm.layers), sum(r.cycles for r in cm.layers)
    table.add_row(
        "",
        "total",
        "",
        "",
        f"{macs:,}",
        f"{cycles:,}",
        f"{macs / (cycles * tgt.rows * tgt.cols):.1%}" if cycles else "-",
        f"{sum(r.dram_bytes for r in cm.layers):,}",
        "",
    )
    Console(width=160).print(table)
    pl = cm.linked.placement
    print(
        f"DRAM: activations and scratch {pl.peak_bytes:,} B with lifetimes shared "
        f"(sum of all tensors {pl.total_bytes:,} B, {pl.total_bytes / max(pl.peak_bytes, 1):.2f}x), "
        f"weights {pl.const_bytes:,} B"
    )
    print(
        f"compiled {len(cm.layers)} layers in {cm.compile_s:.2f} s "
        f"({sum(1 for r in cm.layers if r.schedule == 'auto')} scheduled automatically)"
    )


def cmd_compile(args) -> int:
    from tensorgen.mc.binary import disassemble, encode

    cm = _compile_model(args)
    _print_model_table(cm)
    data = encode(cm.binary)
    files = [(args.asm, disassemble(cm.binary).encode())] if args.asm else []
    _write_all(files + [(args.output, data)])  # both or neither, as emit
    ins = ", ".join(cm.input_names)
    outs = ", ".join(cm.output_names)
    print(
        f"{args.output}: {len(cm.binary.code)} instructions, {len(data):,} bytes, target {cm.target.name}; "
        f"inputs {ins}, outputs {outs}"
    )
    return 0


def cmd_check_model(args) -> int:
    import torch

    from tensorgen.model import check_model

    given = []
    for item in args.input or []:  # read before compiling: a bad path fails fast
        try:
            given.append(
                (item, (torch.from_numpy(np.load(item, allow_pickle=False).astype(np.float32)),))
            )
        except (OSError, ValueError, EOFError) as err:
            raise TensorgenError(f"--input {item}: cannot load ({err})") from None
    if not given and args.trials < 1:
        raise TensorgenError("--trials 0 without --input: nothing to check")
    cm = _compile_model(args)
    _print_model_table(cm)
    if cm.engine != "qnnpack":  # its integer behaviour depends on the CPU: say which one applies
        from tensorgen.frontend.probe import x86_behaviour

        print(x86_behaviour(cm.engine).describe())
    trials = list(given)
    for trial in range(args.trials):
        gen = torch.Generator().manual_seed(args.seed + trial)
        trials.append(
            (
                f"seed {args.seed + trial}",
                tuple(torch.randn(x.shape, generator=gen) for x in cm.example_inputs),
            )
        )
    status = 0
    for i, (label, inputs) in enumerate(trials):
        if tuple(inputs[0].shape) != tuple(cm.example_inputs[0].shape):
            raise TensorgenError(
                f"--input {label}: shape {list(inputs[0].shape)}, the model takes "
                f"{list(cm.example_inputs[0].shape)}"
            )
        cmp, result = check_model(cm, inputs)
        print(f"trial {i + 1} ({label}, {cm.engine}): {cmp.message}")
        if not cmp.exact:
            status = 1
            break
    s = result.stats
    macs = sum(r.macs for r in cm.layers)
    util = macs / (s.cycles * cm.target.peak_macs_per_cycle) if s.cycles else 0.0
    print(
        f"cycles {s.cycles:,}  MACs {macs:,}  MAC utilization {util:.1%}  DRAM {s.dram_bytes:,} B  "
        f"energy {s.energy_pj / 1e6:.3f} uJ"
    )
    return status


def cmd_check(args) -> int:
    from tensorgen.driver import compile_file, random_inputs, run_and_compare
    from tensorgen.reference.torch_ref import check_work

    if is_model(args.op):
        return cmd_check_model(args)
    if args.trials < 1:
        raise TensorgenError(f"--trials {args.trials}: at least one trial")
    limits = _sim_limits(args)
    t0 = time.perf_counter()
    job = compile_file(args.op, args.target, args.schedule, args.schedule_time_limit)
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
        from tensorgen.driver import compile_default
        from tensorgen.sim.machine import simulate

        default = compile_default(prog, tgt)
        base = simulate(default.binary, random_inputs(prog, args.seed), tgt, limits=limits)
        base = base.stats.cycles
        print(
            f"default schedule: cycles {base}  ({base / s.cycles:.2f}x the cycles of this schedule)"
        )
    return status


def cmd_run(args) -> int:
    from tensorgen.mc.verify import binary_target, verify_binary
    from tensorgen.sim.arrays import input_tensor, read_npy
    from tensorgen.sim.machine import simulate
    from tensorgen.target import load_target

    limits = _sim_limits(args)
    binary = _read_binary(args.binary)
    target = load_target(args.target) if args.target else binary_target(binary)
    try:
        verify_binary(binary, target, limits)  # before any input is read or anything runs
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
        files.append((_output_path(args.out, name), buf.getvalue()))
    _write_outputs(Path(args.out), files)
    for name, value in result.outputs.items():
        print(f"{Path(args.out) / (name + '.npy')}: {value.dtype} {list(value.shape)}")
    print(
        f"cycles {result.stats.cycles}  MACs {result.stats.macs}  DRAM {result.stats.dram_bytes} B"
    )
    return 0


def _output_path(out: str, name: str) -> Path:
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
    created = [d for d in (out, *out.parents) if not d.exists()]
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise TensorgenError(
            f"--out {out}: cannot create the output directory ({err.strerror})"
        ) from None
    try:
        _write_all(files)
    except BaseException:
        for d in created:  # innermost first; never a directory that existed before
            try:
                d.rmdir()
            except OSError:
                break
        raise


def cmd_disasm(args) -> int:
    from tensorgen.mc.binary import disassemble

    sys.stdout.write(disassemble(_read_binary(args.binary)))
    return 0


def cmd_isa_doc(args) -> int:
    from tensorgen.mc.doc import isa_markdown

    sys.stdout.write(isa_markdown())
    return 0


def _analysis_target(name: str | None):
    from tensorgen.target import load_target

    return load_target(name or "tg1")


def cmd_report(args) -> int:
    from tensorgen.analysis.core import analyze
    from tensorgen.analysis.report import out_dir, print_table, write_report

    target = _analysis_target(args.target)
    out = out_dir(args.output)
    a = analyze(args.source, target, _params(args.param), args.engine, args.seed, record=True)
    print_table(a)
    for path in write_report(a, out, args.layer):
        print(f"wrote {path}")
    return 0 if a.exact else 1


def cmd_sweep(args) -> int:
    import json
    import os

    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    from tensorgen.analysis import sweep as sw
    from tensorgen.analysis.plots import pareto_png
    from tensorgen.analysis.report import csv_bytes, out_dir, write

    vary = sw.parse_vary(args.vary or [])
    params = _params(args.param)
    if args.jobs is not None and args.jobs < 1:
        raise TensorgenError(f"--jobs {args.jobs}: at least 1")
    sw.check_executor(args.executor, args.scheduler)
    sw.load_base(args.target)  # an unknown base target fails before any work
    out = out_dir(args.output)
    t0 = time.perf_counter()
    tty = sys.stderr.isatty()
    with Progress(
        TextColumn("sweep"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("points"),
        TimeElapsedColumn(),
        TextColumn("ETA"),
        TimeRemainingColumn(),
        disable=not tty,
    ) as bar:
        task = bar.add_task("sweep", total=None)

        def progress(done: int, total: int) -> None:
            bar.update(task, total=total, completed=done)
            if not tty:
                print(
                    f"sweep: {done}/{total} points ({time.perf_counter() - t0:.0f} s)",
                    file=sys.stderr,
                )

        rows, reused = sw.sweep(
            args.source,
            vary,
            out,
            args.target,
            params,
            args.engine,
            args.jobs or os.cpu_count() or 1,
            args.executor,
            args.scheduler,
            progress,
        )
    write(out / "points.csv", csv_bytes(rows))
    write(out / "points.json", json.dumps(rows, indent=1).encode())
    front = sw.pareto(rows)
    if front:
        write(out / "pareto.png", pareto_png(rows, front, lambda r: sw.label(r, vary)))
    _print_pareto(rows, front, vary)
    bad = [r for r in rows if not r.get("bit_exact")]
    print(
        f"{len(rows)} points ({reused} already done) in {time.perf_counter() - t0:.1f} s; "
        f"{len(rows) - len(bad)} bit-exact, {len(bad)} with a reason; wrote {out / 'points.csv'}, "
        f"{out / 'points.json'}" + (f", {out / 'pareto.png'}" if front else "")
    )
    return 1 if any(r.get("ok") and not r.get("bit_exact") for r in rows) else 0


def _print_pareto(rows: list[dict], front: list[dict], vary: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    from tensorgen.analysis import sweep as sw

    table = Table(
        title=f"Pareto set (latency vs energy): {len(front)} of {len(rows)} points",
        title_justify="left",
    )
    cols = list(vary) + ["cycles", "latency ms", "energy uJ", "power mW", "area mm^2", "util"]
    for col in cols:
        table.add_column(col, justify="right")
    for r in front:
        table.add_row(
            *[sw.spelled(k, r[k]) for k in vary],
            f"{r['cycles']:,}",
            f"{r['latency_ms']:.3f}",
            f"{r['energy_uj']:.2f}",
            f"{r['power_mw']:.1f}",
            f"{r['area_mm2']:.3f}",
            f"{r['utilization']:.1%}",
        )
    Console(width=160).print(table)
    for r in rows:
        if not r.get("bit_exact"):
            print(f"  {sw.label(r, vary)}: {r.get('reason')}")


def cmd_compare(args) -> int:
    import json

    from tensorgen.analysis.compare import compare_rows, print_compare
    from tensorgen.analysis.core import analyze
    from tensorgen.analysis.plots import compare_png
    from tensorgen.analysis.report import csv_bytes, out_dir, write

    if len(args.target or []) != 2:
        raise TensorgenError("compare: give exactly two targets (--target A --target B)")
    targets = [_analysis_target(t) for t in args.target]
    out = out_dir(args.output) if args.output else None
    params = _params(args.param)
    a, b = (analyze(args.source, t, params, args.engine, args.seed) for t in targets)
    rows, total = compare_rows(a, b)
    print_compare(rows, total, a, b)
    for run in (a, b):
        if not run.exact:
            print(f"{run.target.name}: {run.message}")
    if out is not None:
        write(out / "compare.csv", csv_bytes(rows + [total]))
        write(out / "compare.json", json.dumps({"layers": rows, "total": total}, indent=1).encode())
        write(out / "compare.png", compare_png(rows, a.target.name, b.target.name))
        print(f"wrote {out / 'compare.csv'}, {out / 'compare.json'}, {out / 'compare.png'}")
    return 0 if a.exact and b.exact else 1


def _model_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "-p",
        "--param",
        action="append",
        metavar="KEY=INT",
        help="for a model: an argument of its factory, e.g. -p size=224",
    )
    p.add_argument(
        "--engine",
        default="qnnpack",
        choices=("qnnpack", "x86", "fbgemm"),
        help="for a model: PyTorch's quantized engine whose qconfig and kernels are the reference",
    )
    p.add_argument(
        "--dump-layers", metavar="DIR", help="for a model: write each layer's op.yaml here"
    )


def _max_steps(p: argparse.ArgumentParser) -> None:
    """`--max-steps N` of run and check: SimLimits.max_steps, the simulator's one limit object."""
    from tensorgen.mc.verify import SimLimits

    default = SimLimits().max_steps
    p.add_argument(
        "--max-steps",
        type=int,
        default=default,
        metavar="N",
        help=f"refuse programs that execute more than N instructions (default {default:,})",
    )


def _sim_limits(args):
    from tensorgen.mc.verify import SimLimits

    if args.max_steps < 1:
        raise TensorgenError(f"--max-steps {args.max_steps}: at least one instruction")
    return SimLimits(max_steps=args.max_steps)


def _seconds(text: str) -> float:
    """An argparse type: a time limit in seconds, > 0 and finite (0 would mean no limit)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {text!r}") from None
    if not 0 < value <= 86400:
        raise argparse.ArgumentTypeError(f"{text} is outside (0, 86400] seconds")
    return value


def _schedule_time_limit(p: argparse.ArgumentParser) -> None:
    from tensorgen.schedule.files import DEFAULT_TIME_LIMIT_S

    p.add_argument(
        "--schedule-time-limit",
        type=_seconds,
        default=DEFAULT_TIME_LIMIT_S,
        metavar="S",
        help="seconds a schedule file may run before it is stopped with a one-line error "
        f"(default {DEFAULT_TIME_LIMIT_S:g})",
    )


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="tensorgen", description="Compile tensor operators to accelerator microcode."
    )
    sub = p.add_subparsers(dest="command", required=True)

    e = sub.add_parser("emit", help="compile an op.yaml to a .tgb binary")
    e.add_argument("op")
    e.add_argument("-o", "--output", required=True)
    e.add_argument("--asm", help="also write readable microcode here")
    e.add_argument(
        "--target",
        help="target name (tensorgen/target/isa/NAME.yaml) or a path (default: the op.yaml's)",
    )
    e.add_argument(
        "--schedule",
        help="a schedule file, 'auto' or 'default' (default: the op.yaml's schedule: key)",
    )
    _schedule_time_limit(e)
    e.set_defaults(func=cmd_emit)

    c = sub.add_parser(
        "check", help="compile, simulate on random inputs, compare with PyTorch bit for bit"
    )
    c.add_argument("op")
    c.add_argument("--target")
    c.add_argument(
        "--schedule",
        help="a schedule file, 'auto' or 'default' (default: the op.yaml's schedule: key); "
        "with a schedule other than the default, also prints the default's cycles",
    )
    c.add_argument(
        "--explain",
        action="store_true",
        help="with the automatic scheduler: print its choice as a schedule file, its bottleneck and "
        "how it beat its neighbours",
    )
    c.add_argument("--seed", type=_bounded_int(0, MAX_SEED, "a 32-bit seed"), default=0)
    c.add_argument(
        "--trials",
        type=_bounded_int(
            0, MAX_TRIALS, "MAX_TRIALS in tensorgen/cli.py; run again with another --seed for more"
        ),
        default=1,
    )
    _schedule_time_limit(c)
    _max_steps(c)
    _model_options(c)
    c.add_argument(
        "--input",
        action="append",
        metavar="FILE.npy",
        help="for a model: also check on this input (float32, the model's input shape)",
    )
    c.set_defaults(func=cmd_check)

    m = sub.add_parser("compile", help="compile a quantized PyTorch model to one .tgb binary")
    m.add_argument(
        "model", help="FILE.py[:FACTORY] (default factory: build) or a saved torch.export FILE.pt2"
    )
    m.add_argument("-o", "--output", required=True)
    m.add_argument("--asm", help="also write readable microcode here")
    m.add_argument(
        "--target", help="target name (tensorgen/target/isa/NAME.yaml) or a path (default tg1)"
    )
    m.add_argument(
        "--seed",
        type=_bounded_int(0, MAX_SEED, "a 32-bit seed"),
        default=0,
        help="seed of the calibration data",
    )
    _model_options(m)
    m.set_defaults(func=cmd_compile)

    r = sub.add_parser("run", help="simulate a .tgb on given inputs")
    r.add_argument("binary")
    r.add_argument("--in", dest="inputs", action="append", metavar="NAME=FILE.npy")
    r.add_argument(
        "--out", required=True, help="directory for the output .npy files (created after the run)"
    )
    r.add_argument(
        "--target",
        help="the target's description (FILE.yaml) when the binary's target is not built in; "
        "its name and parameter hash must match the binary's",
    )
    _max_steps(r)
    r.set_defaults(func=cmd_run)

    d = sub.add_parser("disasm", help="print a .tgb as assembly text")
    d.add_argument("binary")
    d.set_defaults(func=cmd_disasm)

    i = sub.add_parser("isa-doc", help="print the instruction set reference (Markdown)")
    i.set_defaults(func=cmd_isa_doc)
    _analysis_parsers(sub)
    return p


def _analysis_parsers(sub) -> None:
    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "source", metavar="MODEL|op.yaml", help="FILE.py[:FACTORY], FILE.pt2 or an op.yaml"
        )
        p.add_argument(
            "-p",
            "--param",
            action="append",
            metavar="KEY=INT",
            help="for a model: a factory argument",
        )
        p.add_argument("--engine", default="qnnpack", choices=("qnnpack", "x86", "fbgemm"))
        p.add_argument(
            "--seed", type=int, default=0, help="calibration seed (model) or input seed (op.yaml)"
        )

    rp = sub.add_parser(
        "report", help="per-layer cycles/energy/roofline table, plots and a Perfetto trace"
    )
    common(rp)
    rp.add_argument("--target", help="target name or path (default tg1)")
    rp.add_argument("-o", "--output", default="report", help="output directory (default ./report)")
    rp.add_argument("--layer", help="the layer shown in timeline.png (default: the slowest)")
    rp.set_defaults(func=cmd_report)

    sp = sub.add_parser(
        "sweep", help="cross product of target parameters: cycles, energy, area, Pareto front"
    )
    common(sp)
    sp.add_argument(
        "--vary",
        action="append",
        metavar="KEY=V1,V2,...",
        help="mac_array=RxC, spad/acc=BYTES (128K), dram_bytes_per_cycle, lanes, clock, node, "
        "weight_buffers; repeat for a cross product",
    )
    sp.add_argument("--target", help="the base target (default tg1)")
    sp.add_argument(
        "-o",
        "--output",
        default="sweep",
        help="output directory, also the cache of finished points",
    )
    sp.add_argument(
        "--jobs", type=int, help="local worker processes (default: the number of cores)"
    )
    sp.add_argument("--executor", default="local", choices=("local", "dask"))
    sp.add_argument(
        "--scheduler", metavar="ADDRESS", help="the Dask scheduler, e.g. tcp://host:8786"
    )
    sp.set_defaults(func=cmd_sweep)

    cp = sub.add_parser(
        "compare", help="two targets on one model: per-layer and total cycles, energy, area, EDP"
    )
    common(cp)
    cp.add_argument("--target", action="append", help="give twice: A then B")
    cp.add_argument("-o", "--output", help="also write compare.csv/json/png here")
    cp.set_defaults(func=cmd_compare)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except TensorgenError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `tensorgen ... | head`: the reader left; not an error of ours
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # so that the interpreter's final flush stays quiet
        return 141
    except Exception:  # a bug in tensorgen, not in the input
        traceback.print_exc()
        print(
            "internal error: this is a tensorgen bug; please report it with the traceback above",
            file=sys.stderr,
        )
        return 3


if __name__ == "__main__":
    sys.exit(main())
