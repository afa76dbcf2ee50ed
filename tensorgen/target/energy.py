"""PLACEHOLDER energy and area model (the analysis branch's stand-in; the energy helper's
implementation replaces this file at merge). Only the two signatures are the contract:

    energy_breakdown(target, stats) -> {component: pJ}   (mac, vector, spad, acc, dram, static)
    area_breakdown(target) -> {component: mm^2, "total": mm^2}
"""

from __future__ import annotations

from typing import Any

from tensorgen.target import Target

# PLACEHOLDER area constants (mm^2, a crude 7-nm guess), only so that reports and sweeps have an
# area column until the real per-node model lands.
_MM2_PER_MAC = 0.0004
_MM2_PER_KIB = 0.0012
_MM2_PER_LANE = 0.002
_MM2_FIXED = 0.05


def energy_breakdown(target: Target, stats: Any) -> dict[str, float]:
    """Dynamic energy by component from the simulator's action counters (static: 0 here)."""
    e = target.energy_pj
    return {"mac": stats.macs * e["mac"], "vector": stats.vector_ops * e["vector_op"],
            "spad": stats.onchip_bytes["spad"] * e["spad_byte"], "acc": stats.onchip_bytes["acc"] * e["acc_byte"],
            "dram": (stats.dram_read_bytes + stats.dram_write_bytes) * e["dram_byte"], "static": 0.0}


def area_breakdown(target: Target) -> dict[str, float]:
    """PLACEHOLDER: area by component from per-MAC / per-KiB / per-lane constants."""
    parts = {"mac_array": target.rows * target.cols * _MM2_PER_MAC,
             "spad": target.spad.bytes / 1024 * _MM2_PER_KIB, "acc": target.acc.bytes / 1024 * _MM2_PER_KIB,
             "vector": target.lanes * _MM2_PER_LANE, "fixed": _MM2_FIXED}
    parts["total"] = sum(parts.values())
    return parts
