"""tensorgen's integer rule for PT2E graphs, as an independent reference (numpy and float64
torch only; it shares no code with the lowering in pt2e.py / pt2e_layers.py).

A PT2E-converted graph computes in float32 between its quantize / dequantize nodes, so no
integer program matches PyTorch's execution of it bit for bit in general. tensorgen's rule
(docs/numerics.md, "PT2E") is what the accelerator computes instead; `RuleModel` evaluates it
on the graph's own quantize nodes, and `deviations` counts where PyTorch's float execution of
the same graph comes out different.

- quantize (the entry): `clamp(RNE(fma(x, RN(1/s), zp)))`, tensorgen's quantize (PyTorch's
  quantize_per_tensor adds the zero point after rounding: a difference only near ties);
- conv2d / linear: `acc = b_q + Σ (x − zp_x)·w` exact (b_q the graph's int32 bias),
  `y = clamp(RNE(RN(f32(acc)·M[k])) + zp_y)`, `M[k] = f32(s_x·s_w[k]/s_y)` (double, one
  rounding); a fused relu / hardtanh clamps to the quantized bounds;
- add: the float graph's own arithmetic, `c = RN(RN(s_a·(a − zp_a)) + RN(s_b·(b − zp_b)))`,
  then quantize (relu before it when fused);
- max pooling, flatten / view / reshape, cat: integers moved (parameters shared);
- adaptive average pooling and mean over (2, 3): `acc = Σ (x − zp)`,
  `y = clamp(RNE(RN(f32(acc)·M)) + zp_y)`, `M = f32(s_in/(n·s_out))`; average pooling the
  same with ATen's divisor at each output position;
- functions of one tensor (hardswish, hardsigmoid, sigmoid, tanh, leaky_relu, elu, gelu, silu,
  mul / add of a number): the graph's own float operator on the dequantized tensor, quantized;
- mul of two tensors: `(a − zp_a)·(b − zp_b)` exact, requantized with `f32(s_a·s_b/s_y)`;
- nearest upsampling, dropout: integers moved;
- dequantize (the exit): `RN(f32(q − zp)·f32(s))`.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import fx, nn

QUANT = "quantized_decomposed.quantize_per_tensor.default"
DEQUANT = "quantized_decomposed.dequantize_per_tensor.default"
DEQUANT_CH = "quantized_decomposed.dequantize_per_channel.default"


FLOAT_FUNCTIONS = {  # the graph's own float operators of one tensor, as torch runs them
    f"aten.{name}.default": getattr(torch.ops.aten, name).default
    for name in ("hardswish", "hardsigmoid", "sigmoid", "tanh", "leaky_relu", "elu", "gelu", "silu")
}

ARITHMETIC = (  # of a number, or of two tensors
    "aten.mul.Tensor",
    "aten.mul_.Tensor",
    "aten.add.Tensor",
    "aten.add_.Tensor",
)
ARITHMETIC += ("aten.sub.Tensor",)


class Codes:
    """An integer tensor and its quantization parameters."""

    def __init__(self, q: np.ndarray, scale: float, zp: int, lo: int, hi: int) -> None:
        self.q, self.scale, self.zp, self.lo, self.hi = q.astype(np.int64), scale, zp, lo, hi


def _quantize(x: np.ndarray, s: float, zp: int, lo: int, hi: int) -> np.ndarray:
    t = np.asarray(x, np.float32) * np.float32(1.0 / s)
    return np.clip(np.rint(t.astype(np.float64)).astype(np.int64) + zp, lo, hi)


def _quantize_entry(x: np.ndarray, s: float, zp: int, lo: int, hi: int) -> np.ndarray:
    """clamp(RNE(fma(x, RN(1/f32(s)), zp))): the product is exact in double, the sum rounds
    once to float32."""
    inv = np.float32(1) / np.float32(s)
    t = (np.asarray(x, np.float64) * np.float64(inv) + zp).astype(np.float32)
    return np.clip(np.rint(t.astype(np.float64)).astype(np.int64), lo, hi)


def _requant(acc: np.ndarray, m: np.ndarray, zp: int, lo: int, hi: int) -> np.ndarray:
    acc32 = ((acc + 2**31) % 2**32 - 2**31).astype(np.float32)  # the int32 register, then f32
    prod = acc32 * m.astype(np.float32)
    return np.clip(np.rint(prod.astype(np.float64)).astype(np.int64) + zp, lo, hi)


def _dequantize(c: Codes) -> np.ndarray:
    return (c.q - c.zp).astype(np.float32) * np.float32(c.scale)


class _Rule:
    def __init__(self, gm: fx.GraphModule) -> None:
        self.gm = gm
        self.env: dict[fx.Node, object] = {}

    def const(self, node):
        if isinstance(node, fx.Node) and node.op == "get_attr":
            obj = self.gm
            for part in str(node.target).split("."):
                obj = getattr(obj, part)
            return obj.detach()
        return node

    def run(self, inputs) -> dict[fx.Node, object]:
        it = iter(inputs)
        for node in self.gm.graph.nodes:
            if node.op == "placeholder":
                self.env[node] = next(it).detach().numpy().astype(np.float32)
            elif node.op == "call_function" and str(node.target) == QUANT:
                self.env[node] = self.quantize(node)
            elif node.op == "output":
                outs = node.args[0]
                outs = outs if isinstance(outs, (tuple, list)) else (outs,)
                self.env[node] = [_dequantize(self.env[o.args[0]]) for o in outs]
        return self.env

    def codes(self, node) -> Codes:
        if str(node.target) != DEQUANT:
            raise ValueError(f"{node.name}: not a dequantized tensor")
        return self.env[node.args[0]]

    def quantize(self, q: fx.Node) -> Codes:
        s, zp, lo, hi = float(q.args[1]), int(q.args[2]), int(q.args[3]), int(q.args[4])
        src = q.args[0]
        if src.op == "placeholder":
            return Codes(_quantize_entry(self.env[src], s, zp, lo, hi), s, zp, lo, hi)
        bounds = (lo, hi)
        name = str(src.target)
        if name in ("aten.relu.default", "aten.relu_.default"):
            bounds, src = (max(lo, zp), hi), src.args[0]
        elif name in ("aten.hardtanh.default", "aten.hardtanh_.default"):
            a, b = (list(src.args[1:3]) + [-1.0, 1.0][len(src.args) - 1 :])[:2]
            edge = _quantize(np.array([a, b], np.float32), s, zp, lo, hi)
            bounds, src = (int(edge[0]), int(edge[1])), src.args[0]
        return Codes(self.compute(src, s, zp, bounds), s, zp, lo, hi)

    def compute(self, src: fx.Node, s: float, zp: int, bounds) -> np.ndarray:
        name = str(src.target)
        lo, hi = bounds
        if name == DEQUANT:
            return np.clip(self.codes(src).q, lo, hi)
        if name in ("aten.conv2d.default", "aten.linear.default"):
            return self.weighted(src, s, zp, bounds)
        if name == "aten.max_pool2d.default":
            x = self.codes(src.args[0])
            t = torch.from_numpy(x.q.astype(np.float64))
            y = F.max_pool2d(t, *src.args[1:])
            return np.clip(y.numpy().astype(np.int64), lo, hi)
        if name in FLOAT_FUNCTIONS or name in ARITHMETIC:
            return self.elementwise(src, s, zp, bounds)
        if name in ("aten.adaptive_avg_pool2d.default", "aten.mean.dim"):
            x = self.codes(src.args[0])
            n, c, h, w = x.q.shape
            oh, ow = src.args[1] if name.startswith("aten.adaptive") else (1, 1)
            kh, kw = h // oh, w // ow
            acc = (x.q - x.zp).reshape(n, c, oh, kh, ow, kw).sum(axis=(3, 5))
            m = np.float32(x.scale / (kh * kw * s))
            return _requant(acc, np.asarray(m), zp, lo, hi)
        if name == "aten.avg_pool2d.default":
            return self.avg_pool(src, s, zp, bounds)
        if name.startswith("aten.upsample_nearest2d."):
            t = torch.from_numpy(self.codes(src.args[0]).q.astype(np.float64))
            return np.clip(src.target(t, *src.args[1:]).numpy().astype(np.int64), lo, hi)
        if name == "aten.transpose.int":
            return np.clip(np.swapaxes(self.codes(src.args[0]).q, src.args[1], src.args[2]), lo, hi)
        if name == "aten.permute.default":
            return np.clip(np.transpose(self.codes(src.args[0]).q, src.args[1]), lo, hi)
        if name == "<built-in function getitem>":
            whole = src.args[0]
            x = torch.from_numpy(self.codes(whole.args[0]).q)
            fn = torch.chunk if str(whole.target) == "aten.chunk.default" else torch.split
            dim = whole.args[2] if len(whole.args) > 2 else 0
            return np.clip(fn(x, whole.args[1], dim)[src.args[1]].numpy(), lo, hi)
        if name in ("aten.contiguous.default", "aten.clone.default", "aten.dropout.default"):
            return np.clip(self.codes(src.args[0]).q, lo, hi)
        if name in ("aten.flatten.using_ints", "aten.view.default", "aten.reshape.default"):
            x = self.codes(src.args[0])
            return np.clip(self.gm_shape(src, x.q), lo, hi)
        if name == "aten.cat.default":
            dim = src.args[1] if len(src.args) > 1 else 0
            return np.clip(np.concatenate([self.codes(t).q for t in src.args[0]], dim), lo, hi)
        raise ValueError(f"{src.name}: {name} has no rule")

    def elementwise(self, src: fx.Node, s: float, zp: int, bounds) -> np.ndarray:
        """A float function of one tensor (or with a number): the graph's own operator on the
        dequantized codes, quantized; a mul of two tensors: the integer product requantized."""
        name, (lo, hi) = str(src.target), bounds
        if name in FLOAT_FUNCTIONS:
            x = torch.from_numpy(_dequantize(self.codes(src.args[0])))
            y = FLOAT_FUNCTIONS[name](x, *src.args[1:], **src.kwargs).numpy()
            return np.clip(_quantize(y, s, zp, -(2**40), 2**40), lo, hi)
        if not isinstance(src.args[1], fx.Node):
            x = torch.from_numpy(_dequantize(self.codes(src.args[0])))
            c = src.args[1]
            y = (x * c if "mul" in name else x - c if "sub" in name else x + c).numpy()
            return np.clip(_quantize(y, s, zp, -(2**40), 2**40), lo, hi)
        a, b = self.codes(src.args[0]), self.codes(src.args[1])
        if "add" in name:  # the float graph's own add
            return np.clip(
                _quantize(_dequantize(a) + _dequantize(b), s, zp, -(2**40), 2**40), lo, hi
            )
        if "mul" not in name:
            raise ValueError(f"{src.name}: {name} of two tensors has no rule")
        m = np.float32(np.float64(a.scale) * np.float64(b.scale) / np.float64(s))
        return _requant((a.q - a.zp) * (b.q - b.zp), np.asarray(m), zp, lo, hi)

    def avg_pool(self, src: fx.Node, s: float, zp: int, bounds) -> np.ndarray:
        """The window sums of x − zp (ATen's pooling of them with divisor 1, its padding 0),
        each requantized with PyTorch's divisor there: sum(ones) / mean(ones) of the same pooling."""
        x = self.codes(src.args[0])
        args = list(src.args[1:6]) + [(), 0, False, True][len(src.args) - 2 :]
        kernel, stride, padding, ceil, include = args[:5]
        override = src.args[6] if len(src.args) > 6 else None
        pool = torch.ops.aten.avg_pool2d.default

        def run(t, divisor):
            return pool(t, kernel, stride, padding, ceil, include, divisor).numpy()

        acc = np.rint(run(torch.from_numpy((x.q - x.zp).astype(np.float64)), 1)).astype(np.int64)
        ones = torch.ones((1, 1, *x.q.shape[2:]), dtype=torch.float64)
        n = override or np.rint(run(ones, 1) / run(ones, None))
        m = (np.float64(x.scale) / (n * np.float64(s))).astype(np.float32)
        return _requant(acc, np.asarray(m), zp, *bounds)

    def gm_shape(self, src: fx.Node, q: np.ndarray) -> np.ndarray:
        if str(src.target) == "aten.flatten.using_ints":
            start = src.args[1] if len(src.args) > 1 else 0
            return q.reshape(*q.shape[:start], -1)
        return q.reshape(src.args[1])

    def weighted(self, src: fx.Node, s: float, zp: int, bounds) -> np.ndarray:
        x = self.codes(src.args[0])
        wnode = src.args[1]
        w = self.const(wnode.args[0]).numpy().astype(np.float64)
        s_w = self.const(wnode.args[1]).to(torch.float64).numpy()
        bias = src.args[2] if len(src.args) > 2 else None
        xs = torch.from_numpy((x.q - x.zp).astype(np.float64))
        wt = torch.from_numpy(w)
        if str(src.target) == "aten.linear.default":
            acc = (xs @ wt.T).numpy()
            shape = (1,) * (acc.ndim - 1) + (-1,)
        else:
            stride, padding, dilation, groups = (
                list(src.args[3:7]) + [1, 0, 1, 1][len(src.args) - 3 :]
            )[:4]
            acc = F.conv2d(xs, wt, None, stride, padding, dilation, groups).numpy()
            shape = (1, -1, 1, 1)
        acc = np.rint(acc).astype(np.int64)  # exact: every partial sum is an integer < 2^53
        if isinstance(bias, fx.Node):
            acc = acc + self.const(bias.args[0]).numpy().astype(np.int64).reshape(shape)
        m = (np.float64(x.scale) * s_w / np.float64(s)).astype(np.float32).reshape(shape)
        return _requant(acc, m, zp, *bounds)


class RuleModel(nn.Module):
    """The PT2E graph `gm` evaluated by tensorgen's integer rule: the reference `tensorgen
    check` compares the accelerator with. Its outputs are the dequantized float32 tensors."""

    def __init__(self, gm: fx.GraphModule) -> None:
        super().__init__()
        self.gm = gm

    def forward(self, *inputs: torch.Tensor):
        outs = _Rule(self.gm).run(inputs)[next(n for n in self.gm.graph.nodes if n.op == "output")]
        outs = tuple(torch.from_numpy(o) for o in outs)
        return outs if len(outs) > 1 else outs[0]

    def deviations(self, inputs: tuple[torch.Tensor, ...]) -> tuple[int, int, int]:
        """(elements that differ, their largest difference in LSB, elements) between the rule's
        output codes and those of PyTorch's float32 execution of the graph."""
        env, theirs = _Rule(self.gm).run(inputs), self._torch_codes(inputs)
        return _compare((env[q].q, theirs[q]) for q in self._output_quantizes())

    def layer_deviations(self, inputs: tuple[torch.Tensor, ...]) -> tuple[int, int, int]:
        """The same over every quantized tensor, each computed by the rule from PyTorch's own
        values at its inputs: what the rule changes in one layer, without propagation."""
        theirs = self._torch_codes(inputs)
        rule = _Rule(self.gm)
        pairs = []
        for q, codes in theirs.items():
            s, zp, lo, hi = float(q.args[1]), int(q.args[2]), int(q.args[3]), int(q.args[4])
            rule.env[q] = Codes(codes, s, zp, lo, hi)
        rule.env.update(
            {n: x.detach().numpy() for n, x in zip(self._placeholders(), inputs, strict=True)}
        )
        for q in theirs:
            pairs.append((rule.quantize(q).q, theirs[q]))
        return _compare(pairs)

    def _placeholders(self) -> list[fx.Node]:
        return [n for n in self.gm.graph.nodes if n.op == "placeholder"]

    def _output_quantizes(self) -> list[fx.Node]:
        out = next(n for n in self.gm.graph.nodes if n.op == "output").args[0]
        return [o.args[0] for o in (out if isinstance(out, (tuple, list)) else (out,))]

    def _torch_codes(self, inputs) -> dict[fx.Node, np.ndarray]:
        """Every quantize node's int8 result when PyTorch runs the graph."""
        codes: dict[fx.Node, np.ndarray] = {}

        class Recorder(fx.Interpreter):
            def run_node(self, n):
                out = super().run_node(n)
                if n.op == "call_function" and str(n.target) == QUANT:
                    codes[n] = out.numpy().astype(np.int64)
                return out

        with torch.no_grad():
            Recorder(self.gm).run(*inputs)
        return codes

    def describe(self, inputs: tuple[torch.Tensor, ...]) -> str:
        """One line: how PyTorch's float execution of the graph differs from the rule, at the
        outputs and layer by layer (see layer_deviations)."""
        parts = []
        for what, (differ, largest, total) in (
            ("outputs", self.deviations(inputs)),
            ("layer by layer", self.layer_deviations(inputs)),
        ):
            parts.append(
                f"{what} {differ} of {total:,} elements ({differ / total:.3%})"
                + (f", at most {largest} LSB" if differ else "")
            )
        return "PyTorch's float execution differs: " + "; ".join(parts)


def _compare(pairs) -> tuple[int, int, int]:
    differ = largest = total = 0
    for mine, theirs in pairs:
        d = np.abs(mine - theirs)
        differ += int((d > 0).sum())
        largest = max(largest, int(d.max(initial=0)))
        total += d.size
    return differ, largest, total
