"""The fusion groups of a model: runs of consecutive layers that keep on chip every activation
they both write and read (see `tensorgen.fusion`), found from who writes and who reads each
activation buffer."""

from __future__ import annotations

from dataclasses import dataclass

from tensorgen.frontend.fx import Graph
from tensorgen.frontend.layers import Layer
from tensorgen.fusion.program import _buffer
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


def fusion_groups(graph: Graph, target: Target, taken: frozenset[int] = frozenset()) -> list[Group]:
    """The groups of consecutive layers, greedily from the first: each the longest run from its
    first layer that keeps every value it writes and reads on chip and fits the scratchpad, and
    holds no layer of `taken` (fused per band already)."""
    uses, groups, a = _Uses(graph), [], 0
    n = len(graph.layers)
    while a < n:
        best = None
        for b in range(a + 1, n):
            if a in taken or b in taken:
                break
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
