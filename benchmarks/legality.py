"""Time of one legality check of a schedule primitive on ResNet-18's 3x3 convolution nest.

    python benchmarks/legality.py [--repeats N] [--json PATH]

Each primitive is applied to a fresh schedule of examples/conv3x3_resnet18.yaml (seven loops,
one statement); the time of the whole primitive and of its isl check alone (`find_violation` on
the resulting schedule: flow, anti and output dependences, reductions relaxed; for tile, the
check of its last step) are reported as medians over the repeats. The dependences themselves are computed once per program and cached,
as they are in a real session; their one-off cost is reported separately.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from tensorgen.poly import legality
from tensorgen.schedule.api import Schedule
from tensorgen.spec.loader import load_program

ROOT = Path(__file__).resolve().parents[1]

STEPS = {
    "split(k, 16)": lambda s: s.split(s.loop("k"), 16),
    "reorder(c, h)": lambda s: s.reorder(s.loop("c"), s.loop("h")),
    "tile(h, w, 4, 8)": lambda s: s.tile(s.loop("h"), s.loop("w"), 4, 8),
    "skew(w, h, 1)": lambda s: s.skew(s.loop("w"), s.loop("h"), 1),
    "vectorize(s)": lambda s: s.vectorize(s.loop("s")),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--json", default=str(ROOT / "benchmarks" / "results-legality.json"))
    args = ap.parse_args()
    program = load_program(ROOT / "examples" / "conv3x3_resnet18.yaml")
    legality.relaxed_dependences.cache_clear()
    t0 = time.perf_counter()
    legality.relaxed_dependences(program)
    deps_s = time.perf_counter() - t0
    rows = []
    for name, step in STEPS.items():
        check, whole = [], []
        for _ in range(args.repeats):
            s = Schedule(program)
            t = time.perf_counter()
            step(s)
            whole.append(time.perf_counter() - t)
            umap = s.union_map()  # re-run the exact check the primitive ended with, alone
            t = time.perf_counter()
            legality.find_violation(program, umap)
            check.append(time.perf_counter() - t)
        rows.append(
            {
                "step": name,
                "check_median_s": statistics.median(check),
                "primitive_median_s": statistics.median(whole),
                "repeats": args.repeats,
            }
        )
    table = Table(title="legality checks on conv3x3_resnet18 (1x64x56x56, 3x3, 64 channels)")
    for col in ("step", "isl check (median)", "whole primitive (median)"):
        table.add_column(col, justify="right" if col != "step" else "left")
    for r in rows:
        table.add_row(
            r["step"],
            f"{r['check_median_s'] * 1e3:.1f} ms",
            f"{r['primitive_median_s'] * 1e3:.1f} ms",
        )
    console = Console()
    console.print(table)
    console.print(f"dependences of the program (once, cached): {deps_s * 1e3:.1f} ms")
    Path(args.json).write_text(
        json.dumps({"layer": "conv3x3_resnet18", "dependences_s": deps_s, "steps": rows}, indent=2)
    )
    console.print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
