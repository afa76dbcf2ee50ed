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

from dataclasses import dataclass

from tensorgen.frontend.fx import Graph
from tensorgen.frontend.layers import Layer
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
            )
        if joined:
            run.append(i)
            continue
        if len(run) > 1:
            groups.append(_group(graph, [graph.layers[j] for j in run], sizes, target))
        run = [i]
    return groups


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
