"""Whole models: compile, simulate, check against PyTorch, and report per model.

    python benchmarks/models.py [--target tg1] [--only NAME...] [--engine qnnpack] [--json PATH]

For each example model (examples/models/) at its benchmark size it prints and writes to JSON:
layers, MACs, simulated cycles, MAC-array utilization (MACs / (cycles * peak MACs per cycle)),
DRAM bytes moved, DRAM the activations need with lifetimes shared vs the sum of all tensors,
weights, compile time and its phases (quantize, schedule search, lowering, link, and the
simulation compile_model runs to measure each layer) and the median layer's compile time, the
process's peak memory after the model (max RSS, which only grows), the simulator's time on the linked .tgb and PyTorch's own time for
the quantized model on the same input -- interleaved, minimum of --repeats rounds, both at one
thread and at torch's default threads, with both ratios (timing.py) -- and whether the
simulated output equals PyTorch's bit for bit.

Fusion (unless --no-fusion): each model is compiled layer by layer (`fuse=False`, --no-fuse) and
a second time fused (the default) and
a second table sets DRAM bytes, cycles, energy and utilization fused and layer by layer side by
side, with the compulsory DRAM traffic (the model's inputs, weights and outputs once each) and
each one's ratio to it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import resource
import statistics
import sys
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import timing
import torch
from rich.console import Console
from rich.table import Table

import tensorgen.driver
import tensorgen.model
from tensorgen.frontend.quantize import load_factory, quantized_engine
from tensorgen.mc.binary import decode, encode
from tensorgen.model import check_model, compile_model
from tensorgen.sim.machine import simulate
from tensorgen.target import load_target

ROOT = Path(__file__).resolve().parents[1]
MODELS = {  # name -> (file, factory arguments)
    "small_cnn": ("small_cnn.py", {}),
    "mlp": ("mlp.py", {}),
    "mobilenetv2_64": ("mobilenetv2.py", {"size": 64}),
    "mobilenetv2_224": ("mobilenetv2.py", {"size": 224}),
    "mobilenetv3_small_64": ("mobilenetv3_small.py", {"size": 64}),
    "resnet18_64": ("resnet18.py", {"size": 64}),
    "resnet18_224": ("resnet18.py", {"size": 224}),
}


# compile_model's phases: (module, function) -> phase; a phase's time is the sum of its calls
PHASES = {
    (tensorgen.model, "quantize"): "quantize",
    (tensorgen.model, "lower_graph"): "lowering",
    (tensorgen.driver, "auto_schedule"): "schedule",
    (tensorgen.driver, "compile_scheduled"): "lowering",
    (tensorgen.model, "replay_schedule"): "schedule",  # a layer of a structure already searched
    (tensorgen.model, "compile_scheduled"): "lowering",
    (tensorgen.model, "link"): "link",
    (tensorgen.model, "run_model"): "simulate",
}


@contextlib.contextmanager
def phase_times() -> Iterator[dict[str, float]]:
    """Seconds spent in each phase of compile_model while the block runs (the functions it
    calls, wrapped for the duration; the rest of the time is bookkeeping, under "other"), and
    under "layers" the seconds of each layer's compile (schedule and lowering; compile_model
    runs them in this process by default, jobs=1)."""
    times = dict.fromkeys(PHASES.values(), 0.0)
    layers: list[float] = []
    times["layers"] = layers
    wrapped = {**PHASES, (tensorgen.model, "_compile_layer"): None}
    saved = {(mod, fn): getattr(mod, fn) for mod, fn in wrapped}

    def timed(phase, f):
        def call(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return f(*args, **kwargs)
            finally:
                if phase is None:
                    layers.append(time.perf_counter() - t0)
                else:
                    times[phase] += time.perf_counter() - t0

        return call

    for (mod, fn), phase in wrapped.items():
        setattr(mod, fn, timed(phase, saved[(mod, fn)]))
    try:
        yield times
    finally:
        for (mod, fn), f in saved.items():
            setattr(mod, fn, f)


def compulsory_bytes(cm) -> int:
    """The model's inputs and outputs and its weights, once each: DRAM traffic's lower bound."""
    public = sum(t.nbytes for t in cm.binary.tensors if t.role in ("input", "output"))
    weights = {  # by buffer: a constant two layers share counts once
        f"{layer.name}/{p.name}": p.const.astype(np.dtype(p.dtype)).nbytes
        for layer in cm.graph.layers
        for p in layer.ports
        if p.const is not None
    }
    return public + sum(weights.values())


def fused_run(name: str, model, example, target, engine: str, x) -> dict:
    """The model compiled with fusion, checked on the same input as the unfused one."""
    cm = compile_model(model, example, target, engine=engine, fuse=True)
    cmp, result = check_model(cm, x)
    s = result.stats
    macs = sum(r.macs for r in cm.layers)
    return {
        "units": len(cm.layers),
        "groups": sum(r.schedule == "fused" for r in cm.layers),
        "cycles": s.cycles,
        "utilization": macs / (s.cycles * target.peak_macs_per_cycle),
        "dram_bytes": s.dram_bytes,
        "energy_uj": s.energy_pj / 1e6,
        "compile_s": cm.compile_s,
        "bit_exact": cmp.exact,
        "message": cmp.message,
        "notes": cm.fusion_notes,
    }


def run(name: str, target, engine: str, repeats: int, fusion: bool = True) -> dict:
    file, params = MODELS[name]
    model, example = load_factory(str(ROOT / "examples" / "models" / file), params)
    with phase_times() as phases:
        cm = compile_model(model, example, target, engine=engine, fuse=False)
    layer_s = phases.pop("layers")
    phases["other"] = cm.compile_s - sum(phases.values())
    gen = torch.Generator().manual_seed(1)
    x = tuple(torch.randn(t.shape, generator=gen) for t in example)
    cmp, result = check_model(cm, x)  # also the warm-up of both
    binary = decode(encode(cm.binary))
    feed = {n: v.numpy().astype(np.float32) for n, v in zip(cm.input_names, x, strict=True)}

    def reference() -> None:
        with quantized_engine(engine), torch.no_grad():
            cm.qmodel(*x)

    times = timing.compare(lambda: simulate(binary, feed, cm.target), reference, repeats)
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
        "compile_phases_s": phases,
        "median_layer_compile_s": statistics.median(layer_s),
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        **times,
        "bit_exact": cmp.exact,
        "message": cmp.message,
        "auto_layers": sum(r.schedule == "auto" for r in cm.layers),
        "compulsory_dram_bytes": compulsory_bytes(cm),
        "fused": fused_run(name, model, example, target, engine, x) if fusion else None,
    }


def render_fusion(rows: list[dict], target: str) -> Table:
    table = Table(title=f"fusion on {target}: layer by layer -> fused", title_justify="left")
    cols = ("model", "groups", "DRAM B", "compulsory B", "/ bound", "cycles", "energy uJ")
    for c in cols + ("util", "compile s", "bit-exact"):
        table.add_column(c, justify="left" if c in ("model", "bit-exact") else "right")
    for r in rows:
        f = r["fused"]
        if f is None:
            continue
        bound = r["compulsory_dram_bytes"]
        table.add_row(
            r["name"],
            f"{f['groups']} ({r['layers']} -> {f['units']} units)",
            f"{r['dram_bytes']:,} -> {f['dram_bytes']:,}",
            f"{bound:,}",
            f"{r['dram_bytes'] / bound:.2f}x -> {f['dram_bytes'] / bound:.2f}x",
            f"{r['cycles']:,} -> {f['cycles']:,}",
            f"{r['energy_uj']:.1f} -> {f['energy_uj']:.1f}",
            f"{r['utilization']:.1%} -> {f['utilization']:.1%}",
            f"{r['compile_s']:.1f} -> {f['compile_s']:.1f}",
            "yes" if f["bit_exact"] else f"NO: {f['message']}",
        )
    return table


def render(rows: list[dict], target: str, engine: str) -> Table:
    table = Table(title=f"models on {target}, {engine}", title_justify="left")
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
        "quant / sched / lower / link / sim s",
        "median layer s",
        "peak RSS MiB",
        "sim s",
        "torch s",
        "sim/torch",
        "sim/torch dflt",
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
            " / ".join(
                f"{r['compile_phases_s'][p]:.1f}"
                for p in ("quantize", "schedule", "lowering", "link", "simulate")
            ),
            f"{r['median_layer_compile_s']:.2f}",
            f"{r['peak_rss_mib']:,.0f}",
            f"{r['sim_s']:.3f}",
            f"{r['torch_s']:.4f}",
            f"{r['sim_over_torch']:.2f}x",
            f"{r['sim_over_torch_default']:.2f}x",
            "yes" if r["bit_exact"] else f"NO: {r['message']}",
        )
    return table


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", default="tg1")
    p.add_argument("--only", nargs="+", choices=sorted(MODELS), help="models to run (default: all)")
    p.add_argument("--engine", default="qnnpack", choices=("qnnpack", "x86"))
    p.add_argument(
        "--repeats", type=int, default=5, help="interleaved timing rounds per thread count"
    )
    p.add_argument("--json", default=str(ROOT / "benchmarks" / "models.json"))
    p.add_argument("--no-fusion", action="store_true", help="skip the fused compile of each model")
    args = p.parse_args(argv)
    warnings.filterwarnings("ignore")
    target = load_target(args.target)
    rows = []
    for name in args.only or list(MODELS):
        print(f"{name} ...", file=sys.stderr, flush=True)
        rows.append(run(name, target, args.engine, args.repeats, not args.no_fusion))
    table = render(rows, target.name, args.engine)
    Console(width=200).print(table)
    if not args.no_fusion:
        Console(width=200).print(render_fusion(rows, target.name))
    Path(args.json).write_text(
        json.dumps({"target": target.name, "engine": args.engine, "models": rows}, indent=1)
    )
    print(f"wrote {args.json}")
    fused_ok = all(r["fused"] is None or r["fused"]["bit_exact"] for r in rows)
    return 0 if fused_ok and all(r["bit_exact"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
