"""Targets are data: tensorgen/target/isa/*.yaml loaded into a frozen `Target`.

Used by the compiler and by the simulator (which needs timing and energy parameters), so it
depends on nothing but PyYAML. A target file carries, besides its array, memories and
bandwidths, its technology (node, supply, clock) and the constants of its energy and area
model, each group with the `source:` it comes from (tensorgen/target/energy.py computes with
them; docs/targets.md describes every key).
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path

from tensorgen.errors import TargetError
from tensorgen.inputs import load_yaml, read_text
from tensorgen.target.energy import SCALING_NODES_NM

ISA_DIR = Path(__file__).resolve().parent / "isa"  # package data: ships in the wheel


@dataclass(frozen=True)
class Memory:
    name: str
    bytes: int
    bytes_per_cycle: int


@dataclass(frozen=True)
class EnergyConstants:
    """pJ per action at the reference node `node_nm` / `vdd_v` (scaled to the target's)."""

    node_nm: float
    vdd_v: float
    mac_pj: float
    vector_op_pj: float
    sram_read_pj_per_byte: tuple[tuple[int, float], ...]  # (SRAM bytes, pJ per byte), >= 2 points
    sram_write_pj_per_byte: tuple[tuple[int, float], ...]
    dram_pj_per_byte: tuple[tuple[str, float], ...]  # interface -> pJ per byte (not scaled)
    leakage_mw_per_mm2: float
    sources: tuple[tuple[str, str], ...]  # group -> source


@dataclass(frozen=True)
class AreaConstants:
    logic_node_nm: float
    mac_um2: float  # one int8 x int8 + int32 MAC with its activation and partial-sum registers
    weight_register_um2: float  # one weight register of one MAC (per weight buffer)
    vector_lane_um2: float
    sram_node_nm: float
    bitcell_um2: float
    periphery: float  # SRAM periphery area as a share of the bit cells'
    fixed_node_nm: float
    fixed_mm2: float
    sources: tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class Target:
    name: str
    description: str
    node_nm: float
    vdd_v: float
    clock_mhz: float
    rows: int
    cols: int
    fill_cycles: int
    weight_buffers: int  # 2: the next MATMUL's weights load while the current one streams
    lanes: int
    vector_setup_cycles: int
    spad: Memory
    acc: Memory
    dram_bytes_per_cycle: int
    dma_setup_cycles: int
    dram_interface: str
    energy: EnergyConstants
    area: AreaConstants

    @property
    def peak_macs_per_cycle(self) -> int:
        return self.rows * self.cols

    @property
    def hash(self) -> bytes:
        """8 bytes naming these exact parameters; stored in every .tgb."""
        blob = json.dumps(asdict(self), sort_keys=True).encode()
        return hashlib.sha256(blob).digest()[:8]


def _get(d: dict, path: str, kind: type, where: str, positive: bool = True):
    cur = d
    for key in path.split("."):
        if not isinstance(cur, dict) or key not in cur:
            raise TargetError(f"{where}: missing '{path}'")
        cur = cur[key]
    return _check(cur, path, kind, where, positive)


def _check(value, path: str, kind: type, where: str, positive: bool = True):
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    # bools are ints to Python, never numbers (or strings) to a target file
    if not isinstance(value, kind) or isinstance(value, bool):
        raise TargetError(
            f"{where}: '{path}' must be {'a number' if kind is float else kind.__name__}, "
            f"got {value!r}"
        )
    if kind is float and not math.isfinite(value):
        raise TargetError(f"{where}: '{path}' must be finite, got {value!r}")
    if kind in (int, float) and positive and value <= 0:
        raise TargetError(f"{where}: '{path}' must be positive, got {value!r}")
    if kind is str and not value.strip():
        raise TargetError(f"{where}: '{path}' must not be empty")
    return value


def _node(d: dict, path: str, where: str) -> float:
    nm = _get(d, path, float, where)
    lo, hi = SCALING_NODES_NM[0], SCALING_NODES_NM[-1]
    if not lo <= nm <= hi:
        raise TargetError(
            f"{where}: '{path}' must be within {lo}-{hi} nm (the scaling table's range), got {nm:g}"
        )
    return nm


def _points(d: dict, path: str, where: str) -> tuple[tuple[int, float], ...]:
    table = _get(d, path, dict, where)
    if len(table) < 2:
        raise TargetError(
            f"{where}: '{path}' needs at least two (bytes: pJ) points, got {len(table)}"
        )
    return tuple(
        sorted(
            (_check(k, f"{path} key", int, where), _check(v, f"{path}.{k}", float, where))
            for k, v in table.items()
        )
    )


def _energy(d: dict, where: str) -> EnergyConstants:
    groups = ("energy", "energy.sram", "energy.dram", "energy.leakage")
    sources = tuple((g, _get(d, f"{g}.source", str, where)) for g in groups)
    dram = _get(d, "energy.dram.pj_per_byte", dict, where)
    if not dram:
        raise TargetError(f"{where}: 'energy.dram.pj_per_byte' names no interface")
    return EnergyConstants(
        node_nm=_node(d, "energy.node_nm", where),
        vdd_v=_get(d, "energy.vdd_v", float, where),
        mac_pj=_get(d, "energy.mac_pj", float, where),
        vector_op_pj=_get(d, "energy.vector_op_pj", float, where),
        sram_read_pj_per_byte=_points(d, "energy.sram.read_pj_per_byte", where),
        sram_write_pj_per_byte=_points(d, "energy.sram.write_pj_per_byte", where),
        dram_pj_per_byte=tuple(
            sorted(
                (
                    _check(k, "energy.dram.pj_per_byte key", str, where),
                    _check(v, f"energy.dram.pj_per_byte.{k}", float, where),
                )
                for k, v in dram.items()
            )
        ),
        leakage_mw_per_mm2=_get(d, "energy.leakage.mw_per_mm2", float, where, positive=False),
        sources=sources,
    )


def _area(d: dict, where: str) -> AreaConstants:
    groups = ("area.logic", "area.sram", "area.fixed")
    sources = tuple((g, _get(d, f"{g}.source", str, where)) for g in groups)
    return AreaConstants(
        logic_node_nm=_node(d, "area.logic.node_nm", where),
        mac_um2=_get(d, "area.logic.mac_um2", float, where),
        weight_register_um2=_get(d, "area.logic.weight_register_um2", float, where),
        vector_lane_um2=_get(d, "area.logic.vector_lane_um2", float, where),
        sram_node_nm=_node(d, "area.sram.node_nm", where),
        bitcell_um2=_get(d, "area.sram.bitcell_um2", float, where),
        periphery=_get(d, "area.sram.periphery", float, where, positive=False),
        fixed_node_nm=_node(d, "area.fixed.node_nm", where),
        fixed_mm2=_get(d, "area.fixed.mm2", float, where, positive=False),
        sources=sources,
    )


def load_target(name_or_path: str) -> Target:
    """Load `tg1`, `tiny` (names under isa/) or a path to a target yaml."""
    path = Path(name_or_path)
    try:
        if not path.suffix:
            path = ISA_DIR / f"{name_or_path}.yaml"
            if path.is_file():
                return _builtin_target(path)
        found = path.exists()
    except OSError as err:  # a name too long for the file system, say
        raise TargetError(f"{name_or_path}: cannot read ({err.strerror})") from None
    if not found:
        known = ", ".join(sorted(p.stem for p in ISA_DIR.glob("*.yaml")))
        raise TargetError(f"unknown target '{name_or_path}' (known: {known}, or a path to a .yaml)")
    where = str(path)
    return target_from_dict(
        load_yaml(read_text(path, "the target file", TargetError), where, TargetError), where
    )


@lru_cache(maxsize=16)
def _builtin_target(path: Path) -> Target:
    """A target of the package, parsed once per process (a check or run loads it several times;
    0.05 CPU-s each)."""
    where = str(path)
    return target_from_dict(
        load_yaml(read_text(path, "the target file", TargetError), where, TargetError), where
    )


def target_from_dict(d: object, where: str) -> Target:
    """A target description already parsed (the YAML's data) -> a validated `Target`; errors name
    `where` and the key. Design-space sweeps derive their points' targets through this."""
    if not isinstance(d, dict):
        raise TargetError(f"{where}: expected a mapping")
    mac = d.get("mac_array")
    buffers = (
        _get(d, "mac_array.weight_buffers", int, where)
        if isinstance(mac, dict) and "weight_buffers" in mac
        else 1
    )
    if buffers not in (1, 2):
        raise TargetError(f"{where}: 'mac_array.weight_buffers' must be 1 or 2, got {buffers!r}")
    energy = _energy(d, where)
    interface = _get(d, "dram.interface", str, where)
    if interface not in dict(energy.dram_pj_per_byte):
        raise TargetError(
            f"{where}: 'dram.interface' {interface!r} has no energy in 'energy.dram.pj_per_byte' "
            f"(known: {', '.join(k for k, _ in energy.dram_pj_per_byte)})"
        )
    description = d.get("description", "")
    return Target(
        name=_get(d, "name", str, where),
        description=description if isinstance(description, str) else str(description),
        node_nm=_node(d, "technology.node_nm", where),
        vdd_v=_get(d, "technology.vdd_v", float, where),
        clock_mhz=_get(d, "clock_mhz", float, where),
        rows=_get(d, "mac_array.rows", int, where),
        cols=_get(d, "mac_array.cols", int, where),
        fill_cycles=_get(d, "mac_array.fill_cycles", int, where),
        weight_buffers=buffers,
        lanes=_get(d, "vector.lanes", int, where),
        vector_setup_cycles=_get(d, "vector.setup_cycles", int, where),
        spad=Memory(
            "spad",
            _get(d, "memories.spad.bytes", int, where),
            _get(d, "memories.spad.bytes_per_cycle", int, where),
        ),
        acc=Memory(
            "acc",
            _get(d, "memories.acc.bytes", int, where),
            _get(d, "memories.acc.bytes_per_cycle", int, where),
        ),
        dram_bytes_per_cycle=_get(d, "dram.bytes_per_cycle", int, where),
        dma_setup_cycles=_get(d, "dram.dma_setup_cycles", int, where),
        dram_interface=interface,
        energy=energy,
        area=_area(d, where),
    )
