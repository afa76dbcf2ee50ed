"""`tensorgen report`: the per-layer cost table, roofline/energy/timeline plots and a trace."""

from __future__ import annotations

import csv
import io
import json
import os
from pathlib import Path

from tensorgen.analysis.core import Analysis
from tensorgen.errors import TensorgenError


def out_dir(path: str | Path) -> Path:
    """Create (if need be) and check an output directory; an unwritable one is the user's error."""
    p = Path(path)
    try:
        p.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise TensorgenError(
            f"-o {p}: cannot create the output directory ({err.strerror})"
        ) from None
    if not p.is_dir() or not os.access(p, os.W_OK | os.X_OK):
        raise TensorgenError(f"-o {p}: not a writable directory")
    return p


def write(path: Path, data: bytes) -> None:
    from tensorgen.outputs import write_atomic

    try:
        write_atomic(path, data)
    except OSError as err:
        raise TensorgenError(f"{path}: cannot write ({err.strerror})") from None


def csv_bytes(rows: list[dict]) -> bytes:
    buf = io.StringIO()
    keys: list[str] = []
    for r in rows:
        keys += [k for k in r if k not in keys]
    w = csv.DictWriter(buf, fieldnames=keys, lineterminator="\n")
    w.writeheader()
    w.writerows(rows)
    return buf.getvalue().encode()


def layer_table(a: Analysis) -> list[dict]:
    return [r.as_dict(a.target) for r in a.layers]


def summary(a: Analysis) -> dict:
    energy = a.energy
    return {
        "source": a.source,
        "target": a.target.name,
        "clock_mhz": a.target.clock_mhz,
        "bit_exact": a.exact,
        "check": a.message,
        "cycles": a.stats.cycles,
        "latency_ms": a.latency_s * 1e3,
        "macs": a.macs,
        "utilization": a.utilization(),
        "dram_bytes": a.stats.dram_bytes,
        "energy_pj": energy,
        "energy_per_inference_uj": sum(energy.values()) / 1e6,
        "average_power_mw": a.power_w * 1e3,
        "area_mm2": a.area,
        "compile_s": a.compile_s,
        "sim_s": a.sim_s,
    }


def slowest(a: Analysis) -> str:
    return max(a.layers, key=lambda r: r.cycles).name


def print_table(a: Analysis) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(
        title=f"{a.source} on {a.target.name}: {len(a.layers)} layers", title_justify="left"
    )
    cols = (
        "layer",
        "op",
        "MACs",
        "cycles",
        "util",
        "bound",
        "attain",
        "DRAM B",
        "energy uJ",
        "MAC/vec/SRAM/DRAM %",
    )
    for col in cols:
        table.add_column(col, justify="left" if col in ("layer", "op", "bound") else "right")
    for r in a.layers:
        d = r.as_dict(a.target)
        e = r.energy_pj or 1.0
        split = "/".join(
            f"{100 * x / e:.0f}"
            for x in (
                r.energy["mac"],
                r.energy["vector"],
                r.energy["spad"] + r.energy["acc"],
                r.energy["dram"],
            )
        )
        table.add_row(
            r.name,
            r.op,
            f"{r.macs:,}",
            f"{r.cycles:,}",
            f"{d['utilization']:.1%}" if r.macs else "-",
            d["bound"] or "-",
            f"{d['attainment']:.1%}" if d["attainment"] is not None else "-",
            f"{r.dram_bytes:,}",
            f"{r.energy_pj / 1e6:.3f}",
            split,
        )
    Console(width=170).print(table)
    s = summary(a)
    print(
        f"{a.message}; cycles {a.stats.cycles:,} ({s['latency_ms']:.3f} ms at {a.target.clock_mhz:g} MHz), "
        f"MAC utilization {s['utilization']:.1%}, DRAM {a.stats.dram_bytes:,} B"
    )
    print(
        f"energy per inference {s['energy_per_inference_uj']:.3f} uJ ("
        + ", ".join(f"{k} {v / 1e6:.3f}" for k, v in s["energy_pj"].items())
        + f"), average power "
        f"{s['average_power_mw']:.1f} mW, area {a.area.get('total', 0.0):.3f} mm^2"
    )


def write_report(a: Analysis, out: Path, layer: str | None) -> list[Path]:
    """Everything `tensorgen report` writes; returns the paths."""
    from tensorgen.analysis.plots import energy_png, roofline_png, timeline_png
    from tensorgen.analysis.trace import trace_json

    names = [r.name for r in a.layers]
    if layer is not None and layer not in names:
        raise TensorgenError(
            f"--layer {layer}: no such layer (layers: {', '.join(names[:12])}"
            f"{', ...' if len(names) > 12 else ''})"
        )
    rows = layer_table(a)
    files = {
        "layers.csv": csv_bytes(rows),
        "layers.json": json.dumps({"summary": summary(a), "layers": rows}, indent=1).encode(),
        "roofline.png": roofline_png(a),
        "energy.png": energy_png(a),
        "timeline.png": timeline_png(a, layer or slowest(a)),
        "trace.json": trace_json(a),
    }
    paths = []
    for name, data in files.items():
        write(out / name, data)
        paths.append(out / name)
    return paths
