"""Band fusion with recomputed halos: a group whose consumer reads rows of a producer's
activation that two bands need (a 3x3 consumer's halo) run per band of the consumer's rows,
each band computing again every producer row it reads.

The merged program is rewritten before any schedule is replayed on it: every statement gets a
shared outermost loop `band` (the program order becomes `for band: producers; consumer`); the
tile layer's statements run the output rows `rows*band .. rows*band + rows - 1` of that band;
every tensor the producers write gets the band as an extra first dimension (one buffer per
band, so no band reads a row another band wrote). Each producer layer runs, per band, the rows
its readers read there (from the consumer up: their subscripts over their own band's rows),
numbered from the band's first, so that its own schedule's blocks of rows start with the band
(their buffers' origins stay affine); its accumulators hold the band's rows only. Its output
keeps the image's rows, written inside the image only: a row outside is read out of its
tensor's bounds, as the pad (the readers' pad, as for every fused intermediate).
The price is the halo rows' MACs again in the next band; `extra_macs` says how many, and the
caller weighs them before anything is lowered.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import islpy as isl

from tensorgen.fusion.tiled import BAND, TileError
from tensorgen.ir import poly
from tensorgen.ir.core import Access, Affine, BinOp, Call, Expr, Program, Read, Statement
from tensorgen.schedule.api import Schedule


@dataclass(frozen=True)
class _Span:
    """The rows a layer runs in band `band`: `step*band + start + u`, u in 0..count-1."""

    step: int
    start: int
    count: int


def recompute(program: Program, offsets: tuple[int, ...], rows: int) -> Program:
    """`program` (a group's merged program, its layers' statements from `offsets` on, the last
    layer the tile layer) run per band of `rows` of the tile layer's output rows, its producers
    recomputing per band every row the band reads (see the module's docstring)."""
    ends = (*offsets[1:], len(program.statements))
    layers = [program.statements[a:b] for a, b in zip(offsets, ends, strict=True)]
    if len(layers) < 2 or program.shared_loops:
        raise TileError("recompute: a group of one layer, or with loops of its own outside")
    heights = {st.extent(_row(st)) for st in layers[-1]}
    if len(heights) != 1:
        raise TileError("recompute: the tile layer's statements run different rows")
    bands = math.ceil(heights.pop() / rows)
    layer_of = {st.name: i for i, layer in enumerate(layers) for st in layer}
    readers: dict[str, set[int]] = {}
    for st in program.statements:
        for acc in st.reads:
            readers.setdefault(acc.tensor, set()).add(layer_of[st.name])
    written = {st.lhs.tensor: layer_of[st.name] for layer in layers[:-1] for st in layer}
    for name in sorted(written):
        if program.tensor(name).role != "none":
            raise TileError(f"recompute: {name} is written before the tile layer and is a port")
    # a tensor only its own layer reads (an accumulator) is held in the layer's rows of the band
    local = {t for t, i in written.items() if readers.get(t, set()) <= {i}}
    spans = {len(layers) - 1: _Span(rows, 0, rows)}
    out = {}
    for st in layers[-1]:  # its rows numbered from the band's first too: its loops' bounds fixed
        last = dict(zip(st.indices, st.bounds, strict=True))[_row(st)][1]
        inside = f"{_row(st)} + {rows}*{BAND} <= {last}"
        out[st.name] = _moved(st, written, local, spans[len(layers) - 1], bands, inside)
    for i in range(len(layers) - 2, -1, -1):
        mine = {t for t, j in written.items() if j == i}
        span = spans[i] = _span(layers, spans, mine - local, i)
        for st in layers[i]:
            # no row past the image's last; the first rows only where the output is written:
            # an accumulator's block of rows starts with the band's, in every band
            g = f"{_row(st)} + {span.step}*{BAND} + {span.start}"
            last = dict(zip(st.indices, st.bounds, strict=True))[_row(st)][1]
            clip = f"{g} <= {last}" if st.lhs.tensor in local else f"0 <= {g} <= {last}"
            out[st.name] = _moved(st, written, local, span, bands, clip)
    tensors = _per_band(program, written, local, spans, bands)
    statements = tuple(out[st.name] for st in program.statements)
    rows_read = {t: spans[i].count for t, i in written.items() if t not in local}
    return replace(
        program,
        tensors=tensors,
        statements=statements,
        shared_loops=((BAND, bands),),
        # per output of a producer: its rows; per layer: its band's rows (step, start, count)
        meta={
            **program.meta,
            "band_rows": rows_read,
            "band_spans": tuple((sp.step, sp.start, sp.count) for _, sp in sorted(spans.items())),
        },
    )


def _per_band(program: Program, written: dict, local: set, spans: dict, bands: int) -> tuple:
    """The program's tensors, each one a producer writes with the band as its first dimension
    (an accumulator only its layer reads: holding that layer's rows of one band)."""
    tensors = []
    for t in program.tensors:
        if t.name in written:
            shape = list(t.shape)
            if t.name in local:
                shape[2] = spans[written[t.name]].count
            t = replace(t, shape=(bands, *shape))
        tensors.append(t)
    return tuple(tensors)


def _row(st: Statement) -> str:
    """The index of `st` that runs over the rows of the NCHW activation it writes."""
    h = st.lhs.index[2].bare() if len(st.lhs.index) == 4 else None
    if h is None:
        raise TileError(f"recompute: {st.name} writes no NCHW rows (its band is not rows)")
    if h in st.where:
        raise TileError(f"recompute: {st.name} bounds its rows with a where")
    return h


def _span(layers, spans: dict[int, _Span], tensors: set[str], i: int) -> _Span:
    """The rows of `tensors` (layer i's outputs) that the later layers read per band, from
    their read subscripts over their own rows (`spans`) and the bounds of their other indices:
    the band's, before the image's edges clip them (read there, they are the pad)."""
    pieces = set()
    for j in range(i + 1, len(layers)):
        for st in layers[j]:
            h, box = _row(st), dict(zip(st.indices, st.bounds, strict=True))
            for acc in st.reads:
                if acc.tensor not in tensors:
                    continue
                a = acc.index[2]
                c = a.coef(h)
                if c <= 0:
                    raise TileError(f"recompute: {st.name} reads {acc.tensor}'s rows backwards")
                lo = hi = a.const + c * spans[j].start
                hi += c * (spans[j].count - 1)
                for v, k in a.terms:
                    if v != h:
                        lo += min(k * box[v][0], k * box[v][1])
                        hi += max(k * box[v][0], k * box[v][1])
                pieces.add((c * spans[j].step, lo, hi))
    steps = {p[0] for p in pieces}
    if len(steps) != 1:
        raise TileError(f"recompute: the rows layer {i} writes are read at different strides")
    start = min(p[1] for p in pieces)
    return _Span(steps.pop(), start, max(p[2] for p in pieces) - start + 1)


def _moved(st, written, local, span: _Span | None, bands: int, where: str) -> Statement:
    """`st` with the shared `band` index first and its accesses to band tensors at that band;
    with a `span` (a producer), its rows those of the band (numbered from the span's first),
    every access but of `local` tensors at the rows of the image they are."""
    h = _row(st)
    bounds = dict(zip(st.indices, st.bounds, strict=True))
    if span is not None:
        bounds[h] = (0, span.count - 1)

    def access(acc: Access) -> Access:
        if acc.table:
            return acc
        index = acc.index
        if span is not None and acc.tensor not in local:
            index = tuple(_shift(a, h, span) for a in index)
        if acc.tensor in written:
            index = (Affine.of({BAND: 1}), *index)
        return replace(acc, index=index)

    return replace(
        st,
        lhs=access(st.lhs),
        rhs=_expr(st.rhs, access),
        indices=(BAND, *st.indices),
        bounds=((0, bands - 1), *(bounds[i] for i in st.indices)),
        where=" and ".join(f"({w})" for w in (st.where, where) if w),
    )


def _shift(a: Affine, h: str, span: _Span) -> Affine:
    """`a` with the band's row `h` (numbered from its first) the image's row it is."""
    c = a.coef(h)
    if not c:
        return a
    coefs = dict(a.terms)
    coefs[BAND] = coefs.get(BAND, 0) + c * span.step
    return Affine.of(coefs, a.const + c * span.start)


def extra_macs(program: Program, banded: Program, first: int) -> int:
    """The MACs (instances of `+=` statements) the producers run again per band in `banded`
    (recompute's rewrite of `program`)."""
    extra = 0
    for old, new in zip(program.statements[:first], banded.statements[:first], strict=True):
        if old.op == "+=":
            extra += _instances(new, _row(old)) - math.prod(hi - lo + 1 for lo, hi in old.bounds)
    return extra


def _instances(st: Statement, h: str) -> int:
    """How many instances a banded producer statement runs: its `where` bounds only its band
    and rows, so isl counts those pairs (a few hundred points, not every instance's)."""
    pairs = poly.domain(st).project_out_except([BAND, h], [isl.dim_type.set])
    box = zip(st.indices, st.bounds, strict=True)
    others = math.prod(hi - lo + 1 for i, (lo, hi) in box if i not in (BAND, h))
    return int(pairs.count_val().to_python()) * others


def _expr(e: Expr, access) -> Expr:
    if isinstance(e, Read):
        return Read(access(e.access))
    if isinstance(e, Call):
        return Call(e.fn, tuple(_expr(a, access) for a in e.args))
    if isinstance(e, BinOp):
        return BinOp(e.op, _expr(e.lhs, access), _expr(e.rhs, access))
    return e


def band_rows(
    program: Program,
    offsets: tuple[int, ...],
    trace,
    kept: frozenset[str],
    room: int,
    exact: bool = True,
) -> int:
    """The output rows of the tile layer a band runs: a multiple of the rows its own schedule
    splits its row loop by (`trace`), the most such that one band of the `kept` tensors (isl:
    their boxes at the band loop) fits `room` bytes, or the most of at least half as many that
    divide the rows evenly; refused if one block does not fit. Not `exact`: at least as many,
    from the rows each band of the producers' outputs holds alone (no isl, no halo columns,
    no shared inputs): what a cheap refusal may assume."""
    first = offsets[-1]
    h = _row(program.statements[first])
    block = next(
        (
            int(step.args[1])
            for step in trace
            if step.primitive == "split"
            and getattr(step.args[0], "name", "").rsplit(".", 1)[-1] == h
        ),
        1,
    )
    height = program.statements[first].extent(h)

    def fits(rows: int) -> bool:
        banded = recompute(program, offsets, rows)
        if not exact:
            need = 0
            for name, count in banded.meta["band_rows"].items():
                if name in kept:
                    t = banded.tensor(name)
                    need += math.prod(t.shape[1:]) // t.shape[3] * count * t.itemsize
            return need <= room
        s = Schedule(banded, None, checked=False)
        need = 0
        for name in sorted(kept):
            box = s.staged_box(name, BAND, overlaps=False)
            if box is None:
                return False
            need += math.prod(box.size) * banded.tensor(name).itemsize
        return need <= room

    # in blocks: the most that fit (by bisection: a band's boxes only grow with its rows), then
    # the most of those that divide the rows (a last band of fewer rows still moves whole boxes)
    lo, hi = 1, max(1, math.ceil(height / block))
    if not fits(block):
        raise TileError(f"recompute: one band of {block} rows does not fit {room} B")
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if fits(mid * block) else (lo, mid - 1)
    even = [m for m in range(lo, 0, -1) if height % (m * block) == 0]
    return (even[0] if even and 2 * even[0] >= lo else lo) * block
