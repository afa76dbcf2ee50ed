"""Linking separately compiled layers into one program, with DRAM planned by lifetime.

Each layer is compiled on its own into a `Binary` whose tensor table names its inputs, outputs
and spilled temporaries. The linker binds every such tensor to a model-level buffer (an
activation, a weight constant, or the layer's private scratch), gives each buffer a DRAM offset
so that buffers whose lifetimes do not overlap share memory, rewrites the layers' boxes to one
global tensor table, and joins the layers: where two in a row fit the on-chip memories together,
the later one's buffers move to a region disjoint from the earlier one's and its loads of weights
and of activations the earlier one does not store start while the earlier one computes
(`tensorgen.codegen.overlap`); elsewhere a full barrier, after which no queue starts a layer
before every queue has finished the one before.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tensorgen.codegen import overlap as ov
from tensorgen.errors import CodegenError
from tensorgen.mc import isa
from tensorgen.mc.binary import Binary, TensorEntry
from tensorgen.mc.operands import Box

ALIGN = 64
MAX_NAME = 31  # the tensor table's name field holds 32 bytes, NUL-terminated


@dataclass(frozen=True)
class Buffer:
    """A region of DRAM: an activation (by value name), a constant, or a layer's scratch."""

    name: str
    nbytes: int
    role: str  # "input", "output", "temp" or "const"
    data: bytes | None = None  # for "const"


@dataclass(frozen=True)
class LinkLayer:
    name: str  # for tensor table names and messages
    binary: Binary
    bindings: dict[str, str]  # the layer's tensor name -> buffer name; unbound tensors are scratch


@dataclass(frozen=True)
class Placement:
    offsets: dict[str, int]
    peak_bytes: int  # DRAM the activations and scratch need with lifetimes shared
    total_bytes: int  # what they would need each in their own region
    const_bytes: int


@dataclass
class Linked:
    binary: Binary
    placement: Placement
    layer_ranges: list[tuple[int, int]] = field(default_factory=list)  # code words of each layer
    apart: list[frozenset[str]] = field(default_factory=list)  # per boundary: memories kept apart
    early_loads: int = 0  # LOADs (static) that may start while the unit before computes
    onchip: dict[str, int] | None = None  # the memories overlapped in; None: barriers only

    @property
    def overlapped(self) -> list[bool]:
        """Per boundary between two units: whether they overlap (no full barrier there)."""
        return [ov.overlaps(a) for a in self.apart]

    @property
    def overlaps(self) -> int:
        """How many unit boundaries overlap (of len(layer_ranges) - 1)."""
        return sum(self.overlapped)


def plan_dram(buffers: dict[str, Buffer], lifetimes: dict[str, tuple[int, int]]) -> Placement:
    """Offsets for every buffer: constants first, each in its own region; then activations and
    scratch by first fit, largest first, sharing addresses with buffers whose [first, last] layer
    intervals do not intersect (the interval-graph packing of TFLite's and TVM's memory planners)."""
    offsets: dict[str, int] = {}
    top = 0
    for b in buffers.values():
        if b.role == "const":
            offsets[b.name] = top
            top += _align(b.nbytes)
    const_bytes = top
    placed: list[tuple[int, int, int, int]] = []  # (offset, end, first, last)
    order = sorted(
        (b for b in buffers.values() if b.role != "const"), key=lambda b: (-b.nbytes, b.name)
    )
    for b in order:
        first, last = lifetimes[b.name]
        busy = sorted((o, e) for o, e, f, end in placed if not (end < first or last < f))
        at = 0
        for o, e in busy:
            if at + _align(b.nbytes) <= o:
                break
            at = max(at, e)
        offsets[b.name] = const_bytes + at
        placed.append((at, at + _align(b.nbytes), first, last))
    peak = max((e for _, e, _, _ in placed), default=0)
    total = sum(_align(b.nbytes) for b in buffers.values() if b.role != "const")
    return Placement(offsets, peak, total, const_bytes)


def link(
    layers: list[LinkLayer],
    buffers: dict[str, Buffer],
    public: dict[str, str],
    target_name: str,
    target_hash: bytes,
    onchip: dict[str, int] | None = None,
) -> Linked:
    """One binary running `layers` in order. `public` names the model's inputs and outputs: buffer
    name -> the name the tensor table shows (what `tensorgen run` reads and writes). `onchip`:
    each on-chip memory's size in bytes, to overlap the layers that fit it in pairs
    (`tensorgen.codegen.overlap`); None puts a full barrier between every two."""
    used = [_referenced(layer.binary) for layer in layers]
    buffers, lifetimes = _bind(layers, buffers, used)
    shifts, apart = ov.place([ov.footprint(lay.binary.code) for lay in layers], onchip)
    placement = plan_dram(buffers, _widened(lifetimes, [ov.overlaps(a) for a in apart]))
    table = _Table()
    units = []
    for i, layer in enumerate(layers):
        index = table.layer_index(layer, i, used[i], buffers, public, placement)
        units.append(ov.relocate([_rebind(ins, index) for ins in layer.binary.code], shifts[i]))
    code, ranges, early = _join(units, apart, table.entries)
    dram = placement.const_bytes + placement.peak_bytes
    binary = Binary(
        target_name, target_hash, tuple(table.entries), tuple(code), dram, bytes(table.constants)
    )
    return Linked(binary, placement, ranges, apart, early, onchip)


def _join(
    units: list[list[isa.Instruction]], apart: list[frozenset[str]], tensors: list[TensorEntry]
) -> tuple[list[isa.Instruction], list[tuple[int, int]], int]:
    """The units' code in order with what goes between each two (`ov.handover` and the early
    loads where they overlap, else `ov.barrier`); each unit's code range; the early LOADs."""
    overlapped = [ov.overlaps(a) for a in apart]
    pieces, drains = list(units), [[] for _ in units]
    for i, joined in enumerate(overlapped):
        if joined:
            pieces[i], drains[i] = ov.without_drains(pieces[i])
    early = 0
    for i, joined in enumerate(overlapped):
        if joined:
            stored = _stored(units[i], tensors)
            pieces[i + 1], n = ov.early_loads(
                pieces[i + 1],
                drains[i],
                lambda ins, stored=stored: _reads(ins, stored, tensors),
                apart[i],
            )
            early += n
    code: list[isa.Instruction] = []
    ranges = []
    for i, piece in enumerate(pieces):
        if i:
            code.extend(ov.handover() if overlapped[i - 1] else ov.barrier())
        ranges.append((len(code), len(code) + len(piece)))
        code.extend(piece)
    return code, ranges, early


def _widened(
    lifetimes: dict[str, tuple[int, int]], overlapped: list[bool]
) -> dict[str, tuple[int, int]]:
    """Lifetimes for the DRAM plan, a buffer last used by a unit that the next one overlaps kept
    through the next one too: the next one's stores may run while its last reads do."""
    out = {}
    for name, (first, last) in lifetimes.items():
        if last < len(overlapped) and overlapped[last]:
            last += 1
        out[name] = (first, last)
    return out


def _stored(code: list[isa.Instruction], tensors: list[TensorEntry]) -> list[tuple[int, int]]:
    """The DRAM byte ranges of the tensors `code` stores into."""
    out = set()
    for ins in code:
        if ins.mnemonic == "STORE":
            t = tensors[ins.arg("dst").tensor]
            out.add((t.dram_offset, t.dram_offset + t.nbytes))
    return sorted(out)


def _reads(ins: isa.Instruction, stored: list[tuple[int, int]], tensors: list[TensorEntry]) -> bool:
    """Whether LOAD `ins` reads a tensor that overlaps one of the `stored` DRAM ranges."""
    t = tensors[ins.arg("src").tensor]
    lo, hi = t.dram_offset, t.dram_offset + t.nbytes
    return any(s < hi and lo < e for s, e in stored)


def _bind(
    layers: list[LinkLayer], buffers: dict[str, Buffer], used: list[set[int]]
) -> tuple[dict[str, Buffer], dict[str, tuple[int, int]]]:
    """The buffers the layers use, with a private one for each temporary a layer spilled, and
    the [first, last] layer each is live in: what the DRAM plan packs. A tensor bound to a buffer
    must fit it; a buffer no layer touches is dropped."""
    buffers = dict(buffers)
    lifetimes: dict[str, tuple[int, int]] = {}
    for i, layer in enumerate(layers):
        for k, t in enumerate(layer.binary.tensors):
            name = layer.bindings.get(t.name)
            if name is None and k not in used[i]:
                continue  # a temporary the layer keeps on chip: no DRAM at all
            if name is None:  # a temporary the layer spilled: private to it
                name = f"{layer.name}/{t.name}"
                buffers[name] = Buffer(name, t.nbytes, "temp")
            elif name not in buffers:
                raise CodegenError(
                    f"layer {layer.name}: tensor {t.name} bound to unknown buffer {name}"
                )
            elif t.nbytes > buffers[name].nbytes:
                raise CodegenError(
                    f"layer {layer.name}: tensor {t.name} ({t.nbytes} B) does not fit buffer "
                    f"{name} ({buffers[name].nbytes} B)"
                )
            first, last = lifetimes.get(name, (i, i))
            lifetimes[name] = (min(first, i), max(last, i))
    for name, b in list(buffers.items()):
        if b.role in (
            "input",
            "output",
        ):  # live for the whole program: the host reads and writes them
            lifetimes[name] = (0, len(layers) - 1)
        elif name not in lifetimes:  # no layer touches it (a value a fused epilogue kept on chip)
            del buffers[name]
    return buffers, lifetimes


@dataclass
class _Table:
    """The linked binary's tensor table and constant section, grown layer by layer: a model
    input or output, and each constant, appear once however many layers address them."""

    entries: list[TensorEntry] = field(default_factory=list)
    constants: bytearray = field(default_factory=bytearray)
    const_at: dict[str, tuple[int, int]] = field(default_factory=dict)  # offset, bytes

    def layer_index(
        self,
        layer: LinkLayer,
        i: int,
        used: set[int],
        buffers: dict[str, Buffer],
        public: dict[str, str],
        placement: Placement,
    ) -> list[int]:
        """For each tensor of layer `i`'s own table, its index in the linked table (-1 for one
        the layer never addresses in DRAM)."""
        index = []
        for k, t in enumerate(layer.binary.tensors):
            if t.name not in layer.bindings and k not in used:
                index.append(-1)  # never addressed
                continue
            name = layer.bindings.get(t.name, f"{layer.name}/{t.name}")
            b = buffers[name]
            role = b.role
            entry_name = (
                public.get(name) if role in ("input", "output") else _short(layer.name, t.name, i)
            )
            offset = placement.offsets[name]
            if b.role == "const":
                coff, cbytes = self.constant(name, b)
                entry = TensorEntry(
                    entry_name, t.dtype, t.shape, "const", offset, t.pad, coff, cbytes
                )
            else:
                entry = TensorEntry(entry_name, t.dtype, t.shape, role, offset, t.pad)
            index.append(_intern(self.entries, entry))
        return index

    def constant(self, name: str, b: Buffer) -> tuple[int, int]:
        """Where constant buffer `name`'s bytes sit in the constant section (offset, length),
        appended the first time, padded to 8 bytes."""
        if name not in self.const_at:
            self.const_at[name] = (len(self.constants), len(b.data))
            self.constants += b.data + bytes(-len(b.data) % 8)
        return self.const_at[name]


def barrier() -> list[isa.Instruction]:
    """SYNCs after which every queue's next instruction starts after every queue's last one."""
    return ov.barrier()


def _intern(entries: list[TensorEntry], entry: TensorEntry) -> int:
    """The index of `entry` in the table; the model's inputs and outputs appear once."""
    if entry.role in ("input", "output"):
        for i, e in enumerate(entries):
            if e.name == entry.name:
                if (e.dtype, e.shape, e.dram_offset) != (
                    entry.dtype,
                    entry.shape,
                    entry.dram_offset,
                ):
                    break
                return i
    entries.append(entry)
    return len(entries) - 1


def _referenced(binary: Binary) -> set[int]:
    """The tensors a binary's DMAs address."""
    return {v.tensor for ins in binary.code for _, v in ins.args if isinstance(v, Box)}


def _rebind(ins: isa.Instruction, index: list[int]) -> isa.Instruction:
    if not any(isinstance(v, Box) for _, v in ins.args):
        return ins
    args = tuple(
        (k, Box(index[v.tensor], v.origin, v.shape) if isinstance(v, Box) else v)
        for k, v in ins.args
    )
    return isa.Instruction(ins.mnemonic, args, ins.wait, ins.signal)


def _short(layer: str, tensor: str, i: int) -> str:
    name = f"{layer}.{tensor}"
    return name if len(name) <= MAX_NAME else f"L{i}.{tensor}"[:MAX_NAME]


def _align(n: int) -> int:
    return -(-n // ALIGN) * ALIGN
