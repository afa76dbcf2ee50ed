"""One model layer as an op.yaml program: the affine statements of each quantized operator.

Every layer is written in tensorgen's own op.yaml language (docs/op-yaml.md), so a layer of a
model is exactly what a user could have written by hand: `tensorgen compile --dump-layers DIR`
writes them out and `tensorgen check` runs any of them alone. Requantization parameters come
from tensorgen.frontend.numerics (the rules of ../shared/NUMERICS.md); a float constant is
written with `repr` of the float32 value, which round-trips exactly.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass, field

import numpy as np
from torch import fx

from tensorgen.ir.core import Program
from tensorgen.spec.loader import parse_program

NATURAL = {"uint8": (0, 255), "int8": (-128, 127)}  # the range a store saturates to


@dataclass(frozen=True)
class Port:
    """A tensor of a layer: its op.yaml declaration and what it is bound to in the model."""

    name: str  # the layer's tensor name
    shape: tuple[int, ...]
    dtype: str
    role: str  # input, output or none
    pad: int = 0
    value: str | None = None  # the model value (activation buffer) it reads or writes
    const: np.ndarray | None = field(default=None, compare=False)  # weights and biases


@dataclass
class Layer:
    """A layer of a model: `statements(lo, hi)` gives its op.yaml statements with the output
    clamped to [lo, hi], so that a following ReLU or ReLU6 can fold into the epilogue."""

    name: str  # the FX node's name
    path: str  # where it sits in the model (its module path), for messages and the report
    op: str  # "conv2d", "linear", ...
    ports: list[Port]
    body: object  # (lo, hi) -> list of statements (str or {stmt, where})
    lo: int = 0
    hi: int = 255
    fusable: bool = False  # its last statement saturates, so a clamp can move into it
    epilogue: list[str] = field(default_factory=list)  # what was folded in, for the report
    result: str = ""  # the model value its output holds last (a folded ReLU's), default `name`

    @property
    def output(self) -> Port:
        return next(p for p in self.ports if p.role == "output")

    def text(self, target: str) -> str:
        lines = [f"# {self.op} at {self.path}", "tensorgen: 1", f"name: {self.name}", "tensors:"]
        for p in self.ports:
            decl = {"shape": list(p.shape), "dtype": p.dtype}
            if p.role != "none":
                decl["role"] = p.role
            if p.pad:
                decl["pad"] = int(p.pad)
            lines.append(f"  {p.name}: {_flow(decl)}")
        lines.append("statements:")
        lines += [f"  - {_flow(st)}" for st in self.body(self.lo, self.hi)]
        lines += [f"target: {target}", "schedule: auto"]
        return "\n".join(lines) + "\n"

    def program(self, target: str) -> Program:
        return _parse(self.text(target), f"<layer {self.name} ({self.path})>", target)


@functools.lru_cache(maxsize=1024)
def _parse(text: str, where: str, target: str) -> Program:
    """A layer's op.yaml parsed once: a model's compile asks for each layer's program several
    times (its own compile, the fusion groups that hold it); a Program is immutable."""
    return parse_program(text, where, target)


def _flow(value) -> str:
    """One line of YAML flow style: a statement as a double-quoted string (JSON's quoting is
    YAML's), a mapping as `{key: value, ...}`."""
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_flow(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(map(_flow, value)) + "]"
    if isinstance(value, str) and not value.isidentifier():
        return json.dumps(value)
    return str(value)


def f32(x: float) -> str:
    """A float32 constant as op.yaml text: repr of the float32 value as a double is exact."""
    return repr(float(np.float32(x)))


def idx(names: str | list[str]) -> str:
    return ", ".join(names)


def axes(rank: int) -> list[str]:
    return [f"i{d}" for d in range(rank)]


def affine(*terms: tuple[int, str], const: int = 0) -> str:
    """`2*h + r - 1` from ((2, "h"), (1, "r")), const=-1."""
    out = ""
    for coef, name in terms:
        if coef == 0:
            continue
        t = name if coef == 1 else f"{coef}*{name}"
        out += t if not out else f" + {t}"
    if const or not out:
        out += (
            f" + {const}"
            if const > 0 and out
            else f" - {-const}"
            if const < 0 and out
            else str(const)
        )
    return out


def clamp(expr: str, lo: int, hi: int, natural: tuple[int, int]) -> str:
    """`expr` saturated to [lo, hi]; no clamp when the store saturates there anyway."""
    return expr if (lo, hi) == natural else f"clamp({expr}, {lo}, {hi})"


def module_path(node: fx.Node) -> str:
    if node.op == "call_module":
        return str(node.target)
    stack = node.meta.get("nn_module_stack")
    if stack:
        return f"{list(stack.values())[-1][0]} ({node.name})"
    return node.name


def cat_parts(parts: list, rank: int, dim: int, value) -> tuple[list[Port], list[dict]]:
    """The ports X0, X1, ... of a cat's `parts` along `dim` and one statement each, writing
    `value(i, part, read)` (`read`: `Xi[...]`) at the part's offset; the `where` bounds the
    concatenated index by the part (Y's dimension is larger)."""
    ports, stmts, off = [], [], 0
    for i, p in enumerate(parts):
        ix = axes(rank)
        out = list(ix)
        out[dim] = affine((1, ix[dim]), const=off)
        ports.append(p.port(f"X{i}", "input"))
        stmts.append(
            {
                "stmt": f"Y[{idx(out)}] = {value(i, p, f'X{i}[{idx(ix)}]')}",
                "where": f"0 <= {ix[dim]} < {p.shape[dim]}",
            }
        )
        off += p.shape[dim]
    return ports, stmts
