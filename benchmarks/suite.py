"""The layer suite: compile, simulate and check each layer, and report DESIGN.md's measures.

    python benchmarks/suite.py [--target tg1] [--only NAME...] [--all] [--list] [--json PATH]

Prints a table and writes JSON (default benchmarks/results.json) so that one version
of the compiler can be compared with the next. The layers are in layers.py; without
--only the default ones run. --only takes names or shell patterns (`resnet18_*`).

What each number is (per layer):

- macs: the program's useful multiply-accumulates (the compiler's count of the
  iteration domain, padding taps included as in the usual convention);
- cycles, dram_bytes: the simulator's counters for one run of the .tgb;
- dram_compulsory: every input element the program reads, read once, plus every
  output written once, in bytes. "Reads" is the footprint of the read accesses (a
  1x1 stride-2 conv reads a quarter of its input), computed exactly for accesses
  whose tensor dimensions each depend on their own indices, and the whole tensor
  otherwise (a `where:` clause, a diagonal): the only over-estimate, flagged by
  `compulsory_exact: false`;
- roofline_attainment = max(macs / peak MACs per cycle, dram_compulsory / DRAM
  bytes per cycle) / cycles; 1.0 is the physical limit. `roofline_bound` names the
  larger term;
- unit_ceiling: the roofline attainment the layer would have at its unit's useful
  peak (no array fills, no DMA stalls): for a depthwise conv, on the vector unit's
  lanes (16 MACs per cycle on tg1, not the array's 256); on the MAC array, the share
  of its rows and columns that the contraction's K and N extents fill (the stem's 7
  window taps on 16 rows). It is the explanation of a low attainment: a layer far
  below 1.0 whose attainment is near its ceiling is bound by its mapping, not by
  its schedule;
- dram_lower_bound: for a matmul, max(2*M*N*K/sqrt(S) + M*N words, compulsory):
  the communication bound of Kwasniewski et al. (SC'19) with S = the scratchpad's
  bytes (int8 words), input words counted as one byte and the M*N outputs at their
  dtype's size (4 bytes for int32). It exceeds the compulsory M*K + K*N + 4*M*N
  bytes only when 2*M*N/(M+N) > sqrt(S), i.e. 512 on tg1: for none of the suite's
  matmuls yet (BERT's M is 128), and the larger of two lower bounds is still a lower
  bound. Everything else: compulsory traffic. `dram_lower_bound_kind` says which
  applied, `dram_matmul_io_bound` gives the matmul bound itself;
- compile_s: wall time of parse + default schedule + lowering + encoding the .tgb;
- sim_s, torch_s: wall times of `simulate()` on the decoded .tgb and of PyTorch's
  own CPU kernel for the same operator on the same inputs (layers.py says which),
  both at one thread, timed interleaved in this process after a warm-up of each
  (the checked run), the minimum of --repeats rounds (the simulator in the first
  --sim-repeats of them): see timing.py. sim_over_torch is their ratio;
  sim_default_s, torch_default_s and sim_over_torch_default are the same at
  torch's default thread count (`default_threads`); `load_average_1min` says how
  busy the machine was;
- bit_exact: the simulator's outputs equal tensorgen.reference.torch_ref.evaluate's;
  torch_matches_reference: the timed PyTorch call computed those same values, so
  sim/torch compares like with like.

- schedule: `auto` when the automatic scheduler's choice ran, `default` otherwise;
  schedule_fallback: with --schedule auto, why the default schedule was used instead
  (also printed as a warning after the table), or null.

Summary: geometric means of roofline attainment, sim/torch and DRAM/lower bound over
the layers that ran, how many used the automatic schedule and the fallbacks, and total
times. Exit status 1 when a layer fails or differs.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import math
import os
import platform
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import timing
import torch
from layers import LAYERS, Layer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from tensorgen.autosched.layer import recognise
from tensorgen.autosched.search import Space
from tensorgen.driver import compare, compile_auto, compile_default, random_inputs
from tensorgen.errors import TensorgenError
from tensorgen.ir.core import Access, Affine, Program, Statement
from tensorgen.mc.binary import decode, encode
from tensorgen.outputs import write_atomic
from tensorgen.reference.torch_ref import evaluate
from tensorgen.sim.machine import Stats, simulate
from tensorgen.spec.loader import parse_program
from tensorgen.target import Target, load_target

HERE = Path(__file__).resolve().parent
DEFAULT_JSON = HERE / "results.json"
# enumerating one tensor dimension's subscript values beyond this many points is not worth it
MAX_SUBSCRIPT_POINTS = 1 << 22


@dataclass(frozen=True)
class Options:
    seed: int = 0  # random inputs (tensorgen.driver.random_inputs)
    repeats: int = 7  # interleaved timing rounds per thread count; the minimum is reported
    sim_repeats: int = 3  # of those rounds, how many also time the simulator
    schedule: str = "auto"  # "auto" (the automatic scheduler) or "default"


# --- data-movement measures -------------------------------------------------------------------


def _subscript_values(stmt: Statement, sub: Affine, extent: int) -> np.ndarray | None:
    """The in-bounds values an affine subscript takes over the statement's box; None if too many."""
    values = np.array([sub.const], dtype=np.int64)
    for name, coef in sub.terms:
        lo, hi = stmt.bounds[stmt.indices.index(name)]
        if values.size * (hi - lo + 1) > MAX_SUBSCRIPT_POINTS:
            return None
        values = np.unique((values[:, None] + coef * np.arange(lo, hi + 1)[None, :]).ravel())
    return values[(values >= 0) & (values < extent)]


def _mark_footprint(mask: np.ndarray, stmt: Statement, access: Access) -> bool:
    """Set the elements `access` reads in `mask`; False if it cannot be done exactly this way."""
    names = [n for sub in access.index for n in sub.names]
    if stmt.where or len(names) != len(set(names)):  # dimensions not independent of each other
        return False
    per_dim = [
        _subscript_values(stmt, sub, n) for sub, n in zip(access.index, mask.shape, strict=False)
    ]
    if any(v is None for v in per_dim):
        return False
    mask[np.ix_(*per_dim)] = True
    return True


def compulsory_bytes(program: Program) -> tuple[int, bool]:
    """(bytes of every input element read once + every output written once, exact?)."""
    total, exact = 0, True
    for tensor in program.inputs:
        mask = np.zeros(tensor.shape, dtype=bool)
        for stmt in program.statements:
            # `+=` and `max=` read the old value of what they update (an inout tensor's)
            updated = [stmt.lhs] if stmt.op != "=" else []
            for access in stmt.reads + updated:
                if access.tensor == tensor.name and not _mark_footprint(mask, stmt, access):
                    mask[...] = True
                    exact = False
        total += int(mask.sum()) * tensor.itemsize
    total += sum(t.nbytes for t in program.outputs)
    return total, exact


# --- one layer --------------------------------------------------------------------------------


def run_layer(layer: Layer, target: Target, options: Options = Options()) -> dict:
    """Compile, simulate, check and time one layer; returns its row of the JSON report."""
    t0 = time.perf_counter()
    program = parse_program(layer.op_yaml(), f"<{layer.name}>", target.name)
    model_cycles, reason = None, None
    if options.schedule == "auto":
        auto = compile_auto(program, target)
        compiled = auto.compiled
        if auto.plan.chosen is not None and auto.plan.schedule is not None:
            model_cycles = auto.plan.chosen.cycles
        else:
            reason = auto.plan.reason
    else:
        compiled = compile_default(program, target)
    data = encode(compiled.binary)
    compile_s = time.perf_counter() - t0

    binary = decode(data)  # run what would be written to disk
    inputs = random_inputs(program, options.seed)
    result = simulate(binary, inputs, target)  # the checked run doubles as the warm-up
    expected = evaluate(program, inputs)
    check = compare(expected, result.outputs)
    torch_call = layer.op.torch_op(inputs)
    torch_out = torch_call()  # warm-up, and the values the timed calls compute
    (out_name,) = expected  # a suite operator has one output
    torch_matches = bool(np.array_equal(torch_out.numpy(), expected[out_name]))
    times = timing.compare(
        lambda: simulate(binary, inputs, target), torch_call, options.repeats, options.sim_repeats
    )

    return {
        "name": layer.name,
        "network": layer.network,
        "description": layer.op.describe(),
        **performance(
            layer, program, compiled.macs, result.stats, target, unit_peak(program, target)
        ),
        "schedule": options.schedule
        if model_cycles is not None or options.schedule == "default"
        else "default",
        "schedule_fallback": reason,  # with --schedule auto: why the default schedule was used instead
        "model_cycles": model_cycles,
        "model_over_sim": model_cycles / result.stats.cycles if model_cycles else None,
        "instructions": len(compiled.binary.code),
        "binary_bytes": len(data),
        "compile_s": compile_s,
        **times,
        "torch_op": layer.op.torch_name,
        "bit_exact": check.exact,
        "check": check.message,
        "torch_matches_reference": torch_matches,
        "error": None,
    }


def unit_peak(program: Program, target: Target) -> tuple[str, float] | None:
    """(the unit, its most useful MACs per cycle) for a layer the automatic scheduler takes:
    the vector unit's lanes for a depthwise conv, the share of the MAC array that the
    contraction's K and N extents fill (auto.Space.peak_macs_per_cycle); None otherwise."""
    layer = recognise(program)
    if isinstance(layer, str):
        return None
    space = Space.of(program, target, layer)
    return space.band_kind, space.peak_macs_per_cycle()


def performance(
    layer: Layer,
    program: Program,
    macs: int,
    stats: Stats,
    target: Target,
    unit: tuple[str, float] | None = None,
) -> dict:
    """The simulated run against its physical limits: roofline and DRAM lower bound; and the
    ceiling of the roofline attainment that the unit the layer runs on sets (`unit`)."""
    compulsory, compulsory_exact = compulsory_bytes(program)
    compute_cycles = macs / target.peak_macs_per_cycle
    memory_cycles = compulsory / target.dram_bytes_per_cycle
    roofline = max(compute_cycles, memory_cycles)
    ceiling = roofline / max(macs / unit[1], memory_cycles) if unit else None
    io_bound = layer.op.io_lower_bound(target)
    if io_bound is not None and io_bound > compulsory:
        lower_bound, bound_kind = io_bound, "matmul_io"
    else:
        lower_bound, bound_kind = compulsory, "compulsory"
    return {
        "macs": macs,
        "cycles": stats.cycles,
        "utilization": macs / (stats.cycles * target.peak_macs_per_cycle),
        "roofline_attainment": roofline / stats.cycles,
        "roofline_bound": "compute" if compute_cycles >= memory_cycles else "memory",
        "unit": unit[0] if unit else None,
        "unit_ceiling": ceiling,  # the roofline attainment at the unit's useful peak (no fills, no DMA stalls)
        "dram_bytes": stats.dram_bytes,
        "dram_read_bytes": stats.dram_read_bytes,
        "dram_write_bytes": stats.dram_write_bytes,
        "dram_compulsory": compulsory,
        "compulsory_exact": compulsory_exact,
        "dram_matmul_io_bound": io_bound,
        "dram_lower_bound": lower_bound,
        "dram_lower_bound_kind": bound_kind,
        "dram_over_lower_bound": stats.dram_bytes / lower_bound,
        "energy_uj": stats.energy_pj / 1e6,
    }


def failed_row(layer: Layer, err: BaseException) -> dict:
    return {
        "name": layer.name,
        "network": layer.network,
        "description": layer.op.describe(),
        "bit_exact": False,
        "error": f"{type(err).__name__}: {err}",
    }


# --- the suite --------------------------------------------------------------------------------


def _geomean(values: list[float]) -> float | None:
    values = [v for v in values if v is not None and v > 0]
    return math.exp(sum(map(math.log, values)) / len(values)) if values else None


def summarize(rows: list[dict]) -> dict:
    ran = [r for r in rows if r["error"] is None]
    return {
        "layers": len(rows),
        "failed": [r["name"] for r in rows if r["error"] is not None],
        "all_bit_exact": bool(rows) and all(r["bit_exact"] for r in rows),
        "geomean_roofline_attainment": _geomean([r["roofline_attainment"] for r in ran]),
        "geomean_utilization": _geomean([r["utilization"] for r in ran]),
        "geomean_sim_over_torch": _geomean([r["sim_over_torch"] for r in ran]),  # one thread
        "max_sim_over_torch": max((r["sim_over_torch"] for r in ran), default=None),
        "geomean_sim_over_torch_default": _geomean([r["sim_over_torch_default"] for r in ran]),
        "geomean_dram_over_lower_bound": _geomean([r["dram_over_lower_bound"] for r in ran]),
        # the layers below half the roofline, each with the ceiling its unit sets (the explanation)
        "below_half": [
            {
                "name": r["name"],
                "roofline_attainment": r["roofline_attainment"],
                "unit": r.get("unit"),
                "unit_ceiling": r.get("unit_ceiling"),
            }
            for r in ran
            if r["roofline_attainment"] < 0.5
        ],
        # with --schedule auto: the layers that got the default schedule instead, and why
        "auto_scheduled": sum(r["schedule"] == "auto" for r in ran),
        "fallbacks": [
            {"name": r["name"], "reason": r["schedule_fallback"]}
            for r in ran
            if r.get("schedule_fallback") is not None
        ],
        "total_macs": sum(r["macs"] for r in ran),
        "total_cycles": sum(r["cycles"] for r in ran),
        "total_compile_s": sum(r["compile_s"] for r in ran),
        "total_sim_s": sum(r["sim_s"] for r in ran),
        "total_torch_s": sum(r["torch_s"] for r in ran),
    }


def _git_commit() -> str | None:
    try:
        out = subprocess.run(
            ["git", "-C", str(HERE), "describe", "--always", "--dirty"],
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def environment(options: Options) -> dict:
    return {
        "git": _git_commit(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),  # the default; times are also at 1
        "machine": platform.machine(),
        "processor": platform.processor() or None,
        "load_average_1min": os.getloadavg()[0],  # other work on the machine skews wall times
        "seed": options.seed,
        "torch_repeats": options.repeats,
        "sim_repeats": options.sim_repeats,
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def run_suite(
    layers: list[Layer],
    target: Target,
    options: Options = Options(),
    console: Console | None = None,
) -> dict:
    """Every layer in turn; a layer that fails is reported as such and the others still run."""
    rows = []
    for layer in layers:
        if console:
            console.print(f"[dim]{layer.name}: {layer.op.describe()} ...[/dim]")
        try:
            rows.append(run_layer(layer, target, options))
        except Exception as err:  # a compiler bug in one layer must not hide the others' numbers
            if console:
                console.print(f"[red]{layer.name} failed:[/red]\n{escape(traceback.format_exc())}")
            rows.append(failed_row(layer, err))
    return {
        "target": target.name,
        "environment": environment(options),
        "layers": rows,
        "summary": summarize(rows),
    }


# --- presentation -----------------------------------------------------------------------------


def _fmt(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _ceiling(row: dict) -> str:
    if row.get("unit_ceiling") is None:
        return "-"
    return f"{row['unit_ceiling']:.1%}{' v' if row['unit'] == 'vector' else ''}"


def render(report: dict) -> Table:
    table = Table(title=f"tensorgen layer suite on {report['target']}", title_justify="left")
    for header in (
        "layer",
        "MACs",
        "cycles",
        "model",
        "util",
        "roofline",
        "ceiling",
        "DRAM B",
        "lower bd B",
        "DRAM/lb",
        "compile s",
        "sim s",
        "torch s",
        "sim/torch",
        "sim/torch dflt",
        "bit-exact",
    ):
        table.add_column(header, justify="left" if header == "layer" else "right")
    for r in report["layers"]:
        if r["error"] is not None:
            error = escape(r["error"].splitlines()[0][:60])
            table.add_row(r["name"], f"[red]{error}[/red]", *[""] * 13, "[red]no[/red]")
            continue
        bound = "m" if r["roofline_bound"] == "memory" else "c"
        table.add_row(
            r["name"],
            f"{r['macs']:,}",
            f"{r['cycles']:,}",
            f"{r['model_over_sim']:.3f}x" if r.get("model_over_sim") else r.get("schedule", "-"),
            f"{r['utilization']:.1%}",
            f"{r['roofline_attainment']:.1%} {bound}",
            _ceiling(r),
            f"{r['dram_bytes']:,}",
            f"{r['dram_lower_bound']:,}",
            f"{r['dram_over_lower_bound']:.2f}x",
            f"{r['compile_s']:.2f}",
            f"{r['sim_s']:.4f}",
            f"{r['torch_s']:.4f}",
            f"{r['sim_over_torch']:.2f}x",
            f"{r['sim_over_torch_default']:.2f}x",
            "[green]yes[/green]" if r["bit_exact"] else f"[red]no[/red] {escape(r['check'])}",
        )
    s = report["summary"]
    table.add_section()
    table.add_row(
        f"geomean / total ({s['layers']})",
        f"{s['total_macs']:,}",
        f"{s['total_cycles']:,}",
        "",
        _fmt(s["geomean_utilization"], ".1%"),
        _fmt(s["geomean_roofline_attainment"], ".1%"),
        "",
        "",
        "",
        _fmt(s["geomean_dram_over_lower_bound"], ".2f") + "x",
        f"{s['total_compile_s']:.2f}",
        f"{s['total_sim_s']:.2f}",
        f"{s['total_torch_s']:.4f}",
        _fmt(s["geomean_sim_over_torch"], ".2f") + "x",
        _fmt(s["geomean_sim_over_torch_default"], ".2f") + "x",
        "[green]all[/green]" if s["all_bit_exact"] else "[red]not all[/red]",
    )
    table.caption = (
        "model: the cost model's cycles / simulated cycles (or the schedule used when there is no "
        "model); roofline: max(compute, compulsory DRAM) cycles / cycles, c|m: which one; "
        "ceiling: the roofline at the useful peak of the unit the layer runs on (v: vector unit); "
        "lower bd: matmul I/O bound or compulsory traffic; sim, torch: wall times at one thread, "
        "minimum of interleaved runs; sim/torch dflt: the same ratio at torch's default "
        "threads; last row: totals, and geomeans of ratios"
    )
    return table


def select_layers(patterns: list[str] | None, run_all: bool) -> list[Layer]:
    """The default layers, every layer, or those named (shell patterns allowed), in suite order."""
    if run_all:
        return list(LAYERS)
    if not patterns:
        return [layer for layer in LAYERS if layer.default]
    chosen = []
    for pattern in patterns:
        matched = [layer for layer in LAYERS if fnmatch.fnmatchcase(layer.name, pattern)]
        if not matched:
            known = ", ".join(layer.name for layer in LAYERS)
            raise ValueError(f"--only {pattern}: no such layer (known: {known})")
        chosen += [layer for layer in matched if layer not in chosen]
    return chosen


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description="Compile, simulate and check the layer suite; report "
        "the measures of quality of DESIGN.md."
    )
    p.add_argument(
        "--target",
        default="tg1",
        help="target name (tensorgen/target/isa/NAME.yaml) or a path (default tg1)",
    )
    p.add_argument(
        "--only", nargs="+", metavar="NAME", help="layers to run, by name or shell pattern"
    )
    p.add_argument("--all", action="store_true", help="run every layer, not only the default ones")
    p.add_argument("--list", action="store_true", help="list the layers and exit")
    p.add_argument(
        "--json",
        default=str(DEFAULT_JSON),
        metavar="PATH",
        help="where to write the JSON report (default benchmarks/results.json)",
    )
    p.add_argument("--seed", type=int, default=Options.seed, help="seed of the random inputs")
    p.add_argument(
        "--schedule",
        choices=("auto", "default"),
        default=Options.schedule,
        help="the automatic scheduler (default) or the default schedule",
    )
    p.add_argument(
        "--repeats",
        type=int,
        default=Options.repeats,
        help="interleaved timing rounds per layer and thread count (the minimum is reported)",
    )
    p.add_argument(
        "--sim-repeats",
        type=int,
        default=Options.sim_repeats,
        help="of those rounds, how many also time the simulator",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.repeats < 1 or args.sim_repeats < 1:
        parser.error("--repeats and --sim-repeats must be at least 1")
    if args.list:
        for layer in LAYERS:
            mark = "*" if layer.default else " "
            print(f"{mark} {layer.name:30} {layer.network:12} {layer.op.describe()}")
        return 0
    try:
        layers = select_layers(args.only, args.all)
        target = load_target(args.target)
    except (ValueError, TensorgenError) as err:
        parser.error(str(err))
    options = Options(args.seed, args.repeats, args.sim_repeats, args.schedule)
    report = run_suite(layers, target, options, Console(stderr=True))
    # a wide table: do not let a pipe's default of 80 columns fold it
    console = Console() if sys.stdout.isatty() else Console(width=200)
    console.print(render(report))
    for low in report["summary"]["below_half"]:
        ceiling = low["unit_ceiling"]
        why = (
            "no ceiling known"
            if ceiling is None
            else f"{low['unit']} unit ceiling {ceiling:.1%}: {low['roofline_attainment'] / ceiling:.0%} of it attained"
        )
        console.print(f"below 50%: {low['name']} at {low['roofline_attainment']:.1%} ({why})")
    if options.schedule == "auto":
        s = report["summary"]
        console.print(
            f"automatic schedule: {s['auto_scheduled']} of {s['layers'] - len(s['failed'])} layers"
        )
        for fallback in s["fallbacks"]:
            console.print(
                f"[yellow]warning:[/yellow] {fallback['name']} fell back to the default schedule: "
                f"{escape(fallback['reason'])}"
            )
    path = Path(args.json)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, (json.dumps(report, indent=2) + "\n").encode())
    console.print(f"wrote {path}")
    s = report["summary"]
    return 0 if s["all_bit_exact"] and not s["failed"] else 1


if __name__ == "__main__":
    sys.exit(main())
