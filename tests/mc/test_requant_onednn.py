"""VREQUANTO, the instruction that computes oneDNN's conv requantization (PyTorch's x86 engine on
AVX512-VNNI CPUs), and op.yaml's `requant_onednn` that lowers to it: the encoding round trip
(binary and assembler text), the semantics in the simulator against the frontend's model of the
rule (`onednn.requantize_onednn`, which shares no code with it) on random values and on exact
ties where plausible roundings disagree, and programs compiled by both schedulers bit-exact
against the reference's own evaluation (torch)."""

from __future__ import annotations

import numpy as np
import pytest

from tensorgen.driver import Job, compile_auto, compile_default, random_inputs, run_and_compare
from tensorgen.frontend import onednn
from tensorgen.mc import isa
from tensorgen.mc.binary import Binary, TensorEntry, assemble, decode, disassemble, encode
from tensorgen.mc.operands import Box, LoopAffine, View
from tensorgen.mc.verify import verify_binary
from tensorgen.sim.machine import simulate
from tensorgen.spec.loader import parse_program
from tensorgen.target import load_target

F32 = np.float32
TINY = load_target("tiny")
TG1 = load_target("tg1")
M, K = 8, 4  # accumulators: M rows of K output channels


def _at(byte: int) -> LoopAffine:
    return LoopAffine.make(byte)


def requant_binary(s_src: float, d: float, zp: int, lo: int = 0, hi: int = 255) -> Binary:
    """A (int32 [M, K]), SW and BO (float32 [K], broadcast over rows by stride 0) loaded to
    spad, Y = VREQUANTO(A, SW, BO), stored."""
    a = View("spad", "int32", _at(0), (M, K), (K, 1))
    sw = View("spad", "float32", _at(128), (K,), (1,))
    bo = View("spad", "float32", _at(144), (K,), (1,))
    y = View("spad", "uint8", _at(160), (M, K), (K, 1))
    rows = (_at(0), _at(0))
    code = (
        isa.make("LOAD", dst=a, src=Box(0, rows, (M, K))),
        isa.make("LOAD", dst=sw, src=Box(1, (_at(0),), (K,))),
        isa.make("LOAD", dst=bo, src=Box(2, (_at(0),), (K,))).with_tokens(signal={"EX"}),
        isa.make(
            "VREQUANTO",
            dst=y,
            a=a,
            wei=View("spad", "float32", _at(128), (M, K), (0, 1)),
            bias=View("spad", "float32", _at(144), (M, K), (0, 1)),
            s_src=s_src,
            d=d,
            zp=zp,
            lo=lo,
            hi=hi,
        ).with_tokens(wait={"LD"}, signal={"ST"}),
        isa.make("STORE", dst=Box(3, rows, (M, K)), src=y).with_tokens(wait={"EX"}),
    )
    tensors = (
        TensorEntry("A", "int32", (M, K), "input", 0),
        TensorEntry("SW", "float32", (K,), "input", 128),
        TensorEntry("BO", "float32", (K,), "input", 144),
        TensorEntry("Y", "uint8", (M, K), "output", 160),
    )
    return Binary("tiny", TINY.hash, tensors, code, 192)


def rule(acc, sw, bo, s_src: float, d: float, zp: int, lo: int = 0, hi: int = 255):
    sc = onednn.OnednnScales(F32(s_src), np.asarray(sw, F32), F32(d))
    return onednn.requantize_onednn(acc, bo, sc, zp, lo, hi)


def run(binary: Binary, acc, sw, bo) -> np.ndarray:
    inputs = {"A": np.asarray(acc, np.int32), "SW": np.asarray(sw, F32), "BO": np.asarray(bo, F32)}
    return simulate(binary, inputs, TINY).outputs["Y"].astype(np.int64)


def test_encoding_round_trips_through_binary_and_assembler_text():
    b = requant_binary(float(F32(0.0123)), float(F32(37.25)), 131, 3, 250)
    for again in (decode(encode(b)), assemble(disassemble(b))):
        ins = next(i for i in again.code if i.mnemonic == "VREQUANTO")
        want = next(i for i in b.code if i.mnemonic == "VREQUANTO")
        assert ins.args == want.args and ins.wait == want.wait and ins.signal == want.signal
    assert encode(decode(encode(b))) == encode(b)
    verify_binary(decode(encode(b)), TINY)


def test_semantics_in_the_simulator_equal_the_rule_on_random_values():
    rng = np.random.default_rng(40)
    for trial in range(40):
        s_src, d = float(F32(rng.uniform(1e-3, 0.1))), float(F32(rng.uniform(5, 500)))
        zp, lo = int(rng.integers(0, 256)), int(rng.integers(0, 60))
        acc = rng.integers(-(2**15), 2**15, (M, K))
        acc[0, 0], acc[0, 1] = 2**31 - 1, -(2**31)  # the float saturates, never wraps
        sw = rng.uniform(5e-4, 1e-2, K).astype(F32)
        bo = rng.normal(0, 0.5, K).astype(F32)
        got = run(decode(encode(requant_binary(s_src, d, zp, lo))), acc, sw, bo)
        assert np.array_equal(got, rule(acc, sw, bo, s_src, d, zp, lo)), trial
        assert got[0, 0] == 255 and got[0, 1] == lo


def test_exact_ties_round_to_even_with_the_zero_point_added_first():
    """t * d lands exactly on k + 1/2: ties go to even after the zero point is added (oneDNN),
    which neither rounding half away from zero nor adding the zero point after rounding does."""
    acc = np.arange(1, 2 * M * K, 2).reshape(M, K)  # odd: acc * 0.5 is a half
    sw, bo = np.ones(K, F32), np.zeros(K, F32)
    for zp in (0, 3, 100):
        got = run(requant_binary(1.0, 0.5, zp), acc, sw, bo)
        exact = acc * 0.5 + zp
        assert np.array_equal(got, np.clip(np.rint(exact), 0, 255))
        assert np.array_equal(got, rule(acc, sw, bo, 1.0, 0.5, zp))
        assert not np.array_equal(got, np.clip(np.floor(exact + 0.5), 0, 255))
        if zp % 2:
            assert not np.array_equal(got, np.clip(np.rint(acc * 0.5) + zp, 0, 255))


def requant_program(n: int, k: int, relu: bool, consts: str = "0.03125, 0.00390625, 100") -> str:
    """A 1x1 conv as a matrix product, requantized by oneDNN's rule (op.yaml)."""
    y = f"requant_onednn(ACC[i, j], SW[j], BO[j], {consts})"
    y = f"clamp({y}, 100, 255)" if relu else y
    return f"""tensorgen: 1
name: rq_onednn
tensors:
  X: {{shape: [{n}, 24], dtype: uint8, role: input}}
  W: {{shape: [24, {k}], dtype: int8, role: input}}
  SW: {{shape: [{k}], dtype: float32, role: input}}
  BO: {{shape: [{k}], dtype: float32, role: input}}
  ACC: {{shape: [{n}, {k}], dtype: int32, role: none}}
  Y: {{shape: [{n}, {k}], dtype: uint8, role: output}}
statements:
  - "ACC[i, j] = 0"
  - "ACC[i, j] += X[i, r] * W[r, j]"
  - "Y[i, j] = {y}"
"""


@pytest.mark.parametrize("relu", [False, True], ids=["plain", "relu"])
@pytest.mark.parametrize("n, k", [(50, 24), (7, 33)])
def test_requant_onednn_programs_are_bit_exact_under_both_schedulers(n, k, relu):
    program = parse_program(requant_program(n, k, relu), "<rq>", "tg1")
    auto = compile_auto(program, TG1).compiled
    for compiled in (auto, compile_default(program, TG1)):
        assert any(i.mnemonic == "VREQUANTO" for i in compiled.binary.code)
        for seed in (0, 1):
            cmp, _ = run_and_compare(Job(program, TG1, compiled), random_inputs(program, seed))
            assert cmp.exact, cmp.message


def test_the_reference_and_the_program_round_exact_ties_to_even_after_the_zero_point():
    """s_src = 1, d = 1/2, weight scales 1, biases 0: every odd accumulator is a tie, after the
    zero point 3 is added; the simulator and the reference agree, and both equal numpy's
    rounding of the exact value (not the zero point added after rounding)."""
    program = parse_program(requant_program(40, 16, False, "1.0, 0.5, 3"), "<rq>", "tg1")
    rng = np.random.default_rng(41)
    x = rng.integers(0, 4, (40, 24)).astype(np.uint8)
    w = rng.integers(-2, 3, (24, 16)).astype(np.int8)
    inputs = {"X": x, "W": w, "SW": np.ones(16, F32), "BO": np.zeros(16, F32)}
    cmp, result = run_and_compare(Job(program, TG1, compile_default(program, TG1)), inputs)
    assert cmp.exact, cmp.message
    acc = x.astype(np.int64) @ w.astype(np.int64)
    assert (acc % 2 == 1).sum() > 100
    y = result.outputs["Y"].astype(np.int64)
    assert np.array_equal(y, np.clip(np.rint(acc * 0.5 + 3), 0, 255))
    assert not np.array_equal(y, np.clip(np.rint(acc * 0.5) + 3, 0, 255))


@pytest.mark.parametrize(
    "stmt, match",
    [
        ("requant_onednn(A[i], 0.5, BO[i], 1.0, 1.0, 0)", r"needs float32 tensor reads"),
        ("requant_onednn(A[i], SW[i], BO[i], A[i], 1.0, 0)", r"needs float32 tensor reads"),
        ("requant_onednn(A[i], SW[i], BO[i], 1.0, 1.0, 0.5)", r"integer constant as argument 6"),
        ("requant_onednn(A[i], A[i], BO[i], 1.0, 1.0, 0)", r"expected a float32 tensor"),
    ],
)
def test_malformed_requant_onednn_is_refused_in_one_line(stmt, match):
    from tensorgen.errors import SpecError

    text = f"""tensorgen: 1
name: bad
tensors:
  A: {{shape: [4], dtype: int32, role: input}}
  SW: {{shape: [4], dtype: float32, role: input}}
  BO: {{shape: [4], dtype: float32, role: input}}
  Y: {{shape: [4], dtype: uint8, role: output}}
statements:
  - "Y[i] = {stmt}"
"""
    with pytest.raises(SpecError, match=match) as err:
        parse_program(text, "<bad>", "tg1")
    assert "\n" not in str(err.value)
