"""benchmarks/zigzag_compare.py without ZigZag: the accelerator it describes to ZigZag is the
target (sizes, bandwidths, tensorgen's energy constants), the workloads are the layers, and a
missing ZigZag is one line with the install command."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

from tensorgen.target import load_target
from tensorgen.target.energy import action_energy

REPO = Path(__file__).resolve().parents[2]
if str(REPO / "benchmarks") not in sys.path:
    sys.path.insert(0, str(REPO / "benchmarks"))

import layers  # noqa: E402
import zigzag_compare as zc  # noqa: E402


def _bandwidths(memory: dict) -> set[int]:
    return {port["bandwidth_max"] for port in memory["ports"]}


@pytest.mark.parametrize("name", ["tg1", "tg1db", "tiny"])
def test_array_hardware_is_the_target(name):
    target = load_target(name)
    hw = zc.hardware(target)
    mem, e = hw["memories"], action_energy(target)
    assert list(mem) == ["w_reg", "acc", "spad", "dram"]  # innermost first, as ZigZag reads it
    assert hw["operational_array"]["sizes"] == [target.rows, target.cols]
    assert hw["operational_array"]["unit_energy"] == pytest.approx(e["mac"])
    assert mem["w_reg"]["size"] == 8 * target.weight_buffers  # one int8 weight per buffer
    assert mem["w_reg"]["served_dimensions"] == []  # one per MAC
    for key, m in (("acc", target.acc), ("spad", target.spad)):
        assert mem[key]["size"] == 8 * m.bytes
        assert _bandwidths(mem[key]) == {8 * m.bytes_per_cycle}
        # r_cost is per access of bandwidth_max bits: per byte it is tensorgen's figure
        assert mem[key]["r_cost"] / m.bytes_per_cycle == pytest.approx(e[f"{key}_read"])
        assert mem[key]["w_cost"] / m.bytes_per_cycle == pytest.approx(e[f"{key}_write"])
    assert _bandwidths(mem["dram"]) == {8 * target.dram_bytes_per_cycle}
    assert mem["dram"]["r_cost"] / target.dram_bytes_per_cycle == pytest.approx(e["dram"])
    assert mem["acc"]["operands"] == ["O"] and mem["spad"]["operands"] == ["I1", "I2"]


def test_vector_hardware_has_the_lanes():
    target = load_target("tg1")
    hw = zc.hardware(target, "vector")
    assert hw["operational_array"]["sizes"] == [target.lanes]
    assert hw["operational_array"]["unit_energy"] == pytest.approx(
        action_energy(target)["vector_op"]
    )
    assert "w_reg" not in hw["memories"]


@pytest.mark.parametrize("name", zc.DEFAULT_LAYERS)
def test_workload_and_mapping_match_the_layer(name):
    layer = next(layer for layer in layers.LAYERS if layer.name == name)
    target = load_target("tg1")
    (wl,) = zc.workload(layer)
    assert math.prod(wl["loop_sizes"]) == layer.op.macs
    (mp,) = zc.mapping(layer, target)
    sizes = zc.hardware(target, zc.unit_of(layer))["operational_array"]["sizes"]
    for dim, size in zip(("D1", "D2"), sizes, strict=False):
        (entry,) = mp["spatial_mapping"][dim]
        loop, factor = entry.split(", ")
        assert loop in wl["loop_dims"] and 1 <= int(factor) <= size
        assert wl["loop_sizes"][wl["loop_dims"].index(loop)] % int(factor) == 0


def _zz(cycles: float, energy: float, rows_per_load: float) -> dict:
    return {
        "latency_cycles": cycles,
        "ideal_temporal_cycles": cycles,
        "stall_cycles": 0.0,
        "onloading_cycles": 0.0,
        "offloading_cycles": 0.0,
        "energy_pj": energy,
        "mac_energy_pj": 0.0,
        "memory_energy_pj": {"O": {"acc": 0.0, "dram": energy}},
        "temporal_mapping": {
            "O": [[["B", rows_per_load]], [["C", 2.0]]],
            "W": [[["B", rows_per_load]], [["C", 2.0]], []],
        },
        "memory_levels": {"O": ["acc", "dram"], "W": ["w_reg", "spad", "dram"]},
    }


@pytest.fixture(scope="module")
def small():
    target = load_target("tg1")
    layer = layers.Layer("mm", layers.Matmul(64, 64, 64))
    return layer, target, zc.run_tensorgen(layer, target)


def test_tensorgen_side_is_checked_and_split(small):
    layer, target, tg = small
    assert tg["bit_exact"] is True
    assert tg["dynamic_pj"] + tg["energy_breakdown_pj"]["static"] == pytest.approx(tg["energy_pj"])
    terms = zc.cycle_terms(layer, target, tg)
    assert terms["stream"] + terms["fill"] + terms["exposed"] == pytest.approx(tg["cycles"])
    assert terms["matmuls"] >= 1 and terms["rows_per_matmul"] <= 64


def test_no_difference_nothing_to_explain(small):
    layer, target, tg = small
    rows = zc.cycle_terms(layer, target, tg)["rows_per_matmul"]
    assert zc.explain(layer, target, tg, _zz(tg["cycles"], tg["dynamic_pj"], rows)) == []


def test_fewer_cycles_from_the_fill_is_no_lead(small):
    layer, target, tg = small
    terms = zc.cycle_terms(layer, target, tg)
    zz = _zz(tg["cycles"] - terms["fill"] / 2, tg["dynamic_pj"], terms["rows_per_matmul"])
    (sentence,) = zc.explain(layer, target, tg, zz)
    assert "Not a better loop nest" in sentence and "LEAD" not in sentence


def test_more_rows_per_weight_load_is_a_lead(small):
    layer, target, tg = small
    rows = zc.cycle_terms(layer, target, tg)["rows_per_matmul"]
    out = zc.explain(layer, target, tg, _zz(tg["cycles"] / 2, tg["dynamic_pj"] / 2, rows * 2))
    assert any(s.startswith("Cycles x0.50") for s in out)
    assert any("LEAD for the scheduler" in s and "acc: B" in s for s in out)
    assert any(s.startswith("Energy x0.50") and "less DRAM traffic" in s for s in out)


def test_missing_zigzag_is_one_line_with_the_install_command(tmp_path, capsys):
    status = zc.main(
        ["--zigzag-python", str(tmp_path / "nope"), "--json", str(tmp_path / "r.json")]
    )
    err = capsys.readouterr().err
    assert status == 2
    assert len(err.strip().splitlines()) == 1 and "pip install zigzag-dse" in err
    assert not (tmp_path / "r.json").exists()


def test_a_gap_within_the_noise_is_no_lead(small):
    layer, target, tg = small
    zz = _zz(tg["cycles"] - 1, tg["dynamic_pj"], 1e6)  # more rows per load, but one cycle
    (sentence,) = zc.explain(layer, target, tg, zz)
    assert "no lead" in sentence and "LEAD" not in sentence
