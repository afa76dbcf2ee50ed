"""Hypothesis: random matmul and conv2d problems on `tiny` are bit-exact against PyTorch.

The expected values come from torch's own conv2d / matmul, not from tensorgen's reference,
so this also checks the reference's reading of the op.yaml.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from tensorgen.driver import compile_default
from tensorgen.mc.binary import decode, encode
from tensorgen.reference.torch_ref import evaluate
from tensorgen.sim.machine import simulate
from tensorgen.spec.loader import parse_program
from tensorgen.target import load_target

TINY = load_target("tiny")
SETTINGS = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _run(text: str, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    program = parse_program(text, "<random>")
    binary = decode(encode(compile_default(program, TINY).binary))
    out = simulate(binary, inputs, TINY).outputs
    ref = evaluate(program, inputs)
    for name in ref:
        np.testing.assert_array_equal(out[name], ref[name])
    return out


def _affine(stride: int, index: str, dil: int, red: str, pad: int) -> str:
    return f"{stride}*{index} + {dil}*{red} - {pad}"


@SETTINGS
@given(
    c=st.sampled_from([1, 2, 3, 5, 8]),
    k=st.sampled_from([1, 3, 4, 6]),
    h=st.integers(1, 9),
    w=st.integers(1, 9),
    r=st.integers(1, 3),
    q=st.integers(1, 3),
    stride=st.integers(1, 2),
    pad=st.integers(0, 2),
    dil=st.integers(1, 2),
    zp=st.sampled_from([None, 0, 7]),
    seed=st.integers(0, 2**16),
)
def test_random_conv2d(c, k, h, w, r, q, stride, pad, dil, zp, seed) -> None:
    ho = (h + 2 * pad - dil * (r - 1) - 1) // stride + 1
    wo = (w + 2 * pad - dil * (q - 1) - 1) // stride + 1
    assume(ho >= 1 and wo >= 1)
    xdt = "int8" if zp is None else "uint8"
    xpad = 0 if zp is None else zp
    x_read = (
        f"X[n, c, {_affine(stride, 'h', dil, 'r', pad)}, {_affine(stride, 'w', dil, 'q', pad)}]"
    )
    if zp is not None:
        x_read = f"({x_read} - {zp})"
    text = f"""tensorgen: 1
tensors:
  X: {{shape: [1, {c}, {h}, {w}], dtype: {xdt}, role: input, pad: {xpad}}}
  W: {{shape: [{k}, {c}, {r}, {q}], dtype: int8, role: input}}
  Y: {{shape: [1, {k}, {ho}, {wo}], dtype: int32, role: output}}
statements:
  - Y[n, k, h, w] += {x_read} * W[k, c, r, q]
"""
    rng = np.random.default_rng(seed)
    lo, hi = (-128, 127) if zp is None else (0, 255)
    x = rng.integers(lo, hi, (1, c, h, w), endpoint=True).astype(xdt)
    wt = rng.integers(-128, 127, (k, c, r, q), endpoint=True).astype(np.int8)
    out = _run(text, {"X": x, "W": wt})
    xt = torch.from_numpy(x.astype(np.int64)) - (zp or 0)
    expected = F.conv2d(
        xt, torch.from_numpy(wt.astype(np.int64)), stride=stride, padding=pad, dilation=dil
    )
    np.testing.assert_array_equal(out["Y"], expected.numpy().astype(np.int32))


@SETTINGS
@given(
    m=st.integers(1, 40),
    n=st.integers(1, 40),
    k=st.integers(1, 40),
    transposed=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_random_matmul(m, n, k, transposed, seed) -> None:
    b_shape, b_read = ([n, k], "B[j, l]") if transposed else ([k, n], "B[l, j]")
    text = f"""tensorgen: 1
tensors:
  A: {{shape: [{m}, {k}], dtype: int8, role: input}}
  B: {{shape: {b_shape}, dtype: int8, role: input}}
  C: {{shape: [{m}, {n}], dtype: int32, role: output}}
statements:
  - C[i, j] += A[i, l] * {b_read}
"""
    rng = np.random.default_rng(seed)
    a = rng.integers(-128, 127, (m, k), endpoint=True).astype(np.int8)
    b = rng.integers(-128, 127, b_shape, endpoint=True).astype(np.int8)
    out = _run(text, {"A": a, "B": b})
    bm = b.T if transposed else b
    np.testing.assert_array_equal(out["C"], a.astype(np.int64) @ bm.astype(np.int64))


@SETTINGS
@given(
    c=st.integers(1, 9),
    h=st.integers(1, 8),
    w=st.integers(1, 8),
    stride=st.integers(1, 2),
    seed=st.integers(0, 2**16),
)
def test_random_depthwise(c, h, w, stride, seed) -> None:
    ho, wo = (h - 1) // stride + 1, (w - 1) // stride + 1
    text = f"""tensorgen: 1
tensors:
  X: {{shape: [1, {c}, {h}, {w}], dtype: int8, role: input}}
  W: {{shape: [{c}, 1, 3, 3], dtype: int8, role: input}}
  Y: {{shape: [1, {c}, {ho}, {wo}], dtype: int32, role: output}}
statements:
  - Y[n, c, h, w] += X[n, c, {stride}*h + r - 1, {stride}*w + q - 1] * W[c, 0, r, q]
"""
    rng = np.random.default_rng(seed)
    x = rng.integers(-128, 127, (1, c, h, w), endpoint=True).astype(np.int8)
    wt = rng.integers(-128, 127, (c, 1, 3, 3), endpoint=True).astype(np.int8)
    out = _run(text, {"X": x, "W": wt})
    expected = F.conv2d(
        torch.from_numpy(x.astype(np.int64)),
        torch.from_numpy(wt.astype(np.int64)),
        stride=stride,
        padding=1,
        groups=c,
    )
    np.testing.assert_array_equal(out["Y"], expected.numpy().astype(np.int32))
