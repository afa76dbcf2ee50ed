"""LOADs and STOREs decoded once (`tensorgen.sim.state.Transfer`) against their semantics
(stepping, `vectorize_loops=False`): over random boxes that lie inside their tensor, overlap
its edge (a halo: the pad, and the part inside) or miss it, of every dtype and pad, at
addresses moving with a loop, the same outputs, every counter, the trace events and the DRAM
channel -- or the same error, out-of-bounds views and hazards included."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from tensorgen.mc.binary import assemble
from tensorgen.sim import state
from tensorgen.sim.machine import simulate
from tensorgen.target import ISA_DIR, target_from_dict

TARGET = target_from_dict(yaml.safe_load((ISA_DIR / "tiny.yaml").read_text()), "tiny.yaml")
ROWS, COLS = 6, 8  # of X and of Y
RANGES = {"int8": (-128, 128), "uint8": (0, 256), "int32": (-(2**31), 2**31)}


@dataclass(frozen=True)
class Case:
    dtype: str
    pad: int  # X's
    rows: int  # of the box
    cols: int
    r0: int  # the LOAD box's first row at L0 = 0, and its step per iteration
    rs: int
    c0: int
    y0: int  # the STORE box's first row, and its step
    ys: int
    count: int  # iterations of the loop around them
    moves: bool  # the on-chip buffer moves with L0
    fault: str  # none | oob (the buffer past the scratchpad) | race (no token: a hazard)


def _program(c: Case) -> str:
    isz = np.dtype(c.dtype).itemsize
    size = c.rows * c.cols * isz
    # out of bounds: the buffer walks past the scratchpad's end from the second iteration
    oob = c.fault == "oob"
    base = f"{TARGET.spad.bytes - size if oob else 0}"
    buf = base + (f"+{size}*L0" if c.moves or oob else "")
    view = f"spad:{c.dtype}@{buf}[{c.rows}x{c.cols}:{c.cols},1]"
    box = f"[{c.rows}x{c.cols}]"
    race = c.fault == "race"

    def aff(const: int, step: int) -> str:
        return f"{const}{'+' if step >= 0 else '-'}{abs(step)}*L0"

    lines = [
        f".target tiny {TARGET.hash.hex()}",
        f".dram {2 * ROWS * COLS * isz}",
        f".tensor X {c.dtype} {ROWS}x{COLS} input dram=0 pad={c.pad}",
        f".tensor Y {c.dtype} {ROWS}x{COLS} output dram={ROWS * COLS * isz} pad=0",
        "SYNC queue=2 signal=LD",
        f"LOOP count={c.count} body=2",
        f"LOAD dst={view} src=X({aff(c.r0, c.rs)},{c.c0}){box} wait=ST signal=ST",
        f"STORE dst=Y({aff(c.y0, c.ys)},{c.c0}){box} src={view}"
        + ("" if race else " wait=LD")
        + " signal=LD",
        "SYNC queue=0 wait=ST",
    ]
    if race:  # the tokens LD never waits for: one per iteration, signalled by LOADs
        lines += ["SYNC queue=2 wait=LD"] * c.count
    return "\n".join(lines) + "\n"


def _inputs(c: Case, seed: int) -> dict[str, np.ndarray]:
    lo, hi = RANGES[c.dtype]
    rng = np.random.default_rng(seed)
    return {"X": rng.integers(lo, hi, (ROWS, COLS), dtype=np.int64).astype(c.dtype)}


@st.composite
def cases(draw) -> Case:
    dtype = draw(st.sampled_from(sorted(RANGES)))
    lo, hi = RANGES[dtype]
    pad = draw(st.sampled_from([0, lo, hi - 1, 3]))
    rows, cols = draw(st.integers(1, 4)), draw(st.integers(1, COLS))
    return Case(
        dtype,
        pad,
        rows,
        cols,
        draw(st.integers(-rows - 1, ROWS)),
        draw(st.integers(-2, 3)),
        draw(st.integers(-cols, COLS - 1)),
        draw(st.integers(-rows, ROWS)),
        draw(st.sampled_from([0, rows, rows + 1])),  # a STORE meeting itself is stepping's
        draw(st.integers(1, 4)),
        draw(st.booleans()),
        draw(st.sampled_from(["none", "none", "none", "oob", "race"])),
    )


@settings(max_examples=150, deadline=None)
@given(case=cases(), seed=st.integers(0, 2**16))
def test_transfers_equal_their_semantics(case: Case, seed: int, outcome) -> None:
    binary = assemble(_program(case))
    inputs = _inputs(case, seed)
    fast = outcome(binary, inputs, TARGET, True)
    assert fast == outcome(binary, inputs, TARGET, False)
    # run again on other inputs: the places the first run kept (`Transfer.places`) copy alike
    again = _inputs(case, seed + 1)
    assert outcome(binary, again, TARGET, True) == outcome(binary, again, TARGET, False)
    if case.fault == "oob" and case.count > 1:  # the verifier's, or the simulator's
        assert fast[0] == "error" and "spad" in fast[1]
    if case.fault == "race":  # the STORE reads the buffer the LOAD still writes
        assert fast[0] == "error" and "hazard" in fast[1]


def test_transfers_are_taken_and_pad_the_halo(monkeypatch, outcome) -> None:
    """Every LOAD and STORE of the loop takes the decoded path; a box over X's edge loads the
    pad around the rows inside, and a STORE box over Y's edge writes only its rows inside."""
    taken = []
    real = state.Machine.transfer
    monkeypatch.setattr(
        state.Machine, "transfer", lambda m, op: taken.append(op.load) or real(m, op)
    )
    case = Case("int8", -7, 3, 4, -1, 2, 2, -1, 3, 3, True, "none")  # moving: not replayed
    binary = assemble(_program(case))
    inputs = _inputs(case, 1)
    fast = outcome(binary, inputs, TARGET, True)
    assert taken == [True, False] * 3
    assert fast == outcome(binary, inputs, TARGET, False)
    x, want = inputs["X"], np.zeros((ROWS, COLS), np.int8)
    for i in range(3):
        box = np.full((3, 4), -7, np.int8)  # rows -1 + 2i .. 1 + 2i of X, columns 2..5
        for r in range(3):
            if 0 <= -1 + 2 * i + r < ROWS:
                box[r] = x[-1 + 2 * i + r, 2:6]
        for r in range(3):  # stored at rows -1 + 3i ..
            if 0 <= -1 + 3 * i + r < ROWS:
                want[-1 + 3 * i + r, 2:6] = box[r]
    np.testing.assert_array_equal(np.array(fast[0]["Y"], np.int8), want)


def test_a_run_again_reads_zeroed_outputs() -> None:
    """A second run of a binary reuses the first one's memories (`static.Static.spare`),
    zeroing all that its inputs do not overwrite: a program that reads its output tensor
    before writing it reads zeros again, not what the run before left there."""
    binary = assemble(
        "\n".join(
            [
                f".target tiny {TARGET.hash.hex()}",
                ".dram 96",
                ".tensor X int8 6x8 input dram=0 pad=0",
                ".tensor Y int8 6x8 output dram=48 pad=0",
                "LOAD dst=spad:int8@0[6x8:8,1] src=Y(0,0)[6x8]",
                "LOAD dst=spad:int8@64[3x8:8,1] src=X(0,0)[3x8] signal=ST",
                "SYNC queue=2 wait=LD",
                "STORE dst=Y(0,0)[3x8] src=spad:int8@24[3x8:8,1]",  # Y's rows 3..5 as found
                "STORE dst=Y(3,0)[3x8] src=spad:int8@64[3x8:8,1]",
            ]
        )
        + "\n"
    )
    rng = np.random.default_rng(0)
    for _ in range(3):
        x = rng.integers(-128, 128, (ROWS, COLS), dtype=np.int8)
        for fast in (True, False):
            y = simulate(binary, {"X": x}, TARGET, vectorize_loops=fast).outputs["Y"]
            np.testing.assert_array_equal(y, np.concatenate([np.zeros((3, COLS), np.int8), x[:3]]))
