"""oneDNN's conv requantization under PyTorch's x86 engine (tensorgen.frontend.onednn), pinned
against the running PyTorch: on a Linux CPU with AVX512-VNNI the x86 engine runs convs with
symmetric weights and at most 100 groups on oneDNN, whose float rounding differs from fbgemm's
on near-ties (random model 136's mismatch). Random data (>= 1e5 elements per kind) and elements
picked near ties (where the rule and its plausible alternatives disagree), for the rule
(`onednn.requantize_onednn`) and for the instruction that computes it on the accelerator
(VREQUANTO, its semantics in tensorgen.mc); then models that need it, bit-exact."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.ao.nn.intrinsic.quantized as nniq
import torch.ao.nn.quantized as nnq

from tensorgen.frontend import numerics, onednn
from tensorgen.frontend.probe import cpu_has_vnni, x86_behaviour
from tensorgen.mc import arith, isa

F32 = np.float32
ONEDNN = x86_behaviour("x86").onednn_groups > 0
needs_onednn = pytest.mark.skipif(not ONEDNN, reason="the x86 engine runs no conv on oneDNN here")
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

KINDS = {  # name: (C, K, kernel, stride, padding, groups, H)
    "1x1": (10, 9, 1, 1, 0, 1, 32),
    "3x3": (16, 24, 3, 1, 1, 1, 24),
    "3x3/2": (16, 24, 3, 2, 1, 1, 31),
    "depthwise": (32, 32, 3, 1, 1, 32, 24),
    "depthwise 5x5/2": (24, 24, 5, 2, 2, 24, 31),
    "grouped/2": (16, 32, 3, 1, 1, 2, 24),
}


def qtensor(q: np.ndarray, scale: float, zp: int) -> torch.Tensor:
    return torch._make_per_tensor_quantized_tensor(torch.from_numpy(q.astype(np.uint8)), scale, zp)


def random_conv(rng, kind: str, relu: bool, batch: int = 1):
    """(PyTorch's output ints, exact acc, bias, s_in, s_w, s_out, zp_out) of a random conv."""
    c, k, ks, stride, pad, groups, h = KINDS[kind]
    s_in, x_zp = float(rng.uniform(0.005, 0.1)), int(rng.integers(0, 256))
    s_w = rng.uniform(5e-4, 1e-2, k)
    wq = rng.integers(-127, 128, (k, c // groups, ks, ks))
    w = torch._make_per_channel_quantized_tensor(
        torch.tensor(wq, dtype=torch.int8), torch.tensor(s_w), torch.zeros(k, dtype=torch.long), 0
    )
    bias = rng.normal(0, 0.5, k).astype(F32)
    xq = rng.integers(0, 256, (batch, c, h, h))
    acc = torch.nn.functional.conv2d(
        torch.tensor(xq - x_zp, dtype=torch.float64),
        torch.tensor(wq, dtype=torch.float64),
        stride=stride,
        padding=pad,
        groups=groups,
    )
    acc = np.rint(acc.numpy()).astype(np.int64)
    s_out = float(s_in * s_w.mean() * acc.std() / 40)
    zp_out = int(rng.integers(0, 200))
    mod = (nniq.ConvReLU2d if relu else nnq.Conv2d)(c, k, ks, stride, pad, groups=groups)
    mod.set_weight_bias(w, torch.from_numpy(bias))
    mod.scale, mod.zero_point = s_out, zp_out
    y = mod(qtensor(xq, s_in, x_zp)).int_repr().numpy().astype(np.int64)
    return y, acc, bias, s_in, s_w, s_out, zp_out


def rule(acc, bias, s_in, s_w, s_out, zp, lo) -> np.ndarray:
    sc = onednn.onednn_scales(s_in, s_w, s_out)
    sh = (1, -1, 1, 1)
    wei = onednn.OnednnScales(sc.src, sc.wei.reshape(sh), sc.dst_inv)
    return onednn.requantize_onednn(acc, bias.reshape(sh), wei, zp, lo)


def fbgemm_rule(acc, bias, s_in, s_w, s_out, zp, lo) -> np.ndarray:
    p = numerics.fbgemm_requant_params(s_in, s_w, s_out)
    sh = (1, -1, 1, 1)
    return arith.requantize_fbgemm(
        acc, bias.reshape(sh), p.atws.reshape(sh), p.inv_atws.reshape(sh), p.cm.reshape(sh), zp,
        lo, 255, True,
    )  # fmt: skip


@needs_onednn
@pytest.mark.parametrize("relu", [False, True], ids=["conv", "conv_relu"])
@pytest.mark.parametrize("kind", list(KINDS))
def test_onednn_rule_on_random_convs(engine, kind: str, relu: bool) -> None:
    engine("x86")
    rng = np.random.default_rng(20)
    total = 0
    while total < 100_000:
        y, acc, bias, s_in, s_w, s_out, zp = random_conv(rng, kind, relu)
        assert np.array_equal(rule(acc, bias, s_in, s_w, s_out, zp, zp if relu else 0), y)
        total += y.size


def near_ties(rng, kind: str, trials: int):
    """Convs built so that half their outputs lie within ~1e-3 of a tie, where the roundings
    decide: ``s_in * s_w / s_out = (1 + e) / 2`` and ``b / s_out = n + d`` with tiny e, d, so
    an odd accumulator lands next to a half. Per conv, flat (acc, bias, s_in, s_w, s_out, zp, y)
    of those outputs (bias and s_w per element)."""
    c, k, ks, stride, pad, groups, h = {"1x1": (4, 64, 1, 1, 0, 1, 32),
                                        "depthwise": (64, 64, 3, 1, 1, 64, 32)}[kind]  # fmt: skip
    rows = []
    for _ in range(trials):
        s_in, s_out = float(rng.uniform(0.005, 0.1)), float(rng.uniform(0.005, 0.1))
        x_zp, zp = int(rng.integers(30, 220)), int(rng.integers(90, 160))
        s_w = s_out / s_in * 0.5 * (1 + rng.uniform(-1e-5, 1e-5, k))
        bias = (s_out * (rng.integers(-30, 30, k) + rng.uniform(-1e-5, 1e-5, k))).astype(F32)
        wq = rng.integers(-3, 4, (k, c // groups, ks, ks))
        w = torch._make_per_channel_quantized_tensor(
            torch.tensor(wq, dtype=torch.int8), torch.tensor(s_w), torch.zeros(k, dtype=torch.long), 0
        )  # fmt: skip
        mod = nnq.Conv2d(c, k, ks, stride, pad, groups=groups)
        mod.set_weight_bias(w, torch.from_numpy(bias))
        mod.scale, mod.zero_point = s_out, zp
        xq = rng.integers(x_zp - 20, x_zp + 21, (1, c, h, h))
        y = mod(qtensor(xq, s_in, x_zp)).int_repr().numpy().astype(np.int64)
        acc = torch.nn.functional.conv2d(
            torch.tensor(xq - x_zp, dtype=torch.float64), torch.tensor(wq, dtype=torch.float64),
            stride=stride, padding=pad, groups=groups,
        )  # fmt: skip
        acc = np.rint(acc.numpy()).astype(np.int64)
        near = acc % 2 == 1
        ch = np.nonzero(near)[1]
        rows.append((acc[near], bias[ch], s_in, s_w[ch], s_out, zp, y[near]))
    return rows


@needs_onednn
@pytest.mark.parametrize("kind", ["1x1", "depthwise"])
def test_onednn_rule_on_near_ties_and_not_fbgemms(engine, kind: str) -> None:
    """On elements near ties the rule holds on every one and fbgemm's rule fails on some; so do
    plausible variants of the rule: the zero point added after rounding, the input scale taken
    as f32(s_in) rather than inverted twice, src and weight scales multiplied first."""
    engine("x86")
    convs = near_ties(np.random.default_rng(21), kind, 3)
    assert sum(c[-1].size for c in convs) > 50_000

    def variant(which, acc, b, s_in, s_w, s_out, zp):
        sc = onednn.onednn_scales(s_in, s_w, s_out)
        src = F32(s_in) if which == "src f32" else sc.src
        if which == "scales first":
            t = acc.astype(F32) * (src * sc.wei).astype(F32)
        else:
            t = (acc.astype(F32) * src).astype(F32) * sc.wei
        t = ((t.astype(F32) + b).astype(F32) * sc.dst_inv).astype(F32)
        if which == "zp after rounding":
            return np.clip(np.rint(t.astype(np.float64)) + zp, 0, 255)
        return np.clip(np.rint((t + F32(zp)).astype(F32).astype(np.float64)), 0, 255)

    wrong = dict.fromkeys(("fbgemm", "zp after rounding", "src f32", "scales first"), 0)
    for acc, b, s_in, s_w, s_out, zp, y in convs:
        sc = onednn.onednn_scales(s_in, s_w, s_out)
        assert np.array_equal(onednn.requantize_onednn(acc, b, sc, zp), y)
        p = numerics.fbgemm_requant_params(s_in, s_w, s_out)
        fb = arith.requantize_fbgemm(acc, b, p.atws, p.inv_atws, p.cm, zp, 0, 255, True)
        wrong["fbgemm"] += int((fb != y).sum())
        for which in ("zp after rounding", "src f32", "scales first"):
            wrong[which] += int((variant(which, acc, b, s_in, s_w, s_out, zp) != y).sum())
    assert all(n > 0 for n in wrong.values()), wrong


class Registers:
    """A machine state of named arrays: enough for one instruction's semantics."""

    def __init__(self, **arrays) -> None:
        self.arrays = arrays

    def read(self, name: str) -> np.ndarray:
        return self.arrays[name]

    def write(self, name: str, values: np.ndarray) -> None:
        self.arrays[name] = np.asarray(values)


def vrequanto(acc, bias, s_in, s_w, s_out, zp, lo, shape=(1, -1, 1, 1)) -> np.ndarray:
    """What the accelerator's VREQUANTO computes from the exact accumulator `acc` with the
    constants tensorgen's frontend gives a conv under oneDNN (per channel along axis 1 of
    `shape`; shape None: `bias` and `s_w` per element)."""
    rq = onednn.onednn_requant(s_in, np.asarray(s_w, np.float64).reshape(-1), s_out, bias)
    ports = {p.name: p.const for p in rq.ports}
    wei, bo = ports["SW"], ports["BO"]
    if shape is not None:
        wei, bo = wei.reshape(shape), bo.reshape(shape)
    regs = Registers(a=np.asarray(acc, np.int64), wei=wei, bias=bo)
    s_src, d = rq.onednn
    args = dict(dst="y", a="a", wei="wei", bias="bias", s_src=s_src, d=d, zp=zp, lo=lo, hi=255)
    isa.BY_MNEMONIC["VREQUANTO"].execute(regs, args)
    return regs.arrays["y"].astype(np.int64)


@needs_onednn
@pytest.mark.parametrize("relu", [False, True], ids=["conv", "conv_relu"])
@pytest.mark.parametrize("kind", list(KINDS))
def test_vrequanto_is_pytorchs_x86_conv(engine, kind: str, relu: bool) -> None:
    """The instruction, with the frontend's constants, on the exact accumulators of random
    convs, gives PyTorch's own x86 outputs (ReLU: clamped at the zero point)."""
    engine("x86")
    rng = np.random.default_rng(24)
    total = 0
    while total < 100_000:
        y, acc, bias, s_in, s_w, s_out, zp = random_conv(rng, kind, relu)
        assert np.array_equal(vrequanto(acc, bias, s_in, s_w, s_out, zp, zp if relu else 0), y)
        total += y.size


@needs_onednn
@pytest.mark.parametrize("kind", ["1x1", "depthwise"])
def test_vrequanto_on_near_ties(engine, kind: str) -> None:
    """On outputs within ~1e-3 of a tie (where fbgemm's rule and the rule's variants fail,
    test_onednn_rule_on_near_ties_and_not_fbgemms) the instruction still gives PyTorch's."""
    engine("x86")
    for acc, b, s_in, s_w, s_out, zp, y in near_ties(np.random.default_rng(25), kind, 2):
        assert np.array_equal(vrequanto(acc, b, s_in, s_w, s_out, zp, 0, None), y)


def test_vrequanto_equals_the_rule_on_random_values_and_saturates() -> None:
    """Runs on every CPU: the instruction against the frontend's model of the rule on 2e5
    random accumulators and channels, with accumulators at int32's ends (the float saturates
    to 0 and 255, where a plain float -> int32 conversion would give INT32_MIN)."""
    rng = np.random.default_rng(26)
    for trial in range(20):
        k = 64
        s_in, s_out = float(rng.uniform(0.005, 0.1)), float(rng.uniform(0.01, 0.2))
        s_w, zp = rng.uniform(5e-4, 1e-2, k), int(rng.integers(0, 256))
        bias = rng.normal(0, 0.5, k).astype(F32)
        acc = rng.integers(-(2**16), 2**16, (1, k, 40, 40))
        acc[0, :, 0, 0], acc[0, :, 0, 1] = 2**31 - 1, -(2**31)
        lo = zp if trial % 2 else 0
        got = vrequanto(acc, bias, s_in, s_w, s_out, zp, lo)
        assert np.array_equal(got, rule(acc, bias, s_in, s_w, s_out, zp, lo)), trial
        assert (got[0, :, 0, 0] == 255).all() and (got[0, :, 0, 1] == lo).all()


TIE = dict(x=(137, 54), x_zp=53, w=(127, 73), s_in=0.04680776968598366,
           s_w=0.0022756976541131735, b=-0.2137542, s_out=0.014886093325912952)  # fmt: skip


@needs_onednn
def test_random_model_136_tie(engine) -> None:
    """acc = 10741 (exactly 62.49999): fbgemm's rule gives 62, oneDNN's and PyTorch's x86 63;
    the fbgemm engine itself gives 62."""
    acc = np.array([[[[127 * 84 + 73 * 1]]]])
    args = (acc, np.array([TIE["b"]], F32), TIE["s_in"], np.array([TIE["s_w"]]), TIE["s_out"], 0, 0)
    assert rule(*args).item() == 63 and fbgemm_rule(*args).item() == 62
    for eng, want in (("x86", 63), ("fbgemm", 62)):
        engine(eng)
        w = torch._make_per_channel_quantized_tensor(
            torch.tensor(TIE["w"], dtype=torch.int8).reshape(1, 2, 1, 1),
            torch.tensor([TIE["s_w"]], dtype=torch.float64), torch.zeros(1, dtype=torch.long), 0,
        )  # fmt: skip
        mod = nniq.ConvReLU2d(2, 1, 1)
        mod.set_weight_bias(w, torch.tensor([TIE["b"]]))
        mod.scale, mod.zero_point = TIE["s_out"], 0
        x = qtensor(np.array(TIE["x"]).reshape(1, 2, 1, 1), TIE["s_in"], TIE["x_zp"])
        assert mod(x).int_repr().item() == want, eng


def test_probe_sees_onednn_exactly_on_vnni_cpus() -> None:
    """PyTorch's should_use_onednn_quant: Linux, AVX512-VNNI, at most 100 groups."""
    assert x86_behaviour("x86").onednn_groups == (100 if cpu_has_vnni() else 0)
    assert x86_behaviour("fbgemm").onednn_groups == 0
    assert "oneDNN" in x86_behaviour("x86").describe() or not cpu_has_vnni()


RANDOM_CNN = Path(__file__).parents[2] / "examples" / "models" / "random_cnn.py"


@needs_onednn
def test_random_model_136_is_bit_exact_under_x86() -> None:
    """The model whose conv hit the tie compiles to VREQUANTO and is bit-exact."""
    from tensorgen.frontend.quantize import load_factory
    from tensorgen.model import check_model, compile_model
    from tensorgen.target import load_target

    warnings.filterwarnings("ignore", category=UserWarning)
    model, example = load_factory(f"{RANDOM_CNN}:build", {"size": 8, "seed": 136})
    cm = compile_model(model, example, load_target("tg1"), engine="x86")
    assert any(p.name == "SW" for layer in cm.graph.layers for p in layer.ports)
    assert any(i.mnemonic == "VREQUANTO" for i in cm.binary.code)
    for trial in range(2):
        x = torch.randn(*example[0].shape, generator=torch.Generator().manual_seed(trial)) * 1.5
        cmp, _ = check_model(cm, (x,))
        assert cmp.exact, cmp.message


@pytest.mark.parametrize("groups", [0, 100], ids=["fbgemm CPU", "oneDNN CPU"])
def test_the_probe_decides_which_requantization_convs_get(monkeypatch, groups: int) -> None:
    """With the probe's verdict replaced (0: a CPU without AVX512-VNNI, 100: one with it) the
    same model's convs get requant_fbgemm (VREQUANTF) or requant_onednn (VREQUANTO), and only
    under x86: qnnpack never sees either."""
    from dataclasses import replace

    from tensorgen.frontend.quantize import load_factory
    from tensorgen.model import compile_model
    from tensorgen.target import load_target

    seen = replace(x86_behaviour("x86"), onednn_groups=groups)
    monkeypatch.setattr(onednn, "x86_behaviour", lambda engine: seen)
    warnings.filterwarnings("ignore", category=UserWarning)
    model, example = load_factory(f"{RANDOM_CNN}:build", {"size": 8, "seed": 136})
    for eng in ("x86", "qnnpack"):
        cm = compile_model(model, example, load_target("tg1"), engine=eng)
        used = {i.mnemonic for i in cm.binary.code} & {"VREQUANTF", "VREQUANTO"}
        if eng == "qnnpack":
            assert not used
        else:
            assert used == ({"VREQUANTO"} if groups else {"VREQUANTF"}), used
