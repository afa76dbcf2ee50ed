"""What a simulation returns: outputs, counters, marks and the optional trace recorder."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from tensorgen.errors import SimulatorError
from tensorgen.mc import isa


@dataclass
class Stats:
    cycles: int = 0
    instructions: int = 0
    macs: int = 0
    vector_ops: int = 0
    dram_read_bytes: int = 0
    dram_write_bytes: int = 0
    onchip_bytes: dict = field(default_factory=lambda: {"spad": 0, "acc": 0})  # read + written
    onchip_write_bytes: dict = field(default_factory=lambda: {"spad": 0, "acc": 0})
    busy: dict = field(default_factory=lambda: {q: 0 for q in isa.QUEUES})
    stalled: dict = field(default_factory=lambda: {q: 0 for q in isa.QUEUES})
    energy_pj: float = 0.0  # the sum of energy_breakdown
    energy_breakdown: dict = field(
        default_factory=dict
    )  # pJ per component (tensorgen.target.energy)

    @property
    def dram_bytes(self) -> int:
        return self.dram_read_bytes + self.dram_write_bytes

    def as_dict(self) -> dict:
        return {
            "cycles": self.cycles,
            "instructions": self.instructions,
            "macs": self.macs,
            "vector_ops": self.vector_ops,
            "dram_read_bytes": self.dram_read_bytes,
            "dram_write_bytes": self.dram_write_bytes,
            "onchip_bytes": dict(self.onchip_bytes),
            "onchip_write_bytes": dict(self.onchip_write_bytes),
            "busy": dict(self.busy),
            "stalled": dict(self.stalled),
            "energy_pj": self.energy_pj,
            "energy_breakdown": dict(self.energy_breakdown),
        }


@dataclass(frozen=True)
class Mark:
    """The counters when the program reached top-level instruction `pc` (or its end)."""

    pc: int
    cycles: int  # the latest any queue has been busy until
    macs: int
    dram_bytes: int
    counters: dict | None = field(
        default=None, compare=False
    )  # every counter then: Stats.as_dict()


@dataclass
class Recorder:
    """What `simulate(record=True)` keeps for traces and timelines: per executed instruction (a
    vectorised loop nest counts as one aggregated interval) `(queue, ready, start, end, pc,
    mnemonic)` -- `ready` is when its queue was free, so [ready, start) is the stall -- and the
    DRAM channel's busy intervals."""

    events: list[tuple[str, int, int, int, int, str]] = field(default_factory=list)
    channel: list[tuple[int, int]] = field(default_factory=list)


class NoOutputs(Mapping):
    """The outputs of a values-free run (`simulate(values=False)`), which computes none: any
    look at them raises, so that a caller that wants values cannot read zeros unawares."""

    def _fail(self):
        raise SimulatorError(
            "this run computed no values (simulate(..., values=False)): its outputs are "
            "unknown; simulate with values=True to read them"
        )

    def __getitem__(self, name: str) -> np.ndarray:
        self._fail()

    def __iter__(self):
        self._fail()

    def __len__(self) -> int:
        self._fail()

    def __repr__(self) -> str:
        return "NoOutputs()"


@dataclass
class SimResult:
    outputs: Mapping[str, np.ndarray]  # a `NoOutputs` of a values-free run
    stats: Stats
    marks: list[Mark] = field(default_factory=list)
    recorder: Recorder | None = None
