"""From a quantized FX GraphModule to a list of layers (op.yaml programs) and model values.

The GraphModule is what PyTorch's `convert_fx` produces. It is run once on the example inputs
through an `fx.Interpreter` that records every node's result: shapes and the quantization
parameters (scale, zero point) of every value come from PyTorch itself, not from re-deriving
its observer logic. Each node is then lowered by the function registered for its operator.
A node that is not supported, has a shape that is not static, or computes in float where the
accelerator cannot be bit-exact, is refused with a one-line SpecError naming the operator and
its place in the model. The conv and linear layers are built by conv_layer.py (shared with the
PT2E lowering), the pooling layers by fx_pooling.py.
"""

from __future__ import annotations

import operator
import os
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import fx, nn

from tensorgen.errors import SpecError
from tensorgen.frontend import conv_transpose, elementwise, fx_pooling, numerics, ops, upsample
from tensorgen.frontend.conv_layer import ConvGeometry, conv_layer, linear_layer
from tensorgen.frontend.layers import (
    NATURAL,
    Layer,
    Port,
    axes,
    clamp,
    idx,
    module_path,
)
from tensorgen.frontend.onednn import onednn_requant, runs_on_onednn
from tensorgen.frontend.rules import add_rule, bias_array, conv_requant, weights

QDTYPES = {torch.quint8: "uint8", torch.qint8: "int8"}


@dataclass(frozen=True)
class Value:
    """A tensor flowing between layers. `buffer` names its DRAM storage: a flatten or reshape
    is a new value over the same buffer."""

    name: str
    shape: tuple[int, ...]
    dtype: str  # uint8, int8 or float32
    scale: float = 1.0
    zp: int = 0
    buffer: str = ""

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape)) * np.dtype(self.dtype).itemsize

    def port(self, name: str, role: str, pad: int | None = None) -> Port:
        return Port(
            name, self.shape, self.dtype, role, self.zp if pad is None else pad, self.buffer
        )


@dataclass
class Graph:
    """The lowered model: layers in program order, the values, and the model's inputs/outputs."""

    layers: list[Layer]
    values: dict[str, Value]
    inputs: list[Value]
    outputs: list[Value]


def lower_graph(
    gm: fx.GraphModule,
    example_inputs: tuple[torch.Tensor, ...],
    engine: str = "qnnpack",
    threads: int | None = None,
) -> Graph:
    """`engine`: the quantized engine whose kernels' rounding the layers reproduce; `threads`:
    torch's intra-op thread count PyTorch runs the model at (default: the current one), on
    which the rounding of large x86 adds depends."""
    results = record(gm, example_inputs)
    threads = torch.get_num_threads() if threads is None else threads
    return _Lowering(gm, results, engine, threads).run()


def record(gm: fx.GraphModule, example_inputs) -> dict[fx.Node, object]:
    """Every node's result when PyTorch runs `gm` on `example_inputs`."""
    results: dict[fx.Node, object] = {}

    class Recorder(fx.Interpreter):
        def run_node(self, n: fx.Node):
            out = super().run_node(n)
            results[n] = out
            return out

    with torch.no_grad(), _native_stderr() as captured:
        try:
            Recorder(gm).run(*example_inputs)
        except RuntimeError as err:
            if "QNNPACK" not in str(err):
                raise
            # qnnpack refuses some operators at run time (an add whose scale ratios lie outside
            # [2^-14, 2^8)); its reason goes to the C library's stderr, not into the exception
            reason = next(
                (
                    ln.removeprefix("Error in QNNPACK: ")
                    for ln in captured().splitlines()
                    if ln.startswith("Error in QNNPACK")
                ),
                "",
            )
            first = next((ln for ln in str(err).splitlines() if "QNNPACK" in ln), str(err))
            what = first[first.find("failed to") :] if "failed to" in first else first
            raise SpecError(
                f"PyTorch's qnnpack cannot run this model: {what}"
                + (f" ({reason.strip()})" if reason else "")
            ) from None
    return results


@contextmanager
def _native_stderr() -> Iterator[Callable[[], str]]:
    """Capture what native code writes to file descriptor 2 inside the block (yields a function
    returning it so far). It is written back to stderr on exit, unless the block ends in a
    SpecError, which then carries what mattered of it (one line, the CLI's contract)."""
    sys.stderr.flush()
    try:
        saved = os.dup(2)
    except OSError:  # no stderr to capture
        yield lambda: ""
        return
    with tempfile.TemporaryFile() as tmp:
        os.dup2(tmp.fileno(), 2)

        def text() -> str:
            sys.stderr.flush()
            tmp.seek(0)
            return tmp.read().decode(errors="replace")

        refused = False
        try:
            yield text
        except SpecError:
            refused = True
            raise
        finally:
            out = text()
            os.dup2(saved, 2)
            os.close(saved)
            if out and not refused:
                sys.stderr.write(out)


def _op_name(gm: fx.GraphModule, node: fx.Node) -> str:
    if node.op == "call_module":
        return type(gm.get_submodule(node.target)).__name__
    if node.op == "call_function":
        return getattr(node.target, "__name__", str(node.target))
    return f"{node.op} {node.target}"


class _Lowering:
    def __init__(self, gm: fx.GraphModule, results: dict, engine: str, threads: int) -> None:
        self.gm, self.results, self.engine, self.threads = gm, results, engine, threads
        self.values: dict[str, Value] = {}
        self.layers: list[Layer] = []
        self.producer: dict[str, Layer] = {}  # value name -> the layer that writes it
        self.inputs: list[Value] = []
        self.outputs: list[Value] = []

    def run(self) -> Graph:
        for node in self.gm.graph.nodes:
            try:
                self.node(node)
            except SpecError as err:
                raise SpecError(
                    f"{_op_name(self.gm, node)} at {module_path(node)}: {err}"
                ) from None
        return Graph(self.layers, self.values, self.inputs, self.outputs)

    # -- values ------------------------------------------------------------------------------
    def value_of(self, arg) -> Value:
        if not isinstance(arg, fx.Node) or arg.name not in self.values:
            raise SpecError(f"input {arg} is not a tensor the accelerator holds")
        return self.values[arg.name]

    def result_value(self, node: fx.Node, buffer: str | None = None) -> Value:
        r = self.results[node]
        if not isinstance(r, torch.Tensor):
            raise SpecError(f"produces {type(r).__name__}, not a tensor")
        if r.is_quantized:
            if r.qscheme() != torch.per_tensor_affine or r.dtype not in QDTYPES:
                raise SpecError(
                    f"produces a {r.dtype} tensor with {r.qscheme()}; only per-tensor quint8/qint8"
                )
            v = Value(
                node.name,
                tuple(r.shape),
                QDTYPES[r.dtype],
                float(r.q_scale()),
                int(r.q_zero_point()),
                buffer or node.name,
            )
        elif r.dtype == torch.float32:
            v = Value(node.name, tuple(r.shape), "float32", buffer=buffer or node.name)
        else:
            raise SpecError(f"produces a {r.dtype} tensor")
        self.values[node.name] = v
        return v

    def add(self, layer: Layer, out: Value) -> None:
        self.layers.append(layer)
        self.producer[out.name] = layer

    # -- dispatch ----------------------------------------------------------------------------
    def node(self, node: fx.Node) -> None:
        if node.op == "placeholder":
            v = self.result_value(node)
            if v.dtype != "float32":
                raise SpecError("model inputs must be float32 tensors (quantized at the entry)")
            self.inputs.append(v)
            return
        if node.op == "get_attr":
            return
        if node.op == "output":
            outs = node.args[0]
            for o in outs if isinstance(outs, (tuple, list)) else (outs,):
                v = self.value_of(o)
                if v.dtype != "float32":
                    raise SpecError("model outputs must be dequantized float32 tensors")
                self.outputs.append(v)
            return
        if node.op == "call_module":
            mod = self.gm.get_submodule(node.target)
            for cls, fn in elementwise.MODULES + MODULES:
                if isinstance(mod, cls):
                    return fn(self, node, mod)
        elif node.op == "call_function":
            fn = FUNCTIONS.get(node.target)
            if fn is not None:
                return fn(self, node)
        elif node.op == "call_method":
            fn = (METHODS | elementwise.METHODS).get(node.target)
            if fn is not None:
                return fn(self, node)
        self._refuse(node)

    def _refuse(self, node: fx.Node) -> None:
        ins = [self.results.get(a) for a in node.all_input_nodes]
        if any(isinstance(r, torch.Tensor) and r.dtype == torch.float32 for r in ins):
            raise SpecError(
                "a float operation inside the quantized model cannot be bit-exact on the "
                "accelerator; quantize it (give it a qconfig) or remove it"
            )
        raise SpecError("unsupported operator")

    # -- quantize / dequantize ---------------------------------------------------------------
    def quantize(self, node: fx.Node) -> None:
        x = self.value_of(node.args[0])
        if x.dtype != "float32":
            raise SpecError("quantize of a tensor that is already quantized")
        y = self.result_value(node)
        a = idx(axes(len(y.shape)))
        lo, hi = NATURAL[y.dtype]

        def body(lo_, hi_):
            return [
                f"Y[{a}] = " + clamp(f"quantize(X[{a}], {y.scale!r}, {y.zp})", lo_, hi_, (lo, hi))
            ]

        self.add(
            Layer(
                node.name,
                module_path(node),
                "quantize",
                [x.port("X", "input", 0), y.port("Y", "output")],
                body,
                lo,
                hi,
                fusable=True,
            ),
            y,
        )

    def dequantize(self, node: fx.Node) -> None:
        x = self.value_of(node.args[0])
        if x.dtype == "float32":
            raise SpecError("dequantize of a float tensor")
        y = self.result_value(node)
        a = idx(axes(len(y.shape)))
        self.add(
            Layer(
                node.name,
                module_path(node),
                "dequantize",
                [x.port("X", "input"), y.port("Y", "output", 0)],
                lambda lo, hi: [f"Y[{a}] = dequantize(X[{a}], {x.scale!r}, {x.zp})"],
            ),
            y,
        )

    # -- convolution and linear --------------------------------------------------------------
    def conv(self, node: fx.Node, mod) -> None:
        x = self.value_of(node.args[0])
        y = self.result_value(node)
        if getattr(mod, "padding_mode", "zeros") != "zeros":
            raise SpecError(f"padding_mode '{mod.padding_mode}' (only zeros)")
        wq, s_w, w_zp = weights(mod.weight())
        bias = bias_array(mod.bias(), wq.shape[0])
        lo, hi, epilogue = _fused_relu(mod, y)
        if runs_on_onednn(self.engine, mod.groups, w_zp):
            rq = onednn_requant(x.scale, s_w, y.scale, bias)
        else:
            rq = conv_requant(self.engine, x.scale, s_w, y.scale, bias)
        geometry = ConvGeometry(mod.stride, mod.padding, mod.dilation, mod.groups)
        layer = conv_layer(
            node.name, module_path(node), x, y, (wq, w_zp), rq, geometry, (lo, hi), epilogue
        )
        self.add(layer, y)

    def linear(self, node: fx.Node, mod) -> None:
        x = self.value_of(node.args[0])
        y = self.result_value(node)
        wq, s_w, w_zp = weights(mod.weight())
        rq = conv_requant(self.engine, x.scale, s_w, y.scale, bias_array(mod.bias(), wq.shape[0]))
        lo, hi, epilogue = _fused_relu(mod, y)
        layer = linear_layer(node.name, module_path(node), x, y, (wq, w_zp), rq, (lo, hi), epilogue)
        self.add(layer, y)

    # -- element-wise ------------------------------------------------------------------------
    def clamp_op(self, node: fx.Node, kind: str, lo_f: float | None, hi_f: float | None) -> None:
        """relu / relu6 / hardtanh on a quantized tensor: the output keeps the input's qparams,
        so it is a clamp of the integers; folded into the producer's epilogue when it is the
        producer's only user."""
        x = self.value_of(node.args[0])
        if x.dtype == "float32":
            self._refuse(node)
        natural = NATURAL[x.dtype]
        lo = (
            max(natural[0], numerics.quantize_scalar(lo_f, x.scale, x.zp, *natural))
            if lo_f is not None
            else natural[0]
        )
        hi = (
            min(natural[1], numerics.quantize_scalar(hi_f, x.scale, x.zp, *natural))
            if hi_f is not None
            else natural[1]
        )
        r = self.results[node]
        if r.q_scale() != x.scale or r.q_zero_point() != x.zp:
            raise SpecError(
                "changes the quantization parameters (only clamps that keep them are supported)"
            )
        producer = self.producer.get(x.name)
        if (
            producer is not None
            and producer.fusable
            and len(node.args[0].users) == 1
            and producer.output.value == x.buffer
        ):
            producer.lo, producer.hi = max(producer.lo, lo), min(producer.hi, hi)
            producer.epilogue.append(kind)
            producer.result = node.name
            self.values[node.name] = Value(node.name, x.shape, x.dtype, x.scale, x.zp, x.buffer)
            self.producer[node.name] = producer
            return
        y = self.result_value(node)
        a = idx(axes(len(y.shape)))
        self.add(
            Layer(
                node.name,
                module_path(node),
                kind,
                [x.port("X", "input"), y.port("Y", "output")],
                lambda lo_, hi_: [f"Y[{a}] = " + clamp(f"X[{a}]", lo_, hi_, natural)],
                lo,
                hi,
                fusable=True,
            ),
            y,
        )

    def add_op(self, node: fx.Node, relu: bool) -> None:
        a_node, b_node = node.args[0], node.args[1]
        a, b = self.value_of(a_node), self.value_of(b_node)
        y = self.result_value(node)
        if a.shape != b.shape or a.shape != y.shape:
            raise SpecError(
                f"broadcasting add of {list(a.shape)} and {list(b.shape)} (only equal shapes)"
            )
        if y.dtype != "uint8":
            raise SpecError("quantized add of non-quint8 tensors")
        ra, rb = (self.results[n] for n in node.args[:2])
        rule = add_rule(
            self.engine,
            (a.scale, a.zp),
            (b.scale, b.zp),
            (y.scale, y.zp),
            y.shape,
            (tuple(ra.stride()), tuple(rb.stride())),
            self.threads,
        )
        if self.fuse_add(node, relu, rule, y, (a_node, a, b, False), (b_node, b, a, True)):
            return
        ix = idx(axes(len(y.shape)))

        def body(lo, hi):
            return rule.statements(f"Y[{ix}]", f"A[{ix}]", f"B[{ix}]", lo, hi)

        lo = y.zp if relu else 0
        self.add(
            Layer(
                node.name,
                module_path(node),
                "add",
                [a.port("A", "input"), b.port("B", "input"), y.port("Y", "output")],
                body,
                lo,
                255,
                fusable=True,
                epilogue=["relu"] if relu else [],
            ),
            y,
        )

    def fuse_add(self, node: fx.Node, relu: bool, rule, y: Value, *operands) -> bool:
        """Fold a residual add into the conv or linear layer just before it when that layer
        produces one of its operands for the add alone: the epilogue requantizes, then adds the
        other operand, and the conv's output never goes to DRAM."""
        producer = self.layers[-1] if self.layers else None
        if producer is None or producer.op not in ("conv2d", "depthwise", "grouped", "linear"):
            return False
        if rule.tails:
            # an epilogue that recomputes the tails from the accumulator measured slower than the
            # add as its own layer (a 9x61x61 residual: 72,462 cycles folded, 42,495 not)
            return False
        for arg, mine, other, second in operands:
            if (
                self.producer.get(mine.name) is not producer
                or len(arg.users) != 1
                or producer.output.value != mine.buffer
                or other.buffer == mine.buffer
            ):
                continue
            out = producer.output
            old_body, plo, phi = producer.body, producer.lo, producer.hi

            def body(lo, hi, old_body=old_body, plo=plo, phi=phi, second=second):
                *stmts, last = old_body(plo, phi)
                lhs, expr = last.split(" = ", 1)
                r = f"R[{lhs[lhs.index('[') + 1 : -1]}]"
                ea, eb = (r, expr) if second else (expr, r)
                return stmts + rule.statements(lhs, ea, eb, lo, hi)

            producer.body = body
            producer.ports = [q for q in producer.ports if q.role != "output"] + [
                Port("R", out.shape, other.dtype, "input", other.zp, other.buffer),
                Port("Y", out.shape, y.dtype, "output", y.zp, y.buffer),
            ]
            producer.lo, producer.hi = (y.zp if relu else 0), 255
            producer.epilogue += ["add", "relu"] if relu else ["add"]
            producer.result = node.name
            self.producer[node.name] = producer
            return True
        return False

    # -- shapes ------------------------------------------------------------------------------
    def alias(self, node: fx.Node) -> None:
        """flatten / reshape / view / contiguous of a contiguous tensor: the same bytes."""
        x = self.value_of(node.args[0])
        r = self.results[node]
        if isinstance(r, torch.Tensor) and r.numel() != int(np.prod(x.shape)):
            raise SpecError("reshape changes the number of elements")
        v = self.result_value(node, buffer=x.buffer)
        if (v.scale, v.zp) != (x.scale, x.zp):
            raise SpecError("reshape changes the quantization parameters")
        if (
            x.name in self.producer and len(node.args[0].users) == 1
        ):  # a clamp after it may still fold
            self.producer[node.name] = self.producer[x.name]

    def permute(self, node: fx.Node) -> None:
        x = self.value_of(node.args[0])
        dims = node.args[1:] if len(node.args) > 2 else node.args[1]
        dims = [d % len(x.shape) for d in (dims if isinstance(dims, (tuple, list)) else (dims,))]
        y = self.result_value(node)
        src = axes(len(x.shape))
        dst = [src[d] for d in dims]
        self.add(
            Layer(
                node.name,
                module_path(node),
                "permute",
                [x.port("X", "input"), y.port("Y", "output")],
                lambda lo, hi: [f"Y[{idx(dst)}] = X[{idx(src)}]"],
            ),
            y,
        )


def _fused_relu(mod, y: Value) -> tuple[int, int, list[str]]:
    """The output bounds of a conv or linear module and its epilogue: ConvReLU2d and LinearReLU
    clamp at the zero point."""
    natural = NATURAL[y.dtype]
    if "ReLU" in type(mod).__name__:
        return y.zp, natural[1], ["relu"]
    return *natural, []


def _hardtanh_module(lw, node, mod):
    lw.clamp_op(
        node, "hardtanh" if not isinstance(mod, nn.ReLU6) else "relu6", mod.min_val, mod.max_val
    )


MODULES = (
    (torch.ao.nn.quantized.ConvTranspose2d, conv_transpose.conv_transpose),
    (torch.ao.nn.quantized.Conv2d, lambda lw, n, m: lw.conv(n, m)),  # ConvReLU2d derives from it
    (torch.ao.nn.quantized.Linear, lambda lw, n, m: lw.linear(n, m)),  # LinearReLU derives from it
    (nn.ReLU, lambda lw, n, m: lw.clamp_op(n, "relu", 0.0, None)),
    (nn.Hardtanh, _hardtanh_module),  # ReLU6 derives from it
    (nn.MaxPool2d, fx_pooling.max_pool_module),
    (nn.AdaptiveAvgPool2d, lambda lw, n, m: fx_pooling.adaptive_avg_pool(lw, n, m.output_size)),
    (
        nn.AvgPool2d,
        lambda lw, n, m: fx_pooling.avg_pool(
            lw,
            n,
            m.kernel_size,
            m.stride,
            m.padding,
            m.ceil_mode,
            m.count_include_pad,
            m.divisor_override,
        ),
    ),
    (nn.Upsample, lambda lw, n, m: upsample.interpolate(lw, n, m, m.mode)),
    (nn.Flatten, lambda lw, n, m: lw.alias(n)),
    (nn.Identity, lambda lw, n, m: lw.alias(n)),
)

FUNCTIONS = {
    torch.quantize_per_tensor: lambda lw, n: lw.quantize(n),
    torch.ops.quantized.add: lambda lw, n: lw.add_op(n, relu=False),
    torch.ops.quantized.add_relu: lambda lw, n: lw.add_op(n, relu=True),
    torch.flatten: lambda lw, n: lw.alias(n),
    torch.reshape: lambda lw, n: lw.alias(n),
    torch.permute: lambda lw, n: lw.permute(n),
    torch.cat: ops.cat,
    torch.relu: lambda lw, n: lw.clamp_op(n, "relu", 0.0, None),
    F.relu: lambda lw, n: lw.clamp_op(n, "relu", 0.0, None),
    F.relu6: lambda lw, n: lw.clamp_op(n, "relu6", 0.0, 6.0),
    F.hardtanh: lambda lw, n: lw.clamp_op(
        n,
        "hardtanh",
        n.kwargs.get("min_val", (list(n.args) + [-1.0])[1]),
        n.kwargs.get("max_val", (list(n.args) + [-1.0, 1.0])[2]),
    ),
    F.interpolate: lambda lw, n: upsample.interpolate(
        lw,
        n,
        lambda t: n.target(t, *n.args[1:], **n.kwargs),
        n.kwargs.get("mode", n.args[3] if len(n.args) > 3 else "nearest"),
    ),
    F.max_pool2d: fx_pooling.max_pool_function,
    torch.max_pool2d: fx_pooling.max_pool_function,
    F.adaptive_avg_pool2d: lambda lw, n: fx_pooling.adaptive_avg_pool(lw, n, n.args[1]),
    F.avg_pool2d: lambda lw, n: fx_pooling.avg_pool(lw, n, *fx_pooling.avg_pool_args(n)),
    operator.getitem: ops.piece,
    torch.transpose: ops.transpose,
    torch.chunk: ops.split,
    torch.split: ops.split,
    getattr: ops.python_value,
    operator.floordiv: ops.python_value,
    operator.mul: ops.python_value,
    operator.sub: ops.python_value,
    operator.add: ops.python_value,
}
FUNCTIONS = {**{k: v for k, v in FUNCTIONS.items() if v is not None}, **elementwise.FUNCTIONS}

METHODS = {
    "dequantize": lambda lw, n: lw.dequantize(n),
    "flatten": lambda lw, n: lw.alias(n),
    "reshape": lambda lw, n: lw.alias(n),
    "view": lambda lw, n: lw.alias(n),
    "contiguous": lambda lw, n: lw.alias(n),
    "permute": lambda lw, n: lw.permute(n),
    "transpose": ops.transpose,
    "chunk": ops.split,
    "split": ops.split,
    "relu": lambda lw, n: lw.clamp_op(n, "relu", 0.0, None),
}
