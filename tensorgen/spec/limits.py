"""The size limits of an op.yaml program (`tensorgen.inputs.InputLimits`), checked while loading.

Each check runs before the work it guards: tensor sizes before any statement is read, a
`where:` text before isl parses it, a statement's extents and subscript ranges before its access
relations are built. Within these limits every count, offset and product later code computes
fits an int64 and every integer the ISA encodes fits its i32 immediates.
"""

from __future__ import annotations

import math
import re
from typing import Protocol

import yaml

from tensorgen.errors import SpecError
from tensorgen.inputs import LIMITS
from tensorgen.ir.core import Access, Affine, Statement, Tensor


class _Doc(Protocol):
    def error(self, node: yaml.Node, what: str) -> SpecError: ...


def check_tensor_sizes(doc: _Doc, keys: dict[str, yaml.Node], tensors: dict[str, Tensor]) -> None:
    """Elements of each tensor, and bytes of all of them (the DRAM image)."""
    total = 0
    for name, t in tensors.items():
        elements = math.prod(t.shape)
        if elements > LIMITS.tensor_elements:
            raise doc.error(
                keys[name],
                f"{name} has {elements:,} elements; at most {LIMITS.tensor_elements:,} "
                "per tensor (limit InputLimits.tensor_elements in tensorgen/inputs.py)",
            )
        total += elements * t.itemsize
        if total > LIMITS.dram_bytes:
            raise doc.error(
                keys[name],
                f"the tensors up to {name} take {total:,} bytes of DRAM; at most "
                f"{LIMITS.dram_bytes:,} (limit InputLimits.dram_bytes in tensorgen/inputs.py)",
            )


_INTEGER = re.compile(r"(?<![A-Za-z0-9_])\d+")  # not the digits of a name like x1


def check_where(doc: _Doc, node: yaml.Node, where: str) -> None:
    """A `where:` text before isl reads it: its length, and every integer in it within i32."""
    if len(where) > LIMITS.statement_chars:
        raise doc.error(
            node,
            f"where: longer than {LIMITS.statement_chars} characters (limit InputLimits.statement_chars in tensorgen/inputs.py)",
        )
    for m in _INTEGER.finditer(where):
        if len(m[0]) > 10 or int(m[0]) > LIMITS.int_max + 1:  # + 1: the magnitude of int_min
            raise doc.error(
                node,
                f"where: integer {m[0][:20]}{'...' if len(m[0]) > 20 else ''} is outside "
                f"the i32 range (limit InputLimits.int_min/int_max in tensorgen/inputs.py)",
            )


def check_statement_size(stmt: Statement) -> None:
    """A statement's trip counts, its number of instances, and the value range of every
    subscript over them (the i32 range, so that element offsets times strides fit an int64)."""
    count = 1
    for name, (lo, hi) in zip(stmt.indices, stmt.bounds, strict=False):
        extent = hi - lo + 1
        if extent > LIMITS.loop_extent or max(-lo, hi) > LIMITS.int_max:
            raise SpecError(
                f"{stmt.location}: index '{name}' runs over [{lo}, {hi}]; at most "
                f"{LIMITS.loop_extent:,} values within the i32 range (limit InputLimits.loop_extent in tensorgen/inputs.py)"
            )
        count *= extent
    if count > LIMITS.statement_iterations:
        raise SpecError(
            f"{stmt.location}: the statement has {count:,} instances; at most "
            f"{LIMITS.statement_iterations:,} (limit InputLimits.statement_iterations in tensorgen/inputs.py)"
        )
    box = dict(zip(stmt.indices, stmt.bounds, strict=False))
    for acc in [stmt.lhs] + stmt.reads:
        for sub in acc.index:
            lo, hi = subscript_range(sub, box)
            if lo < LIMITS.int_min or hi > LIMITS.int_max:
                raise SpecError(
                    f"{stmt.location}: subscript '{sub}' of {_name(acc)} ranges over [{lo}, {hi}], "
                    f"outside the i32 range (limit InputLimits.int_min/int_max in tensorgen/inputs.py)"
                )


def subscript_range(sub: Affine, box: dict[str, tuple[int, int]]) -> tuple[int, int]:
    """The least and greatest value of `sub` over the box of its indices (exact: a box)."""
    lo = hi = sub.const
    for name, c in sub.terms:
        a, b = c * box[name][0], c * box[name][1]
        lo, hi = lo + min(a, b), hi + max(a, b)
    return lo, hi


def _name(acc: Access) -> str:
    return acc.tensor
