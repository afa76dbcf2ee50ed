"""Lowerings of the element-wise quantized operators beyond add and the clamps.

- Every quantized function of one input whose output parameters are fixed after conversion
  (`Hardswish`, `Hardsigmoid`, `Sigmoid`, `Tanh`, `LeakyReLU`, `ELU`, and `add`/`mul` of a
  tensor and a Python number) is a function of the input's 256 codes: a lookup table
  (`lut(X[...], T)`, the `VLUT` instruction), built by running the node's own PyTorch operator
  on a tensor of all 256 codes with the input's parameters, so that it is PyTorch's result by
  construction. The recorded run of the model is checked against the table before it is used:
  a kernel that is not element-wise in fact (PyTorch's qnnpack clamp on channels-last data
  was not) is refused, never silently mismatched.
- `mul` of two quantized tensors (squeeze-excite's `[N, C, H, W] * [N, C, 1, 1]` broadcast
  included): `requant((A - zp_a) * (B - zp_b), M, zp_y)`, the integer product requantized with
  one float32 multiplier; `numerics.mul_multiplier` finds M against PyTorch's own kernel on all
  256 x 256 code pairs.
- `mean` over the spatial dimensions under qnnpack: PyTorch runs its adaptive average pooling
  to 1 x 1 (bit for bit, pinned in tests/frontend/test_numerics_ops.py), lowered as that.

Each function takes the `_Lowering` of tensorgen.frontend.fx and the FX node.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from tensorgen.errors import SpecError
from tensorgen.frontend import fx_pooling, numerics
from tensorgen.frontend.layers import NATURAL, Layer, Port, axes, f32, idx, module_path

if TYPE_CHECKING:
    from torch import fx

    from tensorgen.frontend.fx import _Lowering

TORCH_QDTYPES = {"uint8": torch.quint8, "int8": torch.qint8}


def all_codes(dtype: str) -> np.ndarray:
    """The 256 codes of `dtype` in table order: entry i holds the code whose byte is i."""
    return np.arange(256, dtype=np.uint8).view(np.dtype(dtype))


def run_on(lw: _Lowering, node: fx.Node, x: torch.Tensor) -> torch.Tensor:
    """The node's own operator applied to `x` in place of its first input."""

    def arg(a):
        if a is node.args[0]:
            return x
        return lw.results[a] if isinstance(a, torch.fx.Node) else a

    args = [arg(a) for a in node.args]
    kwargs = {k: arg(v) for k, v in node.kwargs.items()}
    with torch.no_grad():
        if node.op == "call_module":
            return lw.gm.get_submodule(node.target)(*args, **kwargs)
        if node.op == "call_method":
            return getattr(args[0], node.target)(*args[1:], **kwargs)
        return node.target(*args, **kwargs)


def table_of(lw: _Lowering, node: fx.Node) -> np.ndarray:
    """PyTorch's output codes for each of the 256 input codes, in table order; refused when the
    node's recorded result is not the table applied to its recorded input."""
    x = lw.value_of(node.args[0])
    y = lw.result_value(node)
    if x.dtype not in NATURAL or y.dtype not in NATURAL:
        raise SpecError("a lookup table maps quantized uint8/int8 tensors only")
    codes = torch.from_numpy(all_codes(x.dtype).copy())
    qx = torch._make_per_tensor_quantized_tensor(codes, x.scale, x.zp)
    out = run_on(lw, node, qx)
    if not (isinstance(out, torch.Tensor) and out.is_quantized and out.shape == qx.shape):
        raise SpecError("is not an element-wise function of one quantized tensor")
    if (float(out.q_scale()), int(out.q_zero_point())) != (y.scale, y.zp):
        raise SpecError(
            "its output quantization parameters depend on the input's values, not only on its "
            "codes' parameters: not a lookup table"
        )
    table = out.int_repr().numpy().astype(np.dtype(y.dtype))
    got = lw.results[node].int_repr().numpy()
    seen = lw.results[node.args[0]].int_repr().numpy().view(np.uint8)
    if not np.array_equal(table[seen], got):
        raise SpecError(
            "PyTorch's result in the model is not its result on the same codes alone (the "
            "kernel depends on the layout or on other elements), so no lookup table reproduces it"
        )
    return table


def lookup(lw: _Lowering, node: fx.Node) -> None:
    """A quantized element-wise function of one input as a table lookup; a table that is the
    identity on codes of the same dtype (`mul` by a positive number changes the scale only) is
    an alias of the same bytes."""
    table = table_of(lw, node)
    x = lw.value_of(node.args[0])
    y = lw.result_value(node)
    if x.dtype == y.dtype and np.array_equal(table, all_codes(x.dtype)):
        lw.values[node.name] = y.__class__(y.name, y.shape, y.dtype, y.scale, y.zp, buffer=x.buffer)
        return
    if fuse_lookup(lw, node, table):
        return
    lw.add(lut_layer(node.name, module_path(node), x, y, table), y)


def lut_layer(name: str, path: str, x, y, table: np.ndarray) -> Layer:
    """`Y = lut(X, T)`: each code of X replaced by T's entry at its byte (the VLUT instruction);
    the FX and the PT2E lowerings both build their lookups with it."""
    a = idx(axes(len(y.shape)))
    return Layer(
        name,
        path,
        "lut",
        [
            x.port("X", "input"),
            Port("T", (256,), y.dtype, "input", 0, None, table),
            y.port("Y", "output"),
        ],
        lambda lo, hi: [f"Y[{a}] = lut(X[{a}], T)"],
    )


FOLDS_INTO = ("conv2d", "depthwise", "grouped", "linear")


def fuse_lookup(lw: _Lowering, node: fx.Node, table: np.ndarray) -> bool:
    """Fold the lookup into the conv or linear layer just before it when that layer's output
    has no other user: its epilogue requantizes into a temporary Q, then looks Q up, and the
    conv's own output never goes to DRAM. qnnpack only: under x86 the fold measured slower
    (MobileNetV3-Small at 64x64: 396,377 cycles folded, 352,025 not; the float bias and
    multiplier views beside Q and the table shrink the scheduler's tiles)."""
    producer = lw.layers[-1] if lw.layers else None
    x, y = lw.value_of(node.args[0]), lw.result_value(node)
    if (
        lw.engine != "qnnpack"
        or producer is None
        or producer.op not in FOLDS_INTO
        or lw.producer.get(x.name) is not producer
        or len(node.args[0].users) != 1
        or producer.output.value != x.buffer
    ):
        return False
    out, old_body, plo, phi = producer.output, producer.body, producer.lo, producer.hi

    def body(lo, hi):
        *stmts, last = old_body(plo, phi)
        lhs, expr = last.split(" = ", 1)
        q = "Q" + lhs[lhs.index("[") :]
        return [*stmts, f"{q} = {expr}", f"{lhs} = lut({q}, T)"]

    producer.body = body
    producer.ports = [p for p in producer.ports if p.role != "output"] + [
        Port("Q", out.shape, out.dtype, "none", out.pad),
        Port("T", (256,), y.dtype, "input", 0, None, table),
        Port("Y", out.shape, y.dtype, "output", y.zp, y.buffer),
    ]
    producer.lo, producer.hi = NATURAL[y.dtype]
    producer.fusable = False  # the table is PyTorch's result: nothing more folds after it
    producer.epilogue += ["lut"]
    producer.result = node.name
    lw.producer[node.name] = producer
    return True


def mul(lw: _Lowering, node: fx.Node) -> None:
    """quantized.mul: of a tensor and a number, a lookup; of two tensors, the integer product
    requantized, the second operand broadcast along dimensions of size 1."""
    other = node.args[1]
    if not isinstance(other, torch.fx.Node) or not isinstance(lw.results[other], torch.Tensor):
        return lookup(lw, node)
    na, nb = node.args[0], other
    a, b = lw.value_of(na), lw.value_of(nb)
    y = lw.result_value(node)
    if a.shape != y.shape and b.shape == y.shape:  # the product commutes exactly
        (a, na), (b, nb) = (b, nb), (a, na)
    if a.shape != y.shape or len(b.shape) != len(y.shape):
        raise SpecError(f"mul of {list(a.shape)} and {list(b.shape)}: only broadcasts of B")
    if any(m not in (1, n) for m, n in zip(b.shape, y.shape, strict=True)):
        raise SpecError(f"mul of {list(a.shape)} and {list(b.shape)}: shapes do not broadcast")
    if {a.dtype, b.dtype, y.dtype} != {"uint8"}:
        raise SpecError("quantized mul of non-quint8 tensors")
    m = numerics.mul_multiplier(a.scale, b.scale, y.scale)
    check_mul_rule(a, b, y, m, lw.engine)
    ia = axes(len(y.shape))
    ib = [i if n > 1 else "0" for i, n in zip(ia, b.shape, strict=True)]
    az, bz = (f" - {a.zp}" if a.zp else ""), (f" - {b.zp}" if b.zp else "")
    rhs = f"requant((A[{idx(ia)}]{az}) * (B[{idx(ib)}]{bz}), {f32(m)}, {y.zp})"
    relu = node.target is torch.ops.quantized.mul_relu
    stmt = f"Y[{idx(ia)}] = " + (f"max({rhs}, {y.zp})" if relu else rhs)
    ra, rb = (lw.results[n].int_repr().numpy() for n in (na, nb))
    got = numerics.mul_codes(ra, rb, a.zp, b.zp, m, y.zp)
    got = np.maximum(got, y.zp) if relu else got
    if not np.array_equal(got, lw.results[node].int_repr().numpy()):
        raise SpecError(f"PyTorch's {lw.engine} mul disagrees with its own rule in this model")
    lw.add(
        Layer(
            node.name,
            module_path(node),
            "mul",
            [a.port("A", "input"), b.port("B", "input"), y.port("Y", "output")],
            lambda lo, hi: [stmt],
        ),
        y,
    )


def check_mul_rule(a, b, y, m: np.float32, engine: str) -> None:
    """`numerics.mul_codes` with multiplier m against PyTorch's kernel on all 256 x 256 code
    pairs of these parameters; refused when they differ anywhere."""
    ca = torch.arange(256, dtype=torch.uint8).repeat_interleave(256)
    cb = torch.arange(256, dtype=torch.uint8).repeat(256)
    qa = torch._make_per_tensor_quantized_tensor(ca, a.scale, a.zp)
    qb = torch._make_per_tensor_quantized_tensor(cb, b.scale, b.zp)
    want = torch.ops.quantized.mul(qa, qb, y.scale, y.zp).int_repr().numpy()
    if not np.array_equal(numerics.mul_codes(ca.numpy(), cb.numpy(), a.zp, b.zp, m, y.zp), want):
        raise SpecError(
            f"quantized mul of scales {a.scale!r} and {b.scale!r} into {y.scale!r}: PyTorch's "
            f"{engine} kernel differs from its rule (numerics.mul_multiplier) on some code pairs"
        )


def _dropout(lw: _Lowering, node: fx.Node, mod: nn.Dropout) -> None:
    """Dropout on quantized data (torch.ao.nn.quantized.Dropout, whatever its training flag,
    and float Dropout in eval mode) is the identity: the same bytes."""
    x, y = lw.results[node.args[0]], lw.results[node]
    quantized = isinstance(mod, torch.ao.nn.quantized.Dropout)
    if (mod.training and not quantized) or not torch.equal(x, y):
        raise SpecError("Dropout that drops (put the model in eval mode)")
    lw.alias(node)


def mean(lw: _Lowering, node: fx.Node) -> None:
    """x.mean over the spatial dimensions (2, 3) with keepdim, as PyTorch's qnnpack runs it:
    its adaptive average pooling to 1 x 1."""
    dims = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
    keep = node.args[2] if len(node.args) > 2 else node.kwargs.get("keepdim", False)
    x = lw.value_of(node.args[0])
    dims = sorted(d % len(x.shape) for d in (dims if isinstance(dims, (list, tuple)) else [dims]))
    if len(x.shape) != 4 or dims != [2, 3] or not keep:
        raise SpecError(f"mean over {dims} keepdim={keep} (only over (2, 3) with keepdim=True)")
    if lw.engine != "qnnpack":
        raise SpecError(
            f"quantized mean under {lw.engine}: PyTorch takes the float mean of the dequantized "
            "tensor there (channels-last) or its own integer kernel, neither reproduced yet; "
            "use nn.AdaptiveAvgPool2d(1), or --engine qnnpack"
        )
    fx_pooling.adaptive_avg_pool(lw, node, (1, 1))


MODULES = (
    (torch.ao.nn.quantized.Hardswish, lambda lw, n, m: lookup(lw, n)),
    (torch.ao.nn.quantized.LeakyReLU, lambda lw, n, m: lookup(lw, n)),
    (torch.ao.nn.quantized.ELU, lambda lw, n, m: lookup(lw, n)),
    (nn.Hardsigmoid, lambda lw, n, m: lookup(lw, n)),
    (nn.Sigmoid, lambda lw, n, m: lookup(lw, n)),
    (nn.Tanh, lambda lw, n, m: lookup(lw, n)),
    (nn.Hardswish, lambda lw, n, m: lookup(lw, n)),
    (nn.LeakyReLU, lambda lw, n, m: lookup(lw, n)),
    (nn.ELU, lambda lw, n, m: lookup(lw, n)),
    (nn.Dropout, lambda lw, n, m: _dropout(lw, n, m)),
)

FUNCTIONS = {
    torch.ops.quantized.hardswish: lookup,
    torch.ops.quantized.leaky_relu: lookup,
    torch.ops.quantized.elu: lookup,
    torch.ops.quantized.sigmoid: lookup,
    torch.sigmoid: lookup,
    torch.tanh: lookup,
    F.hardsigmoid: lookup,
    F.hardswish: lookup,
    F.leaky_relu: lookup,
    F.elu: lookup,
    torch.ops.quantized.mul: mul,
    torch.ops.quantized.mul_relu: mul,
    torch.ops.quantized.add_scalar: lookup,
    torch.ops.quantized.mul_scalar: lookup,
    torch.mean: mean,
}

METHODS = {
    "sigmoid": lookup,
    "tanh": lookup,
    "mean": mean,
}


def _add(relu: bool):
    """quantized.add / add_relu: of a tensor and a number (FX writes `x + 1.5` as
    quantized.add(x, 1.5)) a lookup, of two tensors fx's add."""

    def lower(lw: _Lowering, node: fx.Node) -> None:
        if isinstance(node.args[1], torch.fx.Node):
            return lw.add_op(node, relu=relu)
        return lookup(lw, node)

    return lower


FUNCTIONS[torch.ops.quantized.add] = _add(False)
FUNCTIONS[torch.ops.quantized.add_relu] = _add(True)
