"""From a `torch.export` program of a float model to a module-level FX graph for FX quantization.

`torch.export` captures an ATen-level graph: `aten.conv2d` with its weight as a constant,
`aten.batch_norm`, `aten.relu`, `aten.add.Tensor` ... PyTorch's FX graph-mode quantization
(`prepare_fx`) matches modules and torch functions, not aten ops, so it would leave such a graph
in float. `module_from_exported` rebuilds the graph one node at a time: an aten op with
parameters becomes the `nn` module that holds them, an activation or pooling op its `nn` module,
anything else the torch function that FX quantization knows:

    aten.conv2d(x, w, b, stride, padding, dilation, groups)   ->  nn.Conv2d      (call_module)
    aten.batch_norm(x, ..., training=False)                    ->  nn.BatchNorm2d (eval)
    aten.linear(x, w, b)                                       ->  nn.Linear
    aten.relu                                                  ->  nn.ReLU
    aten.hardtanh(x, 0, 6), aten.relu6 / other hardtanh        ->  nn.ReLU6 / nn.Hardtanh
    aten.max_pool2d / avg_pool2d / adaptive_avg_pool2d         ->  nn.MaxPool2d / AvgPool2d /
                                                                   AdaptiveAvgPool2d
    aten.add.Tensor(a, b)                                      ->  operator.add
    aten.flatten / view, reshape / cat / permute               ->  torch.flatten / reshape / cat /
                                                                   permute
    aten.dropout(train=False), aten.clone                      ->  the input itself

Modules are named after the module of the user's model they came from ("layer1.0.conv1" ->
"layer1_0_conv1"), so that the model compiler's messages point into the user's model. Nodes whose
result is never used (the `_guards_fn` call, `num_batches_tracked` updates) are dropped.
"""

from __future__ import annotations

import keyword
import operator
import re
from collections.abc import Callable

import torch
from torch import fx, nn

from tensorgen.errors import SpecError

aten = torch.ops.aten


def module_from_exported(ep: torch.export.ExportedProgram) -> fx.GraphModule:
    """The float model of `ep` as an FX GraphModule of `nn` modules and torch functions.

    Parameters: `ep`, a program from `torch.export.export` (or `torch.export.load`) of a float
    model in eval mode, with static shapes.

    Returns a GraphModule in eval mode computing what `ep.module()` computes (the same kernels
    on the same parameters, so the same floats), whose forward takes the program's positional
    inputs and returns its one output, or a flat tuple of several. For SmallCNN
    (examples/models/small_cnn.py):

        exported, ep.module().code                      rebuilt
        conv2d = aten.conv2d.default(x, conv1_weight,   conv1 = self.conv1(x)
                     None, [1, 1], [1, 1])
        batch_norm = aten.batch_norm.default(conv2d,    bn1 = self.bn1(conv1)
                     bn1_weight, bn1_bias, ...)
        relu = aten.relu.default(batch_norm)            relu1 = self.relu1(bn1)
        ...
        add = aten.add.Tensor(batch_norm_2, relu_1)     add = bn3 + relu2  (operator.add)
        ...
        linear = aten.linear.default(flatten,           fc = self.fc(flatten)
                     fc_weight, fc_bias)

    Raises SpecError naming the aten op and the module of the user's model it came from, for an
    op that has no counterpart above or whose arguments do not fit it (a batch norm in training
    mode, a conv whose weight is computed in the graph, ...).
    """
    unlifted = ep.module()
    out_spec = ep.call_spec.out_spec
    single_output = out_spec is not None and out_spec.is_leaf()
    return _Rebuild(ep, unlifted).run(single_output)


class _Rebuild:
    """One pass over the unlifted exported graph, building the new graph and its modules."""

    def __init__(self, ep: torch.export.ExportedProgram, unlifted: fx.GraphModule) -> None:
        self.ep, self.unlifted = ep, unlifted
        self.graph = fx.Graph()
        self.root = nn.Module()
        self.env: dict[fx.Node, fx.Node] = {}  # exported node -> its value in the new graph
        self.constants: dict[fx.Node, torch.Tensor] = {}  # get_attr node -> its tensor

    def run(self, single_output: bool) -> fx.GraphModule:
        live = _live_nodes(self.unlifted.graph)
        order = {node: i for i, node in enumerate(self.unlifted.graph.nodes)}
        for node in self.unlifted.graph.nodes:
            if node.op == "placeholder":
                self.env[node] = self.graph.placeholder(node.name)
            elif node.op == "get_attr":
                self.constants[node] = self._attribute(node.target)
            elif node.op == "output":
                self._output(node, single_output)
            elif node not in live:  # the _guards_fn call, num_batches_tracked updates
                continue
            elif node.op == "call_function" and node.target in _OPS:
                _check_in_place(node, order)
                self.env[node] = _OPS[node.target](self, node, _bind(node))
            else:
                raise SpecError(f"unsupported operator {_op_name(node)} at {_place(node)}")
        self.graph.lint()
        gm = fx.GraphModule(self.root, self.graph, class_name="ExportedModel")
        return gm.eval()

    def _attribute(self, target: str) -> torch.Tensor:
        for table in (self.ep.state_dict, self.ep.constants):
            if target in table and isinstance(table[target], torch.Tensor):
                return table[target]
        value = operator.attrgetter(target)(self.unlifted)  # what ep.module() itself holds there
        if not isinstance(value, torch.Tensor):
            raise SpecError(f"attribute {target} is a {type(value).__name__}, not a tensor")
        return value

    def _output(self, node: fx.Node, single_output: bool) -> None:
        # ep.module()'s graph returns the flat list of outputs; its pytree codegen restructures it
        flat = node.args[0] if isinstance(node.args[0], (tuple, list)) else (node.args[0],)
        outs = []
        for leaf in flat:
            if not (isinstance(leaf, fx.Node) and leaf in self.env):
                raise SpecError(f"output {leaf} is not a tensor computed from the model's inputs")
            outs.append(self.env[leaf])
        self.graph.output(outs[0] if single_output and len(outs) == 1 else tuple(outs))

    # -- what handlers use ---------------------------------------------------------------------
    def value(self, node: fx.Node, arg: object) -> fx.Node:
        """`arg` of `node` as a value of the new graph: it must be computed from the inputs."""
        if isinstance(arg, fx.Node) and arg in self.env:
            return self.env[arg]
        constant = isinstance(arg, fx.Node) and arg in self.constants
        raise self.refuse(
            node,
            f"an operand is {'a constant tensor' if constant else repr(arg)}, "
            "not a tensor computed from the model's inputs",
        )

    def constant(self, node: fx.Node, arg: object, what: str) -> torch.Tensor | None:
        """`arg` of `node` as a float32 parameter, buffer or constant (None stays None)."""
        if arg is None:
            return None
        tensor = self.constants.get(arg) if isinstance(arg, fx.Node) else None
        if tensor is None:
            raise self.refuse(
                node, f"the {what} is computed in the graph, not a parameter or buffer of the model"
            )
        if tensor.dtype != torch.float32:
            raise self.refuse(node, f"the {what} is {tensor.dtype}, not float32")
        return tensor.detach().clone()

    def refuse(self, node: fx.Node, reason: str) -> SpecError:
        return SpecError(f"{_op_name(node)} at {_place(node)}: {reason}")

    def call_module(self, node: fx.Node, module: nn.Module, *inputs: fx.Node) -> fx.Node:
        name = self._module_name(node, type(module))
        self.root.add_module(name, module)
        return self.graph.call_module(name, inputs)

    def call_function(self, fn: Callable, *args: object) -> fx.Node:
        return self.graph.call_function(fn, args)

    def _module_name(self, node: fx.Node, cls: type[nn.Module]) -> str:
        # The module's own path when the op is that module's forward (its class matches, ReLU6
        # for a Hardtanh(0, 6) too); a functional op inside some module's forward gets the op's
        # node name after that module's path.
        path, type_name = _source(node)
        own = type_name in (cls.__name__, *_SAME_OP.get(cls.__name__, ()))
        base = re.sub(r"\W", "_", path if own else f"{path}_{node.name}" if path else node.name)
        if not base or base[0].isdigit():
            base = f"m_{base}"
        name, i = base, 0
        while hasattr(self.root, name) or keyword.iskeyword(name):  # also nn.Module's attributes
            i += 1
            name = f"{base}_{i}"
        return name


# a module the user wrote as one of these classes computes the same op as the class listed
_SAME_OP = {"ReLU6": ("Hardtanh",), "Hardtanh": ("ReLU6",)}


def _live_nodes(graph: fx.Graph) -> set[fx.Node]:
    """The nodes the outputs depend on."""
    live: set[fx.Node] = set()
    stack = [n for n in graph.nodes if n.op == "output"]
    while stack:
        node = stack.pop()
        if node not in live:
            live.add(node)
            stack.extend(node.all_input_nodes)
    return live


def _check_in_place(node: fx.Node, order: dict[fx.Node, int]) -> None:
    # NOTE: export's graph already routes every later read of a tensor updated in place
    # through the in-place node, which is what lets it be rebuilt as the out-of-place op.
    # A later read of the input itself would see the update; refuse rather than guess.
    first = node.target._schema.arguments[0]
    if not (first.alias_info and first.alias_info.is_write):
        return
    source = node.args[0]
    if isinstance(source, fx.Node) and any(order[u] > order[node] for u in source.users):
        raise SpecError(
            f"{_op_name(node)} at {_place(node)}: updates a tensor in place that is "
            "read again afterwards; use the out-of-place op"
        )


def _bind(node: fx.Node) -> dict[str, object]:
    """The node's arguments by their schema names, defaults filled in."""
    bound = {}
    for i, arg in enumerate(node.target._schema.arguments):
        if i < len(node.args):
            bound[arg.name] = node.args[i]
        elif arg.name in node.kwargs:
            bound[arg.name] = node.kwargs[arg.name]
        elif arg.has_default_value():
            bound[arg.name] = arg.default_value
    return bound


def _source(node: fx.Node) -> tuple[str, str]:
    """(path, class name) of the innermost module of the user's model the node ran in."""
    stack = node.meta.get("nn_module_stack")
    if not stack:
        return "", ""
    path, type_name = list(stack.values())[-1]
    return path, str(type_name).rsplit(".", 1)[-1]


def _place(node: fx.Node) -> str:
    path, _ = _source(node)
    return f"{path} ({node.name})" if path else node.name


def _op_name(node: fx.Node) -> str:
    if node.op == "call_function":
        return str(node.target)
    return f"{node.op} {node.target}"


def _pair(v: object) -> tuple[int, int]:
    if isinstance(v, int):
        return v, v
    v = tuple(v)
    return (v[0], v[0]) if len(v) == 1 else v


def _rank(arg: object) -> int | None:
    val = arg.meta.get("val") if isinstance(arg, fx.Node) else None
    return val.dim() if isinstance(val, torch.Tensor) else None


# -- one handler per aten op: (rebuild, exported node, bound arguments) -> node of the new graph --


def _conv2d(rb: _Rebuild, node: fx.Node, a: dict) -> fx.Node:
    x = rb.value(node, a["input"])
    if _rank(a["input"]) not in (4, None):
        raise rb.refuse(node, "only batched 4-d inputs (N, C, H, W)")
    w = rb.constant(node, a["weight"], "weight")
    b = rb.constant(node, a["bias"], "bias")
    groups, dilation, stride = a["groups"], _pair(a["dilation"]), _pair(a["stride"])
    padding = a["padding"]
    if isinstance(padding, str):  # the conv2d.padding overload: "valid" or "same" (stride 1)
        if padding == "valid":
            padding = (0, 0)
        else:
            total = [d * (k - 1) for d, k in zip(dilation, w.shape[2:], strict=False)]
            if any(t % 2 for t in total):
                raise rb.refuse(
                    node, "padding='same' with an even kernel pads unevenly; pad explicitly"
                )
            padding = tuple(t // 2 for t in total)
    conv = nn.Conv2d(
        w.shape[1] * groups,
        w.shape[0],
        tuple(w.shape[2:]),
        stride=stride,
        padding=_pair(padding),
        dilation=dilation,
        groups=groups,
        bias=b is not None,
    )
    conv.weight = nn.Parameter(w)
    if b is not None:
        conv.bias = nn.Parameter(b)
    return rb.call_module(node, conv, x)


def _batch_norm(rb: _Rebuild, node: fx.Node, a: dict) -> fx.Node:
    x = rb.value(node, a["input"])
    if a["training"]:
        raise rb.refuse(node, "batch norm in training mode; export the model after model.eval()")
    if a["running_mean"] is None or a["running_var"] is None:
        raise rb.refuse(node, "batch norm without running statistics")
    if _rank(a["input"]) not in (4, None):
        raise rb.refuse(node, f"batch norm of a {_rank(a['input'])}-d input; only BatchNorm2d")
    mean = rb.constant(node, a["running_mean"], "running mean")
    var = rb.constant(node, a["running_var"], "running variance")
    weight = rb.constant(node, a["weight"], "weight")
    bias = rb.constant(node, a["bias"], "bias")
    affine = weight is not None or bias is not None
    bn = nn.BatchNorm2d(mean.numel(), eps=a["eps"], momentum=a["momentum"], affine=affine)
    if affine:
        bn.weight = nn.Parameter(torch.ones_like(mean) if weight is None else weight)
        bn.bias = nn.Parameter(torch.zeros_like(mean) if bias is None else bias)
    bn.running_mean.copy_(mean)
    bn.running_var.copy_(var)
    return rb.call_module(node, bn.eval(), x)


def _linear(rb: _Rebuild, node: fx.Node, a: dict) -> fx.Node:
    x = rb.value(node, a["input"])
    w = rb.constant(node, a["weight"], "weight")
    b = rb.constant(node, a["bias"], "bias")
    linear = nn.Linear(w.shape[1], w.shape[0], bias=b is not None)
    linear.weight = nn.Parameter(w)
    if b is not None:
        linear.bias = nn.Parameter(b)
    return rb.call_module(node, linear, x)


def _hardtanh(rb: _Rebuild, node: fx.Node, a: dict) -> fx.Node:
    lo, hi = float(a["min_val"]), float(a["max_val"])
    module = nn.ReLU6() if (lo, hi) == (0.0, 6.0) else nn.Hardtanh(lo, hi)
    return rb.call_module(node, module, rb.value(node, a["self"]))


def _add(rb: _Rebuild, node: fx.Node, a: dict) -> fx.Node:
    if a["alpha"] != 1:
        raise rb.refuse(node, f"add with alpha={a['alpha']}; only alpha=1")
    if not all(isinstance(v, fx.Node) and v in rb.env for v in (a["self"], a["other"])):
        raise rb.refuse(node, "adds a scalar or a constant; only the sum of two computed tensors")
    return rb.call_function(operator.add, rb.value(node, a["self"]), rb.value(node, a["other"]))


def _max_pool2d(rb: _Rebuild, node: fx.Node, a: dict) -> fx.Node:
    kernel = _pair(a["kernel_size"])
    pool = nn.MaxPool2d(
        kernel,
        _pair(a["stride"]) if a["stride"] else kernel,
        _pair(a["padding"]),
        _pair(a["dilation"]),
        ceil_mode=a["ceil_mode"],
    )
    return rb.call_module(node, pool, rb.value(node, a["self"]))


def _avg_pool2d(rb: _Rebuild, node: fx.Node, a: dict) -> fx.Node:
    kernel = _pair(a["kernel_size"])
    pool = nn.AvgPool2d(
        kernel,
        _pair(a["stride"]) if a["stride"] else kernel,
        _pair(a["padding"]),
        a["ceil_mode"],
        a["count_include_pad"],
        a["divisor_override"],
    )
    return rb.call_module(node, pool, rb.value(node, a["self"]))


def _flatten(rb: _Rebuild, node: fx.Node, a: dict) -> fx.Node:
    x = rb.value(node, a["self"])
    if a["end_dim"] == -1:
        return rb.call_function(torch.flatten, x, a["start_dim"])
    return rb.call_function(torch.flatten, x, a["start_dim"], a["end_dim"])


def _dropout(rb: _Rebuild, node: fx.Node, a: dict) -> fx.Node:
    if a["train"]:
        raise rb.refuse(node, "dropout in training mode; export the model after model.eval()")
    return rb.value(node, a["input"])


def _relu(rb: _Rebuild, node: fx.Node, a: dict) -> fx.Node:
    return rb.call_module(node, nn.ReLU(), rb.value(node, a["self"]))


def _relu6(rb: _Rebuild, node: fx.Node, a: dict) -> fx.Node:
    return rb.call_module(node, nn.ReLU6(), rb.value(node, a["self"]))


def _adaptive_avg_pool2d(rb: _Rebuild, node: fx.Node, a: dict) -> fx.Node:
    pool = nn.AdaptiveAvgPool2d(tuple(a["output_size"]))
    return rb.call_module(node, pool, rb.value(node, a["self"]))


def _reshape(rb: _Rebuild, node: fx.Node, a: dict) -> fx.Node:
    shape = a["size"] if "size" in a else a["shape"]  # view(self, size), reshape(self, shape)
    return rb.call_function(torch.reshape, rb.value(node, a["self"]), tuple(shape))


def _cat(rb: _Rebuild, node: fx.Node, a: dict) -> fx.Node:
    return rb.call_function(torch.cat, [rb.value(node, t) for t in a["tensors"]], a["dim"])


def _permute(rb: _Rebuild, node: fx.Node, a: dict) -> fx.Node:
    return rb.call_function(torch.permute, rb.value(node, a["self"]), tuple(a["dims"]))


def _identity(rb: _Rebuild, node: fx.Node, a: dict) -> fx.Node:
    # clone: the values are those of its input (a memory_format is a layout, not a value)
    return rb.value(node, a["self"])


_OPS: dict[object, Callable[[_Rebuild, fx.Node, dict], fx.Node]] = {
    aten.conv2d.default: _conv2d,
    aten.conv2d.padding: _conv2d,
    aten.batch_norm.default: _batch_norm,
    aten.linear.default: _linear,
    aten.relu.default: _relu,
    aten.relu_.default: _relu,
    aten.relu6.default: _relu6,
    aten.hardtanh.default: _hardtanh,
    aten.hardtanh_.default: _hardtanh,
    aten.add.Tensor: _add,
    aten.add_.Tensor: _add,
    aten.max_pool2d.default: _max_pool2d,
    aten.avg_pool2d.default: _avg_pool2d,
    aten.adaptive_avg_pool2d.default: _adaptive_avg_pool2d,
    aten.flatten.using_ints: _flatten,
    aten.view.default: _reshape,
    aten.reshape.default: _reshape,
    aten.cat.default: _cat,
    aten.permute.default: _permute,
    aten.dropout.default: _dropout,
    aten.clone.default: _identity,
}
