"""Which layers of a model could be fused: the candidate groups and what fusing them would save.

A group is a run of consecutive layers, each joined to the next by an activation that no other
layer reads and that is not a model output: fused into one program, that activation becomes a
temporary which never leaves the chip (schedule: `compute_at`, docs/schedules.md). This module
finds the groups and weighs each: the DRAM bytes its intermediates cost layer by layer (each
written once and read once) and the energy of those bytes at the target's price, against the
largest set of activations the group has live at once, which a group kept whole on chip must
fit in the scratchpad. It compiles nothing: the model is still compiled layer by layer
(model.py); grouping the layers' programs into one is the next step.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

import numpy as np

from tensorgen.codegen.scheduled import compile_scheduled
from tensorgen.errors import TensorgenError
from tensorgen.frontend.fx import Graph
from tensorgen.frontend.layers import Layer
from tensorgen.ir.core import Program
from tensorgen.ir.verify import verify_program
from tensorgen.mc.binary import Binary, decode, encode
from tensorgen.schedule.api import Schedule
from tensorgen.schedule.state import Loop
from tensorgen.schedule.steps import LoopRef
from tensorgen.sim.machine import simulate
from tensorgen.spec.loader import parse_program
from tensorgen.target import Target


@dataclass(frozen=True)
class Group:
    layers: tuple[str, ...]  # layer names, in program order
    intermediates: tuple[str, ...]  # the values that would stay on chip
    intermediate_bytes: int  # their bytes, once each
    live_bytes: int  # the largest activation live set of one layer of the group
    fits: bool  # live_bytes within the target's scratchpad

    @property
    def saved_dram_bytes(self) -> int:
        """Layer by layer, every intermediate is stored once and loaded once."""
        return 2 * self.intermediate_bytes

    def reason(self, target: Target) -> str:
        pj = self.saved_dram_bytes * dict(target.energy.dram_pj_per_byte)[target.dram_interface]
        room = "fits" if self.fits else "does not fit"
        return (
            f"{' -> '.join(self.layers)}: {', '.join(self.intermediates)} read by the next "
            f"layer only; {self.saved_dram_bytes} DRAM bytes ({pj / 1e3:.1f} nJ) saved; the "
            f"largest live set, {self.live_bytes} B, {room} the {target.spad.bytes} B scratchpad"
        )


def _buffer(graph: Graph, value: str) -> str:
    v = graph.values.get(value)
    return v.buffer if v is not None and v.buffer else value


def _activations(graph: Graph, layer: Layer, role: str) -> set[str]:
    return {
        _buffer(graph, p.value)
        for p in layer.ports
        if p.role == role and p.value is not None and p.const is None
    }


def fusion_groups(graph: Graph, target: Target) -> list[Group]:
    """The runs of two or more consecutive layers joined by activations only the next reads."""
    readers: dict[str, int] = {}
    for layer in graph.layers:
        for buf in _activations(graph, layer, "input"):
            readers[buf] = readers.get(buf, 0) + 1
    public = {_buffer(graph, v.name) for v in graph.inputs + graph.outputs}
    sizes = {v.buffer or v.name: v.nbytes for v in graph.values.values()}
    groups, run = [], [0]
    for i in range(1, len(graph.layers) + 1):
        joined = False
        if i < len(graph.layers):
            out = _activations(graph, graph.layers[i - 1], "output")
            joined = (
                len(out) == 1
                and out <= _activations(graph, graph.layers[i], "input")
                and readers.get(next(iter(out)), 0) == 1
                and not out & public
                and _same_view(graph, graph.layers[i - 1], graph.layers[i], next(iter(out)))
            )
        if joined:
            run.append(i)
            continue
        if len(run) > 1:
            groups.append(_group(graph, [graph.layers[j] for j in run], sizes, target))
        run = [i]
    return groups


def _same_view(graph: Graph, producer: Layer, consumer: Layer, buf: str) -> bool:
    """Whether the consumer reads the buffer as the producer wrote it (not through a flatten or
    a reshape, which one program cannot say of one tensor)."""

    def port(layer: Layer, role: str):
        return next(
            p
            for p in layer.ports
            if p.role == role and p.value is not None and _buffer(graph, p.value) == buf
        )

    out, inp = port(producer, "output"), port(consumer, "input")
    return tuple(out.shape) == tuple(inp.shape) and out.dtype == inp.dtype


def _group(graph: Graph, layers: list[Layer], sizes: dict[str, int], target: Target) -> Group:
    inner = [next(iter(_activations(graph, layer, "output"))) for layer in layers[:-1]]
    live = max(
        sum(sizes.get(b, 0) for b in _activations(graph, layer, "input"))
        + sum(sizes.get(b, 0) for b in _activations(graph, layer, "output"))
        for layer in layers
    )
    return Group(
        tuple(layer.name for layer in layers),
        tuple(inner),
        sum(sizes.get(b, 0) for b in inner),
        live,
        live <= target.spad.bytes,
    )


# -- one program for a group ----------------------------------------------------------------
# a name: an access `T[...]`, or a tensor passed whole (`lut(Q[i], T)`); not a call's function
_REF = re.compile(r"(?<![\w.])([A-Za-z_][A-Za-z0-9_]*)\b(?!\s*\()")


@dataclass(frozen=True)
class Merged:
    """A group's layers as one program: `names[i]` maps layer i's tensors to the program's;
    `bindings` the program's tensors to what the model binds them to (a model value, or the
    port of a layer whose constant it holds: (layer index, port name))."""

    program: Program
    names: tuple[dict[str, str], ...]
    intermediates: frozenset[str]
    offsets: tuple[int, ...]  # the index of each layer's first statement


def merge(graph: Graph, layers: list[Layer], target: str) -> Merged:
    """The op.yaml of `layers` in one: each layer's tensors renamed `<name>_<i>`, the
    activation between two layers one temporary (the consumer's pad), never a port."""
    names: list[dict[str, str]] = []
    decls: dict[str, dict] = {}
    inner: set[str] = set()
    made: dict[str, str] = {}  # buffer -> the tensor of the layer that wrote it
    for i, layer in enumerate(layers):
        rename = {}
        for p in layer.ports:
            buf = _buffer(graph, p.value) if p.value is not None and p.const is None else None
            if p.role == "input" and buf in made:
                tensor = made[buf]
                have = decls[tensor]
                if list(p.shape) != have["shape"] or p.dtype != have["dtype"]:
                    raise FusionError(f"{layer.name} reads {buf} as another shape")
                have.pop("role", None)
                if p.pad:
                    have["pad"] = int(p.pad)
                inner.add(tensor)
                rename[p.name] = tensor
                continue
            tensor = f"{p.name}_{i}"
            decl = {"shape": list(p.shape), "dtype": p.dtype}
            if p.role != "none":
                decl["role"] = p.role
            if p.pad:
                decl["pad"] = int(p.pad)
            decls[tensor] = decl
            rename[p.name] = tensor
            if p.role == "output" and buf is not None and i + 1 < len(layers):
                made[buf] = tensor
        names.append(rename)
    lines = ["tensorgen: 1", f"name: {layers[0].name}_fused", "tensors:"]
    lines += [f"  {t}: {_flow(d)}" for t, d in decls.items()]
    lines.append("statements:")
    offsets = []
    count = 0
    for layer, rename in zip(layers, names, strict=True):
        offsets.append(count)
        for st in layer.body(layer.lo, layer.hi):
            text = st if isinstance(st, str) else st["stmt"]
            text = _REF.sub(lambda m, r=rename: r.get(m.group(1), m.group(1)), text)
            item = text if isinstance(st, str) else {**st, "stmt": text}
            lines.append(f"  - {_flow(item)}")
            count += 1
    lines += [f"target: {target}", "schedule: auto"]
    where = f"<fused {' + '.join(layer.name for layer in layers)}>"
    program = parse_program("\n".join(lines) + "\n", where, target)
    return Merged(program, tuple(names), frozenset(inner), tuple(offsets))


def _flow(value) -> str:
    """YAML flow style through JSON (a JSON value is YAML)."""
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_flow(v)}" for k, v in value.items()) + "}"
    return json.dumps(value)


class FusionError(TensorgenError):
    """A group that cannot be fused (the model compiles its layers one by one instead)."""


# -- the group's schedule: each layer's own, replayed on the merged program -----------------
def fused_schedule(merged: Merged, alone: list[tuple[Program, tuple]], target: Target):
    """Every layer's schedule (the automatic scheduler's, by its trace) replayed on the merged
    program, the layers one after another; the intermediates are not staged (each is kept whole
    in the scratchpad, where the producer writes it and the consumer reads it: never in DRAM).
    Replayed unchecked: the lowering's verify_schedule checks the result once, dependences and
    capacities (a group whose layers' buffers do not fit together is refused there)."""
    fused = Schedule(merged.program, target, checked=False)
    for tensor, layout in _layouts(merged, alone).items():
        fused.stage(tensor, None, "spad", layout=layout)
    for i, (program, trace) in enumerate(alone):
        rename, offset = merged.names[i], merged.offsets[i]
        stmt = {s.name: f"S{offset + k}" for k, s in enumerate(program.statements)}
        mirror = Schedule(program, target, checked=False)
        handles = {}
        for s in program.statements:
            for a, b in zip(mirror.loops(s.name), fused.loops(stmt[s.name]), strict=True):
                handles[a.name] = b
        for step in trace:
            if step.primitive in ("stage", "double_buffer") and (
                rename[step.args[0]] in merged.intermediates
            ):
                continue
            kwargs = dict(step.kwargs)
            got = getattr(mirror, step.primitive)(*_args(step.args, mirror.loop, None), **kwargs)
            args = _args(step.args, handles.__getitem__, {**rename, **stmt})
            made = getattr(fused, step.primitive)(*args, **kwargs)
            for a, b in zip(_loops(got), _loops(made), strict=True):
                handles[a.name] = b
    return fused  # compile_scheduled's verify_schedule checks it against the dependences


def _layouts(merged: Merged, alone: list[tuple[Program, tuple]]) -> dict[str, object]:
    """Each intermediate's layout on chip: the one its consumer staged it with (a channels-last
    input that folds a small kernel into the MAC array's K), else the tensor's own."""
    layouts: dict[str, object] = {t: None for t in sorted(merged.intermediates)}
    for i, (_, trace) in enumerate(alone):
        for step in trace:
            tensor = merged.names[i].get(step.args[0]) if step.args else None
            if step.primitive == "stage" and tensor in layouts and i > 0:
                layout = dict(step.kwargs).get("layout")
                if layout is not None and merged.names[i - 1].get(step.args[0]) != tensor:
                    layouts[tensor] = tuple(layout)
    return layouts


def _args(args, loop, rename):
    out = []
    for a in args:
        if isinstance(a, LoopRef):
            out.append(loop(a.name))
        elif isinstance(a, tuple):
            out.append(tuple(_args(a, loop, rename)))
        elif isinstance(a, str) and rename is not None:
            out.append(rename.get(a, a))
        else:
            out.append(a)
    return out


def _loops(value) -> list[Loop]:
    if isinstance(value, Loop):
        return [value]
    if isinstance(value, tuple):
        return [v for v in value if isinstance(v, Loop)]
    return []


# -- the model's units: single layers, and the groups fused ---------------------------------
@dataclass
class Unit:
    """What the linker links: one layer compiled alone, or a fused group (several layers)."""

    layers: list[int]  # indices into graph.layers
    binary: Binary
    bindings: dict[str, str]  # the binary's tensor -> model buffer
    macs: int
    schedule: str  # "auto", "default" or "fused"


def fuse_units(
    graph: Graph, target: Target, singles: list[Unit], schedules: list[tuple | None]
) -> tuple[list[Unit], list[str]]:
    """`singles` (one unit per layer, compiled alone) with every group that fits the scratchpad
    and whose layers all have schedules replaced by one fused unit; and one line per group
    saying what was fused and why, or why not."""
    units, notes, start = [], [], {}
    for group in fusion_groups(graph, target):
        first = next(k for k, lay in enumerate(graph.layers) if lay.name == group.layers[0])
        start[first] = group
    i = 0
    while i < len(graph.layers):
        group = start.get(i)
        if group is None:
            units.append(singles[i])
            i += 1
            continue
        idx = list(range(i, i + len(group.layers)))
        units.extend(_fuse_run(graph, target, idx, singles, schedules, notes))
        i += len(idx)
    return units, notes


def _fuse_run(graph, target, idx, singles, schedules, notes: list[str]) -> list[Unit]:
    """One fused unit for the layers `idx`; if they do not compile as one, each half so."""
    if len(idx) < 2:
        return [singles[j] for j in idx]
    sizes = {v.buffer or v.name: v.nbytes for v in graph.values.values()}
    group = _group(graph, [graph.layers[j] for j in idx], sizes, target)
    unit, why = _fused_unit(graph, target, group, idx, singles, schedules)
    notes.append(f"{'fused' if unit else 'not fused'} {group.reason(target)}{why}")
    if unit is not None:
        return [unit]
    mid = len(idx) // 2
    return _fuse_run(graph, target, idx[:mid], singles, schedules, notes) + _fuse_run(
        graph, target, idx[mid:], singles, schedules, notes
    )


def _fused_unit(graph, target, group, idx, singles, schedules) -> tuple[Unit | None, str]:
    if not group.fits:
        return None, ""
    if any(schedules[j] is None for j in idx):
        return None, "; a layer has no schedule to replay (the kernel default)"
    layers = [graph.layers[j] for j in idx]
    try:
        merged = merge(graph, layers, target.name)
        alone = [
            (verify_program(lay.program(target.name)), schedules[j])
            for lay, j in zip(layers, idx, strict=True)
        ]
        sched = fused_schedule(merged, alone, target)
        compiled = compile_scheduled(merged.program, target, sched)
    except TensorgenError as err:
        return None, f"; {err}"
    bindings = {}
    for k, j in enumerate(idx):
        for port, buf in singles[j].bindings.items():
            tensor = merged.names[k][port]
            if tensor not in merged.intermediates:
                bindings[tensor] = buf
    binary = decode(encode(compiled.binary))
    fused, alone_cycles = (
        _cycles(binary, target),
        sum(_cycles(singles[j].binary, target) for j in idx),
    )
    if fused > alone_cycles:  # DRAM bytes and energy are always lower: cycles must not rise
        return None, f"; {fused} cycles fused against {alone_cycles} layer by layer"
    return Unit(
        idx, binary, bindings, compiled.macs, "fused"
    ), f"; {fused} cycles, {alone_cycles} layer by layer"


def _cycles(binary: Binary, target: Target) -> int:
    """The simulated cycles of one unit alone, on zeros (its timing does not depend on values)."""
    zeros = {
        t.name: np.zeros(t.shape, np.dtype(t.dtype)) for t in binary.tensors if t.role == "input"
    }
    return simulate(binary, zeros, target).stats.cycles
