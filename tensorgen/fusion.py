"""Fusion of a model's layers: the groups, one program for each, and what fusing saves.

A group is a run of consecutive layers (in the graph's order) that keeps on chip every
activation it both writes and reads: such an activation must be read by no layer outside the
group, be no model output and be read as it was written (not through a flatten or a reshape).
An activation it writes that a later unit reads is its output; a model value that several of
its layers read (the block input of a residual block: the expand conv and the add) is loaded
once. Fused into one program, the layers run one after another, the kept activations staged
whole in the scratchpad, never in DRAM. `fusion_groups` finds the groups greedily, each the
longest run from its first layer whose kept activations fit WHOLE_SHARE of the scratchpad (the
rest is for the layers' own tiles; the lowering checks the real capacities); `fuse_units`
compiles each (the layers' own schedules replayed on the merged program) and keeps it if its
cycles are no higher than its layers' alone, else tries two parts, split where both are groups.
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
    live_bytes: int  # the largest set of activations live at once in the group's order
    fits: bool  # what the group keeps whole (intermediates and shared inputs) fits the scratchpad
    shared: tuple[str, ...] = ()  # the group's inputs that several of its layers read
    shared_bytes: int = 0  # their bytes, once each: loaded once, not once per reader

    extra_reads: int = 0  # bytes layer by layer loads beyond the first read of each value

    @property
    def saved_dram_bytes(self) -> int:
        """Layer by layer, every intermediate is stored once and loaded once per reader, and a
        shared input loaded once per reader (fused: once)."""
        return 2 * self.intermediate_bytes + self.extra_reads

    @property
    def whole_bytes(self) -> int:
        """What the group keeps in the scratchpad from its first layer to its last."""
        return self.intermediate_bytes + self.shared_bytes

    def reason(self, target: Target) -> str:
        pj = self.saved_dram_bytes * dict(target.energy.dram_pj_per_byte)[target.dram_interface]
        room = "fits" if self.fits else "does not fit"
        shared = f"; {', '.join(self.shared)} loaded once" if self.shared else ""
        return (
            f"{' -> '.join(self.layers)}: {', '.join(self.intermediates)} read inside the "
            f"group only{shared}; {self.saved_dram_bytes} DRAM bytes ({pj / 1e3:.1f} nJ) saved; "
            f"{self.whole_bytes} B kept whole (the largest live set {self.live_bytes} B) {room} "
            f"the {target.spad.bytes} B scratchpad"
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


class _Uses:
    """Who writes and who reads each activation buffer of a graph, and as what view."""

    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        self.writer: dict[str, int] = {}
        self.readers: dict[str, list[int]] = {}
        self.views: dict[tuple[int, str, str], set[tuple]] = {}  # (layer, role, buf) -> views
        for i, layer in enumerate(graph.layers):
            for p in layer.ports:
                if p.value is None or p.const is not None or p.role not in ("input", "output"):
                    continue
                buf = _buffer(graph, p.value)
                self.views.setdefault((i, p.role, buf), set()).add((tuple(p.shape), p.dtype))
                if p.role == "output":
                    self.writer[buf] = i
                elif i not in self.readers.setdefault(buf, []):
                    self.readers[buf].append(i)
        self.public = {_buffer(graph, v.name) for v in graph.inputs + graph.outputs}
        self.sizes = {v.buffer or v.name: v.nbytes for v in graph.values.values()}

    def inner(self, a: int, b: int) -> list[str] | None:
        """The buffers that layers a..b (inclusive) would keep on chip, or None if the range is
        no group: a buffer it writes and reads must be read by none outside it, be no model
        input or output, and be read as it is written (not through a flatten or a reshape)."""
        out = []
        for buf, w in self.writer.items():
            if not a <= w <= b:
                continue
            readers = self.readers.get(buf, [])
            if not any(a <= r <= b for r in readers):
                continue
            written = self.views[(w, "output", buf)]
            if (
                buf in self.public
                or not all(a < r <= b for r in readers)
                or len(written) != 1
                or any(self.views[(r, "input", buf)] != written for r in readers)
            ):
                return None
            out.append(buf)
        return out

    def shared(self, a: int, b: int) -> list[str]:
        """The buffers from outside layers a..b that two or more of them read, as one view."""
        out = []
        for buf, readers in self.readers.items():
            if a <= self.writer.get(buf, -1) <= b:
                continue
            inside = [r for r in readers if a <= r <= b]
            views = {v for r in inside for v in self.views[(r, "input", buf)]}
            if len(inside) > 1 and len(views) == 1:
                out.append(buf)
        return out

    def kept(self, a: int, b: int) -> int:
        """The bytes layers a..b would keep whole: what they write and read, and share."""
        inside = [
            buf
            for buf, w in self.writer.items()
            if a <= w <= b and any(a <= r <= b for r in self.readers.get(buf, []))
        ]
        return sum(self.sizes.get(buf, 0) for buf in inside + self.shared(a, b))

    def live(self, a: int, b: int, inner: list[str]) -> int:
        """The largest set of activations live at once while layers a..b run in order: each
        layer's inputs and outputs, and the intermediates written before it and read after."""
        best = 0
        for i in range(a, b + 1):
            now = _activations(self.graph, self.graph.layers[i], "input") | _activations(
                self.graph, self.graph.layers[i], "output"
            )
            now |= {buf for buf in inner if self.writer[buf] < i < max(self.readers[buf])}
            best = max(best, sum(self.sizes.get(buf, 0) for buf in now))
        return best

    def group(self, a: int, b: int, target: Target) -> Group | None:
        inner = self.inner(a, b)
        if inner is None or b <= a:
            return None
        shared = self.shared(a, b)
        reads = sum(
            self.sizes.get(buf, 0) * (len([r for r in self.readers[buf] if a <= r <= b]) - 1)
            for buf in inner + shared
        )
        whole = sum(self.sizes.get(buf, 0) for buf in inner + shared)
        return Group(
            tuple(self.graph.layers[i].name for i in range(a, b + 1)),
            tuple(inner),
            sum(self.sizes.get(buf, 0) for buf in inner),
            self.live(a, b, inner),
            whole <= WHOLE_SHARE * target.spad.bytes,
            tuple(shared),
            sum(self.sizes.get(buf, 0) for buf in shared),
            reads,
        )


# what a group may keep whole in the scratchpad: the rest is for its layers' own tiles
WHOLE_SHARE = 0.75


def fusion_groups(graph: Graph, target: Target) -> list[Group]:
    """The groups of consecutive layers, greedily from the first: each the longest run from its
    first layer that keeps every value it writes and reads on chip and fits the scratchpad."""
    uses, groups, a = _Uses(graph), [], 0
    n = len(graph.layers)
    while a < n:
        best = None
        for b in range(a + 1, n):
            if uses.kept(a, b) > WHOLE_SHARE * target.spad.bytes:
                break  # it only grows with b
            group = uses.group(a, b, target)
            if group is not None:
                best = (b, group)
        if best is None:
            a += 1
            continue
        groups.append(best[1])
        a = best[0] + 1
    return groups


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
    shared: frozenset[str] = frozenset()  # input ports that several layers read: staged whole

    @property
    def whole(self) -> frozenset[str]:
        """The tensors staged whole in the scratchpad, not by their layers' own schedules."""
        return self.intermediates | self.shared


def merge(graph: Graph, layers: list[Layer], target: str) -> Merged:
    """The op.yaml of `layers` in one: each layer's tensors renamed `<name>_<i>`, an activation
    that a layer writes and later layers read one temporary (its readers' pad), never a port,
    and a model value that several layers read (as one view) one input port, loaded once."""
    names, decls, inner, shared = _ports(graph, layers)
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
    return Merged(program, tuple(names), frozenset(inner), tuple(offsets), frozenset(shared))


def _ports(graph: Graph, layers: list[Layer]):
    """merge's tensors: each layer's port -> tensor map, the tensors' declarations, and the
    tensors kept on chip (written and read inside) and shared (one input several layers read)."""
    names: list[dict[str, str]] = []
    decls: dict[str, dict] = {}
    inner: set[str] = set()
    shared: set[str] = set()
    made: dict[str, str] = {}  # buffer -> the tensor of the layer that wrote it
    seen: dict[str, str] = {}  # buffer -> the input port that reads it from outside
    padded: dict[str, int] = {}  # tensor -> the pad its readers read it with
    for i, layer in enumerate(layers):
        rename = {}
        for p in layer.ports:
            buf = _buffer(graph, p.value) if p.value is not None and p.const is None else None
            have = made.get(buf, seen.get(buf)) if p.role == "input" else None
            if (
                have is not None
                and decls[have]["shape"] == list(p.shape)
                and (decls[have]["dtype"] == p.dtype)
            ):
                # the pad is the readers' (a producer's port carries its zero point, which
                # means nothing for a tensor it writes): a pad of 0 counts too -- max pooling
                # of uint8 pads with 0, and a zero point there would beat every real element
                if padded.setdefault(have, int(p.pad)) != int(p.pad):
                    raise FusionError(f"{layer.name} reads {buf} with another pad")
                decls[have]["pad"] = int(p.pad)
                if buf in made:
                    decls[have].pop("role", None)
                    inner.add(have)
                else:
                    shared.add(have)
                rename[p.name] = have
                continue
            if p.role == "input" and buf in made:
                raise FusionError(f"{layer.name} reads {buf} as another shape")
            tensor = f"{p.name}_{i}"
            decl = {"shape": list(p.shape), "dtype": p.dtype}
            if p.role != "none":
                decl["role"] = p.role
            if p.pad:
                decl["pad"] = int(p.pad)
            decls[tensor] = decl
            rename[p.name] = tensor
            if p.role == "output" and buf is not None:
                made[buf] = tensor
            elif p.role == "input" and buf is not None:
                seen.setdefault(buf, tensor)
                padded[tensor] = int(p.pad)
        names.append(rename)
    return names, decls, inner, shared


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
    program, the layers one after another; the intermediates are not staged by them (each is
    kept whole in the scratchpad, where the producer writes it and its readers read it: never in
    DRAM), nor an input several layers read (staged whole: loaded once).
    Replayed unchecked: the lowering's verify_schedule checks the result once against the
    dependences, and its buffer plan the capacities (a group whose layers' buffers do not fit
    together is refused there)."""
    # no target: the replay skips the capacity check of every step (each one recomputes every
    # staged box of the whole group: quadratic in its layers); the lowering's buffer plan
    # checks the real capacities once
    fused = Schedule(merged.program, None, checked=False)
    for tensor, layout in _layouts(merged, alone).items():
        fused.stage(tensor, None, "spad", layout=layout)
    for i, (program, trace) in enumerate(alone):
        rename, offset = merged.names[i], merged.offsets[i]
        stmt = {s.name: f"S{offset + k}" for k, s in enumerate(program.statements)}
        mirror = Schedule(program, None, checked=False)
        handles = {}
        for s in program.statements:
            for a, b in zip(mirror.loops(s.name), fused.loops(stmt[s.name]), strict=True):
                handles[a.name] = b
        for step in trace:
            if step.primitive in ("stage", "double_buffer") and (
                rename[step.args[0]] in merged.whole
            ):
                continue
            kwargs = dict(step.kwargs)
            got = getattr(mirror, step.primitive)(*_args(step.args, mirror.loop, None), **kwargs)
            args = _args(step.args, handles.__getitem__, {**rename, **stmt})
            made = getattr(fused, step.primitive)(*args, **kwargs)
            for a, b in zip(_loops(got), _loops(made), strict=True):
                handles[a.name] = b
        # the layer's rows shared with the others' (each layer's split made a row for all):
        # isl's AST of the group, its checks and the next layer's steps see a few dimensions
        fused.pack()
    return fused  # compile_scheduled's verify_schedule checks it against the dependences


def _layouts(merged: Merged, alone: list[tuple[Program, tuple]]) -> dict[str, object]:
    """Each tensor kept whole's layout on chip: the one its first reader staged it with (a
    channels-last input that folds a small kernel into the MAC array's K), not its writer's;
    else the tensor's own."""
    layouts: dict[str, object] = {}
    for i, (_, trace) in enumerate(alone):
        for step in trace:
            tensor = merged.names[i].get(step.args[0]) if step.args else None
            if step.primitive != "stage" or tensor not in merged.whole or tensor in layouts:
                continue
            if tensor in merged.intermediates and tensor.endswith(f"_{i}"):
                continue  # the writer's own staging of its output
            layout = dict(step.kwargs).get("layout")
            layouts[tensor] = None if layout is None else tuple(layout)
    return {t: layouts.get(t) for t in sorted(merged.whole)}


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
    uses, units, notes, start = _Uses(graph), [], [], {}
    for group in fusion_groups(graph, target):
        first = next(k for k, lay in enumerate(graph.layers) if lay.name == group.layers[0])
        start[first] = group
    cycles: dict[int, int] = {}  # a single layer's simulated cycles, once each
    run = _Run(graph, target, uses, singles, schedules, notes, cycles)
    i = 0
    while i < len(graph.layers):
        group = start.get(i)
        if group is None:
            units.append(singles[i])
            i += 1
            continue
        units.extend(run.fuse(i, i + len(group.layers) - 1))
        i += len(group.layers)
    return units, notes


@dataclass
class _Run:
    """The fusion of one model's groups: what each try needs."""

    graph: Graph
    target: Target
    uses: _Uses
    singles: list[Unit]
    schedules: list[tuple | None]
    notes: list[str]
    cycles: dict[int, int]
    blamed: int | None = None  # the layer the last refusal named, where to split

    def fuse(self, a: int, b: int) -> list[Unit]:
        """One fused unit for layers a..b; if they do not compile as one, each part so, split
        where both parts are groups (or single layers): before the layer the refusal named
        (after it if it is the first), else nearest the middle."""
        group = self.uses.group(a, b, self.target)
        if group is None:
            return [self.singles[j] for j in range(a, b + 1)]
        self.blamed = None
        unit, why = _fused_unit(self, group, list(range(a, b + 1)))
        self.notes.append(f"{'fused' if unit else 'not fused'} {group.reason(self.target)}{why}")
        if unit is not None:
            return [unit]
        cuts = [m for m in range(a + 1, b + 1) if self._part(a, m - 1) and self._part(m, b)]
        if not cuts:
            return [self.singles[j] for j in range(a, b + 1)]
        blamed = self.blamed if self.blamed is not None and a <= self.blamed <= b else None
        # a cut at m splits before layer m: before the blamed layer, or after it if it is first
        want = a + b + 1 if blamed is None else 2 * max(blamed, a + 1)
        mid = min(cuts, key=lambda m: abs(2 * m - want))
        return self.fuse(a, mid - 1) + self.fuse(mid, b)

    def _part(self, a: int, b: int) -> bool:
        return a == b or self.uses.inner(a, b) is not None

    def alone_cycles(self, j: int) -> int:
        if j not in self.cycles:
            self.cycles[j] = _cycles(self.singles[j].binary, self.target)
        return self.cycles[j]


def _fused_unit(run: _Run, group: Group, idx: list[int]) -> tuple[Unit | None, str]:
    graph, target, singles, schedules = run.graph, run.target, run.singles, run.schedules
    if not group.fits:
        return None, ""
    run.blamed = next((j for j in idx if schedules[j] is None), None)
    if run.blamed is not None:
        return None, "; a layer has no schedule to replay (the kernel default)"
    layers = [graph.layers[j] for j in idx]
    merged = None
    try:
        merged = merge(graph, layers, target.name)
        alone = [
            (verify_program(lay.program(target.name)), schedules[j])
            for lay, j in zip(layers, idx, strict=True)
        ]
        sched = fused_schedule(merged, alone, target)
        compiled = compile_scheduled(merged.program, target, sched)
    except TensorgenError as err:
        run.blamed = None if merged is None else _blame(str(err), merged, idx[0])
        return None, f"; {err}"
    bindings = {}
    for k, j in enumerate(idx):
        for port, buf in singles[j].bindings.items():
            tensor = merged.names[k][port]
            if tensor not in merged.intermediates:
                bindings[tensor] = buf
    binary = decode(encode(compiled.binary))
    fused, alone_cycles = _cycles(binary, target), sum(run.alone_cycles(j) for j in idx)
    if fused > alone_cycles:  # DRAM bytes and energy are always lower: cycles must not rise
        return None, f"; {fused} cycles fused against {alone_cycles} layer by layer"
    return Unit(
        idx, binary, bindings, compiled.macs, "fused"
    ), f"; {fused} cycles, {alone_cycles} layer by layer"


_NAMED = re.compile(r"\bS(\d+)\b|\b[A-Za-z]+_(\d+)\b")


def _blame(message: str, merged: Merged, first: int) -> int | None:
    """The layer (its index in the graph) that the first statement `S<k>` or tensor `<port>_<i>`
    of an error about the merged program names, if any."""
    for m in _NAMED.finditer(message):
        if m.group(1) is not None:
            k = int(m.group(1))
            return first + max(i for i, o in enumerate(merged.offsets) if o <= k)
        if int(m.group(2)) < len(merged.names):
            return first + int(m.group(2))
    return None


def _cycles(binary: Binary, target: Target) -> int:
    """The simulated cycles of one unit alone, on zeros (its timing does not depend on values)."""
    zeros = {
        t.name: np.zeros(t.shape, np.dtype(t.dtype)) for t in binary.tensors if t.role == "input"
    }
    return simulate(binary, zeros, target).stats.cycles
