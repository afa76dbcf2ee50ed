"""VADDQS, the instruction for the scalar path of PyTorch's x86/fbgemm quantized add (the tail of
each vectorised run), and op.yaml's `add_fbgemm_scalar` that lowers to it: the encoding round
trip (binary and assembler text), the semantics in the simulator against PyTorch's own quantized
add on every element of a mixed-layout add (which runs the scalar loop only), on pairs chosen
where the vector and scalar roundings disagree, and malformed calls refused in one line."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tensorgen.errors import SpecError
from tensorgen.frontend import numerics
from tensorgen.mc import arith, isa
from tensorgen.mc.binary import Binary, TensorEntry, assemble, decode, disassemble, encode
from tensorgen.mc.operands import Box, LoopAffine, View
from tensorgen.mc.verify import verify_binary
from tensorgen.sim.machine import simulate
from tensorgen.spec.loader import parse_program
from tensorgen.target import load_target

pytestmark = pytest.mark.filterwarnings(
    "ignore:torch.quantize_per_tensor, torch.quantize_per_channel:UserWarning"
)
F32 = np.float32
TINY = load_target("tiny")
N = 64


def _at(byte: int) -> LoopAffine:
    return LoopAffine.make(byte)


def addqs_binary(s_a: float, zp_a: int, s_b: float, zp_b: int, inv: float, zp: int) -> Binary:
    """A and B (uint8 [N]) loaded to spad, Y = VADDQS(A, B), stored."""
    a, b, y = (View("spad", "uint8", _at(off), (N,), (1,)) for off in (0, N, 2 * N))
    code = (
        isa.make("LOAD", dst=a, src=Box(0, (_at(0),), (N,))),
        isa.make("LOAD", dst=b, src=Box(1, (_at(0),), (N,))).with_tokens(signal={"EX"}),
        isa.make(
            "VADDQS", dst=y, a=a, b=b, s_a=s_a, zp_a=zp_a, s_b=s_b, zp_b=zp_b, inv=inv, zp=zp
        ).with_tokens(wait={"LD"}, signal={"ST"}),
        isa.make("STORE", dst=Box(2, (_at(0),), (N,)), src=y).with_tokens(wait={"EX"}),
    )
    tensors = (
        TensorEntry("A", "uint8", (N,), "input", 0),
        TensorEntry("B", "uint8", (N,), "input", N),
        TensorEntry("Y", "uint8", (N,), "output", 2 * N),
    )
    return Binary("tiny", TINY.hash, tensors, code, 3 * N)


def test_encoding_round_trips_through_binary_and_assembler_text():
    b = addqs_binary(float(F32(0.0123)), 17, float(F32(0.071)), 250, float(F32(31.5)), 131)
    for again in (decode(encode(b)), assemble(disassemble(b))):
        ins = next(i for i in again.code if i.mnemonic == "VADDQS")
        want = next(i for i in b.code if i.mnemonic == "VADDQS")
        assert ins.args == want.args and ins.wait == want.wait and ins.signal == want.signal
    assert encode(decode(encode(b))) == encode(b)
    verify_binary(decode(encode(b)), TINY)


def _torch_scalar_add(qa, qb, s_a, zp_a, s_b, zp_b, s_out, zp_out) -> np.ndarray:
    """PyTorch's quantized add with one operand contiguous and one channels_last: no run is
    dense for all three tensors, so qadd_kernel runs its scalar loop on every element."""
    a = torch._make_per_tensor_quantized_tensor(
        torch.from_numpy(qa.astype(np.uint8)).reshape(1, 4, 4, 4), s_a, zp_a
    )
    b = torch._make_per_tensor_quantized_tensor(
        torch.from_numpy(qb.astype(np.uint8)).reshape(1, 4, 4, 4), s_b, zp_b
    ).contiguous(memory_format=torch.channels_last)
    saved = torch.backends.quantized.engine
    try:
        torch.backends.quantized.engine = "x86"
        y = torch.ops.quantized.add(a, b, s_out, zp_out)
    finally:
        torch.backends.quantized.engine = saved
    return y.int_repr().numpy().reshape(-1).astype(np.int64)


def test_semantics_equal_pytorchs_scalar_loop_where_the_two_roundings_differ():
    rng = np.random.default_rng(60)
    qa_all, qb_all = (g.ravel() for g in np.meshgrid(np.arange(256), np.arange(256)))
    checked = 0
    for _ in range(200):
        s_a, s_b = (float(v) for v in rng.uniform(1e-3, 0.1, 2))
        s_out = float(rng.uniform(max(s_a, s_b) / 8, 2 * (s_a + s_b)))
        zp_a, zp_b, zp_out = (int(v) for v in rng.integers(0, 256, 3))
        p = numerics.fbgemm_add_params(s_a, zp_a, s_b, zp_b, s_out, zp_out)
        vec = arith_vector(qa_all, qb_all, p)
        sca = arith_scalar(qa_all, qb_all, p)
        diff = np.flatnonzero(vec != sca)
        pick = rng.choice(diff, N) if diff.size else rng.integers(0, qa_all.size, N)
        qa, qb = qa_all[pick], qb_all[pick]
        binary = addqs_binary(float(p.s_a), zp_a, float(p.s_b), zp_b, float(p.inv_out), zp_out)
        inputs = {"A": qa.astype(np.uint8), "B": qb.astype(np.uint8)}
        got = simulate(decode(encode(binary)), inputs, TINY).outputs["Y"].astype(np.int64)
        want = _torch_scalar_add(qa, qb, s_a, zp_a, s_b, zp_b, s_out, zp_out)
        assert np.array_equal(got, want)
        checked += int((vec[pick] != sca[pick]).sum())
    assert checked > 2000  # the vector rule would have failed on each of them


def arith_vector(qa, qb, p):
    args = (p.s_a, p.zp_a, p.offset_a, p.s_b, p.zp_b, p.offset_b, p.inv_out, p.zp_out, 0, 255)
    return arith.add_fbgemm(qa, qb, *args, False)


def arith_scalar(qa, qb, p):
    args = (p.s_a, p.zp_a, p.offset_a, p.s_b, p.zp_b, p.offset_b, p.inv_out, p.zp_out, 0, 255)
    return arith.add_fbgemm(qa, qb, *args, True)


@pytest.mark.parametrize(
    "call, match",
    [
        ("add_fbgemm_scalar(A[i], B[i], 0.5, 3, 0.5, 3, 2.0)", r"takes 8 argument"),
        ("add_fbgemm_scalar(A[i], B[i], 0.5, 3.5, 0.5, 3, 2.0, 1)", r"integer constant as arg"),
        ("add_fbgemm_scalar(A[i], B[i], A[i], 3, 0.5, 3, 2.0, 1)", r"needs constants after"),
    ],
)
def test_malformed_add_fbgemm_scalar_is_refused_in_one_line(call, match):
    text = f"""tensorgen: 1
name: bad
tensors:
  A: {{shape: [4], dtype: uint8, role: input}}
  B: {{shape: [4], dtype: uint8, role: input}}
  Y: {{shape: [4], dtype: uint8, role: output}}
statements:
  - "Y[i] = {call}"
"""
    with pytest.raises(SpecError, match=match) as err:
        parse_program(text, "<bad>", "tg1")
    assert "\n" not in str(err.value)
