"""Folding more reduction indices into the MAC array's K than the one the mapping picks.

A 7x7/2 stem on 3 channels has 7 kernel columns for the 16 rows of the array; staged channels
innermost, its columns and channels are one run of 21 bytes in both operands, and with one
output column per staged block of the image, its kernel rows join the run too (147 bytes). The
automatic scheduler (autosched/search.py) offers these folds as loop nests of its search space; the lowering
cuts a run into MATMULs of at most the array's rows (tensorize over several K loops).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tensorgen.ir.core import Program, Statement
from tensorgen.ir.queries import MacMapping, out_indices
from tensorgen.target import Target


@dataclass(frozen=True)
class KFold:
    """Reduction indices folded into the MAC array's K with the array's K index `mapping.k`.

    The 7x7/2 stem's 3 channels and 7 kernel columns are 21 consecutive bytes of each operand
    once both are staged channels innermost (`layouts`), so one MATMUL of 16 rows and one of 5
    do what 3 MATMULs of 7 rows did (`KFold.of`). With one output column per staged block of
    the image (`column` outside the band, `streamed` staged inside it), the block is 7 columns
    wide and the kernel rows join the run too: 147 bytes, 10 MATMULs of up to 16 rows for 21 of
    7, streaming the output rows `m` (`KFold.window`). The lowering checks the run of addresses
    (tensorize over several K loops); the search weighs the MATMULs (`matmuls` per block)."""

    indices: tuple[str, ...]  # the folded reduction indices, besides mapping.k
    layouts: dict[str, tuple[int, ...]]
    matmuls: int
    m: str | None = None  # the M index a window fold streams (None: the mapping's)
    column: str | None = None  # the output index a window fold keeps outside the band
    streamed: str | None = None  # the operand staged inside `column`

    def depth(self, stmt: Statement) -> int:
        return math.prod(stmt.extent(i) for i in self.indices)

    @staticmethod
    def of(program: Program, stmt: Statement, mp: MacMapping, target: Target) -> KFold | None:
        """The index whose whole dimensions, moved innermost in both operands, continue the run
        of `mapping.k` (shorter than the array's rows, innermost with coefficient 1 in both)."""
        k_extent = stmt.extent(mp.k)
        if k_extent >= target.rows or any(
            _dim(acc, mp.k) != len(acc.index) - 1 for acc in (mp.a, mp.b)
        ):
            return None
        out = out_indices(program, stmt)
        best = None
        for index in stmt.indices:
            if index == mp.k or index in out or mp.a.tensor == mp.b.tensor:
                continue
            dims = [_dim(acc, index) for acc in (mp.a, mp.b)]
            if None in dims or any(
                acc.index[d].bare() != index for acc, d in zip((mp.a, mp.b), dims, strict=False)
            ):
                continue
            layouts = {
                acc.tensor: tuple(x for x in range(len(acc.index)) if x != d) + (d,)
                for acc, d in zip((mp.a, mp.b), dims, strict=False)
            }
            extent = stmt.extent(index)
            matmuls = -(-(k_extent * extent) // target.rows)
            if matmuls < extent and (best is None or matmuls * best[1] < best[0].matmuls * extent):
                best = (KFold((index,), layouts, matmuls), extent)
        if best is None:
            return None
        fold = best[0]
        return KFold((mp.k, *fold.indices), fold.layouts, fold.matmuls)

    @staticmethod
    def window(
        program: Program, stmt: Statement, mp: MacMapping, target: Target, fold: KFold | None
    ) -> KFold | None:
        """`fold` plus the kernel-row index: in the streamed operand a dimension `M*h + r`, just
        outside the kernel-column dimension `S*w + s` of `mapping.k`; in the stationary one a
        dimension of its own just outside `mapping.k`'s."""
        if fold is None:
            return None
        a, b = mp.a, mp.b
        out = out_indices(program, stmt)
        dx = len(a.index) - 1
        column = [i for i in a.index[dx].names if i in out]
        if len(column) != 1 or len(a.index[dx].names) != 2:
            return None
        for index in stmt.indices:
            if index in fold.indices or index in out:
                continue
            dy, db = _dim(a, index), _dim(b, index)
            if dy is None or db is None or b.index[db].bare() != index or dy == dx:
                continue
            rows = [i for i in a.index[dy].names if i != index]
            if len(rows) != 1 or rows[0] not in out or rows[0] == column[0]:
                continue
            layouts = {}
            for acc, d in ((a, dy), (b, db)):
                lay = fold.layouts[acc.tensor]
                if lay[-3] != d:  # the row dimension must be just outside the column's
                    break
                layouts[acc.tensor] = lay
            else:
                depth = fold.depth(stmt) * stmt.extent(index)
                return KFold(
                    (*fold.indices, index),
                    layouts,
                    -(-depth // target.rows),
                    rows[0],
                    column[0],
                    a.tensor,
                )
        return None


def _dim(access, index: str) -> int | None:
    """The one dimension of `access` whose subscript has `index`, if it has it with coefficient 1."""
    dims = [d for d, sub in enumerate(access.index) if sub.coef(index)]
    return dims[0] if len(dims) == 1 and access.index[dims[0]].coef(index) == 1 else None


def window_shape(stmt: Statement, out, reds, mp: MacMapping, fold: KFold, target: Target) -> tuple:
    """The loop nest of a window fold: the output columns (and N blocks) outside, a band that
    streams the output rows and folds the whole kernel window and channels into K."""
    n, cols = mp.n, target.cols
    split = stmt.extent(n) > cols
    inner = [f"{n}_i" if split else n] + list(fold.indices)
    n_outer = [f"{n}_o"] if split else []
    others_out = [i for i in out if i not in (fold.m, n)]
    others_red = [i for i in reds if i not in fold.indices]
    orders = list(
        dict.fromkeys(
            [tuple(others_out + n_outer + others_red), tuple(n_outer + others_out + others_red)]
        )
    )
    return [(n, cols)], orders, [fold.m], [fold.m] + inner
