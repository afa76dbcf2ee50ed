"""Target files carry energy and area with sources; the loader refuses bad values naming file and
key; the simulator's energy is its action counters times the per-action energies plus leakage,
recomputed here from the yaml constants (not through tensorgen.target.energy)."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch
import yaml

from tensorgen.errors import TargetError
from tensorgen.mc.binary import assemble
from tensorgen.sim.machine import simulate
from tensorgen.target import ISA_DIR, load_target, target_from_dict
from tensorgen.target.energy import area_breakdown, energy_breakdown


def _raw(name: str) -> dict:
    return yaml.safe_load((ISA_DIR / f"{name}.yaml").read_text())


@pytest.mark.parametrize("name", ["tg1", "tg1db", "tiny"])
def test_every_constant_group_has_a_source(name: str) -> None:
    d = _raw(name)
    groups = [
        d["energy"],
        d["energy"]["sram"],
        d["energy"]["dram"],
        d["energy"]["leakage"],
        d["area"]["logic"],
        d["area"]["sram"],
        d["area"]["fixed"],
    ]
    assert all(isinstance(g["source"], str) and len(g["source"]) > 20 for g in groups)
    t = load_target(name)
    assert t.node_nm == 7 and t.dram_interface == "LPDDR4"
    assert "Horowitz" in dict(t.energy.sources)["energy.sram"]
    assert "Accelergy" in dict(t.energy.sources)["energy.dram"]


def test_tg1db_is_tg1_with_two_weight_buffers() -> None:
    tg1, db = _raw("tg1"), _raw("tg1db")
    assert (
        db["mac_array"].pop("weight_buffers") == 2 and tg1["mac_array"].pop("weight_buffers") == 1
    )
    for d in (tg1, db):
        d.pop("name"), d.pop("description")
    assert tg1 == db
    # the second weight buffer is 8 bits per MAC of area, nothing else
    a1, a2 = area_breakdown(load_target("tg1")), area_breakdown(load_target("tg1db"))
    assert a2["mac_array"] > a1["mac_array"] and a2["spad"] == a1["spad"]
    assert a2["total"] - a1["total"] == pytest.approx(a2["mac_array"] - a1["mac_array"])


@pytest.mark.parametrize(
    "path, value, message",
    [
        ("clock_mhz", True, "'clock_mhz' must be a number, got True"),
        ("clock_mhz", "fast", "'clock_mhz' must be a number"),
        ("clock_mhz", float("nan"), "'clock_mhz' must be finite"),
        ("technology.node_nm", 3, "'technology.node_nm' must be within 7-130 nm"),
        ("mac_array.weight_buffers", 3, "'mac_array.weight_buffers' must be 1 or 2"),
        ("mac_array.weight_buffers", True, "'mac_array.weight_buffers' must be int"),
        ("energy.mac_pj", -0.3, "'energy.mac_pj' must be positive"),
        (
            "energy.sram.read_pj_per_byte",
            {8192: 1.25},
            "'energy.sram.read_pj_per_byte' needs at least two",
        ),
        ("energy.sram.source", None, "'energy.sram.source' must be str"),
        ("dram.interface", "LPDDR5", "'dram.interface' 'LPDDR5' has no energy"),
        ("area.logic.mac_um2", None, "'area.logic.mac_um2' must be a number"),
    ],
)
def test_bad_values_name_file_and_key(path: str, value, message: str) -> None:
    d = _raw("tiny")
    *outer, last = path.split(".")
    node = d
    for key in outer:
        node = node[key]
    node[last] = value
    with pytest.raises(TargetError, match=f"^tiny.yaml: {message}"):
        target_from_dict(d, "tiny.yaml")
    del node[last]
    if last != "weight_buffers":  # optional, default 1
        with pytest.raises(TargetError, match=f"^tiny.yaml: missing '{path}'"):
            target_from_dict(d, "tiny.yaml")


def test_description_is_any_string_and_weight_buffers_default_to_one() -> None:
    d = _raw("tiny")
    d["description"] = "x: 'y' \u00e9"
    del d["mac_array"]["weight_buffers"]
    t = target_from_dict(d, "t.yaml")
    assert t.description == d["description"] and t.weight_buffers == 1


def test_memory_size_drives_sram_energy_and_area() -> None:
    # a sweep changes memories.spad.bytes only: energy per byte and area follow from the size
    d = _raw("tg1")
    small, big = copy.deepcopy(d), copy.deepcopy(d)
    small["memories"]["spad"]["bytes"], big["memories"]["spad"]["bytes"] = 128 * 1024, 512 * 1024
    s, b = target_from_dict(small, "s"), target_from_dict(big, "b")
    stats = type(
        "S",
        (),
        {
            "cycles": 0,
            "macs": 0,
            "vector_ops": 0,
            "dram_bytes": 0,
            "onchip_bytes": {"spad": 1000, "acc": 0},
            "onchip_write_bytes": {"spad": 0, "acc": 0},
        },
    )()
    assert energy_breakdown(s, stats)["spad"] < energy_breakdown(b, stats)["spad"]
    assert area_breakdown(b)["spad"] == pytest.approx(4 * area_breakdown(s)["spad"])
    # a 28 nm target from the same 45 nm constants sits between 45 nm and 16 nm
    areas = []
    for node in (45, 28, 16, 7):
        d2 = copy.deepcopy(d)
        d2["technology"]["node_nm"] = node
        areas.append(area_breakdown(target_from_dict(d2, "n"))["total"])
    assert areas == sorted(areas, reverse=True)


# --- the energy-accounting check, from the yaml's constants -------------------------------------

# Stillmaker & Baas (2017): energy per op a*V^2 + b*V + c at 45 and 7 nm; area factors from 45 nm
POLY = {45: (1.103, -0.362, 0.2767), 7: (0.1776, -0.09097, 0.02447)}
AREA_FROM_45 = {45: 1.0, 40: 0.46 + (40 - 32) / (45 - 32) * (1.0 - 0.46), 7: 0.059}


def _energy_factor(node_from: int, vdd_from: float, node_to: int, vdd_to: float) -> float:
    def e(node, v):
        a, b, c = POLY[node]
        return a * v * v + b * v + c

    return e(node_to, vdd_to) / e(node_from, vdd_from)


def _sram_pj(points: dict, size: int) -> float:
    # below the smallest point: the power law of the first segment (8 KB -> 32 KB)
    (s0, e0), (s1, e1) = sorted(points.items())[:2]
    return e0 * (size / s0) ** (math.log(e1 / e0) / math.log(s1 / s0))


PROGRAM = """.target tiny {hash}
.dram 128
.tensor A int8 4x4 input dram=0 pad=0
.tensor B int8 4x4 input dram=16 pad=0
.tensor C int32 4x4 output dram=64 pad=0
LOAD dst=spad:int8@0[4x4:4,1] src=A(0,0)[4x4]
LOAD dst=spad:int8@16[4x4:4,1] src=B(0,0)[4x4] signal=EX
MATMUL acc=acc:int32@0[4x4:4,1] a=spad:int8@0[4x4:4,1] b=spad:int8@16[4x4:4,1] accumulate=0 a_zp=0 b_zp=0 wait=LD
VADD dst=acc:int32@0[4x4:4,1] a=acc:int32@0[4x4:4,1] b=- imm=1 signal=ST
STORE dst=C(0,0)[4x4] src=acc:int32@0[4x4:4,1] wait=EX
"""


def test_simulated_energy_is_counters_times_yaml_constants() -> None:
    d, tiny = _raw("tiny"), load_target("tiny")
    rng = np.random.default_rng(0)
    ins = {n: rng.integers(-128, 128, (4, 4)).astype(np.int8) for n in "AB"}
    r = simulate(assemble(PROGRAM.format(hash=tiny.hash.hex())), ins, tiny)
    want = torch.from_numpy(ins["A"]).int() @ torch.from_numpy(ins["B"]).int() + 1
    np.testing.assert_array_equal(r.outputs["C"], want.numpy())
    s = r.stats
    # the action counters, by hand: loads write 32 spad bytes, the MATMUL reads them and writes 64
    # acc bytes, the VADD reads and writes 64, the store reads 64
    assert (s.macs, s.vector_ops, s.dram_bytes) == (64, 16, 96)
    assert s.onchip_write_bytes == {"spad": 32, "acc": 128}
    assert s.onchip_bytes == {"spad": 64, "acc": 256}
    en, tech = d["energy"], d["technology"]
    f = _energy_factor(en["node_nm"], en["vdd_v"], tech["node_nm"], tech["vdd_v"])
    spad, acc = d["memories"]["spad"]["bytes"], d["memories"]["acc"]["bytes"]
    sram = en["sram"]
    dynamic = {
        "mac": 64 * en["mac_pj"] * f,
        "vector": 16 * en["vector_op_pj"] * f,
        "spad": f
        * (
            32 * _sram_pj(sram["read_pj_per_byte"], spad)
            + 32 * _sram_pj(sram["write_pj_per_byte"], spad)
        ),
        "acc": f
        * (
            128 * _sram_pj(sram["read_pj_per_byte"], acc)
            + 128 * _sram_pj(sram["write_pj_per_byte"], acc)
        ),
        "dram": 96 * en["dram"]["pj_per_byte"][d["dram"]["interface"]],
    }
    ar = d["area"]
    logic = AREA_FROM_45[7] / AREA_FROM_45[ar["logic"]["node_nm"]] * 1e-6
    mm2 = (
        16 * (ar["logic"]["mac_um2"] + 1 * ar["logic"]["weight_register_um2"]) * logic
        + 4 * ar["logic"]["vector_lane_um2"] * logic
        + (spad + acc)
        * 8
        * ar["sram"]["bitcell_um2"]
        * (1 + ar["sram"]["periphery"])
        * AREA_FROM_45[7]
        * 1e-6
        + ar["fixed"]["mm2"] * AREA_FROM_45[7]
    )
    assert area_breakdown(tiny)["total"] == pytest.approx(mm2, rel=1e-12)
    leak_mw_per_mm2 = en["leakage"]["mw_per_mm2"] * f / AREA_FROM_45[7]
    static = leak_mw_per_mm2 * mm2 * s.cycles / d["clock_mhz"] * 1e3  # mW * us = nJ
    assert s.energy_breakdown.keys() == {*dynamic, "static"}
    for k, v in dynamic.items():
        assert s.energy_breakdown[k] == pytest.approx(v, rel=1e-12), k
    assert s.energy_breakdown["static"] == pytest.approx(static, rel=1e-12)
    assert s.energy_pj == pytest.approx(sum(dynamic.values()) + static, rel=1e-12)
    assert s.as_dict()["energy_breakdown"] == s.energy_breakdown
