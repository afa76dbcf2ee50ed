"""The simulator's per-step fast paths (a VMUL/VMAC and the LOOP/LOOPB nest of VMACs after it
run at once, `tensorgen.sim.vector`) against stepping every instruction through its
semantics: over random programs of the depthwise convolution's instruction mix, the same
outputs, every counter, the trace events, the DRAM channel and the marks -- or the same
error, hazards and out-of-bounds accesses included."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from tensorgen.errors import BinaryError, SimulatorError
from tensorgen.mc.binary import assemble
from tensorgen.sim import vector
from tensorgen.sim.machine import simulate
from tensorgen.target import ISA_DIR, target_from_dict

TARGET = target_from_dict(yaml.safe_load((ISA_DIR / "tiny.yaml").read_text()), "tiny.yaml")


@dataclass(frozen=True)
class Case:
    xd: str  # dtype of X, the VMACs' `a`
    single: str  # before the nest: vmul | imm | vmac | none
    nest: str  # loop | box | corner (a 3x3 box but its first point) | triangle (no box)
    outer: int  # iterations of a LOOP around it all, each storing a block (0: none)
    moves: bool  # the outer loop's blocks have their own destinations
    b_kind: str  # tap (one weight broadcast, as a depthwise tap) | tile (a 4x4 tile)
    fault: str  # none | overlap (a source in the destination) | oob | ld (no LD token) | st
    marks: bool = False  # counters recorded at every top-level pc (a run then steps)


def _program(c: Case) -> str:
    d = 1 if c.outer else 0  # the nest's first loop level
    dst = "acc:int32@0" + ("+64*L0" if c.outer and c.moves else "") + "[4x4:4,1]"
    row = "+16*L0" if c.outer else ""  # the outer loop's block of X rows
    bt = "[4x4:0,0]" if c.b_kind == "tap" else "[4x4:4,1]"
    bs = 1 if c.b_kind == "tap" else 4  # bytes between taps' b
    a0 = "acc:int32@0" if c.fault == "overlap" else f"spad:{c.xd}@0{row}"
    a0 += "[4x4:4,1]" if c.fault == "overlap" else "[4x4:16,1]"
    ex = {
        "vmul": [f"VMUL dst={dst} a={a0} b=spad:int8@128{bt} imm=0"],
        "imm": [f"VMUL dst={dst} a={a0} b=- imm=-3"],
        "vmac": [f"VMAC dst={dst} a={a0} b=spad:int8@128{bt}"],
        "none": [],
    }[c.single]
    i, j = f"L{d}", f"L{d + 1}"
    base = "2000" if c.fault == "oob" else "0"
    a = f"spad:{c.xd}@{base}{row}+16*{i}+{j}[4x4:16,1]"
    b = f"spad:int8@128+{3 * bs}*{i}+{bs}*{j}{bt}"
    if c.nest == "loop":
        ex += [
            "LOOP count=3 body=1",
            f"VMAC dst={dst} a=spad:{c.xd}@{base}{row}+{i}[4x4:16,1] b=spad:int8@128+{bs}*{i}{bt}",
        ]
    else:
        head = {
            "box": "LOOP count=3 body=1",
            "corner": f"LOOPB lower=B(0/1;1-{i}/1) upper=B(2/1) body=1",
            "triangle": f"LOOPB lower=B(0/1) upper=B({i}/1) body=1",
        }[c.nest]
        ex += ["LOOP count=3 body=2", head, f"VMAC dst={dst} a={a} b={b}"]
    store = "" if c.fault == "st" else " wait=EX"
    block = "4*L0" if c.outer else "0"
    ex += [
        "SYNC queue=1 signal=ST" if c.fault != "st" else "SYNC queue=1",
        f"STORE dst=D({block},0)[4x4] src={dst}{store}",
    ]
    if c.outer:
        ex = [f"LOOP count={c.outer} body={len(ex)}"] + ex
    rows = max(c.outer, 1) * 4
    head = f""".target tiny {TARGET.hash.hex()}
.dram {256 + rows * 16}
.tensor X {c.xd} 8x16 input dram=0 pad=0
.tensor W int8 16x4 input dram=128 pad=0
.tensor D int32 {rows}x4 output dram=256 pad=0
LOAD dst=spad:{c.xd}@0[8x16:16,1] src=X(0,0)[8x16]
LOAD dst=spad:int8@128[16x4:4,1] src=W(0,0)[16x4]{"" if c.fault == "ld" else " signal=EX"}
"""
    sync = [] if c.fault == "ld" else ["SYNC queue=1 wait=LD"]
    return head + "\n".join(sync + ex) + "\n"


def _inputs(xd: str, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    lo, hi = (-128, 128) if xd == "int8" else (0, 256)
    return {
        "X": rng.integers(lo, hi, (8, 16)).astype(xd),
        "W": rng.integers(-128, 128, (16, 4)).astype(np.int8),
    }


CASES = st.builds(
    Case,
    xd=st.sampled_from(["int8", "uint8"]),
    single=st.sampled_from(["vmul", "imm", "vmac", "none"]),
    nest=st.sampled_from(["loop", "box", "corner", "triangle"]),
    outer=st.sampled_from([0, 0, 2, 3]),
    moves=st.booleans(),
    b_kind=st.sampled_from(["tap", "tile"]),
    fault=st.sampled_from(["none", "none", "none", "overlap", "oob", "ld", "st"]),
    marks=st.booleans(),
)


@settings(max_examples=120, deadline=None)
@given(case=CASES, seed=st.integers(0, 2**16))
def test_vector_runs_equal_stepping(case: Case, seed: int, outcome) -> None:
    binary = assemble(_program(case))
    inputs = _inputs(case.xd, seed)
    fast = outcome(binary, inputs, TARGET, True, marks=case.marks)
    assert fast == outcome(binary, inputs, TARGET, False, marks=case.marks)
    # a second run takes the plans the first one kept: on other inputs, stepping's too
    again = _inputs(case.xd, seed + 1)
    assert outcome(binary, again, TARGET, True, marks=case.marks) == outcome(
        binary, again, TARGET, False, marks=case.marks
    )


def test_vector_runs_are_taken_and_compute_the_taps(monkeypatch, outcome) -> None:
    """Each nest kind runs at once (box, box but its corner, tap by tap) and is the 3x3
    depthwise sum itself, computed here in int64."""
    taken = []
    real = vector.VectorRuns._compute
    monkeypatch.setattr(
        vector.VectorRuns, "_compute", lambda s, f, p: taken.append(p.box) or real(s, f, p)
    )
    inputs = _inputs("int8", 7)
    x, w = inputs["X"].astype(np.int64), inputs["W"].astype(np.int64).ravel()
    for nest in ("box", "corner", "triangle"):
        taken.clear()
        binary = assemble(_program(Case("int8", "vmul", nest, 0, False, "tap", "none")))
        fast = outcome(binary, inputs, TARGET, True)
        assert fast[0] != "error" and fast == outcome(binary, inputs, TARGET, False)
        assert len(taken) == 1 and (taken[0] is None) == (nest == "triangle")
        taps = {
            "box": [(i, j) for i in range(3) for j in range(3)],
            "corner": [(i, j) for i in range(3) for j in range(3) if (i, j) != (0, 0)],
            "triangle": [(i, j) for i in range(3) for j in range(i + 1)],
        }[nest]
        want = x[0:4, 0:4] * w[128 - 128]  # the VMUL: tap (0, 0)
        for i, j in taps:
            want = want + x[i : i + 4, j : j + 4] * w[3 * i + j]
        np.testing.assert_array_equal(np.array(fast[0]["D"]), want.astype(np.int32))


def test_a_hazard_inside_a_run_is_stepping_s(outcome) -> None:
    """An EX run reading weights LD still writes: the run declines, stepping names the hazard."""
    binary = assemble(_program(Case("int8", "vmul", "box", 0, False, "tap", "ld")))
    fast = outcome(binary, _inputs("int8", 0), TARGET, True)
    assert fast[0] == "error" and "hazard" in fast[1]
    assert fast == outcome(binary, _inputs("int8", 0), TARGET, False)


@dataclass(frozen=True)
class Pipe:
    count: int  # iterations of the pipelined loop (two MATMUL + STORE halves each)
    after: str  # after it: none | token (a LOAD ordered by a token) | race (a LOAD without
    # one) | ex_race (a MATMUL overwriting an accumulator the last STORE reads, no token)
    outer: bool  # a LOOP of three around it all, LOADs inside (LD runs again; replayed
    # too when its inner loop is unrolled, `stacked.MAX_UNROLL`)
    buffers: int


def _pipe(p: Pipe) -> str:
    """A loop on EX and ST only, LD idle (its replay adds the accesses a later LOAD may meet,
    `replay.replicate`), like a 1x1 convolution's loop over output tiles."""
    i = "L1" if p.outer else "L0"
    block = f"+{8 * p.count}*L0" if p.outer else ""  # each outer iteration its own rows of C
    half = [
        [
            "SYNC queue=1 wait=ST",
            f"MATMUL acc=acc:int32@{acc}[4x4:4,1] a=spad:int8@{a}+{a_step}*{i}[4x4:16,1] "
            "b=spad:int8@128[4x4:4,1] accumulate=0 a_zp=0 b_zp=0",
            "SYNC queue=1 signal=ST",
            f"STORE dst=C({row}+8*{i}{block},0)[4x4] src=acc:int32@{acc}[4x4:4,1] wait=EX "
            "signal=EX",
        ]
        for acc, a, a_step, row in ((0, 0, 8, 0), (64, 4, 8, 4))
    ]
    body = half[0] + half[1]
    ex = [f"LOOP count={p.count} body={len(body)}", *body]
    ex = ["SYNC queue=2 signal=EX", "SYNC queue=2 signal=EX", *ex]
    if p.after == "ex_race":  # EX overwrites what the last STORE may still read
        ex.append(
            "MATMUL acc=acc:int32@64[4x4:4,1] a=spad:int8@0[4x4:16,1] b=spad:int8@128[4x4:4,1] "
            "accumulate=0 a_zp=0 b_zp=0"
        )
    ex += ["SYNC queue=1 wait=ST", "SYNC queue=1 wait=ST"]
    load = [
        "LOAD dst=spad:int8@0[8x16:16,1] src=X(0,0)[8x16] wait=EX" if p.outer else "",
        "LOAD dst=spad:int8@128[16x4:4,1] src=W(0,0)[16x4] signal=EX",
        "SYNC queue=1 wait=LD",
    ]
    if p.outer:
        ex = ["SYNC queue=1 signal=LD", *[x for x in load if x], *ex]
        ex = [f"LOOP count=3 body={len(ex)}", *ex]
    if p.after in ("token", "race"):  # new weights, over those the loop's MATMULs read
        tok = " wait=EX" if p.after == "token" else ""
        ex += (["SYNC queue=1 signal=LD"] if tok else []) + [
            f"LOAD dst=spad:int8@128[16x4:4,1] src=W(0,0)[16x4]{tok}"
        ]
    rows, out = 8 * p.count, 8 * p.count * (3 if p.outer else 1)
    head = f""".target tiny {TARGETS[p.buffers].hash.hex()}
.dram {rows * 16 + 64 + out * 16}
.tensor X int8 {rows}x16 input dram=0 pad=0
.tensor W int8 16x4 input dram={rows * 16} pad=0
.tensor C int32 {out}x4 output dram={rows * 16 + 64} pad=0
"""
    first = (
        []
        if p.outer
        else [
            "LOAD dst=spad:int8@0[8x16:16,1] src=X(0,0)[8x16]",
            "LOAD dst=spad:int8@128[16x4:4,1] src=W(0,0)[16x4] signal=EX",
            "SYNC queue=1 wait=LD",
        ]
    )
    return head + "\n".join(first + ex) + "\n"


def _tiny(buffers: int):
    d = yaml.safe_load((ISA_DIR / "tiny.yaml").read_text())
    d["mac_array"]["weight_buffers"] = buffers
    return target_from_dict(d, "tiny.yaml")


TARGETS = {n: _tiny(n) for n in (1, 2)}


@settings(max_examples=40, deadline=None)
@given(
    p=st.builds(
        Pipe,
        count=st.sampled_from([3, 4, 6, 20]),
        after=st.sampled_from(["none", "token", "race", "ex_race"]),
        outer=st.booleans(),
        buffers=st.sampled_from([1, 2]),
    ),
    seed=st.integers(0, 2**16),
)
def test_replay_with_a_queue_idle_equals_stepping(p: Pipe, seed: int) -> None:
    binary = assemble(_pipe(p))
    rng = np.random.default_rng(seed)
    rows = 8 * p.count
    inputs = {
        "X": rng.integers(-128, 128, (rows, 16)).astype(np.int8),
        "W": rng.integers(-128, 128, (16, 4)).astype(np.int8),
    }
    outcome = []
    for fast in (True, False):
        try:
            r = simulate(binary, inputs, TARGETS[p.buffers], vectorize_loops=fast, record=True)
            outcome.append(
                (
                    {k: v.tolist() for k, v in r.outputs.items()},
                    r.stats.as_dict(),
                    r.recorder.events,
                    r.recorder.channel,
                )
            )
        except (SimulatorError, BinaryError) as err:
            outcome.append(("error", str(err)))
    assert outcome[0] == outcome[1]
    if p.after == "race":  # the racing LOAD: a hazard
        assert outcome[0][0] == "error" and "hazard" in outcome[0][1]
    if p.after in ("none", "token"):
        assert outcome[0][0] != "error"
