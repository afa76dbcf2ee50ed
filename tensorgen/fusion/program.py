"""One program for a fused group: its layers' op.yaml merged, their schedules replayed on it
(tile-level: the layers before the tile layer per band of its rows, tiled.py)."""

from __future__ import annotations

import itertools
import json
import math
import re
from dataclasses import dataclass, replace
from functools import lru_cache

from tensorgen.errors import TensorgenError
from tensorgen.frontend.fx import Graph
from tensorgen.frontend.layers import Layer
from tensorgen.fusion.tiled import Tile, is_row_loop, restage, tile_group
from tensorgen.inputs import LIMITS
from tensorgen.ir.core import Access, BinOp, Call, Program, Read, Tensor
from tensorgen.schedule.api import Schedule
from tensorgen.schedule.state import Loop
from tensorgen.schedule.steps import LoopRef
from tensorgen.spec.loader import parse_program
from tensorgen.spec.statement import name_problem
from tensorgen.target import Target


def _buffer(graph: Graph, value: str) -> str:
    v = graph.values.get(value)
    return v.buffer if v is not None and v.buffer else value


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
    items = [_items(layer, rename) for layer, rename in zip(layers, names, strict=True)]
    offsets = tuple(itertools.accumulate((len(x) for x in items[:-1]), initial=0))
    where = f"<fused {' + '.join(layer.name for layer in layers)}>"
    program = _renamed_program(layers, names, decls, items, target, where)
    if program is None:  # what the loader refuses, it refuses with its own message
        program = parse_program(merged_text(layers[0].name, decls, items, target), where, target)
    return Merged(program, tuple(names), frozenset(inner), offsets, frozenset(shared))


def _items(layer: Layer, rename: dict[str, str]) -> list:
    """The op.yaml statements of `layer` (str or {stmt, where}), its tensors renamed."""
    out = []
    for st in layer.body(layer.lo, layer.hi):
        text = st if isinstance(st, str) else st["stmt"]
        text = _REF.sub(lambda m, r=rename: r.get(m.group(1), m.group(1)), text)
        out.append(text if isinstance(st, str) else {**st, "stmt": text})
    return out


def merged_text(name: str, decls: dict[str, dict], items: list[list], target: str) -> str:
    """The op.yaml of a group: its tensors `decls` and its layers' statements `items`."""
    lines = ["tensorgen: 1", f"name: {name}_fused", "tensors:"]
    lines += [f"  {t}: {_flow(d)}" for t, d in decls.items()]
    lines.append("statements:")
    lines += [f"  - {_flow(item)}" for layer in items for item in layer]
    lines += [f"target: {target}", "schedule: auto"]
    return "\n".join(lines) + "\n"


def _renamed_program(layers, names, decls, items, target: str, where: str) -> Program | None:
    """The program the loader makes of merged_text, built from the layers' own programs (each
    parsed once, when it was compiled alone) with their tensors renamed: the same statements,
    bounds, texts and locations. None where the loader could refuse it (a limit of InputLimits,
    a name) or where a renamed name is also an index: then the text is parsed."""
    tensors = tuple(
        Tensor(t, tuple(d["shape"]), d["dtype"], d.get("role", "none"), d.get("pad", 0))
        for t, d in decls.items()
    )
    count = sum(len(x) for x in items)
    if (
        count > LIMITS.statements
        or any(name_problem(t.name, "tensor") for t in tensors)
        or sum(t.nbytes for t in tensors) > LIMITS.dram_bytes
        or any(math.prod(t.shape) > LIMITS.tensor_elements for t in tensors)
        or not any(t.role == "output" for t in tensors)
    ):
        return None
    statements = []
    line = 5 + len(decls)  # merged_text's first statement
    for layer, rename, texts in zip(layers, names, items, strict=True):
        own = layer.program(target).statements
        for st, item in zip(own, texts, strict=True):
            if any(i in rename for i in st.indices):
                return None
            text = item if isinstance(item, str) else item["stmt"]
            col = len("  - ") + 2 if isinstance(item, str) else len(_stmt_prefix(item)) + 2
            statements.append(
                replace(
                    st,
                    name=f"S{len(statements)}",
                    lhs=_renamed(st.lhs, rename),
                    rhs=_renamed(st.rhs, rename),
                    text=text,
                    location=f"{where}:{line + len(statements)}:{col}",
                )
            )
    name = f"{layers[0].name}_fused"
    if not name.isprintable() or len(name) > 128:
        return None
    return Program(name, tensors, tuple(statements), (), target, "auto", where)


def _stmt_prefix(item: dict) -> str:
    """A statement mapping's op.yaml line up to its `stmt` value's opening quote."""
    before = []
    for k, v in item.items():
        if k == "stmt":
            break
        before.append(f"{k}: {_flow(v)}")
    return "  - {" + "".join(f"{b}, " for b in before) + "stmt: "


def _renamed(x, rename: dict[str, str]):
    """An access or expression of a layer's statement with its tensors renamed."""
    if isinstance(x, Access):
        return replace(x, tensor=rename.get(x.tensor, x.tensor))
    if isinstance(x, Read):
        return Read(_renamed(x.access, rename))
    if isinstance(x, Call):
        return Call(x.fn, tuple(_renamed(a, rename) for a in x.args))
    if isinstance(x, BinOp):
        return BinOp(x.op, _renamed(x.lhs, rename), _renamed(x.rhs, rename))
    return x


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
def fused_schedule(
    merged: Merged, alone: list[tuple[Program, tuple]], target: Target, tile: Tile | None = None
):
    """Every layer's schedule (the automatic scheduler's, by its trace) replayed on the merged
    program, the layers one after another; the intermediates are not staged by them (each is
    kept whole in the scratchpad, where the producer writes it and its readers read it: never in
    DRAM), nor an input several layers read (staged whole: loaded once).
    Replayed unchecked: the lowering's verify_schedule checks the result once against the
    dependences, and its buffer plan the capacities (a group whose layers' buffers do not fit
    together is refused there)."""
    # no target: the replay skips the capacity check of every step (each one recomputes every
    # staged box of the whole group: quadratic in its layers); the lowering's buffer plan
    # checks the real capacities once. Nor the parallel check of each band (over the whole
    # group's dependences): the lowering's verify_schedule checks every band once
    # a kept halo's producer (kept.py) runs its statements twice (the first band, the others):
    # the inputs both read (its weights) staged whole, not by its schedule at a loop of one
    merged = replace(merged, shared=merged.shared | _read_twice(merged, alone))
    fused = Schedule(merged.program, None, checked=False, bands=False)
    banded = tile.banded if tile is not None else frozenset()
    layouts = _layouts(merged, alone)
    for tensor, layout in layouts.items():
        if tensor not in banded:
            fused.stage(tensor, None, "spad", layout=layout)
    carries = merged.program.meta.get("carries", {})
    for carry, tensor in carries.items():  # kept halos (kept.py): in the layout of their band's
        fused.stage(carry, None, "spad", layout=layouts.get(tensor))
    deferred: list[tuple[str, Loop, str, bool]] = []
    written = {st.lhs.tensor for st in merged.program.statements}
    for i, (program, trace) in enumerate(alone):
        moved = tile is not None and i < tile.layer
        # a layer that runs per band already (recompute.py) keeps its blocks of rows: only its
        # inputs move to the band loop, their rows loaded once per band, not once per block
        inputs = written if tile is not None and tile.rows is not None else None
        for at, rename in _copies_of(merged, i):  # a kept halo's first band: its own statements
            _replay(
                fused, merged, i, program, trace, deferred if moved else None, inputs, at, rename
            )
            # the layer's rows shared with the others' (each layer's split made a row for all):
            # isl's AST of the group, its checks and the next layer's steps see a few dimensions
            fused.pack()
    _vectorize_copies(fused)
    if tile is not None:  # the layers before the tile layer run per band of its rows
        moved = [f"S{k}" for k in range(merged.offsets[tile.layer])]
        if tile.rows is not None:  # a band's buffers in the layout their readers chose
            layouts = {
                t: None if lay is None else _layout(fused.program, t, lay)
                for t, lay in layouts.items()
            }
        else:
            layouts = {}
        band = tile_group(fused, tile, f"S{merged.offsets[tile.layer]}", moved, layouts)
        restage(fused, band, deferred)
    return fused  # compile_scheduled's verify_schedule checks it against the dependences


def _vectorize_copies(fused: Schedule) -> None:
    """The copies of kept halos (kept.py; in no layer's trace) as vector instructions: one per
    channel, its carried rows and columns one vector."""
    shared = set(fused.program.shared_names)
    for name in fused.program.meta.get("copies", ()):
        own = [lp for lp in fused.loops(name) if lp.name not in shared]
        if own:
            fused.vectorize(*own[-COPY_VECTOR_DIMS:])


# how many of a copy's innermost loops one vector instruction runs
COPY_VECTOR_DIMS = 2


def _copies_of(merged: Merged, i: int) -> list[tuple[int, dict[str, str]]]:
    """Where layer i's statements start in the merged program and its tensors there: once, or
    (a kept halo's producer, kept.py) its first band's and then its other bands'."""
    meta = merged.program.meta
    if i not in meta.get("steady", {}):
        return [(merged.offsets[i], merged.names[i])]
    first = {port: meta["firsts"].get(t, t) for port, t in merged.names[i].items()}
    steady = {port: meta["steadies"].get(t, t) for port, t in merged.names[i].items()}
    return [(merged.offsets[i], first), (meta["steady"][i], steady)]


def _own_layout(merged: Merged, alone: list, tensor: str):
    """The layout the first layer that stages `tensor` gives it (None: the tensor's own)."""
    for i, (_, trace) in enumerate(alone):
        for step in trace:
            if step.primitive == "stage" and merged.names[i].get(step.args[0]) == tensor:
                layout = dict(step.kwargs).get("layout")
                return None if layout is None else tuple(layout)
    return None


def _read_twice(merged: Merged, alone: list) -> frozenset[str]:
    """The inputs of a kept halo's producers (kept.py) that both their copies read, and those
    only the first band reads (staged whole, their box is the first band's: loaded once)
    unless their layer stages them in a layout of its own (a stem's input channels-last for its
    MAC array's K: staged as the layer does, per band, its box loaded in every band)."""
    meta, out = merged.program.meta, set()
    aliased = set(meta.get("firsts", {}))
    for t, first in meta.get("firsts", {}).items():
        if merged.program.tensor(t).role == "input" and _own_layout(merged, alone, t) is None:
            out.add(first)
    for i in meta.get("steady", {}):
        for t in merged.names[i].values():
            role = merged.program.tensor(t).role
            if t not in aliased and t not in merged.whole and role == "input":
                out.add(t)
    return frozenset(out)


def _replay(
    fused: Schedule,
    merged: Merged,
    i: int,
    program: Program,
    trace,
    deferred,
    written=None,
    offset: int | None = None,
    rename: dict[str, str] | None = None,
) -> None:
    """Layer i's trace replayed on the fused schedule; with `deferred` (a layer moved into a
    band), its stagings at a loop over rows are kept there (tensor, loop, memory, double) for
    `restage`: that loop has one iteration per band, where no buffer can be placed; with
    `written` too, only those of tensors not in it (the group's inputs). `offset` and `rename`:
    where the layer's statements start and its tensors' names, if not the layer's own (a kept
    halo's producer runs twice: _copies_of)."""
    rename = merged.names[i] if rename is None else rename
    offset = merged.offsets[i] if offset is None else offset
    stmt = {s.name: f"S{offset + k}" for k, s in enumerate(program.statements)}
    start, made_by = _mirror(program, tuple(trace))
    handles = {}
    shared = set(fused.program.shared_names)  # the band loop of recompute.py: not the layer's
    for s, names in zip(program.statements, start, strict=True):
        own = [lp for lp in fused.loops(stmt[s.name]) if lp.name not in shared]
        for a, b in zip(names, own, strict=True):
            handles[a] = b
    late: dict[str, int] = {}
    for step, mirrored in zip(trace, made_by, strict=True):
        tensor = rename.get(step.args[0]) if step.args else None
        if step.primitive in ("stage", "double_buffer") and tensor in merged.whole:
            continue
        if step.primitive == "double_buffer" and tensor in late:
            deferred[late[tensor]] = (*deferred[late[tensor]][:3], True)
            continue
        if (
            deferred is not None
            and step.primitive == "stage"
            and is_row_loop(step.args[1])
            and (written is None or tensor not in written)
        ):
            late[tensor] = len(deferred)
            deferred.append((tensor, handles[step.args[1].name], step.args[2], False))
            continue
        kwargs = dict(step.kwargs)
        if step.primitive == "stage" and kwargs.get("layout") is not None:
            kwargs["layout"] = _layout(fused.program, tensor, kwargs["layout"])
        args = _args(step.args, handles.__getitem__, {**rename, **stmt})
        made = getattr(fused, step.primitive)(*args, **kwargs)
        for a, b in zip(mirrored, _loops(made), strict=True):
            handles[a] = b


@lru_cache(maxsize=256)
def _mirror(program: Program, trace: tuple) -> tuple[tuple[tuple[str, ...], ...], tuple]:
    """A layer's schedule replayed on its own program for its loops alone: the names of each
    statement's loops before it, and of the loops each step makes; what _replay maps to the
    group's loops. Worked out once per layer, whatever groups it is tried in. The annotations
    and the memory steps make no loop and are not replayed (the layer's schedule checked them
    when it was built)."""
    mirror = Schedule(program, None, checked=False)
    start = tuple(tuple(lp.name for lp in mirror.loops(s.name)) for s in program.statements)
    made = []
    for step in trace:
        if step.primitive in _NO_LOOPS:
            made.append(())
            continue
        got = getattr(mirror, step.primitive)(
            *_args(step.args, mirror.loop, None), **dict(step.kwargs)
        )
        made.append(tuple(lp.name for lp in _loops(got)))
    return start, tuple(made)


_NO_LOOPS = frozenset({"vectorize", "tensorize", "stage", "double_buffer"})


def _layout(program: Program, tensor: str, layout) -> tuple[int, ...]:
    """A layer's layout of `tensor` on chip for the fused program, where a tensor that runs
    per band (recompute.py) has the band as an extra first dimension, kept outermost."""
    extra = len(program.tensor(tensor).shape) - len(layout)
    return tuple(range(extra)) + tuple(d + extra for d in layout)


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
