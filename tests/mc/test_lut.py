"""VLUT, the lookup-table instruction, and op.yaml's `lut(x, T)` that lowers to it: the
semantics (each element's byte indexes 256 table entries), the verifier's operand checks, and
programs compiled by both schedulers bit-exact against the reference's own lookup."""

from __future__ import annotations

import numpy as np
import pytest

from tensorgen.driver import Job, compile_auto, compile_default, random_inputs, run_and_compare
from tensorgen.errors import BinaryError, SpecError
from tensorgen.mc import isa
from tensorgen.mc.binary import Binary, TensorEntry, decode, encode
from tensorgen.mc.operands import Box, LoopAffine, View
from tensorgen.mc.verify import verify_binary
from tensorgen.sim.machine import simulate
from tensorgen.spec.loader import parse_program
from tensorgen.target import load_target

TINY = load_target("tiny")
TG1 = load_target("tg1")


def lut_binary(dtype: str, table_view: View | None = None, a_dtype: str | None = None) -> Binary:
    """X (8 elements) and T (256) loaded to spad, Y = T[X], stored."""
    x = View("spad", a_dtype or dtype, LoopAffine.make(0), (8,), (1,))
    t = table_view or View("spad", "uint8", LoopAffine.make(64), (256,), (1,))
    y = View("spad", "uint8", LoopAffine.make(512), (8,), (1,))
    code = (
        isa.make("LOAD", dst=x, src=Box(0, (LoopAffine.make(0),), (8,))),
        isa.make(
            "LOAD",
            dst=View("spad", "uint8", LoopAffine.make(64), (256,), (1,)),
            src=Box(1, (LoopAffine.make(0),), (256,)),
        ).with_tokens(signal={"EX"}),
        isa.make("VLUT", dst=y, a=x, table=t).with_tokens(wait={"LD"}, signal={"ST"}),
        isa.make("STORE", dst=Box(2, (LoopAffine.make(0),), (8,)), src=y).with_tokens(wait={"EX"}),
    )
    tensors = (
        TensorEntry("X", dtype, (8,), "input", 0),
        TensorEntry("T", "uint8", (256,), "input", 64),
        TensorEntry("Y", "uint8", (8,), "output", 384),
    )
    return Binary("tiny", TINY.hash, tensors, code, 448)


@pytest.mark.parametrize("dtype", ["uint8", "int8"])
def test_vlut_indexes_the_table_by_each_elements_byte(dtype):
    x = np.array([0, 1, 127, -128, -1, 5, 200, 255], np.int64)
    x = x.astype(np.uint8).astype(dtype)  # the same bytes either way
    table = np.random.default_rng(3).integers(0, 256, 256).astype(np.uint8)
    binary = decode(encode(lut_binary(dtype)))
    out = simulate(binary, {"X": x, "T": table}, TINY).outputs["Y"]
    assert np.array_equal(out, table[x.astype(np.uint8)])


@pytest.mark.parametrize(
    "table, a_dtype, match",
    [
        (
            View("spad", "uint8", LoopAffine.make(64), (128,), (1,)),
            None,
            r"table is spad:uint8 \[128\]",
        ),
        (View("spad", "uint8", LoopAffine.make(64), (256,), (2,)), None, r"stride \[2\]"),
        (View("acc", "uint8", LoopAffine.make(0), (256,), (1,)), None, r"expected 256 consecutive"),
        (View("spad", "int32", LoopAffine.make(64), (256,), (1,)), None, r"spad:int32"),
        (None, "int32", r"a is int32; a lookup indexes by int8/uint8 elements"),
    ],
)
def test_verifier_refuses_a_bad_table_or_index_operand(table, a_dtype, match):
    binary = decode(encode(lut_binary("uint8", table, a_dtype)))
    with pytest.raises(BinaryError, match=r"^instruction 2 \(VLUT\): .*" + match) as err:
        verify_binary(binary, TINY)
    assert "\n" not in str(err.value)


def lut_program(shape, xdtype="uint8", tdtype="int8", tshape="[256]", stmt=None) -> str:
    dims = ", ".join(map(str, shape))
    idx = ", ".join(f"i{d}" for d in range(len(shape)))
    stmt = stmt or f"Y[{idx}] = lut(X[{idx}], T)"
    return f"""tensorgen: 1
name: lut
tensors:
  X: {{shape: [{dims}], dtype: {xdtype}, role: input}}
  T: {{shape: {tshape}, dtype: {tdtype}, role: input}}
  Y: {{shape: [{dims}], dtype: {tdtype}, role: output}}
statements:
  - "{stmt}"
"""


@pytest.mark.parametrize("shape", [(1, 16, 7, 9), (2, 96, 40, 56), (300,)])
@pytest.mark.parametrize("xdtype", ["uint8", "int8"])
def test_lut_program_is_bit_exact_under_both_schedulers(shape, xdtype):
    program = parse_program(lut_program(shape, xdtype), "<lut>", "tg1")
    auto = compile_auto(program, TG1).compiled
    for compiled in (auto, compile_default(program, TG1)):
        assert any(i.mnemonic == "VLUT" for i in compiled.binary.code)
        for seed in (0, 1):
            cmp, _ = run_and_compare(Job(program, TG1, compiled), random_inputs(program, seed))
            assert cmp.exact, cmp.message


def test_lut_of_a_transposed_read_and_into_a_sum():
    text = (
        lut_program((6, 10), stmt="Y[i, j] = lut(X[i, j], T) + 3")
        .replace("X: {shape: [6, 10]", "X: {shape: [10, 6]")
        .replace("lut(X[i, j]", "lut(X[j, i]")
        .replace("dtype: int8, role: output", "dtype: int32, role: output")
    )
    program = parse_program(text, "<lut>", "tg1")
    cmp, _ = run_and_compare(
        Job(program, TG1, compile_default(program, TG1)), random_inputs(program, 4)
    )
    assert cmp.exact, cmp.message


@pytest.mark.parametrize(
    "text, match",
    [
        (
            lut_program((4,), tshape="[255]"),
            r"lut\(x, T\) needs T of shape \[256\] and dtype int8 or uint8; T is \[255\] int8",
        ),
        (lut_program((4,), tshape="[16, 16]"), r"T is \[16, 16\] int8"),
        (lut_program((4,), tdtype="int32"), r"T is \[256\] int32"),
        (lut_program((4,), xdtype="int32"), r"looks up int8/uint8 elements; X is int32"),
        (
            lut_program((4,), stmt="Y[i0] = lut(X[i0] + 1, T)"),
            r"lut\(x, T\) needs a tensor read as x",
        ),
        (lut_program((4,), stmt="Y[i0] = lut(X[i0], T[0])"), r"needs a bare tensor name as T"),
        (lut_program((4,), stmt="Y[i0] = lut(X[i0], U)"), r"unknown tensor 'U'"),
    ],
)
def test_bad_lut_is_one_line(text, match):
    with pytest.raises(SpecError, match=match) as err:
        parse_program(text, "<lut>", "tg1")
    assert "\n" not in str(err.value)
