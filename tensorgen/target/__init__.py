"""Targets are data: tensorgen/target/isa/*.yaml loaded into a frozen `Target`.

Used by the compiler and by the simulator (which needs timing and energy
parameters), so it depends on nothing but PyYAML.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path

from tensorgen.errors import TargetError
from tensorgen.inputs import load_yaml, read_text

ISA_DIR = Path(__file__).resolve().parent / "isa"  # package data: ships in the wheel


@dataclass(frozen=True)
class Memory:
    name: str
    bytes: int
    bytes_per_cycle: int


@dataclass(frozen=True)
class Target:
    name: str
    description: str
    clock_mhz: float
    rows: int
    cols: int
    fill_cycles: int
    lanes: int
    vector_setup_cycles: int
    spad: Memory
    acc: Memory
    dram_bytes_per_cycle: int
    dma_setup_cycles: int
    energy_pj: dict

    @property
    def peak_macs_per_cycle(self) -> int:
        return self.rows * self.cols

    @property
    def hash(self) -> bytes:
        """8 bytes naming these exact parameters; stored in every .tgb."""
        blob = json.dumps(asdict(self), sort_keys=True).encode()
        return hashlib.sha256(blob).digest()[:8]


def _get(d: dict, path: str, kind: type, where: str):
    cur = d
    for key in path.split("."):
        if not isinstance(cur, dict) or key not in cur:
            raise TargetError(f"{where}: missing '{path}'")
        cur = cur[key]
    if kind is float and isinstance(cur, int):
        cur = float(cur)
    if not isinstance(cur, kind) or isinstance(cur, bool):
        raise TargetError(f"{where}: '{path}' must be {kind.__name__}, got {cur!r}")
    if kind in (int, float) and cur <= 0 and not path.startswith("energy"):
        raise TargetError(f"{where}: '{path}' must be positive, got {cur!r}")
    return cur


def load_target(name_or_path: str) -> Target:
    """Load `tg1`, `tiny` (names under isa/) or a path to a target yaml."""
    path = Path(name_or_path)
    if not path.suffix:
        path = ISA_DIR / f"{name_or_path}.yaml"
    if not path.exists():
        known = ", ".join(sorted(p.stem for p in ISA_DIR.glob("*.yaml")))
        raise TargetError(f"unknown target '{name_or_path}' (known: {known}, or a path to a .yaml)")
    where = str(path)
    return target_from_dict(load_yaml(read_text(path, "the target file", TargetError), where, TargetError), where)


def target_from_dict(d: object, where: str) -> Target:
    """A target description already parsed (the YAML's data) -> a validated `Target`; errors name
    `where` and the key. Design-space sweeps derive their points' targets through this."""
    if not isinstance(d, dict):
        raise TargetError(f"{where}: expected a mapping")
    energy = _get(d, "energy_pj", dict, where)
    for key in ("mac", "vector_op", "spad_byte", "acc_byte", "dram_byte"):
        _get(d, f"energy_pj.{key}", float, where)
    return Target(
        name=_get(d, "name", str, where),
        description=str(d.get("description", "")),
        clock_mhz=_get(d, "clock_mhz", float, where),
        rows=_get(d, "mac_array.rows", int, where),
        cols=_get(d, "mac_array.cols", int, where),
        fill_cycles=_get(d, "mac_array.fill_cycles", int, where),
        lanes=_get(d, "vector.lanes", int, where),
        vector_setup_cycles=_get(d, "vector.setup_cycles", int, where),
        spad=Memory("spad", _get(d, "memories.spad.bytes", int, where), _get(d, "memories.spad.bytes_per_cycle", int, where)),
        acc=Memory("acc", _get(d, "memories.acc.bytes", int, where), _get(d, "memories.acc.bytes_per_cycle", int, where)),
        dram_bytes_per_cycle=_get(d, "dram.bytes_per_cycle", int, where),
        dma_setup_cycles=_get(d, "dram.dma_setup_cycles", int, where),
        energy_pj={k: float(v) if not isinstance(v, str) else v for k, v in energy.items()},
    )
