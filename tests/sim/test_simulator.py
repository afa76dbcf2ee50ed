"""The simulator on hand-written microcode: semantics, timing, tokens, hazards, bounds."""

from __future__ import annotations

import numpy as np
import pytest

from tensorgen.errors import BinaryError, SimulatorError
from tensorgen.mc.binary import assemble
from tensorgen.sim.machine import simulate
from tensorgen.target import load_target

TINY = load_target("tiny")
HEAD = f""".target tiny {TINY.hash.hex()}
.dram 128
.tensor A int8 4x4 input dram=0 pad=0
.tensor B int8 4x4 input dram=16 pad=0
.tensor C int32 4x4 output dram=64 pad=0
"""
LOADS = """LOAD dst=spad:int8@0[4x4:4,1] src=A(0,0)[4x4]
LOAD dst=spad:int8@16[4x4:4,1] src=B(0,0)[4x4] signal=EX
"""
MATMUL = "MATMUL acc=acc:int32@0[4x4:4,1] a=spad:int8@0[4x4:4,1] b=spad:int8@16[4x4:4,1] accumulate=0 a_zp=0 b_zp=0"
STORE = "STORE dst=C(0,0)[4x4] src=acc:int32@0[4x4:4,1]"


def _inputs(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {n: rng.integers(-128, 128, (4, 4)).astype(np.int8) for n in "AB"}


def test_matmul_program_computes_and_times_the_queues() -> None:
    text = HEAD + LOADS + MATMUL + " wait=LD signal=ST\n" + STORE + " wait=EX\n"
    ins = _inputs()
    r = simulate(assemble(text), ins, TINY)
    np.testing.assert_array_equal(
        r.outputs["C"], ins["A"].astype(np.int32) @ ins["B"].astype(np.int32)
    )
    s = r.stats
    dma = TINY.dma_setup_cycles + 16 // TINY.dram_bytes_per_cycle
    # the two loads serialize on the LD queue; the matmul waits for the second; the store for it
    assert s.cycles == 2 * dma + (4 + TINY.fill_cycles) + (
        TINY.dma_setup_cycles + 64 // TINY.dram_bytes_per_cycle
    )
    assert s.macs == 64 and s.dram_read_bytes == 32 and s.dram_write_bytes == 64
    assert s.busy["EX"] == 4 + TINY.fill_cycles and s.stalled["EX"] > 0


def test_missing_token_is_a_reported_hazard() -> None:
    # the matmul does not wait for the loads: it would read a buffer the DMA is still writing
    text = HEAD + LOADS.replace(" signal=EX", "") + MATMUL + " signal=ST\n" + STORE + " wait=EX\n"
    with pytest.raises(SimulatorError, match="hazard: instruction 2 .MATMUL on EX. touches spad"):
        simulate(assemble(text), _inputs(), TINY)


def test_waiting_for_a_token_never_signalled_is_an_error() -> None:
    text = HEAD + LOADS.replace(" signal=EX", "") + MATMUL + " wait=LD\n"
    # found before it runs: the binary verifier counts tokens (tensorgen.mc.verify)
    with pytest.raises(BinaryError, match="waits for a token from LD that no instruction before"):
        simulate(assemble(text), _inputs(), TINY)


def test_unconsumed_tokens_are_reported() -> None:
    text = HEAD + LOADS + MATMUL + " wait=LD signal=ST\n"
    with pytest.raises(BinaryError, match="signalled and never awaited"):
        simulate(assemble(text), _inputs(), TINY)


def test_out_of_bounds_view_is_refused() -> None:
    text = HEAD + f"LOAD dst=spad:int8@{TINY.spad.bytes - 8}[4x4:4,1] src=A(0,0)[4x4]\n"
    with pytest.raises(BinaryError, match=r"reaches bytes 2,040\.\.2,055 of spad"):
        simulate(assemble(text), _inputs(), TINY)


def test_store_drops_the_part_of_a_box_outside_the_tensor() -> None:
    text = (
        HEAD
        + "VFILL dst=acc:int32@0[4x4:4,1] imm=7 signal=ST\nSTORE dst=C(1,-1)[4x4] src=acc:int32@0[4x4:4,1] wait=EX\n"
    )
    out = simulate(assemble(text), _inputs(), TINY).outputs["C"]
    assert (out[0] == 0).all() and (out[1:, :3] == 7).all() and (out[1:, 3] == 0).all()


def test_bounded_loops_and_conditions() -> None:
    """LOOPB runs a triangular nest; IF skips its body when a term is negative."""
    text = f""".target tiny {TINY.hash.hex()}
.dram 128
.tensor C int32 4x4 output dram=0 pad=0
LOOP count=4 body=4
    LOOPB lower=B(0/1) upper=B(L0/1) body=3
        IF cond=B(L1-1/1) body=1
            VFILL dst=acc:int32@16*L0+4*L1[1:1] imm=1
        VADD dst=acc:int32@16*L0+4*L1[1:1] a=acc:int32@16*L0+4*L1[1:1] b=- imm=2
SYNC queue=1 signal=ST
STORE dst=C(0,0)[4x4] src=acc:int32@0[4x4:4,1] wait=EX
"""
    out = simulate(assemble(text), {}, TINY).outputs["C"]
    expected = np.array([[2 if j == 0 else 3 if j <= i else 0 for j in range(4)] for i in range(4)])
    np.testing.assert_array_equal(out, expected)


def test_load_pads_outside_the_tensor_and_loops_move_operands() -> None:
    # a 2-iteration hardware loop loads rows -1..2 and 1..4 of A (padding with 0) and stores them
    text = f""".target tiny {TINY.hash.hex()}
.dram 64
.tensor A int8 4x4 input dram=0 pad=0
.tensor C int8 4x4 output dram=16 pad=0
LOOP count=2 body=2
    LOAD dst=spad:int8@16*L0[2x4:4,1] src=A(-1+2*L0,0)[2x4]
    SYNC queue=0
SYNC queue=0 signal=ST
STORE dst=C(0,0)[4x4] src=spad:int8@0[4x4:4,1] wait=LD
"""
    a = _inputs()["A"]
    out = simulate(assemble(text), {"A": a}, TINY).outputs["C"]
    np.testing.assert_array_equal(out[0], 0)
    np.testing.assert_array_equal(out[1], a[0])
    np.testing.assert_array_equal(out[2:], np.zeros((2, 4)))  # rows 2..3 of spad: untouched zeros


def test_requant_follows_qnnpack_rounding_half_to_even() -> None:
    text = f""".target tiny {TINY.hash.hex()}
.dram 64
.tensor X int32 4 input dram=0 pad=0
.tensor Y int8 4 output dram=16 pad=0
LOAD dst=spad:int32@0[4:1] src=X(0)[4] signal=EX
VREQUANT dst=spad:int8@32[4:1] a=spad:int32@0[4:1] scale=0.5 zp=1 lo=-128 hi=127 wait=LD signal=ST
STORE dst=Y(0)[4] src=spad:int8@32[4:1] wait=EX
"""
    x = np.array([1, 3, -5, 1000], dtype=np.int32)  # 0.5, 1.5, -2.5 tie to even; 500 saturates
    out = simulate(assemble(text), {"X": x}, TINY).outputs["Y"]
    np.testing.assert_array_equal(out, [0 + 1, 2 + 1, -2 + 1, 127])


def test_binary_for_other_target_parameters_is_refused() -> None:
    text = HEAD.replace(TINY.hash.hex(), "00" * 8)
    with pytest.raises(BinaryError, match="other parameters"):
        simulate(assemble(text), _inputs(), TINY)


def test_missing_and_wrong_inputs_are_refused() -> None:
    b = assemble(HEAD)
    with pytest.raises(SimulatorError, match="missing input tensor 'B'"):
        simulate(b, {"A": _inputs()["A"]}, TINY)
    with pytest.raises(SimulatorError, match="has shape"):
        simulate(b, {"A": np.zeros((2, 2), np.int8), "B": _inputs()["B"]}, TINY)


def test_a_second_run_reuses_the_memories_zeroed() -> None:
    """`simulate` keeps a run's memories for the next run of the binary (`static.spare`),
    zeroed first: a MATMUL accumulating into the untouched accumulator gives A @ B every
    time, not A @ B plus what the run before left there."""
    from tensorgen.mc.verify import SimLimits
    from tensorgen.sim.static import static

    binary = assemble(
        HEAD
        + LOADS
        + MATMUL.replace("accumulate=0", "accumulate=1")
        + " wait=LD signal=ST\n"
        + STORE
        + " wait=EX\n"
    )
    for seed in (0, 1, 1):
        ins = _inputs(seed)
        r = simulate(binary, ins, TINY)
        np.testing.assert_array_equal(
            r.outputs["C"], ins["A"].astype(np.int32) @ ins["B"].astype(np.int32)
        )
        known = static(binary, TINY, SimLimits())  # the kept decode, not a new one
        assert known.spare is not None and known.spare["acc"].view(np.int32)[:16].any()
