"""Whole models: compile, simulate, check against PyTorch, and report per model.

    python benchmarks/models.py [--target tg1] [--only NAME...] [--engine qnnpack] [--json PATH]

For each example model (examples/models/) at its benchmark size it prints and writes to JSON:
layers, MACs, simulated cycles, MAC-array utilization (MACs / (cycles * peak MACs per cycle)),
DRAM bytes moved, DRAM the activations need with lifetimes shared vs the sum of all tensors,
weights, compile time, simulator time and PyTorch's own time for the quantized model on the
same input (median of --repeats calls after a warm-up, this process, torch's default threads),
and whether the simulated output equals PyTorch's bit for bit.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import warnings
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

from tensorgen.frontend.quantize import load_factory, quantized_engine
from tensorgen.model import check_model, compile_model
from tensorgen.target import load_target

ROOT = Path(__file__).resolve().parents[1]
MODELS = {  # name -> (file, factory arguments)
    "small_cnn": ("small_cnn.py", {}),
    "mlp": ("mlp.py", {}),
    "mobilenetv2_64": ("mobilenetv2.py", {"size": 64}),
    "resnet18_64": ("resnet18.py", {"size": 64}),
    "resnet18_224": ("resnet18.py", {"size": 224}),
}


def run(name: str, target, engine: str, repeats: int) -> dict:
    file, params = MODELS[name]
    model, example = load_factory(str(ROOT / "examples" / "models" / file), params)
    cm = compile_model(model, example, target, engine=engine)
    gen = torch.Generator().manual_seed(1)
    x = tuple(torch.randn(t.shape, generator=gen) for t in example)
    t0 = time.perf_counter()
    cmp, result = check_model(cm, x)
    check_s = time.perf_counter() - t0
    with quantized_engine(engine), torch.no_grad():
        cm.qmodel(*x)
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            cm.qmodel(*x)
            times.append(time.perf_counter() - t0)
    s = result.stats
    macs = sum(r.macs for r in cm.layers)
    pl = cm.linked.placement
    return {
        "name": name,
        "layers": len(cm.layers),
        "macs": macs,
        "cycles": s.cycles,
        "utilization": macs / (s.cycles * target.peak_macs_per_cycle),
        "dram_bytes": s.dram_bytes,
        "dram_peak_bytes": pl.peak_bytes,
        "dram_sum_bytes": pl.total_bytes,
        "weight_bytes": pl.const_bytes,
        "energy_uj": s.energy_pj / 1e6,
        "compile_s": cm.compile_s,
        "check_s": check_s,
        "torch_s": statistics.median(times),
        "bit_exact": cmp.exact,
        "message": cmp.message,
        "auto_layers": sum(r.schedule == "auto" for r in cm.layers),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", default="tg1")
    p.add_argument("--only", nargs="+", choices=sorted(MODELS), help="models to run (default: all)")
    p.add_argument("--engine", default="qnnpack", choices=("qnnpack", "x86"))
    p.add_argument("--repeats", type=int, default=5, help="timed PyTorch calls per model")
    p.add_argument("--json", default=str(ROOT / "benchmarks" / "models.json"))
    args = p.parse_args(argv)
    warnings.filterwarnings("ignore")
    target = load_target(args.target)
    rows = []
    for name in args.only or list(MODELS):
        print(f"{name} ...", file=sys.stderr, flush=True)
        rows.append(run(name, target, args.engine, args.repeats))
    table = Table(title=f"models on {target.name}, {args.engine}", title_justify="left")
    cols = (
        "model",
        "layers",
        "auto",
        "MACs",
        "cycles",
        "util",
        "DRAM B",
        "peak / sum DRAM",
        "compile s",
        "sim s",
        "torch s",
        "sim/torch",
        "bit-exact",
    )
    for c in cols:
        table.add_column(c, justify="left" if c in ("model", "bit-exact") else "right")
    for r in rows:
        table.add_row(
            r["name"],
            str(r["layers"]),
            str(r["auto_layers"]),
            f"{r['macs']:,}",
            f"{r['cycles']:,}",
            f"{r['utilization']:.1%}",
            f"{r['dram_bytes']:,}",
            f"{r['dram_peak_bytes']:,} / {r['dram_sum_bytes']:,}",
            f"{r['compile_s']:.1f}",
            f"{r['check_s']:.2f}",
            f"{r['torch_s']:.4f}",
            f"{r['check_s'] / r['torch_s']:.0f}x",
            "yes" if r["bit_exact"] else f"NO: {r['message']}",
        )
    Console(width=200).print(table)
    Path(args.json).write_text(
        json.dumps({"target": target.name, "engine": args.engine, "models": rows}, indent=1)
    )
    print(f"wrote {args.json}")
    return 0 if all(r["bit_exact"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
