"""tensorgen's affine IR: tensors, accesses, expressions and statements.

Values are frozen dataclasses; every transform builds new values. Subscripts
are affine forms over index names (`Affine`); the isl view of the same program
(domains, access relations, schedules) is built from them in `ir.poly`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

DTYPES: dict[str, np.dtype] = {
    "int8": np.dtype(np.int8),
    "uint8": np.dtype(np.uint8),
    "int32": np.dtype(np.int32),
    "float32": np.dtype(np.float32),  # only at a model's entry (quantize) and exit (dequantize)
}
ROLES = ("input", "output", "inout", "none")


def dtype_range(dtype: str) -> tuple[int, int]:
    if DTYPES[dtype].kind == "f":
        return (
            0,
            0,
        )  # float tensors hold no integers: their pad is 0.0 and nothing saturates to them
    info = np.iinfo(DTYPES[dtype])
    return int(info.min), int(info.max)


@dataclass(frozen=True)
class Tensor:
    name: str
    shape: tuple[int, ...]
    dtype: str
    role: str = "none"
    pad: int = 0

    @property
    def itemsize(self) -> int:
        return DTYPES[self.dtype].itemsize

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.itemsize  # Python integers: no int64 overflow

    @property
    def np_dtype(self) -> np.dtype:
        return DTYPES[self.dtype]


@dataclass(frozen=True)
class Affine:
    """``const + sum(coef * index)``; `terms` is sorted by index name, no zero coefficients."""

    terms: tuple[tuple[str, int], ...] = ()
    const: int = 0

    @staticmethod
    def of(coefs: dict[str, int], const: int = 0) -> Affine:
        return Affine(tuple(sorted((k, v) for k, v in coefs.items() if v != 0)), const)

    def coef(self, name: str) -> int:
        return dict(self.terms).get(name, 0)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(n for n, _ in self.terms)

    def bare(self) -> str | None:
        """The index name if this subscript is exactly one index, else None."""
        if self.const == 0 and len(self.terms) == 1 and self.terms[0][1] == 1:
            return self.terms[0][0]
        return None

    def __str__(self) -> str:
        parts = []
        for name, c in self.terms:
            parts.append(name if c == 1 else f"-{name}" if c == -1 else f"{c}*{name}")
        if self.const or not parts:
            parts.append(str(self.const))
        return " + ".join(parts).replace("+ -", "- ")


@dataclass(frozen=True)
class Access:
    tensor: str
    index: tuple[Affine, ...]
    # a lookup table (`lut(x, T)`): the access reads all of T at every instance; `index` is
    # T's first element, where an operand view of it starts
    table: bool = False

    def __str__(self) -> str:
        if self.table:
            return self.tensor
        return f"{self.tensor}[{', '.join(map(str, self.index))}]"


# Expressions ---------------------------------------------------------------


@dataclass(frozen=True)
class Read:
    access: Access

    def __str__(self) -> str:
        return str(self.access)


@dataclass(frozen=True)
class Const:
    value: int | float

    def __str__(self) -> str:
        return repr(self.value)


# Element-wise functions and their arity; requant, quantize and dequantize take (x, scale, zero_point).
FUNCTIONS = {
    "relu": 1,
    "clamp": 3,
    "min": 2,
    "max": 2,
    "requant": 3,
    "int8": 1,
    "uint8": 1,
    "int32": 1,
    "quantize": 3,
    "dequantize": 3,
    "rshift_round": 2,
    "requant_fbgemm": 4,
    "requant_onednn": 6,
    "requant_fma": 3,
    "add_fbgemm": 8,
    "add_fbgemm_scalar": 8,
    "lut": 2,
}
LUT_ENTRIES = 256  # lut(x, T): T[x & 255], T a 1-d int8/uint8 tensor of 256 entries
# functions whose arguments after the first are constants
CONST_ARGS = {
    "requant": "requant(x, scale, zero_point) needs constant scale and zero point",
    "quantize": "quantize(x, scale, zero_point) needs constant scale and zero point",
    "dequantize": "dequantize(x, scale, zero_point) needs constant scale and zero point",
    "clamp": "clamp(x, lo, hi) needs constant bounds",
    "requant_fma": "requant_fma(x, scale, zero_point) needs constant scale and zero point",
}
# functions of two operands and then constants
TWO_OPERANDS = {
    "add_fbgemm": "add_fbgemm(a, b, s_a, offset_a, s_b, offset_b, inv_scale, zero_point) needs "
    "constants after its two operands",
    "add_fbgemm_scalar": "add_fbgemm_scalar(a, b, s_a, zp_a, s_b, zp_b, inv_scale, zero_point) "
    "needs constants after its two operands",
}
# functions of x, then tensor reads (how many: TENSOR_READS), then constants
TENSOR_ARGS = {
    "requant_fbgemm": "requant_fbgemm(x, bias, multiplier, zero_point) needs float32 tensor reads "
    "for bias and multiplier and a constant zero point",
    "requant_onednn": "requant_onednn(x, weight_scale, bias, src_scale, dst_scale, zero_point) "
    "needs float32 tensor reads for weight scale and bias and constants after them",
}
TENSOR_READS = {"requant_fbgemm": 2, "requant_onednn": 2}
BINOPS = {"+", "-", "*", ">>", "<<"}


@dataclass(frozen=True)
class Call:
    fn: str
    args: tuple[Expr, ...]

    def __str__(self) -> str:
        return f"{self.fn}({', '.join(map(str, self.args))})"


@dataclass(frozen=True)
class BinOp:
    op: str
    lhs: Expr
    rhs: Expr

    def __str__(self) -> str:
        return f"({self.lhs} {self.op} {self.rhs})"


Expr = Read | Const | Call | BinOp


def reads_of(expr: Expr) -> list[Access]:
    """Every tensor access of `expr`, left to right."""
    if isinstance(expr, Read):
        return [expr.access]
    if isinstance(expr, Call):
        return [a for arg in expr.args for a in reads_of(arg)]
    if isinstance(expr, BinOp):
        return reads_of(expr.lhs) + reads_of(expr.rhs)
    return []


@dataclass(frozen=True)
class Statement:
    """`lhs op rhs` over the box `bounds` of its indices (shared loops first)."""

    name: str
    lhs: Access
    op: str  # "=", "+=", "max="
    rhs: Expr
    indices: tuple[str, ...]
    bounds: tuple[tuple[int, int], ...]  # inclusive (lo, hi) per index
    where: str = ""  # extra isl constraints over the indices
    text: str = ""
    location: str = ""

    @property
    def reads(self) -> list[Access]:
        return reads_of(self.rhs)

    def extent(self, index: str) -> int:
        lo, hi = self.bounds[self.indices.index(index)]
        return hi - lo + 1

    def __str__(self) -> str:
        return f"{self.name}: {self.lhs} {self.op} {self.rhs}"


@dataclass(frozen=True)
class Program:
    name: str
    tensors: tuple[Tensor, ...]
    statements: tuple[Statement, ...]
    shared_loops: tuple[tuple[str, int], ...] = ()
    target: str = "tg1"
    schedule: str = "default"
    source: str = ""
    meta: dict = field(default_factory=dict, compare=False, hash=False)

    def tensor(self, name: str) -> Tensor:
        for t in self.tensors:
            if t.name == name:
                return t
        raise KeyError(name)

    @property
    def inputs(self) -> list[Tensor]:
        return [t for t in self.tensors if t.role in ("input", "inout")]

    @property
    def outputs(self) -> list[Tensor]:
        return [t for t in self.tensors if t.role in ("output", "inout")]

    @property
    def shared_names(self) -> tuple[str, ...]:
        return tuple(n for n, _ in self.shared_loops)
