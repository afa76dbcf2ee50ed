"""The fbgemm / x86 rules of tensorgen.mc.arith and tensorgen.frontend.numerics, pinned
against PyTorch (torch 2.13; CPU capability AVX2 or AVX512: what depends on the CPU -- exact or
saturating products, the add's vector block -- comes from tensorgen.frontend.probe).

Covers what the small CNN (examples/models/small_cnn.py) quantized for the x86 engine runs:
quantize_per_tensor, per-channel conv / conv+relu and linear (fbgemm), quantized add_relu,
max_pool2d, adaptive_avg_pool2d to 1x1 on channels_last data, dequantize; and, at the end,
the whole model reproduced from numpy bit for bit.

Where random data cannot separate a rule from a plausible alternative, a test builds the
inputs on which they disagree and asserts that PyTorch sides with the rule, never with the
alternative. The quantized add is position dependent (vector body vs scalar tail); those
tests set torch's thread count explicitly because the split depends on it above 32767
elements.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.ao.nn.quantized as nnq

from tensorgen.frontend import numerics
from tensorgen.frontend.probe import x86_behaviour
from tensorgen.mc import arith

pytestmark = pytest.mark.filterwarnings(
    "ignore:torch.quantize_per_tensor, torch.quantize_per_channel:UserWarning"
)

F32 = np.float32
FBGEMM_ENGINES = ("x86", "fbgemm")
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def threads() -> Iterator[Callable[[int], None]]:
    """Set torch's intra-op thread count for one test; restored after."""
    saved = torch.get_num_threads()
    yield torch.set_num_threads
    torch.set_num_threads(saved)


def qtensor(q: np.ndarray, scale: float, zp: int, channels_last: bool = False) -> torch.Tensor:
    """A per-tensor quint8 tensor holding exactly the integers `q` (NCHW indexing)."""
    t = torch._make_per_tensor_quantized_tensor(torch.from_numpy(q.astype(np.uint8)), scale, zp)
    return t.contiguous(memory_format=torch.channels_last) if channels_last else t


def ints(t: torch.Tensor) -> np.ndarray:
    """The integers of a quantized tensor (logical NCHW indexing), as int64."""
    return t.int_repr().numpy().astype(np.int64)


def from_memory_order(flat: np.ndarray, shape: tuple[int, ...], channels_last: bool) -> np.ndarray:
    """An NCHW-indexed array from elements listed in the memory order of a tensor of `shape`
    (NHWC order when `channels_last`)."""
    if not channels_last:
        return flat.reshape(shape)
    n, c, *rest = shape
    return np.moveaxis(flat.reshape((n, *rest, c)), -1, 1)


def scalar_mask(numel: int, num_threads: int = 1, same_layout: bool = True) -> np.ndarray:
    """`fbgemm_add_scalar_mask` with the vector block this CPU's PyTorch uses (probed)."""
    return numerics.fbgemm_add_scalar_mask(
        numel, num_threads, same_layout, x86_behaviour("x86").add_block
    )


def rne(x: np.ndarray) -> np.ndarray:
    return np.rint(np.asarray(x, dtype=np.float64)).astype(np.int64)


# -- quantized add ------------------------------------------------------------------------------


def add_rule(qa, qb, s_a, zp_a, s_b, zp_b, s_out, zp_out, relu, scalar) -> np.ndarray:
    p = numerics.fbgemm_add_params(s_a, zp_a, s_b, zp_b, s_out, zp_out)
    return arith.add_fbgemm(
        qa,
        qb,
        p.s_a,
        p.zp_a,
        p.offset_a,
        p.s_b,
        p.zp_b,
        p.offset_b,
        p.inv_out,
        p.zp_out,
        zp_out if relu else 0,
        255,
        scalar,
    )


def add_op(relu: bool) -> Callable[..., torch.Tensor]:
    return torch.ops.quantized.add_relu if relu else torch.ops.quantized.add


def random_add_qparams(rng: np.random.Generator) -> tuple[float, int, float, int, float, int]:
    s_a, s_b = (float(v) for v in rng.uniform(1e-3, 0.1, 2))
    s_out = float(rng.uniform(max(s_a, s_b) / 8, 2 * (s_a + s_b)))
    zp_a, zp_b, zp_out = (int(v) for v in rng.integers(0, 256, 3))
    return s_a, zp_a, s_b, zp_b, s_out, zp_out


ADD_CASES = {  # name: (shape, a channels_last, b channels_last)
    "conv-out 1x32x16x16 cl": ((1, 32, 16, 16), True, True),
    "1x32x15x15 cl (tail 32)": ((1, 32, 15, 15), True, True),
    "1x3x7x7 contiguous": ((1, 3, 7, 7), False, False),
    "1x3x7x7 cl": ((1, 3, 7, 7), True, True),
    "2x5x9x11 mixed layouts": ((2, 5, 9, 11), True, False),
    "1x100003": ((1, 100_003), False, False),
}


@pytest.mark.parametrize("eng", FBGEMM_ENGINES)
@pytest.mark.parametrize("relu", [False, True], ids=["add", "add_relu"])
@pytest.mark.parametrize("case", list(ADD_CASES))
def test_add_fbgemm_random(engine, threads, eng: str, relu: bool, case: str) -> None:
    """quantized add / add_relu (quint8, per tensor) on random data, both layouts, with tails;
    ~1.2e6 elements per engine in all. add_relu is the add rule with lo = zp_out."""
    engine(eng)
    threads(1)
    shape, cl_a, cl_b = ADD_CASES[case]
    rng = np.random.default_rng(100)
    total, limit = 0, 100_000 if eng == "x86" else 30_000
    while total < limit:
        qp = random_add_qparams(rng)
        qa, qb = rng.integers(0, 256, shape), rng.integers(0, 256, shape)
        out = add_op(relu)(
            qtensor(qa, qp[0], qp[1], cl_a), qtensor(qb, qp[2], qp[3], cl_b), qp[4], qp[5]
        )
        cl_out = cl_a  # the output takes the first input's memory format
        assert out.is_contiguous(memory_format=torch.channels_last) == cl_out or len(shape) < 4
        mask = scalar_mask(qa.size, 1, same_layout=cl_a == cl_b)
        scalar = from_memory_order(mask, shape, cl_out and len(shape) == 4)
        assert np.array_equal(add_rule(qa, qb, *qp, relu, scalar), ints(out))
        total += qa.size


def add_alternatives(qa, qb, s_a, zp_a, s_b, zp_b, s_out, zp_out) -> dict[str, np.ndarray]:
    """Plausible other roundings of the add, for each path (no clamp needed for the tests)."""
    sa, sb, so = F32(s_a), F32(s_b), F32(s_out)
    inv = F32(1) / so
    c_fma = arith.fma_f32(sa, qa.astype(F32), sa * F32(-zp_a)) + arith.fma_f32(
        sb, qb.astype(F32), sb * F32(-zp_b)
    )
    c_mul = (qa - zp_a).astype(F32) * sa + (qb - zp_b).astype(F32) * sb
    alts = {
        "vector: dequantize (q - zp) * s": rne(c_mul * inv) + zp_out,
        "vector: zp added before rounding (fma)": rne(arith.fma_f32(c_fma, inv, F32(zp_out))),
        "vector: division by s_out": rne(c_fma / so) + zp_out,
        "scalar: dequantize fma(s, q, -zp*s)": rne(c_fma * inv + F32(zp_out)),
        "scalar: zp added after rounding": rne(c_mul * inv) + zp_out,
        "scalar: fma(c, inv, zp)": rne(arith.fma_f32(c_mul, inv, F32(zp_out))),
    }
    return {k: np.clip(v, 0, 255) for k, v in alts.items()}


ALL_QA, ALL_QB = (g.ravel() for g in np.meshgrid(np.arange(256), np.arange(256), indexing="ij"))


@pytest.mark.parametrize("path", ["vector", "scalar"])
def test_add_fbgemm_rounding_against_alternatives(engine, threads, path: str) -> None:
    """On (qa, qb) pairs where a plausible alternative rounding differs from the rule, PyTorch
    follows the rule. The vector path is tested with 64-element runs (no tail), the scalar path
    with mixed layouts (every element scalar)."""
    engine("x86")
    threads(1)
    rng = np.random.default_rng(101)
    scalar = path == "scalar"
    wrong = {
        k: 0
        for k in add_alternatives(ALL_QA[:1], ALL_QB[:1], 1, 0, 1, 0, 1, 0)
        if k.startswith(path)
    }
    checked = 0
    while checked < 20_000:
        qp = random_add_qparams(rng)
        rule = add_rule(ALL_QA, ALL_QB, *qp, False, scalar)
        alts = {k: v for k, v in add_alternatives(ALL_QA, ALL_QB, *qp).items() if k in wrong}
        picks = [np.flatnonzero(v != rule) for v in alts.values()]
        picks = [p for p in picks if p.size]
        if not picks:
            continue
        idx = np.concatenate([rng.choice(p, 64 * 16 // len(picks) + 64) for p in picks])[: 64 * 16]
        qa, qb = ALL_QA[idx].reshape(1, 16, 8, 8), ALL_QB[idx].reshape(1, 16, 8, 8)
        ta, tb = qtensor(qa, qp[0], qp[1], True), qtensor(qb, qp[2], qp[3], not scalar)
        y = ints(add_op(False)(ta, tb, qp[4], qp[5]))
        assert np.array_equal(add_rule(qa, qb, *qp, False, scalar), y)
        for k, v in add_alternatives(qa, qb, *qp).items():
            if k in wrong:
                wrong[k] += int((v != y).sum())
        checked += y.size
    assert all(n > 20 for n in wrong.values()), wrong


def vector_scalar_pairs(rng: np.random.Generator) -> tuple[tuple, np.ndarray]:
    """Random qparams and the (qa, qb) pair indices on which the vector and scalar rules differ."""
    while True:
        qp = random_add_qparams(rng)
        diff = np.flatnonzero(
            add_rule(ALL_QA, ALL_QB, *qp, False, False)
            != add_rule(ALL_QA, ALL_QB, *qp, False, True)
        )
        if diff.size:
            return qp, diff


@pytest.mark.parametrize(
    "shape,cl_a,cl_b,n_threads",
    [
        ((1, 3, 7, 7), False, False, 1),
        ((1, 3, 7, 7), True, True, 1),
        ((1, 32, 15, 15), True, True, 1),
        ((1, 32, 16, 16), True, True, 2),
        ((1, 32, 16, 16), True, False, 1),
        ((1, 32, 16, 16), False, True, 1),
        ((1, 64, 33, 33), True, True, 1),
        ((1, 64, 33, 33), True, True, 2),
        ((1, 100_003), False, False, 2),
        ((1, 100_003), False, False, 3),
        ((1, 65_537), False, False, 2),
    ],
)
def test_add_fbgemm_scalar_positions(engine, threads, shape, cl_a, cl_b, n_threads) -> None:
    """Every element is a pair on which the vector and scalar rules differ, so PyTorch's output
    reveals the path of each element: exactly the ones `fbgemm_add_scalar_mask` predicts (in
    memory order; per thread chunk above 32767 elements; all of them for mixed layouts)."""
    engine("x86")
    threads(n_threads)
    rng = np.random.default_rng(102)
    qp, diff = vector_scalar_pairs(rng)
    idx = rng.choice(diff, int(np.prod(shape)))
    qa, qb = ALL_QA[idx].reshape(shape), ALL_QB[idx].reshape(shape)
    y = ints(
        add_op(False)(
            qtensor(qa, qp[0], qp[1], cl_a), qtensor(qb, qp[2], qp[3], cl_b), qp[4], qp[5]
        )
    )
    cl_out = cl_a and len(shape) == 4
    mask = scalar_mask(qa.size, n_threads, same_layout=cl_a == cl_b)
    scalar = from_memory_order(mask, shape, cl_out)
    is_scalar = add_rule(qa, qb, *qp, False, True) == y
    is_vector = add_rule(qa, qb, *qp, False, False) == y
    assert np.all(is_scalar != is_vector)
    assert np.array_equal(is_scalar, scalar)


def test_fbgemm_add_scalar_mask_chunks() -> None:
    m = numerics.fbgemm_add_scalar_mask(147)
    assert np.flatnonzero(m).tolist() == list(range(128, 147))
    assert not numerics.fbgemm_add_scalar_mask(8192, num_threads=4).any()
    m = numerics.fbgemm_add_scalar_mask(100_003, num_threads=2)  # chunks of 50002 and 50001
    assert np.flatnonzero(m).tolist() == list(range(49_984, 50_002)) + list(range(99_986, 100_003))
    assert numerics.fbgemm_add_scalar_mask(10, same_layout=False).all()
    with pytest.raises(ValueError, match="fbgemm_add_scalar_mask"):
        numerics.fbgemm_add_scalar_mask(10, num_threads=0)
    # a wider vector loop (an AVX512 build of the kernel): the tail is what 128 leaves
    assert np.flatnonzero(numerics.fbgemm_add_scalar_mask(300, block=128)).tolist() == list(
        range(256, 300)
    )


# -- the compiled add: vector body, scalar tails ----------------------------------------------

COMPILED_ADDS = {  # name: (shape, a channels_last, b channels_last, threads)
    "1x32x15x15 cl: the last pixel scalar": ((1, 32, 15, 15), True, True, 1),
    "1x5x9x11 cl: a tail of 47 across pixels": ((1, 5, 9, 11), True, True, 1),
    "1x3x7x7 contiguous: a tail of 19": ((1, 3, 7, 7), False, False, 1),
    "2x5x9x11 mixed layouts: all scalar": ((2, 5, 9, 11), True, False, 1),
    "1x32x16x16 cl: no tail": ((1, 32, 16, 16), True, True, 1),
    "1x64x33x33 cl, 2 threads: a tail per chunk": ((1, 64, 33, 33), True, True, 2),
    "1x3x111x199, 2 threads: a tail inside": ((1, 3, 111, 199), False, False, 2),
}


def compiled_add(shape, strides, qp, relu: bool):
    """The add layer tensorgen's frontend emits (`rules.add_rule`), compiled for tg1."""
    from tensorgen.driver import compile_auto
    from tensorgen.frontend.layers import Layer, Port
    from tensorgen.frontend.rules import add_rule
    from tensorgen.target import load_target

    rule = add_rule("x86", qp[0:2], qp[2:4], qp[4:6], shape, strides)
    ix = ", ".join(f"i{d}" for d in range(len(shape)))
    ports = [Port(n, shape, "uint8", "output" if n == "Y" else "input") for n in "ABY"]
    layer = Layer(
        "add",
        "add",
        "add",
        ports,
        lambda lo, hi: rule.statements(f"Y[{ix}]", f"A[{ix}]", f"B[{ix}]", lo, hi),
        qp[5] if relu else 0,
        255,
    )
    program = layer.program("tg1")
    target = load_target("tg1")
    return program, target, compile_auto(program, target).compiled


@pytest.mark.parametrize("relu", [False, True], ids=["add", "add_relu"])
@pytest.mark.parametrize("case", list(COMPILED_ADDS))
def test_compiled_add_equals_pytorch_on_body_and_tails(engine, threads, relu, case) -> None:
    """The compiled add layer, simulated, equals PyTorch's x86 add on inputs where the vector
    and scalar roundings differ at every element (so a position on the wrong path shows) and
    on random inputs; the tails run VADDQS, the body VADDQF, each only where it must."""
    from tensorgen.driver import Job, run_and_compare

    engine("x86")
    shape, cl_a, cl_b, n_threads = COMPILED_ADDS[case]
    threads(n_threads)
    rng = np.random.default_rng(103)
    qp, diff = vector_scalar_pairs(rng)
    idx = rng.choice(diff, int(np.prod(shape)))
    pairs = [(ALL_QA[idx].reshape(shape), ALL_QB[idx].reshape(shape))]
    pairs.append((rng.integers(0, 256, shape), rng.integers(0, 256, shape)))
    ta, tb = (
        qtensor(q, *qp[2 * i : 2 * i + 2], cl)
        for i, (q, cl) in enumerate(zip(pairs[0], (cl_a, cl_b), strict=True))
    )
    program, target, compiled = compiled_add(shape, (ta.stride(), tb.stride()), qp, relu)
    mask = scalar_mask(int(np.prod(shape)), n_threads, cl_a == cl_b)
    mnemonics = {i.mnemonic for i in compiled.binary.code}
    assert ("VADDQS" in mnemonics) == bool(mask.any())
    assert ("VADDQF" in mnemonics) == (not mask.all())
    for qa, qb in pairs:
        ta, tb = qtensor(qa, qp[0], qp[1], cl_a), qtensor(qb, qp[2], qp[3], cl_b)
        want = ints(add_op(relu)(ta, tb, qp[4], qp[5]))
        inputs = {"A": qa.astype(np.uint8), "B": qb.astype(np.uint8)}
        cmp, result = run_and_compare(Job(program, target, compiled), inputs)
        assert cmp.exact, cmp.message  # the reference's own evaluation agrees
        assert np.array_equal(result.outputs["Y"].astype(np.int64), want)


def test_x86_add_refusals_are_one_line(threads) -> None:
    from tensorgen.errors import SpecError
    from tensorgen.frontend.rules import add_rule

    qp = ((0.02, 3), (0.03, 4), (0.04, 5))
    shape = (1, 6, 5, 5)
    view = torch.empty(1, 12, 5, 5)[:, ::2].stride()  # every second channel: not dense
    with pytest.raises(SpecError, match=r"of a strided view") as err:
        add_rule("x86", *qp, shape, (view, torch.empty(shape).stride()))
    assert "\n" not in str(err.value)
    threads(16)  # 16 chunks of 37501 elements, each with a tail of 61
    with pytest.raises(SpecError, match=r"16 thread chunks of 16 threads") as err:
        add_rule("x86", *qp, (1, 600_001), ((600_001, 1), (600_001, 1)))
    assert "\n" not in str(err.value)
    threads(2)
    rule = add_rule("x86", *qp, (1, 600_001), ((600_001, 1), (600_001, 1)))
    assert rule.tails == ((299968, 300001), (599969, 600001))  # chunks of 300001, 300000
    assert rule.where(["n", "j"]) == ("299968 <= j < 300001", "j >= 599969")


class _Residual(torch.nn.Module):
    """conv -> relu, conv, add_relu of both: the add has 9 x 61 x 61 = 33489 elements (tails at
    one thread and, in two chunks, at two)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(7)
        self.c1 = torch.nn.Sequential(torch.nn.Conv2d(3, 9, 3, 1, 1), torch.nn.ReLU())
        self.c2 = torch.nn.Conv2d(9, 9, 1)

    def forward(self, x):
        a = self.c1(x)
        return torch.relu(a + self.c2(a))


@pytest.mark.parametrize("n_threads", [1, 2])
def test_model_with_tailed_add_is_bit_exact_at_its_thread_count(threads, n_threads) -> None:
    """compile_model under x86 at 1 and 2 torch threads: the add's tails follow the caller's
    thread count (not the one thread lowering runs at), and check_model is bit-exact."""
    from tensorgen.model import check_model, compile_model
    from tensorgen.target import load_target

    threads(n_threads)
    model, x = (
        _Residual().eval(),
        torch.randn(1, 3, 61, 61, generator=torch.Generator().manual_seed(3)),
    )
    cm = compile_model(model, (x,), load_target("tg1"), engine="x86")
    numel, flat = 9 * 61 * 61, "i1 + 549*i2 + 9*i3"  # the NHWC position of Y[0, c, h, w]
    edges = np.flatnonzero(np.diff(np.r_[0, scalar_mask(numel, n_threads).astype(int), 0]))
    runs = list(zip(edges[::2], edges[1::2], strict=True))
    assert len(runs) == n_threads  # a tail per chunk, where they differ between 1 and 2 threads
    want = {f"{flat} >= {lo}" if hi == numel else f"{lo} <= {flat} < {hi}" for lo, hi in runs}
    (add,) = (layer for layer in cm.graph.layers if layer.op == "add")  # not folded into c2
    got = {st["where"] for st in add.body(add.lo, add.hi) if isinstance(st, dict)}
    assert got == want
    for seed in (0, 1):
        xs = torch.randn(1, 3, 61, 61, generator=torch.Generator().manual_seed(seed)) * 1.5
        cmp, _ = check_model(cm, (xs,))
        assert cmp.exact, cmp.message


# -- pooling ------------------------------------------------------------------------------------


def avgpool_rule(q: np.ndarray, zp: int, channels_last: bool) -> np.ndarray:
    """adaptive_avg_pool2d(q, 1) under fbgemm / x86 from the exact window sums, shape (N, C)."""
    _, c, kh, kw = q.shape
    sums = q.sum(axis=(2, 3))
    m = numerics.fbgemm_avgpool_multiplier(kh, kw, channels_last)
    if not channels_last:
        return arith.avgpool_fbgemm(sums, m, 0, 0, 255)
    scalar = numerics.fbgemm_avgpool_scalar_channels(c)[None, :]
    return arith.avgpool_fbgemm(sums - zp * kh * kw, m, zp, 0, 255, scalar)


@pytest.mark.parametrize("eng", FBGEMM_ENGINES)
@pytest.mark.parametrize("hw", [8, 7, 4, 2])
@pytest.mark.parametrize("channels,channels_last", [(32, True), (13, True), (32, False)])
def test_adaptive_avg_pool2d_random(engine, eng, hw, channels, channels_last) -> None:
    """adaptive_avg_pool2d to 1x1 keeps the input's qparams and follows avgpool_fbgemm, for
    channels_last (vector and scalar channels) and contiguous inputs."""
    engine(eng)
    rng = np.random.default_rng(103)
    for _ in range(4):
        s, zp = float(rng.uniform(1e-3, 1)), int(rng.integers(0, 256))
        q = rng.integers(0, 256, size=(256, channels, hw, hw))
        y = torch.nn.functional.adaptive_avg_pool2d(qtensor(q, s, zp, channels_last), 1)
        assert (y.q_scale(), y.q_zero_point()) == (s, zp)
        assert np.array_equal(avgpool_rule(q, zp, channels_last), ints(y)[:, :, 0, 0])


def fill_sums(sums: np.ndarray, n: int) -> np.ndarray:
    """Rows of n values in [0, 255] with the given sums."""
    base, rem = np.divmod(sums, n)
    return base[:, None] + (np.arange(n)[None, :] < rem[:, None])


def avgpool_alternatives(sums, kh, kw, zp) -> dict[str, np.ndarray]:
    n = kh * kw
    acc = (sums - zp * n).astype(F32)
    m, m_nchw = F32(1) / F32(n), (F32(1) / F32(kh)) / F32(kw)
    alts = {
        "RNE(acc * M) + zp": rne(acc * m) + zp,
        "RNE(RN(RN(acc * M) + zp))": rne(acc * m + F32(zp)),
        "RNE(fma(acc, M, zp))": rne(arith.fma_f32(acc, m, F32(zp))),
        "RNE(sum * RN(1/n))": rne(sums.astype(F32) * m),
        "RNE(sum * RN(RN(1/kh)/kw))": rne(sums.astype(F32) * m_nchw),
        "RNE(sum / n) exact": rne(sums / n),
    }
    return {k: np.clip(v, 0, 255) for k, v in alts.items()}


@pytest.mark.parametrize("kh,kw", [(6, 6), (10, 10), (14, 14), (3, 10), (8, 8), (2, 2)])
def test_adaptive_avg_pool2d_rounding_against_alternatives(engine, kh, kw) -> None:
    """Window sums chosen where the candidate roundings disagree (for 8x8 and 2x2 only the
    zero point after rounding does): PyTorch follows the rule in each of the three code paths
    (channels_last vector channels, channels_last scalar channels, contiguous), and every
    alternative that differs somewhere is wrong somewhere."""
    engine("x86")
    n = kh * kw
    all_sums = np.arange(255 * n + 1)
    wrong: dict[tuple[str, str], int] = {}
    differs: dict[tuple[str, str], int] = {}
    for zp in range(1, 256, 6):
        alts = avgpool_alternatives(all_sums, kh, kw, zp)
        stacked = np.stack(list(alts.values()))
        sums = all_sums[(stacked != stacked[0]).any(axis=0)][:256]
        if sums.size == 0:
            continue
        vec = np.resize(sums, 8 * -(-sums.size // 8))
        for path, layout_sums, cl in (
            ("nhwc", np.concatenate([vec, sums[:7]]), True),
            ("nchw", sums, False),
        ):
            q = fill_sums(layout_sums, n).reshape(1, -1, kh, kw)
            pooled = torch.nn.functional.adaptive_avg_pool2d(qtensor(q, 0.05, zp, cl), 1)
            y = ints(pooled)[0, :, 0, 0]
            rule = avgpool_rule(q, zp, cl)[0]
            assert np.array_equal(rule, y), (path, zp)
            pos = np.arange(y.size)
            parts = (
                {"nhwc vector": pos < vec.size, "nhwc scalar": pos >= vec.size}
                if cl
                else {"nchw": pos >= 0}
            )
            for name, v in avgpool_alternatives(layout_sums, kh, kw, zp).items():
                for part, sel in parts.items():
                    key = (part, name)
                    wrong[key] = wrong.get(key, 0) + int((v[sel] != y[sel]).sum())
                    differs[key] = differs.get(key, 0) + int((v[sel] != rule[sel]).sum())
    for key, d in differs.items():
        assert wrong[key] == d  # an alternative is wrong exactly where it leaves the rule
    separated = {key for key, d in differs.items() if d > 0}
    expected = {(part, "RNE(acc * M) + zp") for part in ("nhwc vector", "nhwc scalar")}
    if n & (n - 1) and n % 2 == 0:  # even, not a power of two: exact halves meet float error
        expected |= {
            ("nhwc vector", "RNE(RN(RN(acc * M) + zp))"),
            ("nhwc scalar", "RNE(fma(acc, M, zp))"),
            ("nchw", "RNE(fma(acc, M, zp))"),
        }
    if (kh, kw) == (14, 14):  # RN(RN(1/14)/14) != RN(1/196)
        expected |= {("nchw", "RNE(sum * RN(1/n))"), ("nhwc vector", "RNE(sum * RN(RN(1/kh)/kw))")}
    assert expected <= separated, expected - separated


@pytest.mark.parametrize("eng", FBGEMM_ENGINES)
def test_max_pool2d_channels_last_is_integer_max(engine, eng: str) -> None:
    """max_pool2d on channels_last quint8 (the NHWC kernel: 4x32-, 32-lane and scalar channel
    loops, here with 200 channels) is the integer max; padding never wins; qparams kept."""
    engine(eng)
    rng = np.random.default_rng(104)
    q = rng.integers(0, 256, size=(2, 200, 17, 17))
    q[:, :, 0, :] = rng.integers(0, 2, size=(2, 200, 17))
    for k, stride, pad in [(2, 2, 0), (3, 2, 1)]:
        y = torch.nn.functional.max_pool2d(qtensor(q, 0.05, 200, True), k, stride, pad)
        assert (y.q_scale(), y.q_zero_point()) == (0.05, 200)
        padded = torch.from_numpy(
            np.pad(q, ((0, 0), (0, 0), (pad, pad), (pad, pad)), constant_values=-1)
        )
        want = torch.nn.functional.max_pool2d(padded.double(), k, stride).numpy()
        assert np.array_equal(want.astype(np.int64), ints(y))


# -- quantize / dequantize ----------------------------------------------------------------------


@pytest.mark.parametrize("eng", ["qnnpack", *FBGEMM_ENGINES])
def test_quantize_and_dequantize_do_not_depend_on_engine(engine, threads, eng: str) -> None:
    """quantize_per_tensor = arith.quantize and dequantize = arith.dequantize under every
    engine, at every position (tails, 2-thread chunks), on inputs next to rounding ties."""
    engine(eng)
    threads(2)
    rng = np.random.default_rng(105)
    for n in (13, 100_003):
        s, zp = float(F32(rng.uniform(0.01, 0.1))), int(rng.integers(0, 256))
        inv = numerics.inv_scale(s)
        k = rng.integers(-zp, 256 - zp, n)
        x = (
            ((k + 0.5) / np.float64(inv)).astype(F32).view(np.int32)
            + rng.integers(-2, 3, n).astype(np.int32)
        ).view(F32)
        qt = torch.quantize_per_tensor(torch.from_numpy(x), s, zp, torch.quint8)
        q = ints(qt)
        assert np.array_equal(arith.quantize(x, inv, zp, 0, 255), q)
        two_roundings = np.clip(rne((x * inv).astype(F32) + F32(zp)), 0, 255)
        assert n < 100 or (two_roundings != q).sum() > 100
        d = qt.dequantize().numpy()
        assert np.array_equal(arith.dequantize(q, s, zp).view(np.int32), d.view(np.int32))


# -- conv and linear: fbgemm under x86 ----------------------------------------------------------


def test_x86_linear_is_fbgemm_per_channel(engine) -> None:
    """Under x86 a per-channel quantized Linear follows requantize_fbgemm exactly with
    activations <= 127 on every CPU; beyond, it is exact where the probe found exact products
    (AVX512-VNNI) and saturates (> 5% of outputs differ) where it found fbgemm's int16 pairs.
    On both kinds of CPU the saturating model `arith.dot_sat16` predicts the exact result at
    <= 127 and a large mismatch beyond (test_numerics.py pins it further)."""
    engine("x86")
    rng = np.random.default_rng(106)
    f_in, f_out = 256, 64
    wq = rng.integers(-128, 128, size=(f_out, f_in))
    s_w = rng.uniform(1e-3, 2e-2, f_out)
    w = torch._make_per_channel_quantized_tensor(
        torch.from_numpy(wq.astype(np.int8)),
        torch.from_numpy(s_w),
        torch.zeros(f_out, dtype=torch.long),
        0,
    )
    bias = rng.normal(0, 2, f_out).astype(F32)
    mismatch, model_mismatch = {}, {}
    for x_max in (127, 255):
        xq = rng.integers(0, x_max + 1, size=(500, f_in))
        acc = (xq - 3) @ wq.T
        s_in = 0.02
        s_out = float(s_in * s_w.mean() * acc.std() / 40)
        mod = nnq.Linear(f_in, f_out)
        mod.set_weight_bias(w, torch.from_numpy(bias))
        mod.scale, mod.zero_point = s_out, 100
        y = ints(mod(qtensor(xq, s_in, 3)))
        p = numerics.fbgemm_requant_params(s_in, s_w, s_out)
        assert p.per_channel
        want = arith.requantize_fbgemm(acc, bias, p.atws, p.inv_atws, p.cm, 100, 0, 255, True)
        mismatch[x_max] = float((want != y).mean())
        # fbgemm subtracts the zero-point term x_zp * sum(w) after the (saturating) raw product
        acc_sat = arith.dot_sat16(xq, wq) - 3 * wq.sum(axis=1)
        sat = arith.requantize_fbgemm(acc_sat, bias, p.atws, p.inv_atws, p.cm, 100, 0, 255, True)
        model_mismatch[x_max] = float((want != sat).mean())
    assert mismatch[127] == 0 and model_mismatch[127] == 0 and model_mismatch[255] > 0.05
    if x86_behaviour("x86").exact_products:
        assert mismatch[255] == 0
    else:
        assert mismatch[255] > 0.05


# -- the small CNN end to end -------------------------------------------------------------------


@pytest.fixture(scope="module")
def small_cnn_x86():
    from tensorgen.frontend.quantize import load_factory, quantize

    model, example = load_factory(str(ROOT / "examples/models/small_cnn.py"))
    return quantize(model, example, engine="x86"), example


def run_nodes(graph_module: torch.fx.GraphModule, x: torch.Tensor) -> dict[str, object]:
    """Every node's value from one run of the graph."""
    values: dict[str, object] = {}

    class Recorder(torch.fx.Interpreter):
        def run_node(self, n):
            values[n.name] = r = super().run_node(n)
            return r

    Recorder(graph_module).run(x)
    return values


def conv_fbgemm(mod, xq: np.ndarray, s_in: float, zp_in: int, relu: bool) -> np.ndarray:
    """A per-channel ConvReLU2d / Conv2d from the exact accumulator (NCHW indexing)."""
    w = mod.weight()
    assert w.qscheme() == torch.per_channel_affine
    assert not w.q_per_channel_zero_points().any()
    wq = w.int_repr().numpy().astype(np.float64)
    acc = torch.nn.functional.conv2d(
        torch.from_numpy(xq - float(zp_in)),
        torch.from_numpy(wq),
        stride=mod.stride,
        padding=mod.padding,
    )
    acc = np.rint(acc.numpy()).astype(np.int64)
    p = numerics.fbgemm_requant_params(s_in, w.q_per_channel_scales().numpy(), mod.scale)
    ch = lambda v: np.reshape(v, (-1, 1, 1))  # noqa: E731
    return arith.requantize_fbgemm(
        acc,
        ch(mod.bias().detach().numpy()),
        ch(p.atws),
        ch(p.inv_atws),
        ch(p.cm),
        mod.zero_point,
        mod.zero_point if relu else 0,
        255,
        True,
    )


@pytest.mark.parametrize("seed", [None, 5, 6])
def test_small_cnn_x86_bit_exact(engine, small_cnn_x86, seed) -> None:
    """The x86-quantized small CNN, recomputed op by op from numpy with arith/numerics, equals
    PyTorch at every node and in the final float output (the example input and two others)."""
    engine("x86")
    gm, example = small_cnn_x86
    x = (
        example[0]
        if seed is None
        else torch.randn(example[0].shape, generator=torch.Generator().manual_seed(seed))
    )
    v = run_nodes(gm, x)
    mods = dict(gm.named_modules())

    s0, zp0 = float(gm.conv1_input_scale_0), int(gm.conv1_input_zero_point_0)
    xq = arith.quantize(x.numpy(), numerics.inv_scale(s0), zp0, 0, 255)
    assert np.array_equal(xq, ints(v["quantize_per_tensor"]))
    c1, c2, c3 = mods["conv1"], mods["conv2"], mods["conv3"]
    y1 = conv_fbgemm(c1, xq, s0, zp0, relu=True)
    assert np.array_equal(y1, ints(v["conv1"]))
    y2 = conv_fbgemm(c2, y1, c1.scale, c1.zero_point, relu=True)
    assert np.array_equal(y2, ints(v["conv2"]))
    y3 = conv_fbgemm(c3, y2, c2.scale, c2.zero_point, relu=False)
    assert np.array_equal(y3, ints(v["conv3"]))

    s_add, zp_add = float(gm.relu3_scale_0), int(gm.relu3_zero_point_0)
    assert v["conv3"].is_contiguous(memory_format=torch.channels_last)
    assert v["conv2"].is_contiguous(memory_format=torch.channels_last)
    mask = scalar_mask(y3.size, torch.get_num_threads())
    ya = add_rule(
        y3,
        y2,
        c3.scale,
        c3.zero_point,
        c2.scale,
        c2.zero_point,
        s_add,
        zp_add,
        True,
        from_memory_order(mask, y3.shape, True),
    )
    assert np.array_equal(ya, ints(v["add_relu"]))

    n, c, h, w = ya.shape
    yp = ya.reshape(n, c, h // 2, 2, w // 2, 2).max(axis=(3, 5))
    assert np.array_equal(yp, ints(v["pool"]))
    assert v["pool"].is_contiguous(memory_format=torch.channels_last)
    yg = avgpool_rule(yp, zp_add, channels_last=True)
    assert np.array_equal(yg, ints(v["flatten"]))

    fc = mods["fc"]
    wf = fc.weight()
    acc = (yg - zp_add) @ wf.int_repr().numpy().astype(np.int64).T
    p = numerics.fbgemm_requant_params(s_add, wf.q_per_channel_scales().numpy(), fc.scale)
    yf = arith.requantize_fbgemm(
        acc, fc.bias().detach().numpy(), p.atws, p.inv_atws, p.cm, fc.zero_point, 0, 255, True
    )
    assert np.array_equal(yf, ints(v["fc"]))
    out = arith.dequantize(yf, fc.scale, fc.zero_point)
    assert np.array_equal(out.view(np.int32), v["output"].numpy().view(np.int32))
    assert np.array_equal(out.view(np.int32), gm(x).numpy().view(np.int32))
