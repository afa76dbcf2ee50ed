"""`tensorgen compare`: two designs on one model, per layer and in total (B relative to A)."""

from __future__ import annotations

from tensorgen.analysis.core import Analysis


def _ratio(b: float, a: float) -> float | None:
    return b / a if a else None


def compare_rows(a: Analysis, b: Analysis) -> tuple[list[dict], dict]:
    """Per-layer rows sorted by their share of the total difference (cycles, then energy), and the
    total row. Layers are matched by position (both runs compile the same model)."""
    if [r.name for r in a.layers] != [r.name for r in b.layers]:
        raise ValueError("the two runs have different layers")
    area_a, area_b = a.area.get("total", 0.0), b.area.get("total", 0.0)
    dc = abs(b.stats.cycles - a.stats.cycles) or 1
    de = abs(sum(b.energy.values()) - sum(a.energy.values())) or 1.0
    rows = []
    for ra, rb in zip(a.layers, b.layers, strict=False):
        ta, tb = ra.cycles / (a.target.clock_mhz * 1e6), rb.cycles / (b.target.clock_mhz * 1e6)
        rows.append(
            {
                "layer": ra.name,
                "op": ra.op,
                "cycles_a": ra.cycles,
                "cycles_b": rb.cycles,
                "cycles_ratio": _ratio(rb.cycles, ra.cycles),
                "energy_a_pj": ra.energy_pj,
                "energy_b_pj": rb.energy_pj,
                "energy_ratio": _ratio(rb.energy_pj, ra.energy_pj),
                "edp_a": ra.energy_pj * ta,
                "edp_b": rb.energy_pj * tb,
                "edp_ratio": _ratio(rb.energy_pj * tb, ra.energy_pj * ta),
                "cycles_share": (rb.cycles - ra.cycles) / dc,
                "energy_share": (rb.energy_pj - ra.energy_pj) / de,
            }
        )
    rows.sort(key=lambda r: (-abs(r["cycles_share"]), -abs(r["energy_share"])))
    ea, eb = sum(a.energy.values()), sum(b.energy.values())
    total = {
        "layer": "total",
        "op": "",
        "cycles_a": a.stats.cycles,
        "cycles_b": b.stats.cycles,
        "cycles_ratio": _ratio(b.stats.cycles, a.stats.cycles),
        "energy_a_pj": ea,
        "energy_b_pj": eb,
        "energy_ratio": _ratio(eb, ea),
        "edp_a": ea * a.latency_s,
        "edp_b": eb * b.latency_s,
        "edp_ratio": _ratio(eb * b.latency_s, ea * a.latency_s),
        "area_a_mm2": area_a,
        "area_b_mm2": area_b,
        "area_ratio": _ratio(area_b, area_a),
        "latency_ratio": _ratio(b.latency_s, a.latency_s),
    }
    return rows, total


def print_compare(rows: list[dict], total: dict, a: Analysis, b: Analysis) -> None:
    from rich.console import Console
    from rich.table import Table

    def f(x, fmt="{:.3f}"):
        return "-" if x is None else fmt.format(x)

    table = Table(
        title=f"{b.target.name} (B) vs {a.target.name} (A) on {a.source}: layers by share of the difference",
        title_justify="left",
    )
    for col in (
        "layer",
        "op",
        "cycles A",
        "cycles B",
        "cycles B/A",
        "share",
        "energy A uJ",
        "energy B uJ",
        "energy B/A",
        "EDP B/A",
    ):
        table.add_column(col, justify="left" if col in ("layer", "op") else "right")
    for r in rows + [total]:
        table.add_row(
            r["layer"],
            r["op"],
            f"{r['cycles_a']:,}",
            f"{r['cycles_b']:,}",
            f(r["cycles_ratio"]),
            f(r.get("cycles_share"), "{:+.1%}"),
            f"{r['energy_a_pj'] / 1e6:.3f}",
            f"{r['energy_b_pj'] / 1e6:.3f}",
            f(r["energy_ratio"]),
            f(r["edp_ratio"]),
        )
    Console(width=170).print(table)
    print(
        f"total: cycles ratio {f(total['cycles_ratio'])}, latency ratio {f(total['latency_ratio'])}, "
        f"energy ratio {f(total['energy_ratio'])}, area ratio {f(total['area_ratio'])} "
        f"({total['area_a_mm2']:.3f} -> {total['area_b_mm2']:.3f} mm^2), EDP ratio {f(total['edp_ratio'])}"
    )
