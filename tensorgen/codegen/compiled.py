"""What a compile produces (`Compiled`) and the layout facts every lowering pass shares."""

from __future__ import annotations

from dataclasses import dataclass

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
            if stmt.where:  # isl enumerates; only small non-rectangular domains get here
                total += int(poly.domain(stmt).count_val().to_python())
            else:
                total += int(np.prod([hi - lo + 1 for lo, hi in stmt.bounds], dtype=np.int64))
    return total


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
