"""The binary verifier's checks beyond the format: every way it refuses a corrupted binary
(operands against the memories and the ISA's field ranges, tokens, hardware loops, the DRAM
table), each a one-line BinaryError naming the instruction; and every compile runs it."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from tensorgen.driver import compile_file
from tensorgen.errors import BinaryError
from tensorgen.mc import isa
from tensorgen.mc.binary import Binary, TensorEntry, decode, encode
from tensorgen.mc.operands import Bound, Box, LoopAffine, View
from tensorgen.mc.verify import verify_binary
from tensorgen.sim.machine import simulate
from tensorgen.target import load_target

TINY = load_target("tiny")  # 2048 bytes of spad, 1024 of acc


def spad(base: LoopAffine, n: int = 4) -> View:
    return View("spad", "int32", base, (n,), (1,))


OK = spad(LoopAffine.make(0))


def program(*code: isa.Instruction) -> Binary:
    t = TensorEntry("X", "int32", (4,), "input", 0)
    return Binary("tiny", TINY.hash, (t,), tuple(code), 16)


def one_line_refusal(binary: Binary, match: str) -> str:
    with pytest.raises(BinaryError, match=match) as err:
        verify_binary(binary, TINY)
    assert "\n" not in str(err.value)
    return str(err.value)


def load(dst: View) -> isa.Instruction:
    return isa.make("LOAD", dst=dst, src=Box(0, (LoopAffine.make(0),), (4,)))


ENCODABLE = {  # refused after an encode/decode round trip: what a .tgb can hold
    "view past the end of spad": (
        [isa.make("VFILL", dst=spad(LoopAffine.make(2040)), imm=0)],
        r"^instruction 0 \(VFILL\): dst \(.*\) reaches bytes 2,040\.\.2,055 of spad, which has 2,048$",
    ),
    "view before the start of acc": (
        [isa.make("VFILL", dst=View("acc", "int32", LoopAffine.make(8), (4,), (-3,)), imm=0)],
        r"^instruction 0 \(VFILL\): dst .* reaches bytes -28\.\.11 of acc",
    ),
    "view leaves spad at the last iteration": (
        [
            isa.make("LOOP", count=200, body=1),
            isa.make("VFILL", dst=spad(LoopAffine.make(0, (16,))), imm=0),
        ],
        r"^instruction 1 \(VFILL\): dst .* reaches bytes 0\.\.3,199 of spad",
    ),
    "view leaves spad under a LOOPB": (
        [
            isa.make(
                "LOOPB",
                lower=Bound(((LoopAffine.make(0), 1),)),
                upper=Bound(((LoopAffine.make(600), 1),)),
                body=1,
            ),
            isa.make("VFILL", dst=spad(LoopAffine.make(0, (4,))), imm=0),
        ],
        r"^instruction 1 \(VFILL\): dst .* of spad, which has 2,048",
    ),
    "wait before any signal": (
        [isa.make("VFILL", dst=OK, imm=0).with_tokens(wait={"LD"})],
        r"^instruction 0 \(VFILL\): waits for a token from LD that no instruction before it",
    ),
    "signal never awaited": (
        [load(OK).with_tokens(signal={"EX"})],
        r"^1 token\(s\) from LD to EX are signalled and never awaited$",
    ),
    "wait before its signal": (
        [
            isa.make("VFILL", dst=OK, imm=0).with_tokens(wait={"LD"}),
            load(OK).with_tokens(signal={"EX"}),
        ],
        r"^instruction 0 \(VFILL\): waits for a token from LD",
    ),
    "loop waits more often than signalled": (
        [
            load(OK).with_tokens(signal={"EX"}),
            isa.make("LOOP", count=2, body=1),
            isa.make("VFILL", dst=OK, imm=0).with_tokens(wait={"LD"}),
        ],
        r"^instruction 2 \(VFILL\): waits for a token from LD",
    ),
    "IF body that signals": (
        [
            isa.make("IF", cond=Bound(((LoopAffine.make(0), 1),)), body=1),
            load(OK).with_tokens(signal={"EX"}),
            isa.make("VFILL", dst=OK, imm=0).with_tokens(wait={"LD"}),
        ],
        r"^instruction 0 \(IF\): its body's tokens from LD to EX do not balance \(\+1 per run\)",
    ),
    "loop body leaves its enclosing loop": (
        [
            isa.make("LOOP", count=2, body=2),
            isa.make("LOOP", count=2, body=2),
            isa.make("VFILL", dst=OK, imm=0),
            isa.make("VFILL", dst=OK, imm=0),
        ],
        r"^instruction 1 \(LOOP\): body of 2 instructions leaves its enclosing block$",
    ),
}


@pytest.mark.parametrize("case", list(ENCODABLE))
def test_a_corrupted_binary_is_refused_in_one_line(case):
    code, match = ENCODABLE[case]
    decoded = decode(encode(program(*code)))  # a .tgb can hold it: only the verifier refuses
    one_line_refusal(decoded, match)
    with pytest.raises(BinaryError, match=match):  # and the simulator never runs it
        simulate(decoded, {"X": np.zeros(4, np.int32)}, TINY)


IN_MEMORY = {  # refused in a Binary built in memory, before anything encodes it
    "u32 field": (
        [isa.make("LOOP", count=2**32, body=0)],
        r"field count=4294967296 does not fit a u32",
    ),
    "u16 field": ([isa.make("LOOP", count=1, body=-1)], r"field body=-1 does not fit a u16"),
    "u8 field": ([isa.make("SYNC", queue=256)], r"field queue=256 does not fit a u8"),
    "i32 field": (
        [isa.make("VADD", dst=OK, a=OK, imm=2**31)],
        r"field imm=2147483648 does not fit",
    ),
    "f32 field": (
        [isa.make("VREQUANT", dst=OK, a=OK, scale=float("inf"), zp=0, lo=0, hi=1)],
        r"field scale=inf is not a finite f32",
    ),
    "box of no tensor": (
        [isa.make("LOAD", dst=OK, src=Box(3, (LoopAffine.make(0),), (4,)))],
        r"^instruction 0 \(LOAD\): field src names no tensor of the table$",
    ),
}


@pytest.mark.parametrize("case", list(IN_MEMORY))
def test_a_field_out_of_range_is_refused(case):
    code, match = IN_MEMORY[case]
    one_line_refusal(program(*code), match)


def test_a_dram_tensor_outside_the_image():
    b = program(isa.make("VFILL", dst=OK, imm=0))
    t = dataclasses.replace(b.tensors[0], dram_offset=8)
    one_line_refusal(
        dataclasses.replace(b, tensors=(t,)),
        r"^tensor X \(int32 \[4\], 16 bytes at DRAM offset 8\)",
    )


def test_balanced_tokens_pass():
    """Double buffering: the loop's waits consume the signals of the iteration before."""
    code = [
        load(OK).with_tokens(signal={"EX"}),
        isa.make("LOOP", count=3, body=2),
        load(OK).with_tokens(signal={"EX"}),
        isa.make("VFILL", dst=OK, imm=0).with_tokens(wait={"LD"}),
        isa.make("VFILL", dst=OK, imm=0).with_tokens(wait={"LD"}),
    ]
    assert verify_binary(program(*code), TINY) == 8  # the LOOP itself is no step


def test_every_compile_verifies(monkeypatch):
    """driver.compile_file runs the IR and the binary verifier after their passes."""
    from tensorgen import driver

    calls = []
    real_program, real_binary = driver.verify_program, driver.verify_compiled
    monkeypatch.setattr(driver, "verify_program", lambda p: calls.append("ir") or real_program(p))
    monkeypatch.setattr(
        driver, "verify_compiled", lambda b, t: calls.append("binary") or real_binary(b, t)
    )
    compile_file("examples/matmul_odd.yaml", "tiny", "default")
    assert calls == ["ir", "binary"]


@pytest.mark.parametrize("case", ["signal never awaited", "view leaves spad at the last iteration"])
def test_tensorgen_run_verifies_what_it_loads(tmp_path, cli, case):
    """`tensorgen run` refuses a corrupted .tgb before reading inputs: exit 2, one stderr line
    naming the file, nothing written."""
    code, match = ENCODABLE[case]
    tgb = tmp_path / "bad.tgb"
    tgb.write_bytes(encode(program(*code)))
    np.save(tmp_path / "x.npy", np.zeros(4, np.int32))
    out = tmp_path / "out"
    r = cli("run", tgb, "--in", f"X={tmp_path / 'x.npy'}", "--out", out)
    assert r.code == 2 and r.out == ""
    lines = r.err.strip().splitlines()
    assert len(lines) == 1 and str(tgb) in lines[0], r.err
    assert not out.exists()


def test_a_skewed_nest_is_left_to_the_simulator():
    """Under a LOOPB whose bounds follow an outer counter, counter intervals over-approximate
    the iterations: here L1 = L0, so 16*L1 - 16*L0 is 0, though the intervals span -144..144.
    The verifier does not refuse it; the simulator checks every access and runs it."""
    same = Bound(((LoopAffine.make(0, (1,)), 1),))
    code = [
        isa.make("LOOP", count=10, body=2),
        isa.make("LOOPB", lower=same, upper=same, body=1),
        isa.make("VFILL", dst=spad(LoopAffine.make(0, (16, -16))), imm=7),
    ]
    b = decode(encode(program(*code)))
    assert verify_binary(b, TINY) == 100  # an upper bound of the count under a skewed LOOPB
    assert simulate(b, {"X": np.zeros(4, np.int32)}, TINY).stats.instructions == 10
