"""The candidate fusion groups of a model: runs of consecutive layers that keep on chip every
activation they write and read, which must then be read by no layer outside the run
(tensorgen/fusion/)."""

from __future__ import annotations

import dataclasses

import torch

from tensorgen.frontend.fx import lower_graph
from tensorgen.frontend.quantize import quantize, quantized_engine
from tensorgen.fusion import fusion_groups
from tensorgen.target import load_target


class _Block(torch.nn.Module):
    """stem -> (expand 1x1 -> relu -> project 1x1) + residual -> head 1x1."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.expand = torch.nn.Conv2d(8, 16, 1)
        self.relu = torch.nn.ReLU()
        self.project = torch.nn.Conv2d(16, 8, 1)
        self.head = torch.nn.Conv2d(8, 4, 1)

    def forward(self, x):
        y = self.stem(x)
        z = self.project(self.relu(self.expand(y)))
        return self.head(y + z)


def _graph(model, inputs):
    with quantized_engine("qnnpack"):
        return lower_graph(quantize(model, inputs, "qnnpack"), inputs, "qnnpack")


def _readers(graph) -> dict[str, set[str]]:
    """The test's own account: which layers read each activation (by its buffer)."""
    out: dict[str, set[str]] = {}
    for layer in graph.layers:
        for p in layer.ports:
            if p.role == "input" and p.value is not None and p.const is None:
                v = graph.values[p.value]
                out.setdefault(v.buffer or v.name, set()).add(layer.name)
    return out


def test_a_residual_block_is_one_group_with_its_input_kept_on_chip() -> None:
    torch.manual_seed(0)
    model, inputs = _Block().eval(), (torch.randn(1, 3, 8, 8),)
    graph = _graph(model, inputs)
    target = load_target("tg1")
    groups = fusion_groups(graph, target)
    # the stem's output is read by expand and by the residual add (folded into project): both
    # in the group, so it stays on chip: the whole model is one group
    assert len(groups) == 1 and len(groups[0].layers) == len(graph.layers), [
        g.layers for g in groups
    ]
    group = groups[0]
    stem = next(layer for layer in graph.layers if layer.path.endswith("stem"))
    assert stem.output.value in group.intermediates
    readers = _readers(graph)
    assert len(readers[stem.output.value]) == 2
    # quantize's 3x8x8, stem's 8x8x8, expand's 16x8x8, the sum's 8x8x8, head's 4x8x8 (int8)
    assert group.intermediate_bytes == (3 + 8 + 16 + 8 + 4) * 8 * 8
    # layer by layer each is stored once and loaded once per reader: the stem's twice
    assert group.saved_dram_bytes == 2 * group.intermediate_bytes + 8 * 8 * 8
    assert group.live_bytes < group.whole_bytes
    assert group.fits and "fits the 262144 B scratchpad" in group.reason(target)


def test_smaller_groups_never_cut_a_value_from_one_of_its_readers() -> None:
    """With a scratchpad too small for the whole block, each group still keeps on chip only
    values all of whose readers it holds; a value read outside is the group's output."""
    torch.manual_seed(0)
    model, inputs = _Block().eval(), (torch.randn(1, 3, 8, 8),)
    graph = _graph(model, inputs)
    tg1 = load_target("tg1")
    small = dataclasses.replace(tg1, spad=dataclasses.replace(tg1.spad, bytes=1024))
    groups = fusion_groups(graph, small)
    assert groups and all(len(g.layers) < len(graph.layers) for g in groups)
    readers = _readers(graph)
    for g in groups:
        assert g.whole_bytes <= 1024, g
        for value in g.intermediates:
            assert readers[value] <= set(g.layers), (value, g.layers)
        # a value written in the group and read by a layer outside it is not kept
        for layer in graph.layers:
            if layer.name in g.layers:
                out = layer.output.value
                if readers.get(out, set()) - set(g.layers):
                    assert out not in g.intermediates


class _Pools(torch.nn.Module):
    """conv -> max pool (a statement with `where:`) -> conv -> Hardswish (a lookup table)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.relu = torch.nn.ReLU()
        self.pool = torch.nn.MaxPool2d(3, 2, padding=1)
        self.head = torch.nn.Conv2d(8, 8, 1)
        self.act = torch.nn.Hardswish()

    def forward(self, x):
        return self.act(self.head(self.pool(self.relu(self.conv(x)))))


def test_a_merged_program_is_what_the_loader_makes_of_its_text() -> None:
    """merge builds a group's program from its layers' own (parsed once) with the tensors
    renamed: the same program, statement texts and locations included, as parsing the
    group's op.yaml text."""
    from tensorgen.fusion.program import FusionError, _items, _ports, merge, merged_text
    from tensorgen.spec.loader import parse_program

    torch.manual_seed(0)
    checked = 0
    for model in (_Block(), _Pools()):
        graph = _graph(model.eval(), (torch.randn(1, 3, 8, 8),))
        n = len(graph.layers)
        for a in range(n):
            for b in range(a + 1, n):
                layers = graph.layers[a : b + 1]
                try:
                    merged = merge(graph, layers, "tg1")
                except FusionError:
                    continue
                names, decls, _, _ = _ports(graph, layers)
                items = [_items(lay, r) for lay, r in zip(layers, names, strict=True)]
                where = f"<fused {' + '.join(lay.name for lay in layers)}>"
                text = merged_text(layers[0].name, decls, items, "tg1")
                want = parse_program(text, where, "tg1")
                assert merged.program == want
                assert [s.location for s in merged.program.statements] == [
                    s.location for s in want.statements
                ]
                checked += 1
    assert checked >= 10
