"""Linking a model's units: overlapped boundaries (relocated on chip, early loads) and barriers."""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import torch
from torch import nn

from tensorgen.cli import main
from tensorgen.codegen import overlap as ov
from tensorgen.codegen.link import Buffer, LinkLayer, link
from tensorgen.mc.binary import Binary, assemble, decode, encode
from tensorgen.mc.operands import View
from tensorgen.model import check_model, compile_model
from tensorgen.sim.machine import simulate
from tensorgen.target import load_target

TG1 = load_target("tg1")
ONCHIP = {"spad": TG1.spad.bytes, "acc": TG1.acc.bytes}


class TwoConvs(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, 3, padding=1)
        self.relu = nn.ReLU()
        self.conv2 = nn.Conv2d(16, 16, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv2(self.relu(self.conv1(x)))


@functools.cache
def _compiled(overlap: bool):
    torch.manual_seed(0)
    model = TwoConvs().eval()
    example = (torch.randn(1, 3, 16, 16),)
    return compile_model(model, example, TG1, fuse=False, overlap=overlap)


def _inputs(cm, seed: int) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(x.shape, generator=gen) * 1.5 for x in cm.example_inputs)


def _unit_of(ranges: list[tuple[int, int]], pc: int) -> int | None:
    return next((u for u, (lo, hi) in enumerate(ranges) if lo <= pc < hi), None)


def test_overlapped_units_load_weights_while_the_one_before_computes():
    cm = _compiled(True)
    for seed in (0, 1):
        cmp, _ = check_model(cm, _inputs(cm, seed))
        assert cmp.exact, cmp.message  # bit-exact against PyTorch, and no hazard raised
    assert cm.linked.overlaps >= 1 and cm.linked.early_loads >= 1
    feed = {cm.input_names[0]: cm.example_inputs[0].numpy()}
    events = simulate(decode(encode(cm.binary)), feed, TG1, record=True).recorder.events
    ranges, code, tensors = cm.linked.layer_ranges, cm.binary.code, cm.binary.tensors
    found = False
    for b, joined in enumerate(cm.linked.overlapped):
        if not joined:
            continue
        ex_end = max(
            (end for q, _, _, end, pc, _ in events if q == "EX" and _unit_of(ranges, pc) == b),
            default=None,
        )
        weight_starts = [
            start
            for q, _, start, _, pc, m in events
            if m == "LOAD"
            and _unit_of(ranges, pc) == b + 1
            and tensors[code[pc].arg("src").tensor].role == "const"
        ]
        if ex_end is not None and weight_starts and min(weight_starts) < ex_end:
            found = True
    assert found, "no unit's weight loads started before the unit before it finished on EX"


def test_overlap_saves_cycles_and_nothing_else():
    on, off = _compiled(True), _compiled(False)
    assert off.linked.overlaps == 0
    x = _inputs(on, 2)
    (c_on, r_on), (c_off, r_off) = check_model(on, x), check_model(off, x)
    assert c_on.exact and c_off.exact, (c_on.message, c_off.message)
    assert r_on.stats.cycles < r_off.stats.cycles
    assert r_on.stats.dram_bytes == r_off.stats.dram_bytes
    assert r_on.stats.macs == r_off.stats.macs
    assert r_on.stats.onchip_bytes == r_off.stats.onchip_bytes


def _unit(text: str) -> Binary:
    return assemble(f".target {TG1.name} {TG1.hash.hex()}\n" + text)


# two units by hand: Y = X + 1, then Z = Y + W; on chip each from address 0, 128 and 192 bytes
FIRST = _unit(
    """.dram 128
.tensor X int8 64 input dram=0
.tensor Y int8 64 output dram=64
LOAD dst=spad:int8@0[64:1] src=X(0)[64] signal=EX
VADD dst=spad:int8@64[64:1] a=spad:int8@0[64:1] b=- imm=1 wait=LD signal=ST
STORE dst=Y(0)[64] src=spad:int8@64[64:1] wait=EX
"""
)
SECOND = _unit(
    """.dram 192
.tensor Y int8 64 input dram=0
.tensor W int8 64 input dram=64
.tensor Z int8 64 output dram=128
LOAD dst=spad:int8@0[64:1] src=W(0)[64]
LOAD dst=spad:int8@64[64:1] src=Y(0)[64] signal=EX
VADD dst=spad:int8@128[64:1] a=spad:int8@0[64:1] b=spad:int8@64[64:1] imm=0 wait=LD signal=ST
STORE dst=Z(0)[64] src=spad:int8@128[64:1] wait=EX
"""
)


# the same second unit loading the first's output before its weights, each load signalling EX
SECOND_INPUT_FIRST = _unit(
    """.dram 192
.tensor Y int8 64 input dram=0
.tensor W int8 64 input dram=64
.tensor Z int8 64 output dram=128
LOAD dst=spad:int8@64[64:1] src=Y(0)[64] signal=EX
LOAD dst=spad:int8@0[64:1] src=W(0)[64] signal=EX
SYNC queue=1 wait=LD
VADD dst=spad:int8@128[64:1] a=spad:int8@0[64:1] b=spad:int8@64[64:1] imm=0 wait=LD signal=ST
STORE dst=Z(0)[64] src=spad:int8@128[64:1] wait=EX
"""
)


def _link_by_hand(onchip, second=SECOND):
    weights = torch.arange(-32, 32, dtype=torch.int8)
    buffers = {
        "x": Buffer("x", 64, "input"),
        "y": Buffer("y", 64, "temp"),
        "w": Buffer("w", 64, "const", weights.numpy().tobytes()),
        "z": Buffer("z", 64, "output"),
    }
    layers = [
        LinkLayer("first", FIRST, {"X": "x", "Y": "y"}),
        LinkLayer("second", second, {"Y": "y", "W": "w", "Z": "z"}),
    ]
    return link(layers, buffers, {"x": "x", "z": "z"}, TG1.name, TG1.hash, onchip), weights


def _run_by_hand(onchip, second=SECOND):
    linked, weights = _link_by_hand(onchip, second)
    x = torch.randint(
        -128, 128, (64,), dtype=torch.int8, generator=torch.Generator().manual_seed(3)
    )
    result = simulate(decode(encode(linked.binary)), {"x": x.numpy()}, TG1, record=True)
    want = (x + 1) + weights  # int8 wraps in PyTorch as on the machine
    assert np.array_equal(result.outputs["z"], want.numpy())
    return linked, result


def test_two_units_by_hand_overlap_where_they_fit():
    linked, result = _run_by_hand(ONCHIP)
    assert linked.overlapped == [True] and linked.early_loads == 1
    ranges, code = linked.layer_ranges, linked.binary.code
    ex_end = max(
        e for q, _, _, e, pc, _ in result.recorder.events if q == "EX" and pc < ranges[0][1]
    )
    (w_start,) = [
        s
        for _, _, s, _, pc, m in result.recorder.events
        if m == "LOAD" and linked.binary.tensors[code[pc].arg("src").tensor].role == "const"
    ]
    assert w_start < ex_end  # the second unit's weights load while the first computes
    # the second unit's buffers moved to the top of the scratchpad, out of the first's way
    views = [v for ins in code[ranges[1][0] :] for _, v in ins.args if isinstance(v, View)]
    assert min(v.base.const for v in views) >= ONCHIP["spad"] - 192
    barrier, _ = _run_by_hand(None)
    assert result.stats.cycles < simulate(barrier.binary, {"x": np.zeros(64, np.int8)}).stats.cycles


def test_weights_loaded_after_the_input_are_hoisted_before_it():
    linked, result = _run_by_hand(ONCHIP, SECOND_INPUT_FIRST)
    assert linked.overlapped == [True] and linked.early_loads == 1
    code, tensors = linked.binary.code, linked.binary.tensors
    loads = [
        pc for pc in range(linked.layer_ranges[1][0], len(code)) if code[pc].mnemonic == "LOAD"
    ]
    assert [tensors[code[pc].arg("src").tensor].role for pc in loads] == ["const", "temp"]
    w = loads[0]
    assert not code[w].signal  # its signal stays where the load was, on a SYNC after the input's
    assert any(
        ins.mnemonic == "SYNC" and ins.queue == "LD" and ins.signal == {"EX"}
        for ins in code[loads[1] + 1 :]
    )
    ex_end = max(
        e
        for q, _, _, e, pc, _ in result.recorder.events
        if q == "EX" and pc < linked.layer_ranges[0][1]
    )
    (w_start,) = [s for _, _, s, _, pc, m in result.recorder.events if pc == w]
    assert w_start < ex_end


def test_two_units_by_hand_that_do_not_fit_keep_the_full_barrier():
    # 256 bytes of scratchpad: 128 + 192 do not fit side by side
    linked, _ = _run_by_hand({"spad": 256, "acc": ONCHIP["acc"]})
    assert linked.overlapped == [False] and linked.early_loads == 0
    code, ranges = list(linked.binary.code), linked.layer_ranges
    assert code[ranges[0][1] : ranges[1][0]] == ov.barrier()
    assert linked.binary == _link_by_hand(None)[0].binary


def test_a_pair_that_does_not_fit_keeps_the_full_barrier():
    cm = _compiled(True)
    feet = [ov.footprint(u.binary.code) for u in cm.units]
    b = cm.linked.overlapped.index(True)
    # each unit of the pair fits the memories alone, the two together do not
    tight = {
        m: max(f[m][1] for f in feet[b : b + 2] if m in f) if any(m in f for f in feet) else 1
        for m in ONCHIP
    }
    shifts, apart = ov.place(feet, tight)
    assert not ov.overlaps(apart[b])
    assert shifts[b + 1] == dict.fromkeys(ONCHIP, 0)
    shifts, apart = ov.place(feet, ONCHIP)
    assert ov.overlaps(apart[b]) and any(
        shifts[b + 1].values()
    )  # the next unit moved up, out of the way


def test_place_alternates_ends_and_refuses_what_overlaps():
    feet = [
        {"spad": (0, 1000)},
        {"spad": (0, 1000), "acc": (0, 600)},
        {"spad": (0, 3100), "acc": (0, 600)},
        {"acc": (0, 64)},
    ]
    shifts, apart = ov.place(feet, {"spad": 4096, "acc": 1024})
    # the second goes to the top; the third would meet it in the scratchpad: a barrier
    assert [ov.overlaps(a) for a in apart] == [True, False, True]
    assert [s["spad"] for s in shifts] == [0, 3072, 0, 0]
    assert apart[0] == {"spad", "acc"}  # the first uses no accumulators
    assert apart[2] == {"spad", "acc"}  # the fourth uses no scratchpad
    assert shifts[3]["acc"] == 960  # the third sits at the bottom of acc, the fourth at the top
    assert [ov.overlaps(a) for a in ov.place(feet, None)[1]] == [False, False, False]


def test_the_linked_boundaries_are_a_barrier_or_a_handover():
    cm = _compiled(True)
    code, ranges = list(cm.binary.code), cm.linked.layer_ranges
    for b, joined in enumerate(cm.linked.overlapped):
        between = code[ranges[b][1] : ranges[b + 1][0]]
        assert between == (ov.handover() if joined else ov.barrier())
    off = _compiled(False)
    code, ranges = list(off.binary.code), off.linked.layer_ranges
    for b in range(len(ranges) - 1):
        assert code[ranges[b][1] : ranges[b + 1][0]] == ov.barrier()
    assert np.array_equal(
        check_model(off, off.example_inputs)[1].outputs[off.output_names[0]],
        check_model(cm, off.example_inputs)[1].outputs[cm.output_names[0]],
    )


def test_compile_says_how_many_boundaries_overlap(tmp_path, capsys):
    model = str(Path(__file__).parents[2] / "examples" / "models" / "small_cnn.py")
    out = str(tmp_path / "m.tgb")
    assert main(["check", model, "--trials", "1"]) == 0
    text = capsys.readouterr().out
    assert "link: 3 of 3 unit boundaries overlap" in text and "BIT-EXACT" in text
    assert main(["compile", model, "-o", out, "--no-overlap", "--explain"]) == 0
    assert "link: 3 unit boundaries, each a full barrier (--no-overlap)" in capsys.readouterr().out
