"""The rules of the element-wise operators of issue 15, pinned against PyTorch (torch 2.13, CPU)
under qnnpack and x86, contiguous and channels-last: quantized `mul` of two tensors (with
squeeze-excite's channel broadcast), `mean` over the spatial dimensions, and the premise of the
lookup tables: that each quantized function of one input (hardswish, sigmoid, ..., add and mul of
a number) gives every element the value PyTorch gives its code alone. 1e5+ random elements per
rule, plus constructed cases on which the plausible alternatives disagree."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from tensorgen.frontend import elementwise, numerics
from tensorgen.mc import arith

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

ENGINES = ("qnnpack", "x86")
f32 = np.float32


def qtensor(q: np.ndarray, scale: float, zp: int, channels_last: bool = False, dtype="uint8"):
    codes = torch.from_numpy(np.asarray(q).astype(dtype))
    t = torch._make_per_tensor_quantized_tensor(codes, scale, zp)
    return t.contiguous(memory_format=torch.channels_last) if channels_last else t


def scales(rng, n: int = 3) -> list[float]:
    return [float(f32(np.exp(rng.uniform(-7, -1)))) for _ in range(n)]


# --- mul ------------------------------------------------------------------------------------


@pytest.mark.parametrize("eng", ENGINES)
@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "nhwc"])
@pytest.mark.parametrize("broadcast", [False, True], ids=["same", "se"])
def test_mul_is_the_integer_product_requantized(engine, eng, channels_last, broadcast):
    engine(eng)
    rng = np.random.default_rng(11)
    total = 0
    for _ in range(12):
        s_a, s_b, s_y = scales(rng)
        zp_a, zp_b, zp_y = (int(z) for z in rng.integers(0, 256, 3))
        shape = (2, int(rng.integers(1, 70)), 13, 17)
        a = rng.integers(0, 256, shape)
        b = rng.integers(0, 256, shape[:2] + (1, 1) if broadcast else shape)
        qa, qb = qtensor(a, s_a, zp_a, channels_last), qtensor(b, s_b, zp_b, channels_last)
        got = torch.ops.quantized.mul(qa, qb, s_y, zp_y).int_repr().numpy()
        m = numerics.mul_multiplier(s_a, s_b, s_y)
        np.testing.assert_array_equal(numerics.mul_codes(a, b, zp_a, zp_b, m, zp_y), got)
        total += got.size
    assert total >= 100_000


def all_pairs():
    return np.repeat(np.arange(256), 256), np.tile(np.arange(256), 256)


@pytest.mark.parametrize("eng", ENGINES)
def test_mul_multiplier_is_the_float32_product_times_the_reciprocal(engine, eng):
    """On every code pair: the rule always; a double multiplier, or a float32 division by the
    output scale, fails on some scales (found by a seeded search, kept in the test)."""
    engine(eng)
    rng = np.random.default_rng(5)
    a, b = all_pairs()
    alternatives = {
        "double": lambda sa, sb, sy: f32(sa * sb / sy),
        "f32 division": lambda sa, sb, sy: f32(f32(f32(sa) * f32(sb)) / f32(sy)),
    }
    failed = dict.fromkeys(alternatives, 0)
    for trial in range(3000):
        s_a, s_b, s_y = scales(rng)
        s_y = float(f32(s_y * rng.uniform(0.01, 10)))
        zp_a, zp_b, zp_y = (int(z) for z in rng.integers(0, 256, 3))
        want = (
            torch.ops.quantized.mul(qtensor(a, s_a, zp_a), qtensor(b, s_b, zp_b), s_y, zp_y)
            .int_repr()
            .numpy()
        )
        m = numerics.mul_multiplier(s_a, s_b, s_y)
        np.testing.assert_array_equal(numerics.mul_codes(a, b, zp_a, zp_b, m, zp_y), want)
        for name, alt in alternatives.items():
            got = numerics.mul_codes(a, b, zp_a, zp_b, alt(s_a, s_b, s_y), zp_y)
            failed[name] += not np.array_equal(got, want)
        if all(failed.values()) and trial >= 200:
            break
    assert all(failed.values()), failed


@pytest.mark.parametrize("eng", ENGINES)
def test_mul_relu_clamps_at_the_zero_point(engine, eng):
    engine(eng)
    rng = np.random.default_rng(2)
    a, b = (rng.integers(0, 256, (1, 8, 110, 120)) for _ in range(2))
    s_a, s_b, s_y = scales(rng)
    got = torch.ops.quantized.mul_relu(qtensor(a, s_a, 100), qtensor(b, s_b, 130), s_y, 90)
    m = numerics.mul_multiplier(s_a, s_b, s_y)
    want = np.maximum(numerics.mul_codes(a, b, 100, 130, m, 90), 90)
    np.testing.assert_array_equal(got.int_repr().numpy(), want)


# --- mean -----------------------------------------------------------------------------------


@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "nhwc"])
def test_qnnpack_mean_over_space_is_its_average_pooling_to_one(engine, channels_last):
    engine("qnnpack")
    rng = np.random.default_rng(3)
    total = 0
    for _ in range(40):
        c, h, w = int(rng.integers(1, 100)), int(rng.integers(1, 20)), int(rng.integers(1, 20))
        s, zp = scales(rng, 1)[0], int(rng.integers(0, 256))
        q = rng.integers(0, 256, (2, c, h, w))
        x = qtensor(q, s, zp, channels_last)
        y = x.mean((2, 3), keepdim=True)
        assert (y.q_scale(), y.q_zero_point()) == (s, zp)
        assert torch.equal(y.int_repr(), F.adaptive_avg_pool2d(x, 1).int_repr())
        acc = (q - zp).sum(axis=(2, 3), keepdims=True)
        m = numerics.avgpool_multiplier(s, s, h * w)
        np.testing.assert_array_equal(y.int_repr().numpy(), arith.requantize(acc, m, zp, 0, 255))
        total += q.size
    assert total >= 100_000


def test_x86_mean_is_not_its_average_pooling(engine):
    """Why tensorgen refuses mean under x86: PyTorch takes another path there (a float mean of
    the dequantized channels-last tensor), which its adaptive pooling does not reproduce."""
    engine("x86")
    rng = np.random.default_rng(4)
    differ = 0
    for _ in range(2000):  # about one in twelve differs (channel counts that fbgemm pools exactly)
        c, h, w = 8 * int(rng.integers(1, 9)), int(rng.integers(1, 15)), int(rng.integers(1, 15))
        zp = int(rng.integers(0, 256))
        x = qtensor(rng.integers(0, 256, (1, c, h, w)), scales(rng, 1)[0], zp, True)
        a = x.mean((2, 3), keepdim=True).int_repr()
        differ += not torch.equal(a, F.adaptive_avg_pool2d(x, 1).int_repr())
        if differ >= 3:
            break
    assert differ >= 3


# --- lookup tables --------------------------------------------------------------------------

FUNCTIONS = {
    "hardswish": lambda x, s, z: torch.ops.quantized.hardswish(x, s, z),
    "hardsigmoid": lambda x, s, z: F.hardsigmoid(x),
    "sigmoid": lambda x, s, z: torch.sigmoid(x),
    "tanh": lambda x, s, z: torch.tanh(x),
    "leaky_relu": lambda x, s, z: torch.ops.quantized.leaky_relu(x, 0.1, False, s, z),
    "elu": lambda x, s, z: torch.ops.quantized.elu(x, s, z),
    "add_scalar": lambda x, s, z: torch.ops.quantized.add(x, 1.37),
    "mul_scalar": lambda x, s, z: torch.ops.quantized.mul(x, -0.71),
}


@pytest.mark.parametrize("eng", ENGINES)
@pytest.mark.parametrize("name", list(FUNCTIONS))
@pytest.mark.parametrize("dtype", ["uint8", "int8"])
def test_each_element_gets_the_value_of_its_code_alone(engine, eng, name, dtype):
    """PyTorch's kernel on a random tensor (both layouts) equals its kernel on the 256 codes,
    looked up: what makes a table bit-exact by construction."""
    engine(eng)
    if dtype == "int8" and name in ("hardswish", "leaky_relu", "elu"):
        pytest.skip("PyTorch's quantized kernel takes quint8 only")
    fn = FUNCTIONS[name]
    rng = np.random.default_rng(abs(hash((name, dtype))) % 2**32)
    s, zp = scales(rng, 1)[0] * 4, int(rng.integers(0, 256)) - (128 if dtype == "int8" else 0)
    s_y, zp_y = scales(rng, 1)[0] * 4, int(rng.integers(0, 256)) - (128 if dtype == "int8" else 0)
    codes = elementwise.all_codes(dtype)
    ref = fn(qtensor(codes, s, zp, dtype=dtype), s_y, zp_y)
    table = ref.int_repr().numpy()
    total = 0
    for channels_last in (False, True):
        q = rng.integers(0, 256, (2, 37, 29, 31)).astype(np.uint8).view(dtype)
        y = fn(qtensor(q, s, zp, channels_last, dtype), s_y, zp_y)
        assert (y.q_scale(), y.q_zero_point()) == (ref.q_scale(), ref.q_zero_point())
        np.testing.assert_array_equal(y.int_repr().numpy(), table[q.view(np.uint8)])
        total += q.size
    assert total >= 100_000


@pytest.mark.parametrize("eng", ENGINES)
def test_mul_by_a_number_keeps_the_codes_or_mirrors_them(engine, eng):
    """Why a positive mul_scalar is an alias: PyTorch scales the scale and keeps every code;
    a negative one mirrors the codes, `255 - q`, zero point `255 - zp`."""
    engine(eng)
    q = np.arange(256)
    x = qtensor(q, 0.05, 31)
    y = torch.ops.quantized.mul(x, 0.5)
    assert (y.q_scale(), y.q_zero_point()) == (0.025, 31)
    np.testing.assert_array_equal(y.int_repr().numpy(), q)
    y = torch.ops.quantized.mul(x, -2.0)
    assert (y.q_scale(), y.q_zero_point()) == (0.1, 255 - 31)
    np.testing.assert_array_equal(y.int_repr().numpy(), 255 - q)
