"""What a compile produces (`Compiled`) and the layout facts every lowering pass shares."""

from __future__ import annotations

from dataclasses import dataclass

import islpy as isl
import numpy as np

from tensorgen.ir import poly
from tensorgen.ir.core import BinOp, Program
from tensorgen.mc.binary import Binary

ALIGN = 16  # bytes: every on-chip buffer starts at a multiple


@dataclass(frozen=True)
class Compiled:
    binary: Binary
    macs: int  # useful multiply-accumulates of the program


def useful_macs(program: Program) -> int:
    total = 0
    for stmt in program.statements:
        if stmt.op == "+=" and isinstance(stmt.rhs, BinOp) and stmt.rhs.op == "*":
            if stmt.where:
                total += _instances(poly.domain(stmt))
            else:
                total += int(np.prod([hi - lo + 1 for lo, hi in stmt.bounds], dtype=np.int64))
    return total


def _instances(dom) -> int:
    """Points of a statement's domain: its box's volume when the `where:` only narrows the
    bounds (isl's count enumerates: 4.5 s for a 3x3 conv's 115 million points), else isl's count
    (small non-rectangular domains)."""
    if dom.is_empty():
        return 0
    n = dom.dim(isl.dim_type.set)
    lo = [dom.dim_min_val(i).to_python() for i in range(n)]
    hi = [dom.dim_max_val(i).to_python() for i in range(n)]
    names = [dom.get_dim_name(isl.dim_type.set, i) for i in range(n)]
    bounds = " and ".join(f"{a} <= {x} <= {b}" for a, x, b in zip(lo, names, hi, strict=True))
    box = isl.Set(f"{{ {dom.get_tuple_name()}[{', '.join(names)}] : {bounds or 'true'} }}")
    if dom.is_equal(box):
        return int(np.prod([b - a + 1 for a, b in zip(lo, hi, strict=True)], dtype=np.int64))
    return int(dom.count_val().to_python())


def row_major(shape: tuple[int, ...]) -> tuple[int, ...]:
    """The strides of a dense buffer of `shape`, last dimension contiguous."""
    strides, acc = [], 1
    for n in reversed(shape):
        strides.append(acc)
        acc *= n
    return tuple(reversed(strides))


def align(n: int) -> int:
    """`n` bytes rounded up to the buffer alignment."""
    return -(-n // ALIGN) * ALIGN
