"""The automatic scheduler against an exhaustive search of its own search space, by simulation.

    python benchmarks/exhaustive.py [--target tg1] [--only NAME...] [--json PATH]

For each layer, every candidate of the automatic scheduler's search space (auto.Space: every
loop nest x staging level of each tensor x double buffering) that the cost model says fits is
built, compiled, SIMULATED and checked bit for bit; the fastest by simulated cycles is the
exhaustive optimum. Beside it: the automatic scheduler's choice (also simulated), the ratio of
the two, how many candidates there were, the wall time of the exhaustive search and of the
automatic one. Unlike the automatic search, the enumeration has no time budget.

Candidates the cost model refuses (a memory overflows, or a double-buffered loop has fewer than
two iterations) are counted but not built: the lowering would refuse them too. A candidate the
model accepts but that does not lower is counted as `failed`.

The layers (EXHAUSTIVE_LAYERS) are suite layers whose spaces simulate in a minute or less (the
256^3 matmul and two 1x1 convolutions, as they are) and reduced variants of suite layers
(layers.SMALL_VARIANTS, named `*_small`): a 3x3 convolution of the suite has about 2,700
candidates, and a BERT matmul or a 56x56 depthwise convolution takes seconds per simulation,
which would make the enumeration take an hour. The default layers take about 20 minutes on
one core (the depthwise variant's 765 candidates most of it).

A candidate that is not bit-exact is a compiler bug even if the automatic scheduler never picks
it; the table counts them and lists a few.

JSON: {"target", "layers": [{"name", "candidates", "fitting", "simulated", "failed",
"best_cycles", "best", "auto_cycles", "auto_model_cycles", "auto_over_best", "auto_rank",
"exhaustive_s", "auto_search_s", "all_bit_exact", ...}], "summary": {...}}.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

from layers import LAYERS, SMALL_VARIANTS, Layer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from tensorgen.autosched.layer import recognise
from tensorgen.autosched.search import Candidate, Space, auto_schedule
from tensorgen.codegen.scheduled import compile_scheduled
from tensorgen.driver import compare, random_inputs
from tensorgen.errors import TensorgenError
from tensorgen.outputs import write_atomic
from tensorgen.reference.torch_ref import evaluate
from tensorgen.sim.machine import simulate
from tensorgen.spec.loader import parse_program
from tensorgen.target import Target, load_target

HERE = Path(__file__).resolve().parent
DEFAULT_JSON = HERE / "exhaustive.json"
EXHAUSTIVE_LAYERS = (
    "matmul_256",
    "resnet18_layer3_proj_1x1s2",
    "mbv2_pw_96to24_56",
    "resnet18_conv3x3_small",
    "mbv2_dw3x3s1_small",
    "bert_ffn_down_small",
)


def describe(cand: Candidate, blocks) -> str:
    """One line: the splits, the loop order, each tensor's staging loop, double buffering."""
    splits = ",".join(f"{name}/{size}" for name, size in blocks)
    stages = " ".join(f"{t}@{lv or '-'}" for t, lv in cand.stages)
    return f"{f'[{splits}] ' if splits else ''}{' '.join(cand.order)} | {stages}{' | 2buf' if cand.pipelined else ''}"


def enumerate_layer(layer: Layer, target: Target, seed: int = 0) -> dict:
    """Simulate every fitting candidate of `layer`'s search space, and the automatic choice."""
    program = parse_program(layer.op_yaml(), f"<{layer.name}>", target.name)
    inputs = random_inputs(program, seed)
    expected = evaluate(program, inputs)

    plan = auto_schedule(program, target)
    if plan.schedule is None:
        raise TensorgenError(f"{layer.name}: {plan.reason}")
    auto_run = simulate(compile_scheduled(program, target, plan.schedule).binary, inputs, target)

    t0 = time.perf_counter()
    space = Space.of(program, target, recognise(program))
    candidates = refused = failed = 0
    runs: list[
        tuple[int, int, str, bool]
    ] = []  # (simulated cycles, model cycles, description, bit-exact)
    for shape, order in space.nests():
        for cand in space.costed(shape, order):
            candidates += 1
            if cand.cycles == math.inf:
                refused += 1
                continue
            try:
                schedule, _ = space.schedule(cand, shape)
                compiled = compile_scheduled(program, target, schedule)
            except TensorgenError:
                failed += 1
                continue
            result = simulate(compiled.binary, inputs, target)
            exact = compare(expected, result.outputs).exact
            runs.append((result.stats.cycles, cand.cycles, describe(cand, shape[0]), exact))
    exhaustive_s = time.perf_counter() - t0
    if not runs:
        raise TensorgenError(f"{layer.name}: no candidate of the search space lowers")

    best = min(runs)
    auto_cycles = auto_run.stats.cycles
    auto_exact = compare(expected, auto_run.outputs).exact
    model_errors = [abs(m / c - 1) for c, m, _, _ in runs]
    return {
        "name": layer.name,
        "description": layer.op.describe(),
        "macs": layer.op.macs,
        "nests": sum(1 for _ in space.nests()),
        "candidates": candidates,
        "fitting": candidates - refused,
        "simulated": len(runs),
        "failed": failed,
        "best_cycles": best[0],
        "best_model_cycles": best[1],
        "best": best[2],
        "auto_cycles": auto_cycles,
        "auto_model_cycles": plan.chosen.cycles,
        "auto": describe(plan.chosen, ()),
        "auto_over_best": auto_cycles / best[0],
        "auto_rank": 1 + sum(c < auto_cycles for c, _, _, _ in runs),  # 1: nothing simulated faster
        "auto_considered": len(plan.considered),
        "worst_cycles": max(runs)[0],
        "median_cycles": sorted(c for c, _, _, _ in runs)[len(runs) // 2],
        "max_model_error": max(
            model_errors
        ),  # |model / simulated - 1| over the simulated candidates
        # the candidates the model is furthest from the simulator on: (simulated, model, candidate)
        "worst_model_errors": [
            {"simulated": c, "model": m, "error": m / c - 1, "candidate": d}
            for c, m, d, _ in sorted(runs, key=lambda r: -abs(r[1] / r[0] - 1))[:10]
        ],
        "exhaustive_s": exhaustive_s,
        "auto_search_s": plan.search_s,
        "auto_bit_exact": auto_exact,
        "inexact": sum(
            not exact for _, _, _, exact in runs
        ),  # candidates whose outputs differ: compiler bugs
        "inexact_examples": [d for _, _, d, exact in runs if not exact][:5],
        "all_bit_exact": auto_exact and all(exact for _, _, _, exact in runs),
        "error": None,
    }


def summarize(rows: list[dict]) -> dict:
    ran = [r for r in rows if r["error"] is None]
    return {
        "layers": len(rows),
        "failed": [r["name"] for r in rows if r["error"] is not None],
        "worst_auto_over_best": max((r["auto_over_best"] for r in ran), default=None),
        "auto_within_5_percent": bool(ran) and all(r["auto_over_best"] <= 1.05 for r in ran),
        "all_bit_exact": bool(ran) and all(r["all_bit_exact"] for r in ran),
        "total_simulated": sum(r["simulated"] for r in ran),
        "total_exhaustive_s": sum(r["exhaustive_s"] for r in ran),
        "total_auto_search_s": sum(r["auto_search_s"] for r in ran),
    }


def render(report: dict) -> Table:
    table = Table(
        title=f"automatic vs exhaustive (simulated) schedules on {report['target']}",
        title_justify="left",
    )
    for header in (
        "layer",
        "auto cycles",
        "best cycles",
        "auto/best",
        "rank",
        "candidates",
        "fit",
        "simulated",
        "exhaustive s",
        "auto s",
        "speed-up",
        "max model err",
        "bit-exact",
    ):
        table.add_column(header, justify="left" if header == "layer" else "right")
    for r in report["layers"]:
        if r["error"] is not None:
            table.add_row(r["name"], f"[red]{escape(r['error'][:80])}[/red]", *[""] * 11)
            continue
        ratio = r["auto_over_best"]
        table.add_row(
            r["name"],
            f"{r['auto_cycles']:,}",
            f"{r['best_cycles']:,}",
            f"[{'green' if ratio <= 1.05 else 'red'}]{ratio:.3f}x[/]",
            str(r["auto_rank"]),
            f"{r['candidates']:,}",
            f"{r['fitting']:,}",
            f"{r['simulated']:,}",
            f"{r['exhaustive_s']:.1f}",
            f"{r['auto_search_s']:.2f}",
            f"{r['exhaustive_s'] / r['auto_search_s']:.0f}x",
            f"{r['max_model_error']:.1%}",
            "[green]yes[/green]"
            if r["all_bit_exact"]
            else f"[red]no[/red] ({r['inexact']}; auto {'yes' if r['auto_bit_exact'] else 'no'})",
        )
    table.caption = (
        "auto/best: simulated cycles of the automatic choice / of the fastest candidate; rank: 1 + "
        "candidates simulated faster than auto; candidates: the whole space, fit: accepted by the "
        "cost model, simulated: of those, lowered and run; speed-up: exhaustive s / auto s; "
        "max model err: |model/simulated - 1| over the simulated candidates; bit-exact: every "
        "candidate (else how many are not, and whether auto is)"
    )
    return table


def select(names: list[str] | None) -> list[Layer]:
    known = {layer.name: layer for layer in (*LAYERS, *SMALL_VARIANTS)}
    chosen = names or list(EXHAUSTIVE_LAYERS)
    unknown = [n for n in chosen if n not in known]
    if unknown:
        raise ValueError(f"--only {' '.join(unknown)}: no such layer (known: {', '.join(known)})")
    return [known[n] for n in chosen]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description="Simulate every candidate of the automatic scheduler's search "
        "space on small layers; compare the automatic choice with the best."
    )
    p.add_argument(
        "--target",
        default="tg1",
        help="target name (tensorgen/target/isa/NAME.yaml) or a path (default tg1)",
    )
    p.add_argument(
        "--only", nargs="+", metavar="NAME", help=f"layers (default: {' '.join(EXHAUSTIVE_LAYERS)})"
    )
    p.add_argument(
        "--json",
        default=str(DEFAULT_JSON),
        metavar="PATH",
        help="where to write the JSON report (default benchmarks/exhaustive.json)",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the random inputs")
    args = p.parse_args(argv)
    try:
        layers = select(args.only)
        target = load_target(args.target)
    except (ValueError, TensorgenError) as err:
        p.error(str(err))
    err_console = Console(stderr=True)
    rows = []
    for layer in layers:
        err_console.print(f"[dim]{layer.name}: {layer.op.describe()} ...[/dim]")
        try:
            rows.append(enumerate_layer(layer, target, args.seed))
        except TensorgenError as err:
            rows.append({"name": layer.name, "error": f"{type(err).__name__}: {err}"})
    report = {"target": target.name, "layers": rows, "summary": summarize(rows)}
    console = Console() if sys.stdout.isatty() else Console(width=200)
    console.print(render(report))
    for r in rows:
        if r["error"] is None:
            console.print(
                escape(f"{r['name']}: best {r['best']}\n{' ' * len(r['name'])}  auto {r['auto']}")
            )
            worst = r["worst_model_errors"][0]
            console.print(
                escape(
                    f"{' ' * len(r['name'])}  worst model error {worst['error']:+.1%} "
                    f"(model {worst['model']:,} vs simulated {worst['simulated']:,}): {worst['candidate']}"
                )
            )
            for example in r["inexact_examples"]:
                console.print(f"{' ' * len(r['name'])}  [red]not bit-exact[/red] {escape(example)}")
    path = Path(args.json)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, (json.dumps(report, indent=2) + "\n").encode())
    console.print(f"wrote {path}")
    s = report["summary"]
    return 0 if s["auto_within_5_percent"] and s["all_bit_exact"] and not s["failed"] else 1


if __name__ == "__main__":
    sys.exit(main())
