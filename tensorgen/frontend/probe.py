"""What the running PyTorch's x86 / fbgemm engines really compute on this CPU, found by experiment.

Three behaviours of the fbgemm-family engines depend on the CPU, not on torch's version:

- the uint8 x int8 dot product of quantized conv / linear. Without AVX512-VNNI fbgemm multiplies
  pairs with ``vpmaddubsw``, which adds the two products of a pair with *int16 saturation*, so the
  accumulator is not the exact dot product once activations exceed 127 (``arith.dot_sat16``
  models it). With VNNI, fbgemm's ``vpdpbusd`` and the oneDNN kernels the x86 engine routes convs
  to accumulate exactly in int32;
- the block of ATen's vectorised quantized add (``qadd_kernel`` in ``cpu_kernel_vec``): the
  elements past the last whole block of each run take the scalar path, which rounds differently
  (``numerics.fbgemm_add_scalar_mask``). torch 2.13 registers no AVX512 variant of the quantized
  kernels, so AVX512 CPUs run the AVX2 kernel (64 elements); the probe measures it anyway;
- where a conv runs: on Linux with AVX512-VNNI the x86 engine prepacks convs with symmetric
  weights and at most 100 groups for oneDNN, whose requantization rounds differently from
  fbgemm's (``tensorgen.frontend.onednn``). A conv on a near-tie (fbgemm gives 62, oneDNN 63),
  dense and depthwise with 100 and 101 channels, tells which library ran.

``x86_behaviour(engine)`` runs a few tiny quantized ops once per process and engine (an
``lru_cache``; a few milliseconds) and returns what it saw as a frozen ``X86Behaviour``.
"""

from __future__ import annotations

import functools
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from tensorgen.frontend import numerics
from tensorgen.mc import arith

#: Vector blocks the add probe can tell apart (the tail of a 1023-element run identifies each).
_ADD_BLOCKS = (8, 16, 32, 64, 128, 256, 512)
_ADD_PROBE_SIZE = 1023


@dataclass(frozen=True)
class X86Behaviour:
    """The integer behaviour of one fbgemm-family engine in this process.

    ``exact_products``: conv and linear accumulate the exact int32 dot product for any uint8
    activations (False: fbgemm's int16 pair saturation, exact only for activations <= 127).
    ``exact_depthwise``: the same for depthwise convs (groups = channels) with per-channel
    symmetric weights, which run other kernels.
    ``add_block``: elements per iteration of the quantized add's vector loop (None: the add
    matched no block, so tensorgen refuses quantized adds under this engine). ``vnni``: the CPU
    flag as the OS reports it (only for the description: the behaviour is measured).
    ``onednn_groups``: convs with at most this many groups (and symmetric weights) run oneDNN's
    kernels (0: none do; -1: the probe's convs matched neither rule, so tensorgen refuses convs).
    """

    engine: str
    exact_products: bool
    exact_depthwise: bool
    add_block: int | None
    vnni: bool
    capability: str
    onednn_groups: int = 0

    def describe(self) -> str:
        cpu = f"{self.capability}{', AVX512-VNNI' if self.vnni else ', no AVX512-VNNI'}"
        sat = "int16-saturating int8 pair products (exact for activations <= 127)"
        products = "exact int8 products" if self.exact_products else sat
        if self.exact_depthwise != self.exact_products:
            products += (
                f" (depthwise convs: {'exact int8 products' if self.exact_depthwise else sat})"
            )
        add = f"add vector block {self.add_block}" if self.add_block else "add rounding unknown"
        convs = {0: "convs on fbgemm", -1: "conv rounding unknown"}.get(
            self.onednn_groups, f"convs of <= {self.onednn_groups} groups on oneDNN"
        )
        return f"{self.engine} engine: {products}, {add}, {convs} ({cpu})"


@functools.cache
def x86_behaviour(engine: str = "x86") -> X86Behaviour:
    """Probe `engine` ("x86" or "fbgemm") once per process; see the module docstring."""
    if engine not in ("x86", "fbgemm"):
        raise ValueError(f"x86_behaviour: engine must be x86 or fbgemm, got {engine!r}")
    saved, threads = torch.backends.quantized.engine, torch.get_num_threads()
    with warnings.catch_warnings():  # torch's deprecation notice for quantized tensor creation
        warnings.filterwarnings("ignore", "torch.quantize_per_tensor", UserWarning)
        torch.backends.quantized.engine = engine
        torch.set_num_threads(
            1
        )  # the add's tail split depends on threads only above 32767 elements
        try:
            exact, depthwise = _products_are_exact(), _depthwise_is_exact()
            block, onednn = _add_block(), _onednn_groups()
        finally:
            torch.backends.quantized.engine = saved
            torch.set_num_threads(threads)
    return X86Behaviour(
        engine,
        exact,
        depthwise,
        block,
        cpu_has_vnni(),
        torch.backends.cpu.get_cpu_capability(),
        onednn,
    )


def cpu_has_vnni() -> bool:
    """Whether the OS lists the avx512_vnni flag (False where /proc/cpuinfo is unreadable)."""
    try:
        return "avx512_vnni" in Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        return False


def _qtensor(q: np.ndarray, scale: float, zp: int) -> torch.Tensor:
    return torch._make_per_tensor_quantized_tensor(torch.from_numpy(q.astype(np.uint8)), scale, zp)


def _products_are_exact() -> bool:
    """A linear and a conv whose every pair of products is 255 * 127 * 2 = 64770 > 32767: the
    exact accumulator and the saturated one requantize to different outputs. Both must be exact
    for the verdict "exact" (a mixed CPU keeps the stricter, saturating rule)."""
    import torch.ao.nn.quantized as nnq

    k = 8  # 4 pairs: exact 259080, saturated 131068
    w = torch._make_per_channel_quantized_tensor(
        torch.full((1, k), 127, dtype=torch.int8),
        torch.tensor([1.0], dtype=torch.float64),
        torch.zeros(1, dtype=torch.long),
        0,
    )
    lin = nnq.Linear(k, 1)
    lin.set_weight_bias(w, None)
    lin.scale, lin.zero_point = 2048.0, 0
    y_lin = int(lin(_qtensor(np.full((1, k), 255), 1.0, 0)).int_repr().item())
    conv = nnq.Conv2d(k, 1, 1)
    conv.set_weight_bias(w.reshape(1, k, 1, 1), None)
    conv.scale, conv.zero_point = 2048.0, 0
    y_conv = int(conv(_qtensor(np.full((1, k, 1, 1), 255), 1.0, 0)).int_repr().item())
    exact = round(255 * 127 * k / 2048)  # 126; saturated: 64
    return y_lin == exact and y_conv == exact


def _depthwise_is_exact() -> bool:
    """A 3x3 depthwise conv of 255s with weights 127 (per-channel, symmetric, as tensorgen
    quantizes them): the centre output's 9 products give 71 exactly, 40 with saturated pairs."""
    import torch.ao.nn.quantized as nnq

    c = 8
    w = torch._make_per_channel_quantized_tensor(
        torch.full((c, 1, 3, 3), 127, dtype=torch.int8),
        torch.ones(c, dtype=torch.float64),
        torch.zeros(c, dtype=torch.long),
        0,
    )
    conv = nnq.Conv2d(c, c, 3, padding=1, groups=c)
    conv.set_weight_bias(w, None)
    conv.scale, conv.zero_point = 4096.0, 0
    y = conv(_qtensor(np.full((1, c, 3, 3), 255), 1.0, 0)).int_repr()
    return bool((y[:, :, 1, 1] == round(9 * 255 * 127 / 4096)).all())


def _add_block() -> int | None:
    """Elements on which the vector and scalar roundings of the add differ reveal each element's
    path; the tail of a contiguous 1023-element add is its last ``1023 % block`` elements."""
    rng = np.random.default_rng(0)
    qa_all, qb_all = (g.ravel() for g in np.meshgrid(np.arange(256), np.arange(256), indexing="ij"))
    for _ in range(200):
        s_a, s_b = (float(v) for v in rng.uniform(1e-3, 0.1, 2))
        s_y = float(rng.uniform(max(s_a, s_b) / 8, 2 * (s_a + s_b)))
        zp_a, zp_b, zp_y = (int(v) for v in rng.integers(0, 256, 3))
        p = numerics.fbgemm_add_params(s_a, zp_a, s_b, zp_b, s_y, zp_y)

        def rule(qa, qb, scalar, p=p):
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
                0,
                255,
                scalar,
            )

        differ = np.flatnonzero(rule(qa_all, qb_all, False) != rule(qa_all, qb_all, True))
        if differ.size:
            break
    else:
        return None
    idx = rng.choice(differ, _ADD_PROBE_SIZE)
    qa, qb = qa_all[idx], qb_all[idx]
    y = torch.ops.quantized.add(_qtensor(qa, s_a, zp_a), _qtensor(qb, s_b, zp_b), s_y, zp_y)
    y = y.int_repr().numpy().astype(np.int64)
    for block in _ADD_BLOCKS:
        mask = numerics.fbgemm_add_scalar_mask(_ADD_PROBE_SIZE, 1, True, block)
        if np.array_equal(rule(qa, qb, mask), y):
            return block
    return None


#: A conv output on a near-tie (random model 136's, found by experiment): acc = 10741 from
#: inputs (137, 54) less 53 times weights (127, 73); fbgemm's rule gives 62, oneDNN's 63.
_TIE = {"x": (137, 54), "x_zp": 53, "w": (127, 73), "s_in": 0.04680776968598366}
_TIE_W, _TIE_B, _TIE_OUT = 0.0022756976541131735, -0.2137542, 0.014886093325912952


def _tie_conv_engine(channels: int) -> str | None:
    """Which rule a depthwise conv of `channels` channels (kernel 1x2; 1 channel: a dense
    conv) follows on the tie: "onednn", "fbgemm", or None for neither."""
    import torch.ao.nn.quantized as nnq

    c = channels
    w = torch._make_per_channel_quantized_tensor(
        torch.tensor([_TIE["w"]] * c, dtype=torch.int8).reshape(c, 1, 1, 2),
        torch.full((c,), _TIE_W, dtype=torch.float64),
        torch.zeros(c, dtype=torch.long),
        0,
    )
    conv = nnq.Conv2d(c, c, (1, 2), groups=c)
    conv.set_weight_bias(w, torch.full((c,), _TIE_B))
    conv.scale, conv.zero_point = _TIE_OUT, 0
    x = _qtensor(np.array([_TIE["x"]] * c).reshape(1, c, 1, 2), _TIE["s_in"], _TIE["x_zp"])
    got = set(conv(x).int_repr().reshape(-1).tolist())
    return {frozenset({63}): "onednn", frozenset({62}): "fbgemm"}.get(frozenset(got))


def _onednn_groups() -> int:
    """100 where a dense conv and a 100-group depthwise one run oneDNN and a 101-group one
    fbgemm (PyTorch's rule), 0 where all run fbgemm, -1 for anything else."""
    seen = tuple(_tie_conv_engine(c) for c in (1, 100, 101))
    if seen == ("onednn", "onednn", "fbgemm"):
        return 100
    return 0 if seen == ("fbgemm",) * 3 else -1
