"""Band fusion with kept halos (tensorgen/fusion/kept.py): a pair whose activation does not fit
the scratchpad whole runs per band, the producer computing per band only the rows no band
before computed (its first band peeled: its whole window), the halo rows carried on chip from
the band before; bit-exact, fewer MACs than recomputing the halo, the activation never in
DRAM, and the choice said in the fusion notes (`--explain`)."""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import pytest
import torch

from tensorgen import fusion
from tensorgen.fusion.kept import copy_elements, keep, kept_extra_macs
from tensorgen.fusion.recompute import extra_macs, recompute
from tensorgen.ir.verify import verify_program
from tensorgen.mc.binary import disassemble
from tensorgen.model import check_model, compile_model
from tensorgen.spec.loader import load_program
from tensorgen.target import load_target

TG1 = load_target("tg1")
SIZE = 56

warnings.filterwarnings("ignore", category=UserWarning)


class _Pair(torch.nn.Module):
    """16 -> 64 channels (1x1, ReLU) -> a 3x3 depthwise (`groups` 64) of `stride`."""

    def __init__(self, stride: int, groups: int) -> None:
        super().__init__()
        self.a = torch.nn.Conv2d(16, 64, 1)
        self.relu = torch.nn.ReLU()
        self.b = torch.nn.Conv2d(64, 64, 3, stride=stride, padding=1, groups=groups)

    def forward(self, x):
        return self.b(self.relu(self.a(x)))


def _compiled(monkeypatch, model, example, keep_halos):
    monkeypatch.setattr(fusion, "fusion_groups", lambda graph, target, taken=(): [])
    monkeypatch.setattr(fusion, "BAND_SLACK", 10**9)
    monkeypatch.setattr(fusion, "TILE_LAYERS", 2)
    monkeypatch.setattr(fusion, "RECOMPUTE_MARGIN", 0)
    monkeypatch.setattr(fusion, "KEEP_HALOS", keep_halos)
    cm = compile_model(model, example, TG1, fuse=True)
    fused = [r for r in cm.layers if r.schedule == "fused"]
    assert len(fused) == 1, [(r.name, r.op, r.schedule) for r in cm.layers]
    note = next(n for n in cm.fusion_notes if n.startswith("fused per band a -> b"))
    return cm, fused[0], note


@pytest.mark.parametrize(("stride", "groups"), [(1, 64), (2, 64)])
def test_a_kept_halo_is_exact_and_runs_fewer_macs_than_a_recomputed_one(
    monkeypatch, stride: int, groups: int
) -> None:
    torch.manual_seed(0)
    model, example = _Pair(stride, groups).eval(), (torch.randn(1, 16, SIZE, SIZE),)
    kept, unit, note = _compiled(monkeypatch, model, example, True)
    assert "(a halo): kept per band" in note, note
    again, slow, said = _compiled(monkeypatch, model, example, False)
    assert "(a halo): recomputed per band" in said, said
    assert unit.macs < slow.macs, (unit.macs, slow.macs)
    # the activation never in DRAM (no DMA names it, nor its carry): fewer DRAM bytes than
    # layer by layer, by the simulator's counters (more than recomputed: the first band's rows
    # of the input load through a port of their own, and the other bands' port loads a box in
    # the first band too)
    asm = disassemble(kept.binary)
    assert f"{unit.name}.Y_0(" not in asm and f"{unit.name}.H_Y_0(" not in asm
    fused, alone = (int(n) for n in re.findall(r"(\d+) DRAM B", note))
    assert unit.dram_bytes == fused < alone, note
    for seed in (0, 1):
        x = torch.randn(*example[0].shape, generator=torch.Generator().manual_seed(seed))
        for cm in (kept, again):
            cmp, _ = check_model(cm, (x * 1.5,))
            assert cmp.exact, cmp.message


def test_the_rewrite_computes_each_row_once() -> None:
    program = verify_program(load_program(Path(__file__).parent / "conv1x1_conv3x3.yaml", None))
    kept, offsets = keep(program, (0, 2), 4)  # two bands of 4 of 8 rows
    kept = verify_program(kept)
    # the 1x1's first band (its window, rows -1..4: its own accumulator and input port), its
    # other bands (their last 4 rows), the copy-in and the copy-out, then the 3x3
    assert offsets == (0, 6) and kept.meta["steady"] == {0: 2}
    assert kept.meta["copies"] == ("S4", "S5")
    assert kept.meta["firsts"] == {"ACC1": "ACC1_first", "X": "X_first"}
    assert "band <= 0" in kept.statements[0].where and "band >= 1" in kept.statements[2].where
    assert kept.meta["band_runs"] == ((4, 1, 4), (4, 0, 4))  # band 1: rows 5..8
    assert kept.tensor("H_H").shape == (1, 16, 2, 8)  # rows 3 and 4, carried
    assert kept.tensor("ACC1").shape == (2, 1, 16, 4, 8)
    assert kept.tensor("ACC1_first").shape == (2, 1, 16, 5, 8)  # rows 0..4: none above the image
    copy_in, copy_out = kept.statements[4:6]
    assert str(copy_in.lhs).startswith("H[band, n, c, 4*band + u - 1")
    assert str(copy_out.rhs) == "H[band, n, c, 4*band + u + 3, w]"
    assert copy_elements(kept, "S4") == copy_elements(kept, "S5") == 2 * 16 * 8
    recomputed = recompute(program, (0, 2), 4)
    pixels = 16 * 8  # channels x columns
    assert extra_macs(program, recomputed, 2) == 3 * pixels * 16
    assert kept_extra_macs(program, kept) == 0  # every row once


class _Stem(torch.nn.Module):
    """ResNet's stem: a 7x7 conv of stride 2 (its input staged channels-last) -> a 3x3 max pool."""

    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Conv2d(3, 64, 7, stride=2, padding=3)
        self.relu = torch.nn.ReLU()
        self.b = torch.nn.MaxPool2d(3, 2, 1)

    def forward(self, x):
        return self.b(self.relu(self.a(x)))


def test_a_stem_keeps_its_halo_with_its_input_in_its_own_layout(monkeypatch) -> None:
    # at 112 its 64x56x56 activation (200,704 B) is over 3/4 of the scratchpad: per band
    torch.manual_seed(0)
    model, example = _Stem().eval(), (torch.randn(1, 3, 112, 112),)
    kept, unit, note = _compiled(monkeypatch, model, example, True)
    assert "(a halo): kept per band" in note and "0 MACs more" in note, note
    assert unit.macs == 64 * 3 * 7 * 7 * 56 * 56  # the conv's MACs, none again
    fused, alone = (int(n) for n in re.findall(r"(\d+) DRAM B", note))
    assert unit.dram_bytes == fused < alone, note
    cmp, _ = check_model(kept, (example[0] * 1.5,))
    assert cmp.exact, cmp.message
