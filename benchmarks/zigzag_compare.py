"""tensorgen against an independent model: ZigZag (KU Leuven's DSE framework) on the same hardware.

    python benchmarks/zigzag_compare.py [--target tg1] [--only NAME...] [--zigzag-python PATH]
                                        [--json PATH]

For each layer: tensorgen compiles it with the automatic schedule, simulates the .tgb and checks
the outputs bit-exact against the reference; ZigZag gets the same target described as its
accelerator (`hardware`: the MAC array, the weight registers, `acc`, `spad`, DRAM, their sizes,
bandwidths and tensorgen's own energy constants from tensorgen/target/energy.py) and searches its
best-latency temporal mapping (LOMA) under the spatial mapping tg1's array imposes (K of the
contraction on the rows, N on the columns). The table puts ZigZag's latency and energy beside the
simulator's cycles and energy, with their ratios, and a sentence per difference over 20 %.

ZigZag is a benchmark-only dependency with a venv of its own (it must not touch tensorgen's):

    python3 -m venv /work/venvs/zigzag && /work/venvs/zigzag/bin/pip install zigzag-dse six

This script runs under tensorgen's venv and runs benchmarks/peers/zigzag_run.py with that venv's
python (`--zigzag-python`, default $TENSORGEN_ZIGZAG_PYTHON, else /work/venvs/zigzag/bin/python),
exchanging YAML and JSON files in a temporary folder.

Energy is compared on its dynamic part (MAC, on-chip SRAM, DRAM): ZigZag models no leakage, so
tensorgen's static energy is shown in its own column and left out of the ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml
from layers import LAYERS, Conv2d, Layer, Matmul
from rich.console import Console
from rich.table import Table

from tensorgen.driver import compare, compile_auto, random_inputs
from tensorgen.errors import TensorgenError
from tensorgen.mc.binary import decode, encode
from tensorgen.outputs import write_atomic
from tensorgen.reference.torch_ref import evaluate
from tensorgen.sim.machine import simulate
from tensorgen.target import Target, load_target
from tensorgen.target.energy import action_energy, energy_breakdown

HERE = Path(__file__).resolve().parent
RUNNER = HERE / "peers" / "zigzag_run.py"
DEFAULT_JSON = HERE / "results_zigzag.json"
DEFAULT_PYTHON = "/work/venvs/zigzag/bin/python"
INSTALL = "python3 -m venv /work/venvs/zigzag && /work/venvs/zigzag/bin/pip install zigzag-dse six"
# a spread of the suite: 3x3, strided 3x3, 1x1, strided 1x1, depthwise (vector unit), two linears
DEFAULT_LAYERS = (
    "resnet18_conv3x3",
    "resnet18_layer3_3x3s2",
    "mbv2_pw_32to16_112",
    "resnet18_layer3_proj_1x1s2",
    "mbv2_dw3x3s1_144ch_56",
    "matmul_256",
    "bert_qkv_proj_128x768x768",
)
LARGE = 0.2  # a difference worth a sentence
NOISE = 0.02  # ZigZag faster by less than this share of the cycles: within the models' noise


# --- the target, described to ZigZag -----------------------------------------------------------


def _port(name: str, kind: str, bits: int, allocation: list[str]) -> dict:
    # bandwidth_min 8: ZigZag counts accesses as ceil(bits / min) * (min / max) words of `max`
    # bits, so with a byte minimum an access of `max` bits costs r_cost and energy is per byte
    return {
        "name": name,
        "type": kind,
        "bandwidth_min": 8,
        "bandwidth_max": bits,
        "allocation": allocation,
    }


def _memory(
    bytes_: int, bits: int, read_pj: float, write_pj: float, operands, ports, served
) -> dict:
    """A ZigZag memory of `bytes_` whose ports move `bits` per cycle; costs per byte moved."""
    return {
        "size": bytes_ * 8,
        "r_cost": read_pj * bits / 8,  # per access of bandwidth_max bits
        "w_cost": write_pj * bits / 8,
        "area": 0,
        "latency": 1,
        "operands": operands,
        "ports": ports,
        "served_dimensions": served,
    }


def _sram(target: Target, mem, operands: list[str], served: list[str]) -> dict:
    """`spad` or `acc`: a read and a write port of the target's bytes_per_cycle each (the
    simulator does not limit on-chip bandwidth; this is the figure the target file gives)."""
    e = action_energy(target)
    bits = mem.bytes_per_cycle * 8
    reads = [f"{op}, {d}" for op in operands for d in (("tl", "th") if op == "O" else ("tl",))]
    writes = [f"{op}, {d}" for op in operands for d in (("fh", "fl") if op == "O" else ("fh",))]
    ports = [_port("r_port_1", "read", bits, reads), _port("w_port_1", "write", bits, writes)]
    return _memory(
        mem.bytes, bits, e[f"{mem.name}_read"], e[f"{mem.name}_write"], operands, ports, served
    )


def hardware(target: Target, unit: str = "array") -> dict:
    """ZigZag's accelerator for `target`: the MAC array (`unit="array"`, D1 = rows holding the
    contraction's K, D2 = columns holding N, one 8-bit weight register per weight buffer in each
    MAC) or the vector unit (`unit="vector"`, D1 = lanes, operands from the SRAMs); the int32
    accumulator SRAM `acc` holding outputs, the scratchpad `spad` holding both inputs, and DRAM
    with the target's bandwidth shared by every transfer. Energies are tensorgen's own per-byte
    and per-MAC figures at the target's node; the weight registers cost nothing (tensorgen
    prices no register either)."""
    e = action_energy(target)
    dram_bits = target.dram_bytes_per_cycle * 8
    everything = [f"{op}, {d}" for op in ("I1", "I2") for d in ("fh", "tl")]
    everything += [f"O, {d}" for d in ("fh", "tl", "fl", "th")]
    served = ["D1", "D2"] if unit == "array" else ["D1"]
    memories = {}
    if unit == "array":
        memories["w_reg"] = _memory(
            target.weight_buffers,
            8,
            0.0,
            0.0,
            ["I2"],
            [
                _port("r_port_1", "read", 8, ["I2, tl"]),
                _port("w_port_1", "write", 8, ["I2, fh"]),
            ],
            [],
        )
    memories["acc"] = _sram(target, target.acc, ["O"], served)
    memories["spad"] = _sram(target, target.spad, ["I1", "I2"], served)
    memories["dram"] = _memory(
        1 << 40,
        dram_bits,
        e["dram"],
        e["dram"],
        ["I1", "I2", "O"],
        [_port("rw_port_1", "read_write", dram_bits, everything)],
        served,
    )
    array = (
        {"unit_energy": e["mac"], "dimensions": ["D1", "D2"], "sizes": [target.rows, target.cols]}
        if unit == "array"
        else {"unit_energy": e["vector_op"], "dimensions": ["D1"], "sizes": [target.lanes]}
    )
    return {
        "name": f"{target.name}_{unit}",
        "memories": memories,
        "operational_array": {"unit_area": 1, **array},
    }


def unit_of(layer: Layer) -> str:
    """Where tensorgen runs the layer: depthwise convs on the vector unit, the rest on the array."""
    return "vector" if isinstance(layer.op, Conv2d) and layer.op.depthwise else "array"


def workload(layer: Layer) -> list[dict]:
    """The layer as a ZigZag workload: int8 inputs and weights, int32 partial and final sums."""
    op = layer.op
    precision = {"W": 8, "I": 8, "O": 32, "O_final": 32}
    common = {"id": 0, "name": layer.name, "operand_precision": precision}
    if isinstance(op, Matmul):  # C[i, j] += A[i, k] * B[k, j]: A streams (I), B is stationary (W)
        return [
            {
                **common,
                "operator_type": "Gemm",
                "equation": "O[b][k]+=W[k][c]*I[b][c]",
                "loop_dims": ["B", "K", "C"],
                "loop_sizes": [op.m, op.n, op.k],
            }
        ]
    s, p, o = op.stride, op.pad, op.out_size
    geometry = {
        "dimension_relations": [f"ix={s}*ox+1*fx", f"iy={s}*oy+1*fy"],
        "pr_loop_dims": ["IY", "IX"],
        "pr_loop_sizes": [op.size, op.size],
        "padding": [[p, p], [p, p]],
        "operand_source": {"I": 0},
        "operator_type": "Conv",
    }
    if op.depthwise:
        return [
            {
                **common,
                **geometry,
                "equation": "O[b][g][oy][ox]+=W[g][fy][fx]*I[b][g][iy][ix]",
                "loop_dims": ["B", "G", "OY", "OX", "FY", "FX"],
                "loop_sizes": [op.batch, op.cin, o, o, op.kernel, op.kernel],
            }
        ]
    return [
        {
            **common,
            **geometry,
            "equation": "O[b][k][oy][ox]+=W[k][c][fy][fx]*I[b][c][iy][ix]",
            "loop_dims": ["B", "K", "C", "OY", "OX", "FY", "FX"],
            "loop_sizes": [op.batch, op.cout, op.cin, o, o, op.kernel, op.kernel],
        }
    ]


def mapping(layer: Layer, target: Target) -> list[dict]:
    """The spatial mapping tg1 imposes: on the array the contraction's channels C on the rows and
    the outputs' K on the columns (what tensorgen's MATMUL does; the stem's folded window taps
    aside); on the vector unit the channels G on the lanes. Temporal mapping: ZigZag's search."""
    op = layer.op
    if unit_of(layer) == "vector":
        spatial = {"D1": [f"G, {min(target.lanes, op.cin)}"]}
    else:
        k, n = (op.k, op.n) if isinstance(op, Matmul) else (op.cin, op.cout)
        spatial = {"D1": [f"C, {min(target.rows, k)}"], "D2": [f"K, {min(target.cols, n)}"]}
    return [
        {
            "name": "default",
            "spatial_mapping": spatial,
            "memory_operand_links": {"O": "O", "W": "I2", "I": "I1"},
        }
    ]


# --- the two runs ------------------------------------------------------------------------------


def run_tensorgen(layer: Layer, target: Target, seed: int = 0) -> dict:
    """Compile with the automatic schedule, simulate the encoded binary, check bit-exact."""
    from tensorgen.spec.loader import parse_program

    program = parse_program(layer.op_yaml(), f"<{layer.name}>", target.name)
    auto = compile_auto(program, target)
    inputs = random_inputs(program, seed)
    result = simulate(decode(encode(auto.compiled.binary)), inputs, target)
    check = compare(evaluate(program, inputs), result.outputs)
    st = result.stats
    parts = energy_breakdown(target, st)
    chosen = auto.plan.chosen
    transfer = st.dram_bytes / target.dram_bytes_per_cycle
    return {
        "cycles": st.cycles,
        "macs": auto.compiled.macs,
        "bit_exact": check.exact,
        "check": check.message,
        "energy_pj": st.energy_pj,
        "dynamic_pj": st.energy_pj - parts["static"],
        "energy_breakdown_pj": parts,
        "dram_bytes": st.dram_bytes,
        "busy": dict(st.busy),
        # DMA queue time beyond the bytes on the channel: descriptor setup (and channel waits)
        "dma_overhead_cycles": st.busy["LD"] + st.busy["ST"] - transfer,
        "schedule": None
        if chosen is None
        else {
            "order": list(chosen.order),
            "stages": [[t, loop] for t, loop in chosen.stages],
            "pipelined": chosen.pipelined,
            "model_cycles": chosen.cycles,
        },
        "schedule_fallback": auto.plan.reason or None,
    }


class ZigZagMissing(RuntimeError):
    pass


def zigzag_python(given: str | None) -> str:
    """The python of ZigZag's venv, checked to import zigzag; ZigZagMissing says how to install."""
    python = given or os.environ.get("TENSORGEN_ZIGZAG_PYTHON") or DEFAULT_PYTHON
    try:
        probe = subprocess.run(
            [python, "-c", "import zigzag.api"], capture_output=True, text=True, timeout=120
        )
    except (OSError, subprocess.SubprocessError) as err:
        raise ZigZagMissing(f"ZigZag python {python!r} cannot run ({err}); {INSTALL}") from None
    if probe.returncode != 0:
        last = (probe.stderr.strip().splitlines() or ["import failed"])[-1]
        raise ZigZagMissing(f"ZigZag is not installed for {python} ({last}); {INSTALL}")
    return python


def run_zigzag(python: str, layer: Layer, target: Target) -> dict:
    """ZigZag's best-latency mapping of `layer` on `target`, in ZigZag's venv."""
    with tempfile.TemporaryDirectory(prefix="tg-zigzag-") as tmp:
        folder = Path(tmp)
        files = {
            "workload.yaml": workload(layer),
            "hardware.yaml": hardware(target, unit_of(layer)),
            "mapping.yaml": mapping(layer, target),
        }
        for name, data in files.items():
            (folder / name).write_text(yaml.safe_dump(data, sort_keys=False))
        run = subprocess.run(
            [python, str(RUNNER), tmp], capture_output=True, text=True, timeout=3600
        )
        if run.returncode != 0:
            tail = " | ".join(run.stderr.strip().splitlines()[-3:])
            raise RuntimeError(f"ZigZag failed on {layer.name}: {tail}")
        return json.loads((folder / "result.json").read_text())


# --- reading the difference --------------------------------------------------------------------


def dram_bytes(zz: dict, target: Target) -> float:
    """The DRAM bytes ZigZag's mapping moves: its DRAM energy over tensorgen's pJ per byte."""
    per_byte = action_energy(target)["dram"]
    return sum(levels.get("dram", 0.0) for levels in zz["memory_energy_pj"].values()) / per_byte


def loop_text(zz: dict) -> str:
    """ZigZag's temporal loops, innermost first, as the output operand's levels give them
    (every operand sees the same loop nest, split at its own memory levels)."""
    levels = zz["temporal_mapping"]["O"]
    names = zz["memory_levels"]["O"]
    return " | ".join(
        f"{name}: " + " ".join(f"{d}{int(s)}" for d, s in loops)
        for name, loops in zip(names, levels, strict=False)
        if loops
    )


def _useful(layer: Layer, target: Target) -> int:
    """MACs per cycle the unit does while streaming: the share of the array K and N fill."""
    op = layer.op
    if unit_of(layer) == "vector":
        return target.lanes
    k, n = (op.k, op.n) if isinstance(op, Matmul) else (op.cin, op.cout)
    return min(target.rows, k) * min(target.cols, n)


def cycle_terms(layer: Layer, target: Target, tg: dict) -> dict[str, float]:
    """tensorgen's cycles split: streaming at the unit's useful width, array fills (or vector
    setup) on EX, and EX idle waiting for DMA; with the MATMUL count and rows per MATMUL."""
    stream = tg["macs"] / _useful(layer, target)
    fill = tg["busy"]["EX"] - stream
    loads = fill / target.fill_cycles if unit_of(layer) == "array" else 0.0
    return {
        "stream": stream,
        "fill": fill,
        "exposed": tg["cycles"] - tg["busy"]["EX"],
        "matmuls": loads,
        "rows_per_matmul": stream / loads if loads else 0.0,
    }


def zigzag_rows_per_weight_load(zz: dict) -> float:
    """Rows ZigZag streams through the array per weight-register load: the product of W's loops
    at its innermost level (w_reg); 0 when W has no register level (the vector unit)."""
    if zz["memory_levels"].get("W", [None])[0] != "w_reg":
        return 0.0
    rows = 1.0
    for _, size in zz["temporal_mapping"]["W"][0]:
        rows *= size
    return rows


def cycle_sentence(layer: Layer, target: Target, tg: dict, zz: dict) -> str:
    """Where each model's cycles go, in the terms each one has."""
    t = cycle_terms(layer, target, tg)
    overhead = "array fill" if unit_of(layer) == "array" else "vector setup"
    ours = (
        f"tensorgen {t['stream']:,.0f} streaming + {t['fill']:,.0f} {overhead} + "
        f"{t['exposed']:,.0f} EX waiting on DMA (the DMA queues spent "
        f"{tg['dma_overhead_cycles']:,.0f} cycles beyond the bytes on the channel: "
        f"{target.dma_setup_cycles} setup per transfer, which ZigZag does not model)"
    )
    theirs = (
        f"ZigZag {zz['ideal_temporal_cycles']:,.0f} compute + {zz['stall_cycles']:,.0f} stalls "
        f"+ {zz['onloading_cycles'] + zz['offloading_cycles']:,.0f} on/off-loading"
    )
    return f"{ours}; {theirs}."


def lead_sentence(layer: Layer, target: Target, tg: dict, zz: dict) -> str:
    """Whether ZigZag's fewer cycles come from a better loop nest or from the array fill it does
    not model: tg1 pays `fill_cycles` per MATMUL, ZigZag reloads weight registers at the
    scratchpad's bandwidth in the shadow of compute."""
    gap = tg["cycles"] - zz["latency_cycles"]
    head = (
        f"ZigZag's mapping needs {gap:,.0f} fewer cycles ({gap / tg['cycles']:.1%}) than the "
        f"automatic schedule; its loops (innermost first) {loop_text(zz)}"
    )
    t, zrows = cycle_terms(layer, target, tg), zigzag_rows_per_weight_load(zz)
    if gap < NOISE * tg["cycles"]:
        return f"{head}. Within {NOISE:.0%}: no lead, the two models agree."
    if t["matmuls"] and zrows <= t["rows_per_matmul"] * 1.001 and t["fill"] >= gap:
        return (
            f"{head}. Not a better loop nest: it streams {zrows:,.0f} rows per weight load, "
            f"tensorgen's MATMULs {t['rows_per_matmul']:,.0f}, so it loads weights at least as "
            f"often; the gap is within the {t['fill']:,.0f} cycles of {t['matmuls']:,.0f} array "
            f"fills ({target.fill_cycles} each) that ZigZag does not charge (it reloads weight "
            f"registers at the scratchpad's bandwidth; a second weight buffer, tg1db, hides them)."
        )
    if t["matmuls"] and zrows > t["rows_per_matmul"]:
        return (
            f"{head}. LEAD for the scheduler: ZigZag streams {zrows:,.0f} rows per weight "
            f"load against tensorgen's {t['rows_per_matmul']:,.0f} rows per MATMUL, fewer fills."
        )
    return f"{head}. LEAD for the scheduler: " + cycle_sentence(layer, target, tg, zz)


def _components(tg: dict, zz: dict) -> dict[str, tuple[float, float]]:
    """Energy per component, (tensorgen, ZigZag) in pJ."""
    per_level: dict[str, float] = {}
    for levels in zz["memory_energy_pj"].values():
        for name, pj in levels.items():
            per_level[name] = per_level.get(name, 0.0) + pj
    parts = tg["energy_breakdown_pj"]
    return {
        "MAC": (parts["mac"] + parts["vector"], zz["mac_energy_pj"]),
        "spad": (parts["spad"], per_level.get("spad", 0.0)),
        "acc": (parts["acc"], per_level.get("acc", 0.0)),
        "dram": (parts["dram"], per_level.get("dram", 0.0)),
    }


def energy_sentence(tg: dict, zz: dict, target: Target) -> str:
    comps = _components(tg, zz)
    worst = max(comps, key=lambda c: abs(comps[c][1] - comps[c][0]))
    a, b = comps[worst]
    text = (
        f"the largest energy difference is {worst}: tensorgen {a / 1e6:.2f} uJ, "
        f"ZigZag {b / 1e6:.2f} uJ"
    )
    if worst == "dram":
        per_byte = action_energy(target)["dram"]
        ops = ", ".join(
            f"{op} {levels.get('dram', 0.0) / per_byte:,.0f}"
            for op, levels in zz["memory_energy_pj"].items()
        )
        text += (
            f" (ZigZag's mapping moves {dram_bytes(zz, target):,.0f} DRAM bytes: {ops}; at "
            f"DRAM level its loops are {top_loops(zz)}; tensorgen's schedule moves "
            f"{tg['dram_bytes']:,} with {schedule_text(tg)})"
        )
        if dram_bytes(zz, target) < tg["dram_bytes"]:
            text += ". LEAD for the scheduler: the same layer with less DRAM traffic"
        else:
            text += (
                ". ZigZag searched for latency, not energy: among mappings of equal latency "
                "its choice re-fetches what its DRAM-level loops re-visit"
            )
    elif worst == "acc":
        text += (
            " (tensorgen's MATMUL reads and writes each int32 partial-sum row of acc once "
            "per weight tile; ZigZag's energy counts accesses per word of its 64-byte port "
            "with the output reuse its loop order gives)"
        )
    elif worst == "spad":
        text += (
            " (tensorgen counts every byte a MATMUL or DMA moves in the scratchpad; ZigZag "
            "counts accesses under its loop order's reuse)"
        )
    return text + "."


def top_loops(zz: dict) -> str:
    """Per operand, the loops ZigZag keeps above its on-chip levels (each one re-fetches)."""
    return "; ".join(
        f"{op}: " + (" ".join(f"{d}{int(s)}" for d, s in levels[-1]) or "none")
        for op, levels in zz["temporal_mapping"].items()
    )


def schedule_text(tg: dict) -> str:
    sched = tg.get("schedule")
    if not sched:
        return "the default schedule"
    stages = ", ".join(f"{t} at {loop or 'the program'}" for t, loop in sched["stages"])
    return f"loop order {' '.join(sched['order'])} and staging {stages}"


def explain(layer: Layer, target: Target, tg: dict, zz: dict) -> list[str]:
    """A sentence per large difference (and the lead for the scheduler when ZigZag is faster)."""
    out = []
    cycles_ratio = zz["latency_cycles"] / tg["cycles"]
    if cycles_ratio < 1 - LARGE or cycles_ratio > 1 + LARGE:
        out.append(f"Cycles x{cycles_ratio:.2f}: " + cycle_sentence(layer, target, tg, zz))
    if zz["latency_cycles"] < tg["cycles"]:
        out.append("Fewer cycles in ZigZag: " + lead_sentence(layer, target, tg, zz))
    energy_ratio = zz["energy_pj"] / tg["dynamic_pj"]
    if energy_ratio < 1 - LARGE or energy_ratio > 1 + LARGE:
        out.append(f"Energy x{energy_ratio:.2f}: " + energy_sentence(tg, zz, target))
    return out


def compare_layer(python: str, layer: Layer, target: Target) -> dict:
    t0 = time.perf_counter()
    tg = run_tensorgen(layer, target)
    tg_s = time.perf_counter() - t0
    zz = run_zigzag(python, layer, target)
    explanations = explain(layer, target, tg, zz)
    return {
        "name": layer.name,
        "description": layer.op.describe(),
        "unit": unit_of(layer),
        "tensorgen": {**tg, "seconds": tg_s},
        "zigzag": zz,
        "cycles_ratio": zz["latency_cycles"] / tg["cycles"],
        "energy_ratio": zz["energy_pj"] / tg["dynamic_pj"],
        "zigzag_faster": zz["latency_cycles"] < tg["cycles"],
        "leads": [s for s in explanations if "LEAD for the scheduler" in s],
        "zigzag_loops": loop_text(zz),
        "zigzag_dram_bytes": dram_bytes(zz, target),
        "explanations": explanations,
    }


# --- presentation ------------------------------------------------------------------------------


def render(rows: list[dict], target: Target) -> Table:
    table = Table(
        title=f"tensorgen (auto schedule, simulated) vs ZigZag (best latency mapping) on {target.name}",
        title_justify="left",
    )
    headers = (
        "layer", "unit", "MACs", "tg cycles", "zz cycles", "zz/tg", "tg dyn uJ", "tg static uJ",
        "zz uJ", "zz/tg", "tg DRAM B", "zz DRAM B", "bit-exact",
    )  # fmt: skip
    for h in headers:
        table.add_column(h, justify="left" if h in ("layer", "unit") else "right")
    for r in rows:
        tg, zz = r["tensorgen"], r["zigzag"]
        faster = "[bold yellow]" if r["zigzag_faster"] else ""
        table.add_row(
            r["name"],
            r["unit"],
            f"{tg['macs']:,}",
            f"{tg['cycles']:,}",
            f"{faster}{zz['latency_cycles']:,.0f}",
            f"{faster}{r['cycles_ratio']:.2f}",
            f"{tg['dynamic_pj'] / 1e6:.2f}",
            f"{tg['energy_breakdown_pj']['static'] / 1e6:.2f}",
            f"{zz['energy_pj'] / 1e6:.2f}",
            f"{r['energy_ratio']:.2f}",
            f"{tg['dram_bytes']:,}",
            f"{r['zigzag_dram_bytes']:,.0f}",
            "yes" if tg["bit_exact"] else "[red]NO",
        )
    return table


def print_report(console: Console, rows: list[dict], target: Target) -> None:
    console.print(render(rows, target))
    for r in rows:
        for sentence in r["explanations"]:
            console.print(f"[bold]{r['name']}[/bold]: {sentence}", highlight=False)
    faster = [r["name"] for r in rows if r["zigzag_faster"]]
    if faster:
        console.print(
            f"[yellow]ZigZag finds fewer cycles than the automatic schedule for: "
            f"{', '.join(faster)}.[/yellow]"
        )
    leads = [r["name"] for r in rows if r["leads"]]
    console.print(
        f"[yellow]Leads for the scheduler: {', '.join(leads)}.[/yellow]"
        if leads
        else "No lead for the scheduler: every gap is one the models explain."
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="tg1")
    ap.add_argument(
        "--only", nargs="+", metavar="NAME", help=f"default: {' '.join(DEFAULT_LAYERS)}"
    )
    ap.add_argument("--zigzag-python", help="python of ZigZag's venv ($TENSORGEN_ZIGZAG_PYTHON)")
    ap.add_argument("--json", type=Path, default=DEFAULT_JSON)
    args = ap.parse_args(argv)
    console = Console(width=max(Console().width, 160))  # the table is wide; a pipe gets 80
    by_name = {layer.name: layer for layer in LAYERS}
    names = args.only or list(DEFAULT_LAYERS)
    unknown = [n for n in names if n not in by_name]
    if unknown:
        print(
            f"zigzag_compare: unknown layer {unknown[0]!r} (see benchmarks/layers.py)",
            file=sys.stderr,
        )
        return 2
    try:
        python = zigzag_python(args.zigzag_python)
    except ZigZagMissing as err:
        print(f"zigzag_compare: {err}", file=sys.stderr)
        return 2
    try:
        target = load_target(args.target)
    except TensorgenError as err:
        print(f"zigzag_compare: {err}", file=sys.stderr)
        return 2
    rows = []
    for name in names:
        console.print(f"[dim]{name}: {by_name[name].op.describe()} ...[/dim]")
        try:
            rows.append(compare_layer(python, by_name[name], target))
        except (RuntimeError, subprocess.TimeoutExpired) as err:  # ZigZag rejected or hung
            print(f"zigzag_compare: {err}", file=sys.stderr)
            return 1
    print_report(console, rows, target)
    report = {"target": target.name, "hardware": hardware(target), "layers": rows}
    write_atomic(args.json, json.dumps(report, indent=1).encode())
    console.print(f"[dim]wrote {args.json}[/dim]")
    return 0 if all(r["tensorgen"]["bit_exact"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
