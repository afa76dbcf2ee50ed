"""From a PT2E-quantized GraphModule to tensorgen's layer graph (the Graph of frontend/fx.py).

torchao's `convert_pt2e` leaves an ATen graph in which every quantized tensor is a
`quantized_decomposed.quantize_per_tensor` node, read through `dequantize_per_tensor`, and the
operators between compute in float32 (`conv2d` of dequantized int8 input, per-channel int8
weights and int32 bias). Each quantize node, with the float operators that feed it back to
the dequantize nodes, is one integer layer, computed by tensorgen's integer rule for PT2E
graphs (docs/numerics.md, "PT2E"): exact int32 accumulation, one float32 multiplier per
output channel; adds and the entry's quantize as PyTorch's float32 graph computes them.

The graph is run once on the example inputs (`fx.record`): shapes come from PyTorch, the
quantization parameters from the quantize nodes' arguments.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import fx

from tensorgen.errors import SpecError
from tensorgen.frontend.fx import Graph, Value, record
from tensorgen.frontend.layers import NATURAL, Layer, Port
from tensorgen.frontend.layers import module_path as _path_of
from tensorgen.frontend.rules import Requant

Q, DQ, DQC = (
    f"quantized_decomposed.{n}.default"
    for n in ("quantize_per_tensor", "dequantize_per_tensor", "dequantize_per_channel")
)
DTYPES = {torch.int8: "int8", torch.uint8: "uint8"}
ACTIVATIONS = {"aten.relu.default", "aten.relu_.default", "aten.hardtanh.default"}
ACTIVATIONS |= {"aten.hardtanh_.default"}


def op_of(node: fx.Node) -> str:
    return str(node.target) if node.op == "call_function" else node.op


def is_pt2e(model: torch.nn.Module) -> bool:
    """Whether `model` is a GraphModule converted by PT2E (quantize_per_tensor nodes in it)."""
    return isinstance(model, fx.GraphModule) and any(op_of(n) == Q for n in model.graph.nodes)


def lower_pt2e(gm: fx.GraphModule, example_inputs: tuple[torch.Tensor, ...]) -> Graph:
    results = record(gm, example_inputs)
    return _Pt2e(gm, results).run()


def inv_scale(s: float) -> float:
    """PyTorch's `1.0 / scale` in double, then float32 as the multiply with a float32 tensor."""
    return float(np.float32(1.0 / float(s)))


def quantize_bound(v: float, s: float, zp: int, lo: int, hi: int) -> int:
    """quantize_per_tensor of one float32 value: clamp(RNE(RN(v·RN(1/s))) + zp)."""
    t = np.float32(np.float32(v) * np.float32(inv_scale(s)))
    return int(min(hi, max(lo, int(np.rint(t)) + zp)))


class _Pt2e:
    def __init__(self, gm: fx.GraphModule, results: dict) -> None:
        self.gm, self.results = gm, results
        self.values: dict[str, Value] = {}
        self.layers: list[Layer] = []
        self.inputs: list[Value] = []
        self.outputs: list[Value] = []
        self.used: set[fx.Node] = set()  # float operators lowered as part of a layer

    def run(self) -> Graph:
        nodes = list(self.gm.graph.nodes)
        for node in [n for n in nodes if n.op != "output"] + [n for n in nodes if n.op == "output"]:
            if node.op == "output":  # every float operator is part of a layer by now
                self.check_float(nodes)
            try:
                self.node(node)
            except SpecError as err:
                site = node.args[0] if op_of(node) == Q else node  # the float operator quantized
                site = site if isinstance(site, fx.Node) else node
                raise SpecError(f"{op_of(site)} at {_path_of(site)}: {err}") from None
        return Graph(self.layers, self.values, self.inputs, self.outputs)

    def check_float(self, nodes: list[fx.Node]) -> None:
        for node in nodes:
            lowered = op_of(node) in (Q, DQ, DQC) or node in self.used
            if node.op == "call_function" and not lowered:
                raise SpecError(
                    f"{op_of(node)} at {_path_of(node)}: a float operation whose result is not "
                    "quantized (tensorgen's PT2E quantizer does not quantize it) cannot be "
                    "bit-exact on the accelerator"
                )

    # -- values --------------------------------------------------------------------------
    def value_of(self, node) -> Value:
        """The integer value a dequantize node reads (or a placeholder's float value)."""
        if isinstance(node, fx.Node) and op_of(node) == DQ:
            node = node.args[0]
        if not isinstance(node, fx.Node) or node.name not in self.values:
            raise SpecError(f"input {node} is not a quantized tensor the accelerator holds")
        return self.values[node.name]

    def shape(self, node: fx.Node) -> tuple[int, ...]:
        r = self.results[node]
        if not isinstance(r, torch.Tensor):
            raise SpecError(f"produces {type(r).__name__}, not a tensor")
        return tuple(r.shape)

    def new_value(self, q: fx.Node, buffer: str | None = None) -> Value:
        _, s, zp, lo, hi, dtype = q.args[:6]
        if dtype not in DTYPES or (lo, hi) != NATURAL[DTYPES[dtype]]:
            raise SpecError(f"quantizes to {dtype} in [{lo}, {hi}]; only int8/uint8, full range")
        v = Value(q.name, self.shape(q), DTYPES[dtype], float(s), int(zp), buffer or q.name)
        self.values[q.name] = v
        return v

    def weight(self, node) -> tuple[np.ndarray, np.ndarray]:
        """int8 weights (or int32 bias) and their scales per output channel."""
        if not isinstance(node, fx.Node) or op_of(node) != DQC:
            raise SpecError("weights or bias that are not quantized per channel")
        data, scales, zps, axis = (
            self.results[a] if isinstance(a, fx.Node) else a for a in node.args[:4]
        )
        if axis != 0 or (zps is not None and torch.as_tensor(zps).any()):
            raise SpecError("per-channel quantization along axis != 0 or with zero points")
        return data.numpy(), scales.to(torch.float64).numpy()

    def add(self, layer: Layer) -> None:
        self.layers.append(layer)

    # -- dispatch ------------------------------------------------------------------------
    def node(self, node: fx.Node) -> None:
        op = op_of(node)
        if node.op == "placeholder":
            r = self.results[node]
            if not isinstance(r, torch.Tensor) or r.dtype != torch.float32:
                raise SpecError("model inputs must be float32 tensors (quantized at the entry)")
            v = Value(node.name, tuple(r.shape), "float32", buffer=node.name)
            self.values[node.name] = v
            self.inputs.append(v)
        elif node.op == "output":
            outs = node.args[0]
            for o in outs if isinstance(outs, (tuple, list)) else (outs,):
                self.output(o)
        elif op == Q:
            self.quantized(node)

    def output(self, o) -> None:
        if not isinstance(o, fx.Node) or op_of(o) != DQ:
            raise SpecError("model outputs must be dequantized tensors")
        if o.name not in self.values:
            from tensorgen.frontend.pt2e_layers import dequantize

            dequantize(self, o)
        self.outputs.append(self.values[o.name])

    def quantized(self, q: fx.Node) -> None:
        """One layer: the quantize node `q` and the float operators feeding it."""
        from tensorgen.frontend import pt2e_layers as L

        src = q.args[0]
        if not isinstance(src, fx.Node):
            raise SpecError("quantizes a constant")
        if src.op == "placeholder":
            return L.quantize(self, q)
        lo_f, hi_f, act = None, None, None
        if op_of(src) in ACTIVATIONS and len(src.users) == 1:
            act, src = src, src.args[0]
            self.used.add(act)
            lo_f = (
                float(act.args[1]) if len(act.args) > 1 else (0.0 if "relu" in op_of(act) else -1.0)
            )
            hi_f = (
                None if "relu" in op_of(act) else (float(act.args[2]) if len(act.args) > 2 else 1.0)
            )
        if op_of(src) == DQ:  # an activation alone on a quantized tensor
            return L.clamp_only(self, q, src, act, lo_f, hi_f)
        if len(src.users) != 1:
            raise SpecError(f"{op_of(src)}'s float result has {len(src.users)} users")
        self.used.add(src)
        fn = L.LAYERS.get(op_of(src))
        if fn is None:
            raise SpecError(f"{op_of(src)} is not supported in a PT2E graph")
        if act is not None and fn not in L.FUSABLE:
            raise SpecError(f"{op_of(act)} after {op_of(src)} (only after conv, linear, add)")
        fn(self, q, src, lo_f, hi_f)

    def bounds(self, y: Value, lo_f, hi_f) -> tuple[int, int]:
        lo, hi = NATURAL[y.dtype]
        if lo_f is not None:
            lo = max(lo, quantize_bound(lo_f, y.scale, y.zp, lo, hi))
        if hi_f is not None:
            hi = min(hi, quantize_bound(hi_f, y.scale, y.zp, lo, hi))
        return lo, hi


def requant_per_channel(b_q: np.ndarray, s_x: float, s_w: np.ndarray, s_y: float) -> Requant:
    """The int32 bias and the float32 multiplier per channel `f32(s_x·s_w[k] / s_y)` (in
    double, rounded once), applied as `RN(f32(acc + b)·M[k])` by requant_fbgemm with a zero
    float bias."""
    m = (np.float64(s_x) * s_w / np.float64(s_y)).astype(np.float32)
    k = m.shape[0]
    b = np.zeros(k, np.int32) if b_q is None else b_q.astype(np.int32)
    return Requant(
        [
            Port("B", (k,), "int32", "input", 0, None, b),
            Port("BF", (k,), "float32", "input", 0, None, np.zeros(k, np.float32)),
            Port("CM", (k,), "float32", "input", 0, None, m),
        ]
    )
