"""The loop nests the automatic scheduler tries for one layer (`Space.of`): which indices to
split by how much, the loop orders outside the band, the band's M loops and the band itself.

On the MAC array, N and K are blocked by the array and M streams (with a block of a second
output index, blocked by the accumulators' rows, in super-blocks of N columns, or with K in
chunks); on the vector unit, bands of one to three output indices.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tensorgen.ir.core import Statement


@dataclass(frozen=True)
class _Loops:
    """The loops every MAC-array shape of one layer shares: the band's N and K loops (and what
    folds into K), the outer loops of N's and K's blocks, and the other reduction indices."""

    inner: list[str]
    n_outer: list[str]
    k_outer: list[str]
    others_red: list[str]
    k_more: list[str]

    def orders(self, others_out: list[str]) -> list[tuple[str, ...]]:
        """The loop orders outside the band: the other output loops outside N's, or inside."""
        rest = self.k_outer + self.others_red
        return list(
            dict.fromkeys(
                [tuple(others_out + self.n_outer + rest), tuple(self.n_outer + others_out + rest)]
            )
        )


def tile_shapes(
    stmt: Statement,
    out,
    reds,
    mp,
    m: str,
    blocks,
    kind: str,
    acc_rows: int,
    fused: bool,
    vector_elements: int,
    k_more: list[str],
    spad: int,
):
    """(blocks to split, loop orders outside the band, the band's M loops, the band) to try.

    On the MAC array, N and K are blocked by the array; M streams: the M index alone, or with
    a block of a second output index (image rows) so that more rows share one fill. Rows of
    M: up to 256, and no more than `acc_rows`, the rows of an accumulator tile that fit; M
    itself is blocked (equal blocks of at most `acc_rows`) if need be: in a fused layer that tile
    must stay on chip, and in any layer the accumulators must hold at least one tile of M rows;
    and blocks of a half and a quarter of `acc_rows` are tried too, whose tiles the accumulators
    can double-buffer."""
    others_red = [i for i in reds if i not in (mp.k if mp else ()) and i not in k_more]
    base_out = [i for i in out if i not in (m, mp.n if mp else None)]
    if kind == "vector":
        yield blocks, [tuple(base_out + others_red)], [m], [m]
        yield from _vector_bands(stmt, out, others_red, vector_elements)
        return
    loops = _Loops(
        # N, then K (and what folds into it)
        [f"{n}_i" if stmt.extent(n) > size else n for n, size in blocks] + k_more,
        [f"{n}_o" for n, size in blocks[:1] if stmt.extent(n) > size],
        [f"{n}_o" for n, size in blocks[1:] if stmt.extent(n) > size],
        others_red,
        k_more,
    )
    yield from _m_row_shapes(stmt, loops, blocks, base_out, m, acc_rows, fused, spad)
    yield from _m_block_shapes(stmt, loops, blocks, base_out, m, acc_rows)


def _m_row_shapes(
    stmt: Statement, loops: _Loops, blocks, base_out, m: str, acc_rows: int, fused: bool, spad: int
):
    """The shapes whose band streams M (blocked if the accumulators cannot hold it whole), with
    rows of a second output index, super-blocks of N, or chunks of K."""
    m2 = max(
        (i for i in base_out if stmt.extent(i) > 1),
        key=lambda i: (stmt.extent(i), stmt.indices.index(i)),
        default=None,
    )
    factors = {1}
    fill_rows = min(256, acc_rows)
    m_split = stmt.extent(m) > acc_rows
    if m_split:
        blocks = blocks + [(m, _m_block(stmt.extent(m), acc_rows))]
        base_out = base_out + [f"{m}_o"]
        m, m2 = f"{m}_i", None
    elif m2 is not None and stmt.extent(m) < fill_rows:
        # rows of M up to 256 per fill; half or a quarter as many when the accumulators or the
        # budget are tight (a quarter: a tile of every output channel double-buffered in 'acc')
        widest = max(1, min(stmt.extent(m2), fill_rows // stmt.extent(m)))
        factors = {widest, max(1, widest // 2), max(1, widest // 4)}
    n, cols = blocks[0]
    if m2 is None and not m_split and stmt.extent(n) > 2 * cols:
        # a super-block of N columns whose accumulators stay on chip, so that each block of A
        # (M x K) is loaded once per super-block instead of once per column block
        yield from _super_blocks(
            stmt, blocks, base_out, loops.others_red, m, loops.k_outer, loops.k_more
        )
    for f in sorted(factors):
        blocks_f, others_out, m_loops = list(blocks), list(base_out), [m]
        if f > 1:
            if f < stmt.extent(m2):
                blocks_f.append((m2, f))
                others_out[others_out.index(m2)] = f"{m2}_o"
                m_loops = [f"{m2}_i", m]
            else:
                others_out.remove(m2)
                m_loops = [m2, m]
        yield blocks_f, loops.orders(others_out), m_loops, m_loops + loops.inner
    if (
        m2 is None
        and not m_split
        and not fused
        and stmt.extent(m) * stmt.extent(blocks[1][0]) > spad
    ):
        yield from _k_chunks(stmt, blocks, base_out, loops.others_red, m)


def _m_block_shapes(stmt: Statement, loops: _Loops, blocks, base_out, m: str, acc_rows: int):
    """M blocked by a half or a quarter of the accumulator rows, whose tiles can be
    double-buffered (a block size not already tried by `_m_row_shapes`)."""
    m_rows = stmt.extent(m)
    done = {_m_block(m_rows, acc_rows)} if m_rows > acc_rows else set()
    for rows in (acc_rows // 2, acc_rows // 4):
        size = _m_block(m_rows, max(rows, 1))
        if rows >= 1 and m_rows > rows and size not in done:
            done.add(size)
            orders = loops.orders(base_out + [f"{m}_o"])
            yield blocks + [(m, size)], orders, [f"{m}_i"], [f"{m}_i"] + loops.inner


def _m_block(extent: int, rows: int) -> int:
    """Rows of the blocks of M that split `extent` rows into blocks of at most `rows`, all of
    equal size as near as can be: a ragged last block is peeled out of its loop, not pipelined."""
    return -(-extent // -(-extent // rows))


def _vector_bands(stmt: Statement, out, others_red, cap: int):
    """Vector bands of two and three output indices (the widest ones), which pay the vector
    unit's setup once for many rows; the outermost of them blocked when the band would hold
    more than `cap` elements."""
    wide = sorted(
        (i for i in out if stmt.extent(i) > 1),
        key=lambda i: (stmt.extent(i), stmt.indices.index(i)),
        reverse=True,
    )
    for count in (2, 3):
        if len(wide) < count:
            return
        band = sorted(wide[:count], key=stmt.indices.index)
        rest = [i for i in out if i not in band]
        blocks = []
        inner = math.prod(stmt.extent(i) for i in band[1:])
        if inner * stmt.extent(band[0]) > cap:
            if inner > cap:
                return
            f = cap // inner
            blocks = [(band[0], f)]
            rest.append(f"{band[0]}_o")
            band = [f"{band[0]}_i"] + band[1:]
        yield blocks, [tuple(rest + others_red)], band, band


def _super_blocks(stmt: Statement, blocks, others_out, others_red, m: str, k_outer, k_more):
    (n, cols), (k, rows) = blocks
    for columns in (4 * cols, 8 * cols):
        if columns >= stmt.extent(n):
            continue
        split = [(n, columns), (f"{n}_i", cols), (k, rows)]
        inner = [
            f"{n}_i_i" if columns > cols else f"{n}_i",
            f"{k}_i" if stmt.extent(k) > rows else k,
        ] + k_more
        head = [f"{n}_o"]
        orders = [
            tuple(head + others_out + k_outer + [f"{n}_i_o"] + others_red),
            tuple(others_out + head + k_outer + [f"{n}_i_o"] + others_red),
        ]
        yield split, list(dict.fromkeys(orders)), [m], [m] + inner


def _k_chunks(stmt: Statement, blocks, others_out, others_red, m: str):
    """K split into two or three even chunks outside the column blocks of N, so that a chunk of A
    (M x K, which does not fit the scratchpad whole) staged once serves every column block,
    instead of A being loaded again for each super-block of columns whose accumulators fit: the
    accumulators of a column block are then stored after each chunk and loaded back for the
    next (not before the first)."""
    (n, cols), (k, rows) = blocks
    extent = stmt.extent(k)
    n_outer = [f"{n}_o"] if stmt.extent(n) > cols else []
    inner = [f"{n}_i" if n_outer else n, f"{k}_i_i"]
    # even chunks only: in a last, partial chunk the loops inside would vary, and not pipeline
    for chunk in [extent // count for count in (2, 3) if extent % (count * rows) == 0]:
        if rows < chunk:
            order = tuple(others_out + [f"{k}_o"] + n_outer + [f"{k}_i_o"] + others_red)
            yield [(n, cols), (k, chunk), (f"{k}_i", rows)], [order], [m], [m] + inner
