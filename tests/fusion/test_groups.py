"""The candidate fusion groups of a model: runs of layers joined by activations only the next
layer reads (tensorgen/fusion.py)."""

from __future__ import annotations

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


def test_groups_stop_at_an_activation_another_layer_reads() -> None:
    torch.manual_seed(0)
    model, inputs = _Block().eval(), (torch.randn(1, 3, 8, 8),)
    with quantized_engine("qnnpack"):
        graph = lower_graph(quantize(model, inputs, "qnnpack"), inputs, "qnnpack")
    ops = [layer.op for layer in graph.layers]
    target = load_target("tg1")
    groups = fusion_groups(graph, target)
    names = [g.layers for g in groups]
    by_name = {layer.name: layer for layer in graph.layers}
    # the stem's output is read by expand and by the residual add: it never joins a group
    stem = next(layer.name for layer in graph.layers if layer.path.endswith("stem"))
    assert all(g[:-1].count(stem) == 0 for g in names), (ops, names)
    # expand (the ReLU folded into its epilogue) -> project (the residual add folded into it,
    # so it reads the stem's output too) -> head -> the final dequantize: one group whose
    # intermediates are expand's 16x8x8, the sum's 8x8x8 and head's 4x8x8 int8 activations
    # (and the input's quantize -> stem, whose quantized input only the stem reads)
    assert len(groups) == 2 and groups[0].layers[-1] == stem, names
    group = groups[1]
    assert [by_name[n].path.split(".")[-1] for n in group.layers[:3]] == [
        "expand",
        "project",
        "head",
    ], names
    assert group.intermediate_bytes == (16 + 8 + 4) * 8 * 8
    assert group.saved_dram_bytes == 2 * group.intermediate_bytes
    assert group.fits and "fits the 262144 B scratchpad" in group.reason(target)
