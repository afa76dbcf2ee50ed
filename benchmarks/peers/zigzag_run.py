"""Run ZigZag on one layer: the half of benchmarks/zigzag_compare.py that runs in ZigZag's venv.

    /work/venvs/zigzag/bin/python benchmarks/peers/zigzag_run.py DIR

DIR holds workload.yaml, hardware.yaml and mapping.yaml (written by zigzag_compare.py); this
writes DIR/result.json: ZigZag's best mapping for latency (its LOMA temporal-mapping search,
the spatial mapping given) with its latency split into ideal compute, stalls, on- and
off-loading, its energy split into MAC and memory per operand and level, and the chosen loops.
It imports nothing from tensorgen: ZigZag's venv has neither tensorgen nor torch.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from pathlib import Path


def _loops(levels) -> list[list[list]]:
    """[[dim, size], ...] per memory level, innermost level first (ZigZag's own order)."""
    return [[[str(dim), float(size)] for dim, size in level] for level in levels]


def summarize(cme, seconds: float) -> dict:
    tm = cme.temporal_mapping.mapping_dic_origin  # per operand: loops per memory level
    levels = {
        str(op): [
            str(level.name) for level in cme.accelerator.memory_hierarchy.get_memory_levels(mem_op)
        ]
        for op, mem_op in ((op, cme.memory_operand_links.layer_to_mem_op(op)) for op in tm)
    }
    return {
        "latency_cycles": float(cme.latency_total2),
        "ideal_cycles": float(cme.ideal_cycle),
        "ideal_temporal_cycles": float(cme.ideal_temporal_cycle),
        "stall_cycles": float(cme.stall_slack_comb),
        "onloading_cycles": float(cme.data_onloading_cycle),
        "offloading_cycles": float(cme.data_offloading_cycle),
        "energy_pj": float(cme.energy_total),
        "mac_energy_pj": float(cme.mac_energy),
        "memory_energy_pj": {
            str(op): dict(zip(levels[str(op)], map(float, per_level), strict=False))
            for op, per_level in cme.mem_energy_breakdown.items()
        },
        "temporal_mapping": {str(op): _loops(loops) for op, loops in tm.items()},
        "memory_levels": levels,
        "spatial_mapping": str(cme.layer.spatial_mapping),
        "seconds": seconds,
    }


def main(folder: Path) -> None:
    logging.basicConfig(level=logging.WARNING)  # before ZigZag's own INFO-level basicConfig
    from zigzag.api import get_hardware_performance_zigzag

    t0 = time.perf_counter()
    _, _, cmes = get_hardware_performance_zigzag(
        str(folder / "workload.yaml"),
        str(folder / "hardware.yaml"),
        str(folder / "mapping.yaml"),
        opt="latency",
        dump_folder=str(folder / "out"),
        loma_show_progress_bar=False,
    )
    cme = cmes[0][1][0][0]  # the one layer's best cost-model evaluation
    result = summarize(cme, time.perf_counter() - t0)
    (folder / "result.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
