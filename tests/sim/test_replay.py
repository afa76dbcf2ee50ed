"""Bulk replay of steady pipelined loops (`tensorgen.sim.replay`, values by
`tensorgen.sim.stacked`) against stepping every instruction: over random double-buffered
LOAD/MATMUL/STORE loops ordered by SYNC tokens, the same outputs, every counter, the trace
events and the DRAM channel -- or the same error, hazards and limits included."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from tensorgen.mc.binary import assemble
from tensorgen.mc.verify import SimLimits
from tensorgen.sim import blocks, replay, taps
from tensorgen.sim.machine import simulate
from tensorgen.target import ISA_DIR, target_from_dict


def _tiny(buffers: int):
    d = yaml.safe_load((ISA_DIR / "tiny.yaml").read_text())
    d["mac_array"]["weight_buffers"] = buffers
    return target_from_dict(d, "tiny.yaml")


TARGETS = {n: _tiny(n) for n in (1, 2)}


@dataclass(frozen=True)
class Case:
    buffers: int
    xd: str
    a_zp: int
    b_zp: int
    n: int  # loop iterations
    slots: int  # 1, or 2: double buffered (the body unrolled twice, two buffers, two accs)
    nest: str  # after the peeled MATMUL: loop | loopb | none
    acc0: int  # the peeled MATMUL's accumulate (1: each iteration needs the one before)
    extra: bool  # an IF-guarded STORE of acc into D, taken in every iteration but the last
    drop: str  # none | ld (EX reads a buffer LD may still write) | st (the store races)
    halo: bool  # the loads' boxes start a row early: the first one is padded
    vec: bool = False  # a VMUL and a LOOPB nest of VMACs too, stored into E
    # no: X loaded per iteration; yes: loaded whole before the loop, read at moving addresses
    # (LD idle in the loop); reload: and its last rows loaded again after it, racing the reads
    resident: str = "no"
    epi: bool = False  # a VADD of 7 and a VMAX with -1000 on the accumulator before its STORE
    # output-channel blocks: the MATMULs in an inner LOOP over blocks of 4 columns of W and of
    # the accumulator (unrolled by `stacked`, one product: `blocks`)
    blocks: int = 1
    # with nest none: three more MATMULs after the peeled one, each the next 4 of K (a K split
    # into the array's width, one product: `blocks.merge_k`)
    split: bool = False


ROWS = 4  # rows of X per iteration


def _program(c: Case) -> str:
    s, res, nb = c.slots, c.resident != "no", c.blocks
    wb = 1536 if res else 1024  # the weights' address
    n, lv = 4 * nb, 1 if nb == 1 else 2  # columns; the level of the reduction nests
    blk = "" if nb == 1 else "+4*L1"  # the block's columns of W (and 16 bytes of acc)
    lines = [f"LOAD dst=spad:int8@{wb}[16x{n}:{n},1] src=W(0,0)[16x{n}]"]
    if res:  # X loaded whole before the loop, which reads it at addresses moving with L0
        rows = ROWS * s * c.n
        lines += [
            f"LOAD dst=spad:{c.xd}@0[{rows}x16:16,1] src=X(0,0)[{rows}x16]"
            + ("" if c.drop == "ld" else " signal=EX"),
            *([] if c.drop == "ld" else ["SYNC queue=1 wait=LD"]),
        ]
    else:
        lines += ["SYNC queue=1 signal=LD"] * s  # the buffers start free
    lines += ["SYNC queue=2 signal=EX"] * s  # and so do the accumulators
    body = []
    for k in range(s):
        off = ROWS * k - (1 if c.halo else 0)
        r = f"{off}+{ROWS * s}*L0"
        acc = 64 * nb * k
        acc_blk = f"{acc}{'' if nb == 1 else '+16*L1'}"

        def buf(extra: int, k=k) -> str:
            return f"{16 * ROWS * k + extra}+{16 * ROWS * s}*L0" if res else f"{128 * k + extra}"

        if not res:
            body.append(
                f"LOAD dst=spad:{c.xd}@{buf(0)}[{ROWS}x16:16,1] src=X({r},0)[{ROWS}x16] wait=EX"
                + ("" if c.drop == "ld" else " signal=EX")
            )
        wait = f"wait={'' if c.drop == 'ld' or res else 'LD,'}ST"
        if nb > 1:  # the tokens once, before the blocks
            body.append(f"SYNC queue=1 {wait}")
        mms = [
            f"MATMUL acc=acc:int32@{acc_blk}[4x4:{n},1] a=spad:{c.xd}@{buf(0)}[4x4:16,1] "
            f"b=spad:int8@{wb}{blk}[4x4:{n},1] accumulate={c.acc0} a_zp={c.a_zp} b_zp={c.b_zp}"
            + (f" {wait}" if nb == 1 else "")
        ]
        mm = (
            f"acc=acc:int32@{acc_blk}[4x4:{n},1] a=spad:{c.xd}@{{a}}[4x4:16,1] "
            f"b=spad:int8@{{b}}{blk}[4x4:{n},1] accumulate=1 a_zp={c.a_zp} b_zp={c.b_zp}"
        )
        if c.nest == "loop":
            mms += [
                "LOOP count=3 body=1",
                "MATMUL " + mm.format(a=f"{buf(4)}+4*L{lv}", b=f"{wb + 4 * n}+{4 * n}*L{lv}"),
            ]
        elif c.split:
            mms += ["MATMUL " + mm.format(a=buf(4 * j), b=wb + 4 * n * j) for j in (1, 2, 3)]
        elif c.nest == "loopb":
            mms += [
                "LOOP count=2 body=2",
                f"LOOPB lower=B(1-L{lv}/1) upper=B(1/1) body=1",
                "MATMUL "
                + mm.format(
                    a=f"{buf(0)}+8*L{lv}+4*L{lv + 1}", b=f"{wb}+{8 * n}*L{lv}+{4 * n}*L{lv + 1}"
                ),
            ]
        body += mms if nb == 1 else [f"LOOP count={nb} body={len(mms)}", *mms]
        if c.vec:
            v = f"acc:int32@{256 + acc}[4x4:4,1]"  # clear of the blocks' accumulators
            body += [
                f"VMUL dst={v} a=spad:{c.xd}@{buf(0)}[4x4:16,1] b=- imm=-3",
                "LOOP count=2 body=2",
                "LOOPB lower=B(1-L1/1) upper=B(1/1) body=1",
                f"VMAC dst={v} a=spad:int8@{buf(0)}+8*L1+4*L2[4x4:16,1] b=spad:int8@{wb}[4x4:0,0]",
            ]
        if c.epi:
            v = f"acc:int32@{acc}[4x{n}:{n},1]"
            body += [f"VADD dst={v} a={v} b=- imm=7", f"VMAX dst={v} a={v} b=- imm=-1000"]
        signal = ([] if res else ["LD"]) + ([] if c.drop == "st" else ["ST"])
        body += [
            "SYNC queue=1" + (f" signal={','.join(signal)}" if signal else ""),
            f"STORE dst=C({ROWS * k}+{ROWS * s}*L0,0)[4x{n}] src=acc:int32@{acc}[4x{n}:{n},1]"
            + ("" if c.drop == "st" else " wait=EX"),
        ]
        if c.vec:
            body += [
                f"STORE dst=E({ROWS * k}+{ROWS * s}*L0,0)[4x4] src=acc:int32@{256 + acc}[4x4:4,1]"
            ]
        if c.extra:
            body += [
                f"IF cond=B({c.n - 2}-L0/1) body=1",
                f"STORE dst=D({ROWS * k}+{ROWS * s}*L0,0)[4x{n}] src=acc:int32@{acc}[4x{n}:{n},1]",
            ]
        body += ["SYNC queue=2 signal=EX"]
    lines += [f"LOOP count={c.n} body={len(body)}", *body]
    if c.resident == "reload":  # over the last rows the loop read, without a token: a race
        last = ROWS * s * c.n - ROWS
        lines.append(f"LOAD dst=spad:{c.xd}@{16 * last}[{ROWS}x16:16,1] src=X({last},0)[{ROWS}x16]")
    lines += ([] if res else ["SYNC queue=0 wait=EX"] * s) + ["SYNC queue=1 wait=ST"] * s
    rows = ROWS * s * c.n
    c_at, nw = rows * 16 + 64 * nb, 16 * n  # C after X and W; D and E after C
    head = f""".target tiny {TARGETS[c.buffers].hash.hex()}
.dram {c_at + rows * (2 * nw + 16)}
.tensor X {c.xd} {rows}x16 input dram=0 pad=0
.tensor W int8 16x{n} input dram={rows * 16} pad=0
.tensor C int32 {rows}x{n} output dram={c_at} pad=0
.tensor D int32 {rows}x{n} output dram={c_at + rows * nw} pad=0
.tensor E int32 {rows}x4 output dram={c_at + 2 * rows * nw} pad=0
"""
    return head + "\n".join(lines) + "\n"


def _inputs(c: Case, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    lo, hi = (-128, 128) if c.xd == "int8" else (0, 256)
    return {
        "X": rng.integers(lo, hi, (ROWS * c.slots * c.n, 16)).astype(c.xd),
        "W": rng.integers(-128, 128, (16, 4 * c.blocks)).astype(np.int8),
    }


DRAWN = dict(  # how each field of a Case is drawn
    buffers=st.sampled_from([1, 2]),
    xd=st.sampled_from(["int8", "uint8"]),
    a_zp=st.sampled_from([0, 3, 128]),
    b_zp=st.sampled_from([0, -2]),
    n=st.integers(4, 9),
    slots=st.sampled_from([1, 2]),
    nest=st.sampled_from(["loop", "loopb", "none"]),
    acc0=st.sampled_from([0, 0, 0, 1]),
    extra=st.booleans(),
    drop=st.sampled_from(["none", "none", "none", "ld", "st"]),
    halo=st.booleans(),
    vec=st.booleans(),
    resident=st.sampled_from(["no", "no", "yes", "reload"]),
    epi=st.booleans(),
    blocks=st.sampled_from([1, 1, 2]),
    split=st.booleans(),
)
CASES = st.builds(Case, **DRAWN)


@settings(max_examples=60, deadline=None)
@given(case=CASES, seed=st.integers(0, 2**16))
def test_replay_equals_stepping(case: Case, seed: int, outcome) -> None:
    binary = assemble(_program(case))
    inputs, target = _inputs(case, seed), TARGETS[case.buffers]
    fast = outcome(binary, inputs, target, True)
    assert fast == outcome(binary, inputs, target, False)
    if fast[0] != "error" and case.drop == "none" and case.acc0 == 0:
        x = inputs["X"].astype(np.int64) - case.a_zp
        if (
            case.halo and case.resident == "no"
        ):  # every box a row early: the first row is the pad, 0 before its zero point
            x = np.concatenate([np.full((1, 16), -case.a_zp), x[:-1]])
        w = inputs["W"].astype(np.int64) - case.b_zp
        k = {"loop": 16, "loopb": 16, "none": 16 if case.split else 4}[case.nest]
        tiles = [x[i : i + 4, :k] @ w[:k] for i in range(0, len(x), ROWS)]
        if case.epi:
            tiles = [np.maximum(b + 7, -1000) for b in tiles]
        np.testing.assert_array_equal(np.array(fast[0]["C"]), np.concatenate(tiles))


def _counting(monkeypatch) -> list:
    taken, real = [], replay._replay
    monkeypatch.setattr(replay, "_replay", lambda *a: taken.append(real(*a)) or taken[-1])
    return taken


@pytest.mark.parametrize("vec", [False, True])
@pytest.mark.parametrize("nest", ["loop", "loopb"])
def test_a_steady_pipelined_loop_is_replayed(nest: str, vec: bool, monkeypatch, outcome) -> None:
    """The double-buffered loop reaches a steady state and is replayed up to its last
    iteration, whose IF differs (stepped again); its outputs, counters and trace are
    stepping's."""
    taken = _counting(monkeypatch)
    rows, real = [], taps.tap_sum
    monkeypatch.setattr(taps, "tap_sum", lambda *a: rows.append(a[3]) or real(*a))
    c = Case(2, "int8", 3, -2, 9, 2, nest, 0, True, "none", True, vec, "no", vec)
    binary, inputs = assemble(_program(c)), _inputs(c, 1)
    fast = outcome(binary, inputs, TARGETS[2], True)
    assert True in taken
    assert fast[0] != "error" and fast == outcome(binary, inputs, TARGETS[2], False)
    # the replayed VMUL/VMAC taps: one sum over the stacked iterations (`taps`), or tap by tap
    assert (max(rows, default=0) > 1) == vec
    monkeypatch.setattr(taps, "ENABLED", False)
    assert outcome(binary, inputs, TARGETS[2], True) == fast


@pytest.mark.parametrize("drop", ["none", "ld", "st"])
@pytest.mark.parametrize("nest", ["loop", "loopb", "none"])
def test_a_loop_of_fast_paths_is_timed_then_computed_at_once(
    nest: str, drop: str, monkeypatch, outcome
) -> None:
    """A body of LOADs, MATMULs, STOREs and elementwise vector instructions (the epilogue's
    VADD and VMAX: what they touch from `state.access_pattern`) with the same IF outcomes in
    every iteration is stepped for its timing only (nothing computed: `state.Machine.values`)
    and all its values come from one plan afterwards (`replay.whole_plan`); outputs,
    counters, trace and errors (a hazard while timing only) are stepping's. An IF that
    differs in one iteration keeps the values stepped."""
    wholes, real = [], replay.whole_plan
    monkeypatch.setattr(replay, "whole_plan", lambda *a: wholes.append(real(*a)) or wholes[-1])
    timed = []  # the values flag of every stepped MATMUL run
    real_run = replay.stacked.Plan.run
    monkeypatch.setattr(
        replay.stacked.Plan, "run", lambda p, m, b: timed.append(m.values) or real_run(p, m, b)
    )
    for extra, epi in ((False, False), (True, False), (False, True)):
        wholes.clear()
        c = Case(2, "int8", 3, -2, 7, 2, nest, 0, extra, drop, True, False, "no", epi)
        binary, inputs = assemble(_program(c)), _inputs(c, 4)
        fast = outcome(binary, inputs, TARGETS[2], True)
        assert fast == outcome(binary, inputs, TARGETS[2], False)
        assert (wholes[0] is not None) == (not extra)
        if drop != "none":
            assert fast[0] == "error" and "hazard" in fast[1]
        else:
            assert fast[0] != "error"
    assert all(timed)  # a plan computes with the flag back on


def test_replay_declines_a_loop_carried_accumulator(monkeypatch, outcome) -> None:
    """accumulate=1 on the peeled MATMUL: each iteration reads the accumulator the one before
    left; the values cannot be computed at once, so the loop is stepped (same result)."""
    taken = _counting(monkeypatch)
    c = Case(1, "int8", 0, 0, 8, 1, "none", 1, False, "none", False)
    binary, inputs = assemble(_program(c)), _inputs(c, 2)
    fast = outcome(binary, inputs, TARGETS[1], True)
    assert taken and True not in taken
    assert fast == outcome(binary, inputs, TARGETS[1], False)


def test_replay_stops_short_of_the_step_limit(outcome) -> None:
    """A limit the replayed iterations would cross is reported as stepping reports it."""
    c = Case(2, "int8", 0, 0, 9, 2, "loop", 0, False, "none", False)
    binary, inputs = assemble(_program(c)), _inputs(c, 3)
    full = outcome(binary, inputs, TARGETS[2], True)
    steps = full[1]["instructions"]
    limits = SimLimits(max_steps=steps - 5)
    fast = outcome(binary, inputs, TARGETS[2], True, limits)
    assert fast[0] == "error" and fast == outcome(binary, inputs, TARGETS[2], False, limits)


def test_a_binary_run_again_is_the_same_and_verified_per_limits(outcome) -> None:
    """The decode kept across runs of one binary (`sim.static`) changes nothing: a second run
    is the first, and other limits are checked again (the step limit refuses it up front)."""
    c = Case(2, "uint8", 128, -2, 7, 2, "loopb", 0, True, "none", True, True)
    binary, inputs = assemble(_program(c)), _inputs(c, 4)
    first = outcome(binary, inputs, TARGETS[2], True)
    assert first[0] != "error" and outcome(binary, inputs, TARGETS[2], True) == first
    tight = SimLimits(max_steps=10)
    refused = outcome(binary, inputs, TARGETS[2], True, tight)
    assert refused[0] == "error" and refused == outcome(binary, inputs, TARGETS[2], False, tight)


@pytest.mark.parametrize("resident", ["yes", "reload"])
def test_sources_moving_with_the_loop_are_replayed_unless_a_load_may_meet_them(
    resident: str, monkeypatch, outcome
) -> None:
    """X loaded whole before the loop, read at addresses that move with it, LD idle meanwhile
    (its later LOADs may meet every access and DMA of the loop): replayed, unless a LOAD after
    the loop may write what the loop read (then stepped: the race is reported as stepping
    finds it, or not at all)."""
    taken = _counting(monkeypatch)
    c = Case(2, "int8", 3, -2, 9, 2, "loopb", 0, True, "none", False, True, resident)
    binary, inputs = assemble(_program(c)), _inputs(c, 5)
    fast = outcome(binary, inputs, TARGETS[2], True)
    assert (True in taken) == (resident == "yes")
    assert fast == outcome(binary, inputs, TARGETS[2], False)
    if resident == "yes":
        assert fast[0] != "error"


def test_dram_effects_are_ordered_by_the_iterations_their_boxes_meet_in() -> None:
    """boxes.dram_order: stepping runs effect i of iteration a before effect j > i of
    iteration b iff a <= b; the batched order must agree wherever two boxes meet."""
    from types import SimpleNamespace

    from tensorgen.sim.boxes import dram_order

    binary = SimpleNamespace(tensors=[SimpleNamespace(shape=(8, 64))])
    store = (0, (0, 0), (0, 8), (8, 8))  # columns 8c .. 8c+8 of iteration c
    ahead = (0, (0, 8), (0, 8), (8, 8))  # the box the store writes in the next iteration
    # a load of the next iteration's box after the store: it must read it before the store
    assert dram_order([(0, "store", store), (1, "load", ahead)], 5, binary) == [(1, 0)]
    # a load of this iteration's box after the store reads what it stored: the store first
    assert dram_order([(0, "store", store), (1, "load", store)], 5, binary) == [(0, 1)]
    # a store that meets itself in another iteration (no step): no batched order exists
    still = (0, (0, 0), (0, 0), (8, 8))
    assert dram_order([(0, "store", still)], 5, binary) is None
    # meeting both an earlier and a later iteration's box: none either
    wide = (0, (0, 0), (0, 8), (8, 16))
    assert dram_order([(0, "store", store), (1, "load", wide)], 5, binary) is None
    # disjoint tensors or loads only: unordered
    assert dram_order([(0, "load", still), (1, "load", still)], 5, binary) == []


def test_a_replayed_load_with_a_huge_stride_reads_each_box_alone():
    """The fuzzer's .tgb: matmul_odd on tiny with a LOAD whose row moves by 2^40 per iteration
    (every box but the first is halo). The replay built a padded copy of the boxes' hull,
    84 TiB; it now takes each iteration's box alone, and agrees with stepping."""
    from tensorgen.driver import compile_file, random_inputs
    from tensorgen.mc.binary import disassemble
    from tensorgen.target import load_target

    job = compile_file(Path(__file__).resolve().parents[2] / "examples" / "matmul_odd.yaml", "tiny")
    text = disassemble(job.compiled.binary)
    assert "src=B(0,8+8*L1)[37x4]" in text
    binary = assemble(text.replace("src=B(0,8+8*L1)[37x4]", "src=B(1099511627776*L1,8+8*L1)[37x4]"))
    inputs, tiny = random_inputs(job.program, 3), load_target("tiny")
    fast = simulate(binary, inputs, tiny)
    slow = simulate(binary, inputs, tiny, vectorize_loops=False)
    assert np.array_equal(fast.outputs["C"], slow.outputs["C"])
    assert fast.stats == slow.stats


@pytest.mark.parametrize("nest", ["loop", "loopb", "none"])
@pytest.mark.parametrize("resident", ["no", "yes"])
def test_an_unrolled_block_loop_is_one_product(nest: str, resident: str, monkeypatch, outcome):
    """The MATMULs of an inner LOOP over two output-channel blocks, unrolled in a stacked plan,
    are merged into one product twice as wide (`blocks.merge_blocks`); outputs, counters and
    trace are stepping's, and those of a product per block."""
    merged, real = [], replay.stacked.merge_blocks
    monkeypatch.setattr(
        replay.stacked, "merge_blocks", lambda e: merged.append((len(e), len(real(e)))) or real(e)
    )
    c = Case(2, "uint8", 3, -2, 7, 2, nest, 0, False, "none", False, False, resident, True, 2)
    binary, inputs = assemble(_program(c)), _inputs(c, 6)
    fast = outcome(binary, inputs, TARGETS[2], True)
    assert fast[0] != "error" and fast == outcome(binary, inputs, TARGETS[2], False)
    assert merged and all(after < before for before, after in merged)
    monkeypatch.setattr(blocks, "ENABLED", False)
    merged.clear()  # a binary of its own: the plans are kept per binary (`sim.static`)
    assert outcome(assemble(_program(c)), inputs, TARGETS[2], True) == fast
    assert merged and all(after == before for before, after in merged)


@pytest.mark.parametrize("resident", ["no", "yes"])
@pytest.mark.parametrize("nb", [1, 2])
def test_a_k_split_into_matmuls_is_one_piece(resident: str, nb: int, monkeypatch, outcome):
    """Four MATMULs into one accumulator, each the next stretch of K, are one piece of the
    stacked plan's product (`blocks.merge_k`); outputs, counters and trace are stepping's,
    and those of a piece per MATMUL."""
    merged, real = [], replay.stacked.blocks.merge_k
    pieces = lambda es: [len(e.refs) for e in es if e.kind == "mm"]  # noqa: E731
    monkeypatch.setattr(
        replay.stacked.blocks,
        "merge_k",
        lambda e: merged.append((pieces(e), pieces(real(e)))) or real(e),
    )
    c = Case(2, "uint8", 3, -2, 7, 2, "none", 0, False, "none", False, False, resident, True, nb)
    c = replace(c, split=True)
    binary, inputs = assemble(_program(c)), _inputs(c, 5)
    fast = outcome(binary, inputs, TARGETS[2], True)
    assert fast[0] != "error" and fast == outcome(binary, inputs, TARGETS[2], False)
    assert merged and all(set(after) == {2} and min(before) > 2 for before, after in merged)
    monkeypatch.setattr(blocks, "ENABLED", False)
    merged.clear()  # a binary of its own: the plans are kept per binary (`sim.static`)
    assert outcome(assemble(_program(c)), inputs, TARGETS[2], True) == fast
    assert merged and all(after == before for before, after in merged)


CHAINS = st.builds(  # bodies whose MATMULs each are stored before the next: `blocks.chains`
    Case,
    **{
        **DRAWN,
        "slots": st.just(2),
        "extra": st.just(False),
        "vec": st.just(False),
        "resident": st.just("yes"),
        "epi": st.just(False),
        "blocks": st.sampled_from([1, 2]),
    },
)


@settings(max_examples=30, deadline=None)
@given(case=CHAINS, seed=st.integers(0, 2**16))
def test_chains_equal_stepping(case: Case, seed: int, outcome) -> None:
    binary = assemble(_program(case))
    inputs, target = _inputs(case, seed), TARGETS[case.buffers]
    assert outcome(binary, inputs, target, True) == outcome(binary, inputs, target, False)


@pytest.mark.parametrize("nb", [1, 2])
@pytest.mark.parametrize("nest", ["loop", "loopb", "none"])
def test_matmuls_each_stored_are_one_product(nest: str, nb: int, monkeypatch, outcome) -> None:
    """Two MATMUL groups, each into its own accumulator and stored before the next, are one
    product over both (`blocks.chains`); outputs, counters and trace are stepping's, and
    those of a product per group; the accumulators keep their last values."""
    chained, real = [], replay.stacked.blocks.chains
    monkeypatch.setattr(
        replay.stacked.blocks,
        "chains",
        lambda e, k: chained.append((len(e), len(real(e, k)))) or real(e, k),
    )
    c = Case(2, "uint8", 3, -2, 7, 2, nest, 0, False, "none", False, False, "yes", False, nb)
    n = 4 * nb
    text = _program(c) + "".join(  # the accumulators after the loop, into D's first rows
        f"SYNC queue=1 signal=ST\nSTORE dst=D({4 * k},0)[4x{n}] src=acc:int32@{64 * nb * k}"
        f"[4x{n}:{n},1] wait=EX\n"
        for k in range(2)
    )
    binary, inputs = assemble(text), _inputs(c, 7)
    fast = outcome(binary, inputs, TARGETS[2], True)
    assert fast[0] != "error" and fast == outcome(binary, inputs, TARGETS[2], False)
    assert chained and all(after < before for before, after in chained)
    # the accumulators hold the last iteration's products: its rows of C
    d, rows = np.array(fast[0]["D"]), 2 * ROWS * c.n
    np.testing.assert_array_equal(d[:8], np.array(fast[0]["C"])[rows - 8 :])
    monkeypatch.setattr(blocks, "ENABLED", False)
    chained.clear()
    assert outcome(assemble(text), inputs, TARGETS[2], True) == fast
    assert chained and all(after == before for before, after in chained)
