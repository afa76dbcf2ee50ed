"""PNG plots with matplotlib's Agg backend (no display): roofline, energy, timeline, Pareto, compare.

Each function returns the PNG's bytes; the caller writes them atomically.
"""

from __future__ import annotations

import io
import math

from tensorgen.analysis.core import ENERGY_PARTS, Analysis

COLORS = {
    "mac": "#4c72b0",
    "vector": "#55a868",
    "spad": "#c44e52",
    "acc": "#8172b2",
    "dram": "#ccb974",
    "static": "#64b5cd",
}


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    _plt().close(fig)
    return buf.getvalue()


def roofline_png(a: Analysis) -> bytes:
    plt = _plt()
    tgt = a.target
    peak, bw = 2.0 * tgt.peak_macs_per_cycle, float(tgt.dram_bytes_per_cycle)
    pts = [
        (r.intensity(), r.ops_per_cycle(), f"{i}")
        for i, r in enumerate(a.layers)
        if r.macs and r.dram_bytes and r.cycles
    ]
    fig, ax = plt.subplots(figsize=(11, 6.5))
    lo = min([p[0] for p in pts] + [peak / bw]) / 4
    hi = max([p[0] for p in pts] + [peak / bw]) * 4
    ridge = peak / bw
    ax.plot([lo, ridge], [lo * bw, peak], color="#c44e52", lw=2, label=f"DRAM {bw:g} B/cycle")
    ax.plot([ridge, hi], [peak, peak], color="#4c72b0", lw=2, label=f"compute {peak:g} ops/cycle")
    groups: dict[tuple[int, int], list] = {}  # points within ~5% of each other share one label
    for x, y, name in pts:
        groups.setdefault((round(math.log10(x) * 40), round(math.log10(y) * 40)), []).append(
            (x, y, name)
        )
    for members in groups.values():
        x, y, _ = members[0]
        ax.scatter([m[0] for m in members], [m[1] for m in members], color="black", s=18, zorder=3)
        ax.annotate(
            ",".join(m[2] for m in members),
            (x, y),
            textcoords="offset points",
            xytext=(4, 3),
            fontsize=7,
        )
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ymin = min([p[1] for p in pts] + [lo * bw]) / 2
    ax.set_ylim(ymin, peak * 2.5)
    ax.set_xlabel("arithmetic intensity (int8 ops per DRAM byte)")
    ax.set_ylabel("achieved int8 ops per cycle")
    ax.set_title(f"roofline: {a.source} on {tgt.name}")
    ax.grid(True, which="both", alpha=0.25)
    ax.legend(loc="lower right")
    # points cluster near the ridge: numbers on the plot, names in a key beside it
    key = "\n".join(
        f"{i:>2}  {r.name}" for i, r in enumerate(a.layers) if r.macs and r.dram_bytes and r.cycles
    )
    ax.text(
        1.02, 1.0, key, transform=ax.transAxes, va="top", ha="left", fontsize=7, family="monospace"
    )
    return _png(fig)


def energy_png(a: Analysis) -> bytes:
    plt = _plt()
    names = [r.name for r in a.layers]
    fig, ax = plt.subplots(figsize=(max(7, 0.38 * len(names) + 3), 5.5))
    bottom = [0.0] * len(names)
    for part in ENERGY_PARTS:
        vals = [r.energy.get(part, 0.0) / 1e6 for r in a.layers]  # uJ
        if any(vals):
            ax.bar(range(len(names)), vals, bottom=bottom, color=COLORS[part], label=part)
            bottom = [b + v for b, v in zip(bottom, vals, strict=False)]
    ax.set_xticks(range(len(names)))
    ax.set_xticklabels(names, rotation=60, ha="right", fontsize=8)
    ax.set_ylabel("energy (uJ)")
    ax.set_title(f"energy per layer by component: {a.source} on {a.target.name}")
    ax.legend()
    ax.grid(True, axis="y", alpha=0.25)
    return _png(fig)


def timeline_png(a: Analysis, layer: str) -> bytes:
    """Busy and stalled intervals of each queue and the DRAM channel during one layer."""
    plt = _plt()
    row = next(r for r in a.layers if r.name == layer)
    t0, t1 = row.start, row.start + row.cycles
    queues = ["LD", "EX", "ST"]
    fig, ax = plt.subplots(figsize=(11, 3.6))
    busy = {q: [] for q in queues}
    stall = {q: [] for q in queues}
    for q, ready, start, end, _pc, _m in a.recorder.events:
        if end > t0 and ready < t1:
            if start > ready:
                stall[q].append((max(ready, t0), min(start, t1) - max(ready, t0)))
            if end > start:
                busy[q].append((max(start, t0), min(end, t1) - max(start, t0)))
    dram = [
        (max(b, t0), min(e, t1) - max(b, t0)) for b, e in a.recorder.channel if e > t0 and b < t1
    ]
    lanes = queues + ["DRAM"]
    for i, q in enumerate(queues):
        ax.broken_barh(
            [s for s in stall[q] if s[1] > 0],
            (i - 0.35, 0.7),
            color="#dd8452",
            alpha=0.6,
            linewidth=0,
        )
        ax.broken_barh(
            [s for s in busy[q] if s[1] > 0], (i - 0.35, 0.7), color="#4c72b0", linewidth=0
        )
    ax.broken_barh([s for s in dram if s[1] > 0], (3 - 0.35, 0.7), color="#ccb974", linewidth=0)
    ax.set_yticks(range(len(lanes)))
    ax.set_yticklabels(lanes)
    ax.set_ylim(-0.7, len(lanes) - 0.3)
    ax.invert_yaxis()
    ax.set_xlim(t0, t1)
    ax.set_xlabel("cycle")
    ax.set_title(f"timeline of {layer} ({row.cycles:,} cycles) on {a.target.name}")
    from matplotlib.patches import Patch

    ax.legend(
        handles=[
            Patch(color="#4c72b0", label="busy"),
            Patch(color="#dd8452", alpha=0.6, label="stalled"),
            Patch(color="#ccb974", label="DRAM transfer"),
        ],
        loc="upper left",
        bbox_to_anchor=(1.0, 1.0),
        fontsize=8,
    )
    return _png(fig)


def pareto_png(rows: list[dict], front: list[dict], label) -> bytes:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(9, 6))
    ok = [r for r in rows if r.get("bit_exact")]
    lat = [r["latency_ms"] for r in ok]
    en = [r["energy_uj"] for r in ok]
    area = [r["area_mm2"] for r in ok]
    sc = ax.scatter(lat, en, c=area, cmap="viridis", s=40, zorder=2)
    fig.colorbar(sc, ax=ax, label="area (mm^2)")
    fl = sorted(front, key=lambda r: r["latency_ms"])
    ax.plot(
        [r["latency_ms"] for r in fl],
        [r["energy_uj"] for r in fl],
        color="#c44e52",
        lw=1.5,
        zorder=1,
        marker="o",
        markersize=11,
        markerfacecolor="none",
        label="Pareto front (latency, energy)",
    )
    for i, r in enumerate(fl):  # alternate above/below: neighbours on the front are often close
        ax.annotate(
            label(r),
            (r["latency_ms"], r["energy_uj"]),
            textcoords="offset points",
            xytext=(8, 10 if i % 2 == 0 else -14),
            fontsize=7,
            bbox={"boxstyle": "round,pad=0.2", "fc": "white", "ec": "none", "alpha": 0.8},
        )
    if lat and max(lat) / max(min(lat), 1e-12) > 20:
        ax.set_xscale("log")
    ax.set_xlabel("latency (ms)")
    ax.set_ylabel("energy per inference (uJ)")
    ax.set_title(f"design points: {len(ok)} bit-exact of {len(rows)}")
    ax.grid(True, alpha=0.25)
    ax.legend(loc="best")
    return _png(fig)


def compare_png(rows: list[dict], name_a: str, name_b: str, top: int = 20) -> bytes:
    """Per layer: cycles and energy of B relative to A (ratio), the layers that differ most."""
    plt = _plt()
    rows = rows[:top]
    fig, ax = plt.subplots(figsize=(9, max(3.5, 0.32 * len(rows) + 1.5)))
    ys = range(len(rows))
    cr = [r["cycles_ratio"] or 0 for r in rows]
    er = [r["energy_ratio"] or 0 for r in rows]
    ax.barh([y - 0.2 for y in ys], cr, height=0.4, color="#4c72b0", label="cycles ratio")
    ax.barh([y + 0.2 for y in ys], er, height=0.4, color="#ccb974", label="energy ratio")
    ax.axvline(1.0, color="black", lw=0.8)
    ax.set_yticks(list(ys))
    ax.set_yticklabels([r["layer"] for r in rows], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel(f"{name_b} / {name_a} (layers sorted by their share of the difference)")
    ax.set_title(f"compare {name_b} vs {name_a}")
    ax.legend(loc="lower right", fontsize=8)
    ax.grid(True, axis="x", alpha=0.25)
    if cr and max(cr + er) / max(min([v for v in cr + er if v > 0] or [1]), 1e-12) > 50:
        ax.set_xscale("log")
    return _png(fig)


def finite(x: float) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)
