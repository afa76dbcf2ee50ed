"""Energy and area of a target: one definition, used by the simulator, the cost model and reports.

The constants are data in the target file (each group with its source) and are given at a
reference node; `scale_energy` and `scale_area` carry them to the target's node with Stillmaker
and Baas's tables. Energy is dynamic by action counts (MACs, vector element operations, bytes
read and written in each on-chip memory, DRAM bytes) plus static: leakage power per mm^2 times
the target's area, over the cycles at the target's clock.
"""

from __future__ import annotations

import bisect
import math
from typing import Protocol

# A. Stillmaker, B. Baas, "Scaling equations for the accurate prediction of CMOS device
# performance from 180 nm to 7 nm", Integration 58 (2017): per node, the area factor from
# 45 nm and the energy per operation as a*Vdd^2 + b*Vdd + c (polynomials fit to HSpice runs of
# the PTM / ITRS models). The 45 -> 7 nm area factor 0.059 is the one ENERGY-AREA.md quotes.
SCALING_NODES_NM = (7, 10, 14, 16, 20, 32, 45, 65, 90, 130)
AREA_FROM_45NM = (0.059, 0.1, 0.17, 0.19, 0.21, 0.46, 1.0, 1.5, 2.8, 6.4)
ENERGY_POLY = (
    (0.1776, -0.09097, 0.02447),
    (0.2068, -0.09311, 0.02375),
    (0.2363, -0.09675, 0.02239),
    (0.2958, -0.1241, 0.03024),
    (0.373, -0.1582, 0.04104),
    (0.9559, -0.7823, 0.471),
    (1.103, -0.362, 0.2767),
    (3.755, -4.398, 1.975),
    (4.762, -4.781, 2.092),
    (7.171, -6.709, 2.904),
)
SCALING_SOURCE = (
    "Stillmaker & Baas, Integration 58 (2017), area factors and energy polynomials per node"
)


def _between(node_nm: float) -> tuple[int, float]:
    """(index of the table node at or below `node_nm`, weight of the next one): linear in nm."""
    if not SCALING_NODES_NM[0] <= node_nm <= SCALING_NODES_NM[-1]:
        raise ValueError(
            f"node {node_nm} nm outside {SCALING_NODES_NM[0]}-{SCALING_NODES_NM[-1]} nm"
        )
    i = min(bisect.bisect_right(SCALING_NODES_NM, node_nm) - 1, len(SCALING_NODES_NM) - 2)
    lo, hi = SCALING_NODES_NM[i], SCALING_NODES_NM[i + 1]
    return i, (node_nm - lo) / (hi - lo)


def _interp(table, node_nm: float, value) -> float:
    i, w = _between(node_nm)
    return (1 - w) * value(table[i]) + w * value(table[i + 1])


def scale_area(from_nm: float, to_nm: float) -> float:
    """Area factor from one node to another."""
    return _interp(AREA_FROM_45NM, to_nm, float) / _interp(AREA_FROM_45NM, from_nm, float)


def scale_energy(from_nm: float, from_vdd: float, to_nm: float, to_vdd: float) -> float:
    """Energy-per-operation factor from one (node, supply) to another."""

    def e(node: float, vdd: float) -> float:
        return _interp(ENERGY_POLY, node, lambda p: p[0] * vdd * vdd + p[1] * vdd + p[2])

    return e(to_nm, to_vdd) / e(from_nm, from_vdd)


def sram_pj_per_byte(points: tuple[tuple[int, float], ...], nbytes: int) -> float:
    """Energy per byte of an SRAM of `nbytes`, interpolated between published (size, pJ/byte)
    points linearly in log(size) and log(energy) (a power law per segment; the nearest
    segment's outside the points, so that a 2 KiB memory does not get zero or negative energy)."""
    pts = sorted(points)
    i = min(max(bisect.bisect_right([s for s, _ in pts], nbytes) - 1, 0), len(pts) - 2)
    (s0, e0), (s1, e1) = pts[i], pts[i + 1]
    slope = math.log(e1 / e0) / math.log(s1 / s0)
    return e0 * (nbytes / s0) ** slope


class Counters(Protocol):
    """What energy is computed from: the simulator's Stats (or a cost model's estimate)."""

    cycles: int
    macs: int
    vector_ops: int
    onchip_bytes: dict  # memory -> bytes read + written
    onchip_write_bytes: dict  # memory -> bytes written

    @property
    def dram_bytes(self) -> int: ...


def action_energy(target) -> dict[str, float]:
    """pJ per action at the target's node: 'mac', 'vector_op', '<mem>_read' and '<mem>_write'
    per byte of each on-chip memory, 'dram' per byte over the target's interface, and
    'static_per_cycle' (leakage of the whole area during one clock cycle)."""
    en = target.energy
    f = scale_energy(en.node_nm, en.vdd_v, target.node_nm, target.vdd_v)
    out = {"mac": en.mac_pj * f, "vector_op": en.vector_op_pj * f}
    for mem in (target.spad, target.acc):
        out[f"{mem.name}_read"] = sram_pj_per_byte(en.sram_read_pj_per_byte, mem.bytes) * f
        out[f"{mem.name}_write"] = sram_pj_per_byte(en.sram_write_pj_per_byte, mem.bytes) * f
    out["dram"] = dict(en.dram_pj_per_byte)[
        target.dram_interface
    ]  # off chip: not scaled with the node
    # leakage power of a block scales like its energy per operation (Stillmaker & Baas give no
    # separate leakage fit): per mm^2 at the target's node, f / (area factor)
    density_mw = en.leakage_mw_per_mm2 * f / scale_area(en.node_nm, target.node_nm)
    # mW x mm^2 x (1 / MHz = us per cycle) = nJ per cycle -> pJ
    out["static_per_cycle"] = density_mw * area_breakdown(target)["total"] / target.clock_mhz * 1e3
    return out


def energy_breakdown(target, stats: Counters) -> dict[str, float]:
    """pJ per component of one run: mac, vector, each on-chip memory (spad, acc), dram, static."""
    e = action_energy(target)
    out = {"mac": stats.macs * e["mac"], "vector": stats.vector_ops * e["vector_op"]}
    for mem in (target.spad.name, target.acc.name):
        written = stats.onchip_write_bytes.get(mem, 0)
        read = stats.onchip_bytes.get(mem, 0) - written
        out[mem] = read * e[f"{mem}_read"] + written * e[f"{mem}_write"]
    out["dram"] = stats.dram_bytes * e["dram"]
    out["static"] = stats.cycles * e["static_per_cycle"]
    return out


def area_breakdown(target) -> dict[str, float]:
    """mm^2 per component at the target's node (MAC array with its weight registers, vector
    lanes, each SRAM with its periphery, fixed overhead) and their 'total'."""
    a = target.area
    logic = scale_area(a.logic_node_nm, target.node_nm) * 1e-6  # um^2 at its node -> mm^2 here
    sram = scale_area(a.sram_node_nm, target.node_nm) * 1e-6
    macs = target.rows * target.cols
    out = {
        "mac_array": macs * (a.mac_um2 + target.weight_buffers * a.weight_register_um2) * logic,
        "vector": target.lanes * a.vector_lane_um2 * logic,
    }
    for mem in (target.spad, target.acc):
        out[mem.name] = mem.bytes * 8 * a.bitcell_um2 * (1 + a.periphery) * sram
    out["fixed"] = a.fixed_mm2 * scale_area(a.fixed_node_nm, target.node_nm)
    out["total"] = sum(out.values())
    return out
