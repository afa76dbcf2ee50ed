"""One compile-and-simulate of a model or an op.yaml on one target, cut into per-layer rows.

Shared by `tensorgen report`, `sweep` and `compare`: the automatic schedule, one simulation
(recorded when a trace is wanted) compared bit for bit with PyTorch, and per layer the
counters between the simulator's marks, the energy by component and the roofline position.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from tensorgen.errors import TensorgenError
from tensorgen.sim.machine import Mark, Recorder, Stats
from tensorgen.target import Target
from tensorgen.target.energy import area_breakdown, energy_breakdown

ENERGY_PARTS = ("mac", "vector", "spad", "acc", "dram", "static")


def is_model(path: str) -> bool:
    return path.split(":", 1)[0].endswith((".py", ".pt2"))


@dataclass(frozen=True)
class LayerRow:
    name: str
    op: str
    macs: int
    cycles: int
    start: int  # cycle at which the layer's first instruction could begin (the previous mark)
    dram_bytes: int
    energy: dict[str, float]  # pJ by component

    @property
    def energy_pj(self) -> float:
        return sum(self.energy.values())

    def intensity(self) -> float:
        """int8 ops (2 per MAC) per DRAM byte."""
        return 2 * self.macs / self.dram_bytes if self.dram_bytes else float("inf")

    def ops_per_cycle(self) -> float:
        return 2 * self.macs / self.cycles if self.cycles else 0.0

    def roof(self, target: Target) -> tuple[str, float]:
        """The bound (compute or DRAM) at this layer's intensity and its ops/cycle."""
        peak = 2.0 * target.peak_macs_per_cycle
        slope = self.intensity() * target.dram_bytes_per_cycle
        return ("compute", peak) if slope >= peak else ("DRAM", slope)

    def as_dict(self, target: Target) -> dict:
        bound, roof = self.roof(target)
        util = self.macs / (self.cycles * target.peak_macs_per_cycle) if self.cycles else 0.0
        d = {
            "layer": self.name,
            "op": self.op,
            "macs": self.macs,
            "cycles": self.cycles,
            "utilization": round(util, 6),
            "bound": bound if self.macs else "",
            "attainment": round(self.ops_per_cycle() / roof, 6) if self.macs and roof else None,
            "dram_bytes": self.dram_bytes,
        }
        d.update({f"energy_{k}_pj": round(v, 3) for k, v in self.energy.items()})
        d["energy_pj"] = round(self.energy_pj, 3)
        return d


@dataclass
class Analysis:
    source: str
    target: Target
    layers: list[LayerRow]
    stats: Stats
    exact: bool
    message: str  # "BIT-EXACT" or the first mismatch
    compile_s: float
    sim_s: float
    recorder: Recorder | None = None
    area: dict[str, float] = field(default_factory=dict)

    @property
    def energy(self) -> dict[str, float]:
        return energy_breakdown(self.target, self.stats)

    @property
    def latency_s(self) -> float:
        return self.stats.cycles / (self.target.clock_mhz * 1e6)

    @property
    def power_w(self) -> float:
        return sum(self.energy.values()) * 1e-12 / self.latency_s if self.stats.cycles else 0.0

    @property
    def macs(self) -> int:
        return sum(r.macs for r in self.layers)

    def utilization(self) -> float:
        return (
            self.macs / (self.stats.cycles * self.target.peak_macs_per_cycle)
            if self.stats.cycles
            else 0.0
        )


def _stats_from(d: dict) -> Stats:
    return Stats(
        cycles=d["cycles"],
        instructions=d["instructions"],
        macs=d["macs"],
        vector_ops=d["vector_ops"],
        dram_read_bytes=d["dram_read_bytes"],
        dram_write_bytes=d["dram_write_bytes"],
        onchip_bytes=dict(d["onchip_bytes"]),
        onchip_write_bytes=dict(d["onchip_write_bytes"]),
        busy=dict(d["busy"]),
        stalled=dict(d["stalled"]),
    )


def _delta(a: dict, b: dict, cycles: int) -> Stats:
    """The counters accumulated between two snapshots; `cycles` is the layer's span."""
    sub = {
        k: (b[k] - a[k]) if not isinstance(b[k], dict) else {q: b[k][q] - a[k][q] for q in b[k]}
        for k in (
            "instructions",
            "macs",
            "vector_ops",
            "dram_read_bytes",
            "dram_write_bytes",
            "onchip_bytes",
            "onchip_write_bytes",
            "busy",
            "stalled",
        )
    }
    return _stats_from({"cycles": cycles, **sub})


def _layer_rows(
    names: list[tuple[str, str]], macs: list[int], marks: list[Mark], target: Target
) -> list[LayerRow]:
    """One row per layer from the simulator's marks at the layers' ends."""
    rows, before = [], Mark(0, 0, 0, 0, Stats().as_dict())
    for (name, op), n_macs, mark in zip(names, macs, marks, strict=False):
        cycles = mark.cycles - before.cycles
        d = _delta(before.counters, mark.counters, cycles)
        rows.append(
            LayerRow(
                name, op, n_macs, cycles, before.cycles, d.dram_bytes, energy_breakdown(target, d)
            )
        )
        before = mark
    return rows


def analyze(
    source: str,
    target: Target,
    params: dict[str, int] | None = None,
    engine: str = "qnnpack",
    seed: int = 0,
    record: bool = False,
    quantizer: str = "fx",
    objective: str = "cycles",
) -> Analysis:
    """Compile `source` (a model file or an op.yaml) for `target` with the automatic schedule
    (minimising `objective`), simulate it once on one input (the model's example input, or
    seeded random op inputs) and compare with PyTorch."""
    if is_model(source):
        return _analyze_model(
            source, target, params or {}, engine, seed, record, quantizer, objective
        )
    if params:
        raise TensorgenError(f"{source}: --param applies to a model, not to an op.yaml")
    return _analyze_op(source, target, seed, record, objective)


def _analyze_model(
    source: str,
    target: Target,
    params: dict[str, int],
    engine: str,
    seed: int,
    record: bool,
    quantizer: str = "fx",
    objective: str = "cycles",
) -> Analysis:
    from tensorgen.frontend.load import load_model
    from tensorgen.mc.binary import decode, encode
    from tensorgen.model import compile_model, reference_outputs
    from tensorgen.sim.machine import simulate

    model, example = load_model(source, params)
    cm = compile_model(
        model, example, target, engine=engine, seed=seed, quantizer=quantizer, objective=objective
    )
    t0 = time.perf_counter()
    feed = {
        name: x.detach().numpy().astype(np.float32)
        for name, x in zip(cm.input_names, example, strict=False)
    }
    marks = tuple(end for _, end in cm.linked.layer_ranges)
    result = simulate(decode(encode(cm.binary)), feed, target, marks=marks, record=record)
    exact, message = True, "BIT-EXACT"
    for name, ref in zip(cm.output_names, reference_outputs(cm, example), strict=False):
        out = result.outputs[name]
        if ref.shape != out.shape or not np.array_equal(ref.view(np.int32), out.view(np.int32)):
            exact, message = False, f"MISMATCH {name}: the simulator differs from PyTorch"
            break
    sim_s = time.perf_counter() - t0
    names = [(r.path or r.name, r.op + "".join(f"+{e}" for e in r.epilogue)) for r in cm.layers]
    rows = _layer_rows(names, [r.macs for r in cm.layers], result.marks, target)
    return Analysis(
        source,
        target,
        rows,
        result.stats,
        exact,
        message,
        cm.compile_s,
        sim_s,
        result.recorder,
        area_breakdown(target),
    )


def _analyze_op(
    source: str, target: Target, seed: int, record: bool, objective: str = "cycles"
) -> Analysis:
    from tensorgen.driver import compare, compile_auto, random_inputs
    from tensorgen.mc.binary import decode, encode
    from tensorgen.reference.torch_ref import evaluate
    from tensorgen.sim.machine import simulate
    from tensorgen.spec.loader import load_program

    t0 = time.perf_counter()
    program = load_program(source, target.name)
    compiled = compile_auto(program, target, objective).compiled
    compile_s = time.perf_counter() - t0
    inputs = random_inputs(program, seed)
    binary = decode(encode(compiled.binary))
    result = simulate(binary, inputs, target, marks=(len(binary.code),), record=record)
    cmp = compare(evaluate(program, inputs), result.outputs)
    sim_s = time.perf_counter() - t0 - compile_s
    rows = _layer_rows([(program.name, "op")], [compiled.macs], result.marks, target)
    return Analysis(
        source,
        target,
        rows,
        result.stats,
        cmp.exact,
        cmp.message,
        compile_s,
        sim_s,
        result.recorder,
        area_breakdown(target),
    )
