"""The PyTorch reference: its aten fast paths agree with its generic gather path and with torch."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from tensorgen.driver import random_inputs
from tensorgen.reference import torch_ref
from tensorgen.spec.loader import parse_program

CONV = """tensorgen: 1
tensors:
  X: {{shape: [2, 3, 7, 6], dtype: uint8, role: input, pad: 4}}
  W: {{shape: [5, 3, 3, 2], dtype: int8, role: input}}
  Y: {{shape: [2, 5, {ho}, {wo}], dtype: int32, role: output}}
statements:
  - Y[n, k, h, w] += (X[n, c, {s}*h + 2*r - 1, {s}*w + q] - 4) * W[k, c, r, q]
"""


@pytest.mark.parametrize("stride", [1, 2])
def test_conv_fast_path_equals_generic_path_and_torch(stride: int, monkeypatch) -> None:
    ho, wo = (7 + 2 - 4 - 1) // stride + 1, (6 - 1 - 1) // stride + 1
    p = parse_program(CONV.format(ho=ho, wo=wo, s=stride))
    inputs = random_inputs(p, seed=5)
    fast = torch_ref.evaluate(p, inputs)["Y"]
    monkeypatch.setattr(torch_ref, "_fast_contraction", lambda *a: False)
    generic = torch_ref.evaluate(p, inputs)["Y"]
    np.testing.assert_array_equal(fast, generic)
    x = torch.from_numpy(inputs["X"].astype(np.int64)) - 4
    expected = F.conv2d(
        F.pad(x, (0, 0, 1, 1)),
        torch.from_numpy(inputs["W"].astype(np.int64)),
        stride=stride,
        dilation=(2, 1),
    )
    np.testing.assert_array_equal(fast, expected.numpy()[:, :, :ho, :wo])


def test_int32_accumulation_wraps_like_hardware() -> None:
    p = parse_program("""tensorgen: 1
tensors:
  A: {shape: [1, 2], dtype: int32, role: input}
  C: {shape: [1], dtype: int32, role: output}
statements:
  - C[i] += A[i, k] * A[i, k]
""")
    a = np.array([[2**16, 2**16]], dtype=np.int32)  # 2 * 2**32 wraps to 0
    assert torch_ref.evaluate(p, {"A": a})["C"][0] == 0


def test_requant_matches_pytorch_quantized_conv_output_rule() -> None:
    """requant() is qnnpack's rule (NUMERICS.md): checked against torch's own quantize of the float
    value on exact ties and on random accumulators."""
    acc = torch.tensor([5, 15, 25, -5, -15, 7, 1_000_000, -1_000_000])
    got = torch_ref.requant(acc, 0.1, 3, "uint8")
    # 0.5, 1.5, 2.5 round half to even; -0.5 -> -0; saturation at both ends
    assert got.tolist() == [3 + 0, 3 + 2, 3 + 2, 3 + 0, 3 - 2, 3 + 1, 255, 0]
    m = torch.tensor(0.0047, dtype=torch.float32)
    rnd = torch.randint(-(2**20), 2**20, (10000,))
    expected = torch.clamp(torch.round(rnd.to(torch.float32) * m).to(torch.int64) - 3, -128, 127)
    assert torch.equal(torch_ref.requant(rnd, 0.0047, -3, "int8"), expected)


def test_recurrence_reads_the_previous_step() -> None:
    p = parse_program("""tensorgen: 1
tensors:
  H: {shape: [4, 3], dtype: int32, role: inout}
loops: {t: 3}
statements:
  - H[t + 1, j] = H[t, j] * 2 + 1
""")
    h = np.zeros((4, 3), np.int32)
    h[0] = [1, 2, 3]
    out = torch_ref.evaluate(p, {"H": h})["H"]
    np.testing.assert_array_equal(out[3], ((np.array([1, 2, 3]) * 2 + 1) * 2 + 1) * 2 + 1)


def test_self_dependent_statement_runs_in_program_order() -> None:
    p = parse_program("""tensorgen: 1
tensors:
  X: {shape: [6], dtype: int32, role: input}
  S: {shape: [6], dtype: int32, role: output}
statements:
  - S[i] = X[i]
  - {stmt: "S[i] = S[i - 1] + X[i]", where: "1 <= i < 6"}
""")
    x = np.arange(1, 7, dtype=np.int32)
    np.testing.assert_array_equal(torch_ref.evaluate(p, {"X": x})["S"], np.cumsum(x))


def test_max_into_a_narrow_tensor_wraps_at_every_instance() -> None:
    # each instance stores wrap8(max(Z, x)): 200 wraps to -56, then max(-56, 3) = 3; a single max
    # of the int32 values (200) wrapped once would give -56
    p = parse_program("""tensorgen: 1
tensors:
  X: {shape: [3, 2], dtype: int32, role: input}
  Z: {shape: [2], dtype: int8, role: output}
statements:
  - Z[i] max= X[r, i]
""")
    x = np.array([[200, 1], [3, -300], [-1, 130]], dtype=np.int32)
    z = torch_ref.evaluate(p, {"X": x})["Z"]
    expected = []
    for col in x.T:
        acc = 0
        for v in col:
            acc = (max(acc, int(v)) + 128) % 256 - 128
        expected.append(acc)
    np.testing.assert_array_equal(z, np.array(expected, dtype=np.int8))
    assert z.tolist() == [3, -126]


def test_where_on_a_shared_loop_skips_the_other_steps() -> None:
    p = parse_program("""tensorgen: 1
tensors:
  Y: {shape: [2], dtype: int32, role: output}
loops: {t: 5}
statements:
  - {stmt: "Y[i] += 1", where: "1 <= t <= 2"}
""")
    assert torch_ref.evaluate(p, {})["Y"].tolist() == [2, 2]


def test_temporary_starts_at_zero_and_carries_across_steps() -> None:
    p = parse_program("""tensorgen: 1
tensors:
  X: {shape: [3, 2], dtype: int32, role: input}
  T: {shape: [2], dtype: int32}
  Y: {shape: [3, 2], dtype: int32, role: output}
loops: {t: 3}
statements:
  - T[i] += X[t, i]
  - Y[t, i] = T[i]
""")
    x = np.arange(6, dtype=np.int32).reshape(3, 2)
    np.testing.assert_array_equal(torch_ref.evaluate(p, {"X": x})["Y"], np.cumsum(x, axis=0))


def test_statement_reading_its_own_element_over_a_reduction_runs_in_order() -> None:
    # Q[i] = 2 X[t, i] + Q[i] over t: each instance reads the previous one's write (found by the
    # property test: the reference once evaluated every t from the initial Q and kept the last)
    p = parse_program("""tensorgen: 1
tensors:
  X: {shape: [3, 2], dtype: int32, role: input}
  Q: {shape: [2], dtype: int32, role: output}
statements:
  - {stmt: "Q[i] = X[t, i] + (X[t, i] + Q[i])", where: "0 <= t <= 2"}
""")
    x = np.array([[1, 10], [2, 20], [4, 40]], dtype=np.int32)
    assert torch_ref.evaluate(p, {"X": x})["Q"].tolist() == [14, 140]
