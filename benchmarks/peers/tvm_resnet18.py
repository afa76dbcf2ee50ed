"""tensorgen's compile of ResNet-18 beside Apache TVM's import and build of the same float model.

    /work/venvs/tvm/bin/python benchmarks/peers/tvm_resnet18.py [--size 224] [--rounds 3]

Install TVM's venv once (a benchmark-only dependency, never one of tensorgen's):

    python3 -m venv /work/venvs/tvm && /work/venvs/tvm/bin/pip install torch==2.13.0 apache-tvm

The model is examples/models/resnet18.py (plain torch, loaded by its path: this venv has no
tensorgen). TVM's side is `torch.export.export` + `relax.frontend.torch.from_exported_program`
+ `tvm.compile(..., target="llvm")`, untuned: it does less than tensorgen (no quantization, no
schedule search, no simulation). Each round runs, back to back in cold processes, tensorgen's
`compile examples/models/resnet18.py:build -p size=N -o ...` (with --tensorgen-python, default
/work/main/.venv/bin/python) and this script's `--tvm-only` child, which also reports TVM's
in-process import and build time, and a tensorgen child that times its quantize and compile in
process (the libraries' imports excluded, as on TVM's side). Printed: the minimum over rounds of each time and the ratios;
written: --json (default benchmarks/results_tvm.json).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MODEL = ROOT / "examples" / "models" / "resnet18.py"
DEFAULT_TENSORGEN = "/work/main/.venv/bin/python"
ENV = {**os.environ, "OPENBLAS_NUM_THREADS": "1"}


def tvm_build(size: int) -> dict:
    """Import and build the float model with TVM in this process; the seconds of each part."""
    t0 = time.perf_counter()
    import torch
    import tvm
    from tvm.relax.frontend.torch import from_exported_program

    t1 = time.perf_counter()
    spec = importlib.util.spec_from_file_location("resnet18_example", MODEL)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    model, example = module.build(size=size)
    model = model.eval()
    t2 = time.perf_counter()
    with torch.no_grad():
        exported = torch.export.export(model, example)
        mod = from_exported_program(exported, keep_params_as_input=False)
    t3 = time.perf_counter()
    executable = tvm.compile(mod, target="llvm")
    t4 = time.perf_counter()
    assert executable is not None
    return {
        "tvm_version": tvm.__version__,
        "import_libraries_s": t1 - t0,
        "build_model_s": t2 - t1,
        "import_graph_s": t3 - t2,
        "compile_s": t4 - t3,
        "import_and_build_s": t4 - t2,
    }


TENSORGEN_IN_PROCESS = """
import json, sys, time
t0 = time.perf_counter()
from tensorgen.frontend.load import load_model
from tensorgen.model import compile_model
from tensorgen.target import load_target
t1 = time.perf_counter()
model, example = load_model(sys.argv[1], {"size": int(sys.argv[2])})
cm = compile_model(model, example, load_target("tg1"))
t2 = time.perf_counter()
print(json.dumps({"tensorgen_import_libraries_s": t1 - t0, "tensorgen_in_process_s": t2 - t1}))
"""


def _timed(cmd: list[str]) -> tuple[float, str]:
    start = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, env=ENV, timeout=1800)
    wall = time.perf_counter() - start
    if done.returncode:
        raise SystemExit(f"{' '.join(cmd[:3])}...: exit {done.returncode}: {done.stderr[-400:]}")
    return wall, done.stdout


def round_trip(tensorgen_python: str, size: int, out: Path) -> dict:
    tg_wall, _ = _timed(
        [tensorgen_python, "-m", "tensorgen.cli", "compile", f"{MODEL}:build"]
        + ["-p", f"size={size}", "-o", str(out)]
    )
    _, tg_text = _timed([tensorgen_python, "-c", TENSORGEN_IN_PROCESS, f"{MODEL}:build", str(size)])
    tvm_wall, text = _timed([sys.executable, __file__, "--tvm-only", "--size", str(size)])
    return {
        "tensorgen_process_s": tg_wall,
        "tvm_process_s": tvm_wall,
        **json.loads(tg_text),
        **json.loads(text),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--tensorgen-python", default=DEFAULT_TENSORGEN)
    p.add_argument("--json", default=str(ROOT / "benchmarks" / "results_tvm.json"))
    p.add_argument("--tvm-only", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.tvm_only:
        print(json.dumps(tvm_build(args.size)))
        return 0
    with tempfile.TemporaryDirectory(prefix="tg-tvm-") as tmp:
        rounds = [
            round_trip(args.tensorgen_python, args.size, Path(tmp) / "r.tgb")
            for _ in range(args.rounds)
        ]
    best = {key: min(r[key] for r in rounds) for key in rounds[0] if key.endswith("_s")}
    best["ratio_process"] = best["tensorgen_process_s"] / best["tvm_process_s"]
    best["ratio_in_process"] = best["tensorgen_in_process_s"] / best["import_and_build_s"]
    print(f"ResNet-18 at {args.size}, minimum of {args.rounds} rounds, back to back:")
    print(
        f"  tensorgen compile (cold process, int8, search + lowering): {best['tensorgen_process_s']:7.2f} s"
    )
    print(
        f"  TVM {rounds[0]['tvm_version']} cold process (float, llvm, untuned):    {best['tvm_process_s']:7.2f} s"
    )
    print(
        f"  tensorgen in-process quantize + compile:                 {best['tensorgen_in_process_s']:7.2f} s"
    )
    print(
        f"  TVM in-process import + build:                           {best['import_and_build_s']:7.2f} s"
    )
    print(
        f"  ratio tensorgen / TVM: {best['ratio_process']:.2f}x cold processes, "
        f"{best['ratio_in_process']:.2f}x in process (libraries' imports excluded on both sides)"
    )
    Path(args.json).write_text(
        json.dumps({"size": args.size, "rounds": rounds, "best": best}, indent=1)
    )
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
