"""The arithmetic of each quantized engine as op.yaml expressions: how a conv or linear layer
requantizes and how a quantized add rounds, under qnnpack (the golden path) and x86/fbgemm.
The parameters come from tensorgen.frontend.numerics, whose rules tests pin against PyTorch."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np
import torch

from tensorgen.errors import SpecError
from tensorgen.frontend import numerics
from tensorgen.frontend.layers import Port, affine, f32
from tensorgen.frontend.probe import x86_behaviour


@dataclass(frozen=True)
class Requant:
    """Bias and requantization of a conv/linear layer: qnnpack's int32 bias and one float32
    multiplier (`multiplier` set), or fbgemm's float bias and multiplier per channel, or with
    `onednn` = (s_src, d) oneDNN's rule (onednn.py): float32 weight scale and bias per channel
    (ports SW, BO) and the two factors."""

    ports: list[Port]
    multiplier: float | None = None
    onednn: tuple[float, float] | None = None

    def init(self, channel: str) -> str:
        return f"B[{channel}]" if any(p.name == "B" for p in self.ports) else "0"

    def plus(self, offset: np.ndarray) -> Requant:
        """The same with an integer `offset` per channel added to the accumulator's start."""
        ports = [p for p in self.ports if p.name != "B"]
        old = next((p.const for p in self.ports if p.name == "B"), np.zeros(offset.shape, np.int64))
        b = (old.astype(np.int64) + offset).astype(np.int32)  # int32 wrap, like the accumulator
        return replace(self, ports=[Port("B", b.shape, "int32", "input", 0, None, b), *ports])

    def expr(self, acc: str, channel: str, zp: int) -> str:
        if self.multiplier is not None:
            return f"requant({acc}, {f32(self.multiplier)}, {zp})"
        if self.onednn is not None:
            src, d = (f32(v) for v in self.onednn)
            return f"requant_onednn({acc}, SW[{channel}], BO[{channel}], {src}, {d}, {zp})"
        return f"requant_fbgemm({acc}, BF[{channel}], CM[{channel}], {zp})"

    def grouped(self, g: int, kg: int) -> Requant:
        """The same with each per-channel port split into (group, channel in group, ...)."""
        ports = [
            Port(p.name, (g, kg, *p.shape[1:]), p.dtype, p.role, 0, None,
                 p.const.reshape(g, kg, *p.shape[1:]))
            for p in self.ports
        ]  # fmt: skip
        return replace(self, ports=ports)


def conv_requant(engine: str, s_in: float, s_w, s_out: float, bias: np.ndarray) -> Requant:
    """The bias and requantization of a conv or linear layer under `engine`."""
    if engine == "qnnpack":
        if np.ndim(s_w):
            raise SpecError(
                "per-channel weights under qnnpack are not supported yet "
                "(the default qnnpack qconfig quantizes weights per tensor)"
            )
        b_q = numerics.quantize_bias(bias, s_in, s_w).astype(np.int32)
        return Requant(
            [Port("B", b_q.shape, "int32", "input", 0, None, b_q)],
            multiplier=float(numerics.requant_multiplier(s_in, s_w, s_out)),
        )
    if not np.ndim(s_w):
        raise SpecError(
            f"per-tensor weights under {engine} are not supported yet "
            f"(the default {engine} qconfig quantizes weights per channel)"
        )
    p = numerics.fbgemm_requant_params(s_in, s_w, s_out, per_channel=True)
    # fbgemm adds RN(b / atws) to the float accumulator: a float32 constant per channel
    bf = (bias.astype(np.float32) / np.asarray(p.atws, np.float32)).astype(np.float32)
    cm = np.broadcast_to(np.asarray(p.cm, np.float32), bf.shape).copy()
    return Requant(
        [
            Port("BF", bf.shape, "float32", "input", 0, None, bf),
            Port("CM", cm.shape, "float32", "input", 0, None, cm),
        ]
    )


#: most tail statements an x86 add may have: one per thread chunk of ATen's parallel loop
MAX_ADD_TAILS = 8


@dataclass(frozen=True)
class AddRule:
    """How an engine adds two quantized tensors: `vector(ea, eb)`, the expression of the sum
    before its final clamp, everywhere except at `tails`, the [start, stop) ranges of memory
    positions (`order`: the strides of the output's memory order, by dimension; `numel`
    elements) where `scalar(ea, eb)` holds instead (x86: fbgemm's scalar tail of each
    vectorised run). `vector` is None when every element takes the scalar rule."""

    vector: Callable[[str, str], str] | None
    scalar: Callable[[str, str], str] | None = None
    tails: tuple[tuple[int, int], ...] = ()
    order: tuple[int, ...] = ()
    numel: int = 0

    @property
    def uniform(self) -> Callable[[str, str], str] | None:
        """The one expression that holds at every position, or None."""
        if self.vector is None:
            return self.scalar
        return None if self.tails else self.vector

    def where(self, names: list[str]) -> tuple[str, ...]:
        """The tails as op.yaml `where:` constraints over the output's indices `names`."""
        flat = affine(*zip(self.order, names, strict=True))  # the memory position
        return tuple(
            f"{flat} >= {lo}" if hi == self.numel else f"{lo} <= {flat} < {hi}"
            for lo, hi in self.tails
        )

    def statements(self, lhs: str, ea: str, eb: str, lo: int, hi: int) -> list:
        """`lhs = clamp(sum, lo, hi)` over the whole domain, then each tail overwritten by the
        scalar rule (a few dozen elements: cheaper than cutting the body's domain). `lhs` is
        `Y[...]` with one bare index per dimension of the output."""
        first = self.vector or self.scalar
        stmts: list = [f"{lhs} = clamp({first(ea, eb)}, {lo}, {hi})"]
        if self.tails:
            tail = f"{lhs} = clamp({self.scalar(ea, eb)}, {lo}, {hi})"
            names = lhs[lhs.index("[") + 1 : -1].split(", ")
            stmts += [{"stmt": tail, "where": w} for w in self.where(names)]
        return stmts


def add_rule(
    engine: str,
    a: tuple[float, int],
    b: tuple[float, int],
    y: tuple[float, int],
    shape: tuple[int, ...],
    strides: tuple[tuple[int, ...], tuple[int, ...]],
    threads: int | None = None,
) -> AddRule:
    """The quantized sum of A and B as `engine` computes it; a, b, y are (scale, zero point),
    `strides` the two operands' strides in PyTorch and `threads` torch's intra-op thread count
    when PyTorch runs the add (default: the current one): the x86 add's rounding depends on the
    position in memory order and, above 32767 elements, on the thread count."""
    (s_a, zp_a), (s_b, zp_b), (s_y, zp_y) = a, b, y
    if engine == "qnnpack":
        p = numerics.add_params(s_a, zp_a, s_b, zp_b, s_y)
        return AddRule(
            lambda ea, eb: (
                f"rshift_round({ea} * {p.a_mult} + {eb} * {p.b_mult} {_signed(p.zp_product)}, "
                f"{p.shift}) {_signed(zp_y)}"
            )
        )
    threads = torch.get_num_threads() if threads is None else threads
    return _fbgemm_add_rule(engine, a, b, y, shape, strides, threads)


def _fbgemm_add_rule(engine: str, a, b, y, shape, strides, threads: int) -> AddRule:
    """x86 / fbgemm: the vector loop's rounding, and the scalar rule at the end of each run."""
    (s_a, zp_a), (s_b, zp_b), (s_y, zp_y) = a, b, y
    block = x86_behaviour(engine).add_block  # the vector loop's width on this CPU, measured
    if block is None:
        raise SpecError(
            f"quantized add under {engine}: this PyTorch's add matched no known rounding "
            f"({x86_behaviour(engine).describe()})"
        )
    order = [_memory_order(shape, st) for st in strides]
    if None in order:
        raise SpecError(
            f"quantized add under {engine} of a strided view (strides {strides[0]} and "
            f"{strides[1]}): only contiguous and channels_last operands have known runs"
        )
    scalar = numerics.fbgemm_add_scalar_mask(
        int(np.prod(shape)), threads, order[0] == order[1], block
    )
    p = numerics.fbgemm_add_params(s_a, zp_a, s_b, zp_b, s_y, zp_y)
    consts = ", ".join(f32(v) for v in (p.s_a, p.offset_a, p.s_b, p.offset_b, p.inv_out))
    s_consts = f"{f32(p.s_a)}, {zp_a}, {f32(p.s_b)}, {zp_b}, {f32(p.inv_out)}, {zp_y}"
    vector = lambda ea, eb: f"add_fbgemm({ea}, {eb}, {consts}, {zp_y})"  # noqa: E731
    tails = _runs(scalar)
    if not tails:
        return AddRule(vector)
    s_rule = lambda ea, eb: f"add_fbgemm_scalar({ea}, {eb}, {s_consts})"  # noqa: E731
    if tails == [(0, scalar.size)]:
        return AddRule(None, s_rule)
    if len(tails) > MAX_ADD_TAILS:
        raise SpecError(
            f"quantized add under {engine}: {len(tails)} thread chunks of "
            f"{threads} threads take fbgemm's scalar path at their ends (at most "
            f"{MAX_ADD_TAILS}; fewer torch threads give fewer chunks)"
        )
    return AddRule(vector, s_rule, tuple(tails), order[0], scalar.size)


def _memory_order(shape: tuple[int, ...], strides: tuple[int, ...]) -> tuple[int, ...] | None:
    """The strides of a contiguous or channels_last tensor with those of its size-1 dimensions
    set to 0 (they never move), so that two layouts compare equal when their memory orders do;
    None for any other layout."""
    layouts = [torch.contiguous_format] + ([torch.channels_last] if len(shape) == 4 else [])
    known = {_dense_strides(shape, torch.empty(shape, memory_format=m).stride()) for m in layouts}
    mine = _dense_strides(shape, strides)
    return mine if mine in known else None


def _dense_strides(shape: tuple[int, ...], strides: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(st if n > 1 else 0 for n, st in zip(shape, strides, strict=True))


def _runs(mask: np.ndarray) -> list[tuple[int, int]]:
    """The [start, stop) ranges of the True runs of a 1-d bool array."""
    edges = np.flatnonzero(np.diff(np.concatenate([[0], mask.astype(np.int8), [0]])))
    return [(int(lo), int(hi)) for lo, hi in zip(edges[::2], edges[1::2], strict=True)]


def weights(w: torch.Tensor) -> tuple[np.ndarray, float | np.ndarray, int]:
    """int8 weights, their scale (an array per output channel if so quantized), zero point."""
    wq = w.int_repr().numpy().astype(np.int8)
    if w.qscheme() in (torch.per_tensor_affine, torch.per_tensor_symmetric):
        return wq, float(w.q_scale()), int(w.q_zero_point())
    if (
        w.qscheme() in (torch.per_channel_affine, torch.per_channel_symmetric)
        and w.q_per_channel_axis() == 0
    ):
        zps = w.q_per_channel_zero_points().numpy()
        if zps.any():
            raise SpecError("per-channel weights with non-zero zero points")
        return wq, w.q_per_channel_scales().numpy().astype(np.float64), 0
    raise SpecError(f"weights quantized {w.qscheme()} along axis {w.q_per_channel_axis()}")


def bias_array(bias: torch.Tensor | None, n: int) -> np.ndarray:
    if bias is None:
        return np.zeros(n, np.float32)
    return bias.detach().numpy().astype(np.float32)


def _signed(c: int) -> str:
    return f"+ {c}" if c >= 0 else f"- {-c}"
