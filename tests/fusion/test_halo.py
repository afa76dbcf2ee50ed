"""Band fusion with recomputed halos (tensorgen/fusion/recompute.py): an expand 1x1 -> depthwise
3x3 pair whose activation does not fit the scratchpad whole runs per band of the depthwise's
rows, the 1x1 computing per band every row the band reads (the halo rows again), the
activation one band at a time on chip and never in DRAM."""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import pytest
import torch

from tensorgen import fusion
from tensorgen.fusion.recompute import extra_macs, recompute
from tensorgen.ir import poly
from tensorgen.ir.verify import verify_program
from tensorgen.mc.binary import disassemble
from tensorgen.model import check_model, compile_model
from tensorgen.spec.loader import load_program
from tensorgen.target import load_target

TG1 = load_target("tg1")
SIZE = 56  # the 64-channel activation is 64 * 56 * 56 = 200704 B: more than 3/4 of 256 KiB

warnings.filterwarnings("ignore", category=UserWarning)


class _Expand(torch.nn.Module):
    """16 -> 64 channels (1x1, ReLU) -> a 3x3 depthwise of `stride`, pad 1."""

    def __init__(self, stride: int) -> None:
        super().__init__()
        self.a = torch.nn.Conv2d(16, 64, 1)
        self.relu = torch.nn.ReLU()
        self.b = torch.nn.Conv2d(64, 64, 3, stride=stride, padding=1, groups=64)

    def forward(self, x):
        return self.b(self.relu(self.a(x)))


@pytest.mark.parametrize(("stride", "share"), [(1, 0.5), (2, 0.5), (1, 0.15)])
def test_an_expand_and_depthwise_pair_is_fused_per_band_with_its_halo_recomputed(
    monkeypatch, stride: int, share: float
) -> None:
    # the pair alone: no group kept whole, none with the quantize or dequantize around it;
    # `share` 0.15: bands of fewer rows, more than two (a loop over the middle ones)
    monkeypatch.setattr(fusion, "fusion_groups", lambda graph, target, taken=(): [])
    monkeypatch.setattr(fusion, "BAND_SHARE", share)
    monkeypatch.setattr(fusion, "BAND_SLACK", 10**9)
    monkeypatch.setattr(fusion, "TILE_LAYERS", 2)
    monkeypatch.setattr(fusion, "KEEP_HALOS", False)  # recomputed (kept: test_kept.py)
    torch.manual_seed(0)
    model, example = _Expand(stride).eval(), (torch.randn(1, 16, SIZE, SIZE),)
    cm = compile_model(model, example, TG1, fuse=True)
    fused = [r for r in cm.layers if r.schedule == "fused"]
    assert [r.op for r in fused] == ["conv2d+depthwise"], [(r.name, r.op) for r in cm.layers]
    note = next(n for n in cm.fusion_notes if n.startswith("fused per band a -> b"))
    assert "(a halo): recomputed per band" in note, note
    rows = int(re.search(r"(\d+) rows a band", note).group(1))
    out = SIZE // stride
    bands = out // rows
    assert bands * rows == out and bands > (
        1 if share == 0.5 else 2
    )  # rows that divide the image's
    # DRAM, by the simulator's counters: the 1x1's weights once, the depthwise's once (or once
    # per band, staged inside it), the output once and per band the input rows the 1x1 reads,
    # its halo row above and below included (a DMA moves its whole box): not one byte of the
    # 64-channel activation, which no DMA of the unit names
    first, second = (
        sum(p.const.nbytes for p in layer.ports if p.const is not None)
        for layer in cm.graph.layers
        if layer.name in ("a", "b")
    )
    read = stride * (rows - 1) + 3
    moved = first + bands * 16 * read * SIZE + 64 * out * out
    assert fused[0].dram_bytes in (moved + second, moved + bands * second)
    asm = disassemble(cm.binary)
    unit = fused[0].name
    assert f"src={unit}.X_0(" in asm and f"{unit}.Y_0(" not in asm
    # the band buffer's pad is filled where it lies outside the image in some band only (rows
    # above the first band and below the last, the columns left and right), never the whole
    # buffer: every fill is one row or one column of each channel
    fills = re.findall(r"VFILL dst=spad:uint8@\d+\[([\dx]+):", asm)
    assert fills, asm
    for shape in fills:
        *_, h, w = (int(d) for d in shape.split("x"))
        assert h == 1 or w == 1, (shape, fills)
    for seed in (0, 1):
        x = torch.randn(*example[0].shape, generator=torch.Generator().manual_seed(seed))
        cmp, _ = check_model(cm, (x * 1.5,))
        assert cmp.exact, cmp.message


def test_the_rewrite_recomputes_the_halo_rows_per_band() -> None:
    program = verify_program(load_program(Path(__file__).parent / "conv1x1_conv3x3.yaml", None))
    banded = verify_program(recompute(program, (0, 2), 4))  # two bands of 4 of 8 rows
    assert banded.shared_loops == (("band", 2),)
    # band 0 reads rows -1..4, band 1 rows 3..8: the 1x1 writes H's rows 0..4 and 3..7 (row 3
    # and 4 twice), and accumulates rows -1..4 and 3..7 (a block of rows starts with the band)
    pixels = 16 * 8  # channels x columns
    assert poly.domain(banded.statements[1]).count_val().to_python() == (5 + 5) * pixels
    assert poly.domain(banded.statements[0]).count_val().to_python() == (6 + 5) * pixels * 16
    assert extra_macs(program, banded, 2) == 3 * pixels * 16
    assert banded.tensor("H").shape == (2, 1, 16, 8, 8)  # one buffer per band, the image's rows
    assert banded.tensor("ACC1").shape == (2, 1, 16, 6, 8)  # the band's 6 rows only
    # the consumer runs its band's rows, numbered from the band's first (its loops' bounds
    # fixed), and reads its band's buffer at the image's rows
    consumer = banded.statements[2]
    assert dict(zip(consumer.indices, consumer.bounds, strict=True))["h"] == (0, 3)
    assert "h + 4*band <= 7" in consumer.where
    assert str(consumer.reads[0]).startswith("H[band, n, k, 4*band + h + r - 1")
    assert banded.meta["band_spans"] == ((4, -1, 6), (4, 0, 4))  # (step, first row, rows)
