"""Band fusion with recomputed halos: a group whose consumer reads rows of a producer's
activation that two bands need (a 3x3 consumer's halo) run per band of the consumer's rows,
each band computing again every producer row it reads.

The merged program is rewritten before any schedule is replayed on it: every statement gets a
shared outermost loop `band` (the program order becomes `for band: producers; consumer`); the
tile layer's statements run the output rows `rows*band .. rows*band + rows - 1` of that band;
every tensor the producers write gets the band as an extra first dimension (one buffer per
band, so no band reads a row another band wrote), and each producer statement runs, per band,
the instances whose values that band reads (isl: the readers' accesses applied back through
its writes, from the consumer up). A row outside the image is no instance: the consumer reads
it out of its tensor's bounds, as the pad (the readers' pad, as for every fused intermediate).
The price is the halo rows' MACs again in the next band; `extra_macs` says how many, and the
caller weighs them before anything is lowered.
"""

from __future__ import annotations

import math
from dataclasses import replace

import islpy as isl

from tensorgen.fusion.tiled import BAND, TileError
from tensorgen.ir import poly
from tensorgen.ir.core import Access, Affine, BinOp, Call, Expr, Program, Read, Statement
from tensorgen.schedule.api import Schedule


def row_index(st: Statement) -> str | None:
    """The index of `st` that runs over the rows of the NCHW activation it writes."""
    return st.lhs.index[2].bare() if len(st.lhs.index) == 4 else None


def recompute(program: Program, first: int, rows: int) -> Program:
    """`program` (a group's merged program whose statements from `first` on are its tile layer)
    run per band of `rows` of the tile layer's output rows, its producers recomputing per band
    every instance the band reads (see the module's docstring)."""
    producers, tile = program.statements[:first], program.statements[first:]
    if not producers or program.shared_loops:
        raise TileError("recompute: a group of one layer, or with loops of its own outside")
    heights = set()
    for st in tile:
        h = row_index(st)
        if h is None:
            raise TileError(f"recompute: {st.name} writes no NCHW rows (its band is not rows)")
        heights.add(st.extent(h))
    if len(heights) != 1:
        raise TileError("recompute: the tile layer's statements run different rows")
    bands = math.ceil(heights.pop() / rows)
    banded = {st.lhs.tensor for st in producers}
    for name in sorted(banded):
        if program.tensor(name).role != "none":
            raise TileError(f"recompute: {name} is written before the tile layer and is a port")
    tensors = tuple(
        replace(t, shape=(bands, *t.shape)) if t.name in banded else t for t in program.tensors
    )
    out = {}
    for st in tile:
        h = row_index(st)
        inside = f"{rows}*{BAND} <= {h} <= {rows}*{BAND} + {rows - 1}"
        out[st.name] = _banded(st, banded, bands, inside)
    fresh = replace(program, tensors=tensors, shared_loops=((BAND, bands),))
    for st in reversed(producers):
        every = _banded(st, banded, bands, "")
        out[st.name] = replace(every, where=_needed(fresh, every, list(out.values())))
    statements = tuple(out[st.name] for st in program.statements)
    return replace(fresh, statements=statements)


def extra_macs(program: Program, banded: Program, first: int) -> int:
    """The MACs (instances of `+=` statements) the producers run again per band in `banded`
    (recompute's rewrite of `program`)."""
    extra = 0
    for old, new in zip(program.statements[:first], banded.statements[:first], strict=True):
        if old.op == "+=":
            extra += _count(poly.domain(new)) - _count(poly.domain(old))
    return extra


def _count(s: isl.Set) -> int:
    return int(s.count_val().to_python())


def _needed(program: Program, st: Statement, readers: list[Statement]) -> str:
    """The `where` of `st` (banded, over every band) that keeps, per band, the instances whose
    writes some reader reads in that band: readers are later statements, already banded."""
    tensor = program.tensor(st.lhs.tensor)
    read = None
    for r in readers:
        for acc in r.reads:
            if acc.tensor != tensor.name:
                continue
            m = poly.access_map(r, acc).intersect_range(poly.tensor_box(tensor)).range()
            read = m if read is None else read.union(m)
    if read is None:
        raise TileError(f"recompute: nothing in the group reads {tensor.name}")
    dom = poly.domain(st)
    need = poly.access_map(st, st.lhs).intersect_range(read).domain().coalesce()
    text = str(need.gist(dom).remove_redundancies())
    if " : " not in text:
        return st.where  # every instance (a band needs all of them)
    constraints = text.split(" : ", 1)[1].rsplit("}", 1)[0].strip()
    return f"({st.where}) and ({constraints})" if st.where else constraints


def _banded(st: Statement, banded: set[str], bands: int, inside: str) -> Statement:
    """`st` with the shared `band` index first, its accesses to `banded` tensors at that band,
    and `inside` added to its `where`."""
    where = " and ".join(f"({w})" for w in (st.where, inside) if w)
    return replace(
        st,
        lhs=_access(st.lhs, banded),
        rhs=_expr(st.rhs, banded),
        indices=(BAND, *st.indices),
        bounds=((0, bands - 1), *st.bounds),
        where=where,
    )


def _access(acc: Access, banded: set[str]) -> Access:
    if acc.tensor not in banded or acc.table:
        return acc
    return replace(acc, index=(Affine.of({BAND: 1}), *acc.index))


def _expr(e: Expr, banded: set[str]) -> Expr:
    if isinstance(e, Read):
        return Read(_access(e.access, banded))
    if isinstance(e, Call):
        return Call(e.fn, tuple(_expr(a, banded) for a in e.args))
    if isinstance(e, BinOp):
        return BinOp(e.op, _expr(e.lhs, banded), _expr(e.rhs, banded))
    return e


def band_rows(program: Program, first: int, trace, kept: frozenset[str], room: int) -> int:
    """The most output rows of the tile layer a band may run: a multiple of the rows its own
    schedule splits its row loop by (`trace`), such that one band of the `kept` tensors (isl:
    their boxes at the band loop) fits `room` bytes; refused if one block does not."""
    h = row_index(program.statements[first])
    block = next(
        (
            int(step.args[1])
            for step in trace
            if step.primitive == "split" and getattr(step.args[0], "name", None) == h
        ),
        1,
    )
    height = program.statements[first].extent(h)

    def fits(rows: int) -> bool:
        banded = recompute(program, first, rows)
        s = Schedule(banded, None, checked=False)
        need = 0
        for name in sorted(kept):
            box = s.staged_box(name, BAND, overlaps=False)
            if box is None:
                return False
            need += math.prod(box.size) * banded.tensor(name).itemsize
        return need <= room

    lo, hi = 1, max(1, math.ceil(height / block))  # in blocks: the most that fit, by bisection
    if not fits(block):
        raise TileError(f"recompute: one band of {block} rows does not fit {room} B")
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if fits(mid * block) else (lo, mid - 1)
    return lo * block
