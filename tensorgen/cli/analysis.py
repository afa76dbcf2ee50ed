"""The architect's subcommands: report, sweep, compare."""

from __future__ import annotations

import argparse
import sys
import time
from contextlib import contextmanager

from tensorgen.cli.common import factory_params, objective_option
from tensorgen.errors import TensorgenError


def _analysis_target(name: str | None):
    from tensorgen.target import load_target

    return load_target(name or "tg1")


def cmd_report(args) -> int:
    from tensorgen.analysis.core import analyze
    from tensorgen.analysis.report import out_dir, print_table, write_report

    target = _analysis_target(args.target)
    out = out_dir(args.output)
    a = analyze(
        args.source,
        target,
        factory_params(args.param),
        args.engine,
        args.seed,
        record=True,
        quantizer=args.quantizer,
        objective=args.objective,
    )
    print_table(a)
    for path in write_report(a, out, args.layer):
        print(f"wrote {path}")
    return 0 if a.exact else 1


def _report_options(rp: argparse.ArgumentParser) -> None:
    rp.add_argument("--target", help="target name or path (default tg1)")
    rp.add_argument("-o", "--output", default="report", help="output directory (default ./report)")
    rp.add_argument("--layer", help="the layer shown in timeline.png (default: the slowest)")
    rp.add_argument(
        "--quantizer",
        default="fx",
        choices=("fx", "pt2e"),
        help="for a float model: PyTorch's FX flow (default) or torch.export + torchao's PT2E",
    )


def cmd_sweep(args) -> int:
    import os

    from tensorgen.analysis import sweep as sw
    from tensorgen.analysis.report import out_dir

    vary = sw.parse_vary(args.vary or [])
    params = factory_params(args.param)
    if args.jobs is not None and args.jobs < 1:
        raise TensorgenError(f"--jobs {args.jobs}: at least 1")
    sw.check_executor(args.executor, args.scheduler)
    sw.load_base(args.target)  # an unknown base target fails before any work
    out = out_dir(args.output)
    t0 = time.perf_counter()
    with _sweep_progress(t0) as progress:
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
            args.objective,
        )
    _write_sweep(out, rows, reused, vary, t0)
    return 1 if any(r.get("ok") and not r.get("bit_exact") for r in rows) else 0


@contextmanager
def _sweep_progress(t0: float):
    """A progress callback (points done, points in all) for the sweep: a bar on a terminal, else
    one line per point on stderr, so that a log shows how far a long sweep got."""
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

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

        yield progress


def _write_sweep(out, rows: list[dict], reused: int, vary: dict, t0: float) -> None:
    """The sweep's files (points.csv, points.json, pareto.png when a point is on the front), its
    Pareto table, and one line of totals naming what it wrote."""
    import json

    from tensorgen.analysis import sweep as sw
    from tensorgen.analysis.plots import pareto_png
    from tensorgen.analysis.report import csv_bytes, write

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
    params = factory_params(args.param)
    a, b = (
        analyze(args.source, t, params, args.engine, args.seed, objective=args.objective)
        for t in targets
    )
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


def analysis_parsers(sub) -> None:
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
        objective_option(p)

    rp = sub.add_parser(
        "report", help="per-layer cycles/energy/roofline table, plots and a Perfetto trace"
    )
    common(rp)
    _report_options(rp)
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
