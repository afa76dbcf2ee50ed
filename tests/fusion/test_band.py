"""Fusion per band (tensorgen/fusion/tiled.py): a pair of layers whose activation does not fit
the scratchpad whole runs per band of the consumer's rows, the producer moved into the band
loop by compute_at, one band of the activation on chip at a time and none in DRAM; a pair
whose consumer reads a halo is refused before anything is lowered."""

from __future__ import annotations

import warnings

import pytest
import torch

from tensorgen import fusion
from tensorgen.model import check_model, compile_model
from tensorgen.target import load_target

TG1 = load_target("tg1")
SIZE = 56  # the 64-channel activation is 64 * 56 * 56 = 200704 B: more than 3/4 of 256 KiB

warnings.filterwarnings("ignore", category=UserWarning)


class _Pair(torch.nn.Module):
    """16 -> 64 channels -> 16: the wide activation between two convolutions."""

    def __init__(self, kernel: int) -> None:
        super().__init__()
        self.a = torch.nn.Conv2d(16, 64, 1)
        self.relu = torch.nn.ReLU()
        self.b = torch.nn.Conv2d(64, 16, kernel, padding=kernel // 2)

    def forward(self, x):
        return self.b(self.relu(self.a(x)))


def _compile(monkeypatch, kernel: int, slack: int):
    # no group kept whole (they would take quantize -> a and b -> dequantize): the pair alone
    monkeypatch.setattr(fusion, "fusion_groups", lambda graph, target, taken=(): [])
    monkeypatch.setattr(fusion, "BAND_SLACK", slack)
    lowered = []
    real = fusion.compile_scheduled

    def counting(program, target, schedule):
        lowered.append(program.name)
        return real(program, target, schedule)

    monkeypatch.setattr(fusion, "compile_scheduled", counting)
    torch.manual_seed(0)
    model, example = _Pair(kernel).eval(), (torch.randn(1, 16, SIZE, SIZE),)
    return compile_model(model, example, TG1, fuse=True), example, lowered


def test_a_pair_too_wide_to_keep_whole_is_fused_per_band_bit_exact(monkeypatch) -> None:
    cm, example, lowered = _compile(monkeypatch, 1, 10**9)
    fused = [r for r in cm.layers if r.schedule == "fused"]
    assert [r.op for r in fused] == ["conv2d+conv2d"], [(r.name, r.op) for r in cm.layers]
    assert any(n.startswith("fused per band a -> b") for n in cm.fusion_notes), cm.fusion_notes
    # the unit moves its input, its output, weights and biases once each: no byte of the
    # 200704 B activation, and its input once, not once per block of output channels
    layers = [layer for layer in cm.graph.layers if layer.name in ("a", "b")]
    consts = sum(p.const.nbytes for layer in layers for p in layer.ports if p.const is not None)
    assert fused[0].dram_bytes == 2 * 16 * SIZE * SIZE + consts
    for seed in (0, 1):
        x = torch.randn(*example[0].shape, generator=torch.Generator().manual_seed(seed))
        cmp, _ = check_model(cm, (x * 1.5,))
        assert cmp.exact, cmp.message
    assert lowered == ["a_fused"]


def test_a_band_that_costs_cycles_the_model_cannot_spare_is_not_fused(monkeypatch) -> None:
    cm, _, lowered = _compile(monkeypatch, 1, 0)
    # per band its DMAs overlap less: a few more cycles, which no whole group saved here
    assert any(n.startswith("fused per band a -> b:") for n in cm.fusion_notes)  # measured
    note = next(n for n in cm.fusion_notes if n.startswith("not fused per band a -> b:"))
    assert "more than its whole groups save (0)" in note, note
    assert all(r.schedule != "fused" for r in cm.layers)
    assert lowered == ["a_fused"]  # lowered once, measured, dropped


def test_a_halo_is_recomputed_per_band(monkeypatch) -> None:
    monkeypatch.setattr(fusion, "TILE_LAYERS", 2)  # the pair, not with the dequantize after it
    monkeypatch.setattr(fusion, "KEEP_HALOS", False)  # recomputed, not kept (test_kept.py)
    cm, example, lowered = _compile(monkeypatch, 3, 10**9)
    note = next(n for n in cm.fusion_notes if "per band a -> b:" in n)
    # the 3x3 reads rows of the 1x1's above and below its own: two bands read them, each
    # computes them (recompute.py; tests/fusion/test_halo.py has the DRAM bytes)
    assert "(a halo): recomputed per band" in note, note
    assert note.startswith("fused per band"), note
    assert lowered == ["a_fused"], lowered
    cmp, _ = check_model(cm, example)
    assert cmp.exact, cmp.message


def test_the_capacity_check_before_lowering_counts_the_staged_footprints() -> None:
    import dataclasses
    from pathlib import Path

    from tensorgen.fusion.tiled import TileError, check_capacity
    from tensorgen.ir.verify import verify_program
    from tensorgen.schedule.api import Schedule
    from tensorgen.spec.loader import load_program

    program = verify_program(load_program(Path(__file__).parent / "conv1x1_pair.yaml", None))
    s = Schedule(program, None, checked=False)
    for t in ("X", "W1", "H"):
        s.stage(t, None, "spad")
    need = sum(s.footprint_bytes(st) for st in s.stages)
    assert need == sum(program.tensor(t).nbytes for t in ("X", "W1", "H"))
    room = dataclasses.replace(TG1, spad=dataclasses.replace(TG1.spad, bytes=need))
    check_capacity(s, room, (0,), frozenset())  # exactly full: accepted
    tight = dataclasses.replace(TG1, spad=dataclasses.replace(TG1.spad, bytes=need - 1))
    with pytest.raises(TileError, match=rf"spad needs at least {need} B of its {need - 1} B"):
        check_capacity(s, tight, (0,), frozenset())
