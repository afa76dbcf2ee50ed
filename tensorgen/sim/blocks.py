"""MATMUL groups of a `stacked` plan that are one product, merged into it.

Blocks: a short inner LOOP over output-channel blocks is unrolled by `stacked.effects_of`
into one MATMUL group per block, each reading the same activations and its own block of
weights into its own block of the accumulator. When the blocks of B and of the accumulator
follow one another along N, the groups are one product N times as wide, the activations
gathered once, as the stepped path does for such a loop (`tensorgen.sim.loops`).

Chains: groups each stored before the next (a 1x1 convolution's row tiles, two accumulators
taking turns) whose A moves by a fixed step from one to the next and whose B is the same are
one product with an axis over the groups, into a scratch copy of each group's accumulator
that its STORE reads; the accumulators get the last group written to each.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from tensorgen.sim.batch import MAX_BATCH_ELEMENTS, Piece, reduce_into
from tensorgen.sim.boxes import store_boxes

# tests set this to False to keep a product per block
ENABLED = True


def merge_blocks(effects: list) -> list:
    """The effects with every row of MATMUL groups that are the blocks of one product merged
    into that product: groups next to each other in the order, of one instruction, reading
    the same A, with blocks of B and of the accumulator that follow one another along N
    (`_widened`)."""
    if not ENABLED:
        return effects
    out: list = []
    for e in effects:
        merged = _widened(out[-1], e) if out else None
        if merged is None:
            out.append(e)
        else:
            out[-1] = merged
    return out


def merge_k(effects: list) -> list:
    """The effects with the pieces of each MATMUL group that are one stretch of its K merged
    into one piece (`_next_k`): a K split into the MAC array's width (the stem conv's 147 as
    9 pieces of 16 and one of 3) is then gathered in runs of the whole K, not of 16 bytes. The
    same integers: the product sums over the same K, wrapping alike."""
    if not ENABLED:
        return effects
    out = []
    for e in effects:
        if e.kind != "mm" or len(e.refs) < 3:
            out.append(e)
            continue
        parts = [e.refs[1]]
        for part in e.refs[2:]:
            merged = _next_k(parts[-1], part)
            if merged is None:
                parts.append(part)
            else:
                parts[-1] = merged
        out.append(replace(e, refs=(e.refs[0], *parts)))
    return out


def _next_k(p, q):
    """Piece `p` (a, b, a_zp, b_zp, term) with `q` as the next stretch of its one K axis (A's
    last, B's first), or None: q's A and B must start where p's end along it, with p's
    strides, zero points and everything else."""
    (pa, pb, *p_zps, p_term), (qa, qb, *q_zps, q_term) = p, q
    if p_zps != q_zps or len(pb.shape) != 2 or len(qb.shape) != 2:
        return None
    for x, y, axis in ((pa, qa, len(pa.shape) - 1), (pb, qb, 0)):
        if (x.mem, x.dtype, x.mode, x.step, x.strides) != (
            y.mem,
            y.dtype,
            y.mode,
            y.step,
            y.strides,
        ):
            return None
        rest = x.shape[:axis] + x.shape[axis + 1 :]
        if rest != y.shape[:axis] + y.shape[axis + 1 :]:
            return None
        if y.offset != x.offset + x.shape[axis] * x.strides[axis]:
            return None
    a = replace(pa, shape=(*pa.shape[:-1], pa.shape[-1] + qa.shape[-1]))
    b = replace(pb, shape=(pb.shape[0] + qb.shape[0], pb.shape[1]))
    return (a, b, *p_zps, max(p_term, q_term))


def _widened(g, e):
    """`g` (a MATMUL group, perhaps already widened) with `e` as its next block along N, or
    None: e must be g's instruction with g's A, and its accumulator and every B must start
    where g's end along their N axis (strides and everything else equal). The widened
    accumulator must not overlap itself (the blocks' accumulators are then disjoint) nor
    any operand (no block reads what another writes)."""
    if g.kind != "mm" or e.kind != "mm" or (g.pc, g.accumulate) != (e.pc, e.accumulate):
        return None
    if len(g.refs) != len(e.refs) or len(g.refs) < 2:
        return None
    refs = [_next_block(g.refs[0], e.refs[0])]
    for (ga, gb, *grest), (ea, eb, *erest) in zip(g.refs[1:], e.refs[1:], strict=True):
        if ga != ea or grest != erest or gb.shape[-1] != g.refs[0].shape[-1]:
            return None
        refs.append((ga, _next_block(gb, eb), *grest))
    acc = refs[0]
    if acc is None or any(b is None for _, b, *_ in refs[1:]) or not _distinct(acc):
        return None
    lo, hi = span(acc)
    for part in refs[1:]:
        for r in part[:2]:
            r_lo, r_hi = span(r)
            if r.mem == acc.mem and r_lo < hi and lo < r_hi:
                return None
    return replace(g, refs=tuple(refs))


def _next_block(g, e):
    """`g` widened along its last (N) axis by `e`, which must start where g ends on it."""
    if (g.mem, g.dtype, g.mode, g.step, g.strides) != (e.mem, e.dtype, e.mode, e.step, e.strides):
        return None
    if g.shape[:-1] != e.shape[:-1] or e.offset != g.offset + g.shape[-1] * g.strides[-1]:
        return None
    return replace(g, shape=(*g.shape[:-1], g.shape[-1] + e.shape[-1]))


def _distinct(r) -> bool:
    """Whether no two elements of `r` share a byte (sufficient: each axis, by increasing
    positive stride, steps past everything the axes before it span)."""
    extent = r.dtype.itemsize
    for n, s in sorted(zip(r.shape, r.strides, strict=True), key=lambda x: x[1]):
        if n == 1:
            continue
        if s < extent:
            return False
        extent += (n - 1) * s
    return True


def span(r) -> tuple[int, int]:
    """The bytes [lo, hi) an operand touches."""
    lo = r.offset + sum(min(0, (n - 1) * s) for n, s in zip(r.shape, r.strides, strict=True))
    hi = r.offset + sum(max(0, (n - 1) * s) for n, s in zip(r.shape, r.strides, strict=True))
    return lo, hi + r.dtype.itemsize


# --- chains: MATMUL groups each stored before the next, into a product over them all ------


@dataclass(frozen=True)
class Chain:
    """MATMUL groups (accumulate 0), each followed by the STORE of its accumulator, that are
    one product with a leading axis over the groups: A moving by a fixed step from one group
    to the next, B the same for all. The product goes into a scratch holding each group's
    accumulator bytes (the `size` bytes of its span), the STOREs read their group's, and the
    memory gets the last group written to each accumulator (`last`)."""

    acc: object  # the first group's accumulator (`stacked.Ref`), at its offset in the scratch
    parts: tuple  # (a with the groups' axis, b, a_zp, b_zp, term) per piece
    size: int
    stores: tuple  # (STORE effect, its source's offset relative to its group's scratch)
    last: tuple  # (group, its accumulator) for the last group writing each accumulator
    whole: tuple | None = None  # (dimension, box shape): the STOREs as one box (`_whole`)


def chains(effects: list, chunk: int) -> list:
    """The effects with every run of at least two MATMUL-then-STORE pairs that are one
    product (`_chain`) as one effect of kind "chain" (its refs: the `Chain`)."""
    if not ENABLED:
        return effects
    out, i = [], 0
    while i < len(effects):
        chain, end = _chain(effects, i, chunk)
        if chain is None:
            out.append(effects[i])
            i += 1
        else:
            out.append(replace(effects[i], kind="chain", refs=(chain,), box=None))
            i = end
    return out


def _pair(effects, i: int):
    """The MATMUL group and the STORE of (part of) its accumulator at i, i + 1, or None."""
    if i + 1 >= len(effects):
        return None
    mm, st = effects[i], effects[i + 1]
    if mm.kind != "mm" or st.kind != "store" or mm.accumulate or len(mm.refs) < 2:
        return None
    acc, src = mm.refs[0], st.refs[0]
    lo, hi = span(acc)
    s_lo, s_hi = span(src)
    if src.mem != acc.mem or src.mode != acc.mode or s_lo < lo or s_hi > hi:
        return None
    if not _distinct(acc) or math.prod(acc.shape) * acc.dtype.itemsize != hi - lo:
        return None  # the STORE may read only bytes the group writes: a dense accumulator
    return mm, st


def _chain(effects, i: int, chunk: int):
    """The `Chain` of the pairs from effect i and the effect after them, or (None, i): the
    groups' accumulators alike but for where they are (the same or apart), each group's
    pieces alike but for A's offset, moving by the same step from group to group, no piece
    reading an accumulator, the scratch within the batch bound."""
    first = _pair(effects, i)
    if first is None:
        return None, i
    mm0, _ = first
    acc0 = mm0.refs[0]
    size = span(acc0)[1] - span(acc0)[0]
    groups, steps, j = [], None, i
    while (p := _pair(effects, j)) is not None:
        mm, _ = p
        acc = mm.refs[0]
        if replace(acc, offset=0) != replace(acc0, offset=0) or len(mm.refs) != len(mm0.refs):
            break
        d = []
        for (a0, b0, *r0), (a, b, *r) in zip(mm0.refs[1:], mm.refs[1:], strict=True):
            if b != b0 or r != r0 or replace(a, offset=0) != replace(a0, offset=0):
                break
            d.append(a.offset - a0.offset)
        else:
            n = len(groups)
            if steps is None and n == 1:
                steps = tuple(d)
            if n == 0 or all(x == n * s for x, s in zip(d, steps, strict=True)):
                groups.append(p)
                j += 2
                continue
        break
    if len(groups) < 2 or chunk * len(groups) * size > 4 * MAX_BATCH_ELEMENTS:
        return None, i
    accs = [mm.refs[0] for mm, _ in groups]
    offsets = sorted({r.offset for r in accs})
    if any(b - a < size for a, b in zip(offsets, offsets[1:], strict=False)):
        return None, i  # accumulators that overlap without being the same
    lo0 = span(acc0)[0]
    parts = []
    for (a, b, *rest), st in zip(mm0.refs[1:], steps, strict=True):
        wide = replace(a, shape=(len(groups), *a.shape), strides=(st, *a.strides))
        for r in (wide, b):
            r_lo, r_hi = span(r)
            if r.mem == acc0.mem and any(r_lo < o + size and o < r_hi for o in offsets):
                return None, i
        parts.append((wide, b, *rest))  # and no group reads an accumulator any group writes
    stores = tuple((st, st.refs[0].offset - span(mm.refs[0])[0]) for mm, st in groups)
    last = {}
    for g, r in enumerate(accs):
        last[r.offset] = (g, r)
    chain = Chain(
        replace(acc0, offset=acc0.offset - lo0), tuple(parts), size, stores, tuple(last.values())
    )
    return replace(chain, whole=_whole(stores)), j


def _whole(stores):
    """(d, shape) when the STOREs are one box of `shape` for every iteration: the groups'
    boxes side by side along dimension d (each group's source at the same place in its
    scratch), and the iterations' boxes apart in some dimension (else None: one STORE
    after the other, as stepping orders them)."""
    (st0, at0), boxes = stores[0], [st.box for st, _ in stores]
    t, o0, steps, shape = boxes[0]
    src0 = replace(st0.refs[0], offset=0)
    if any(
        (b[0], b[2], b[3]) != (t, steps, shape)
        or replace(st.refs[0], offset=0) != src0
        or at != at0
        for b, (st, at) in zip(boxes, stores, strict=True)
    ):
        return None
    d1 = [b - a for a, b in zip(o0, boxes[1][1], strict=True)]
    dims = [i for i, x in enumerate(d1) if x]
    if len(dims) != 1 or d1[dims[0]] != shape[dims[0]]:
        return None
    d = dims[0]
    if any(
        tuple(b - a for a, b in zip(o0, box[1], strict=True)) != tuple(g * x for x in d1)
        for g, box in enumerate(boxes)
    ):
        return None
    whole = (*shape[:d], len(boxes) * shape[d], *shape[d + 1 :])
    if not any(abs(s) >= n for s, n in zip(steps, whole, strict=True)):
        return None
    return d, whole


def run_chain(c: Chain, array, binary, mem, k: int, first: int) -> None:
    """The chain's values for the `k` stacked iterations of a `stacked.Plan` from iteration
    `first` (`array`: its operands' arrays)."""
    n = len(c.stores)
    scratch = np.empty((k, n, c.size), np.uint8)
    lead = scratch.strides[0]

    def view(r, offset: int, groups: tuple[int, ...] = ()) -> np.ndarray:
        return np.ndarray(
            (k, *groups, *r.shape),
            r.dtype,
            buffer=scratch,
            offset=offset,
            strides=(lead, *([c.size] if groups else []), *r.strides),
        )

    acc = view(c.acc, c.acc.offset, (n,))
    pieces = [Piece(array(a), array(b), azp, bzp, term) for a, b, azp, bzp, term in c.parts]
    reduce_into(acc, pieces, 0, batch=k)
    for g, (st, at) in enumerate(c.stores):
        t, origin, steps, shape = st.box
        box = (t, tuple(o + s * first for o, s in zip(origin, steps, strict=True)), steps, shape)
        if c.whole is None:
            store_boxes(binary, mem, box, k, view(st.refs[0], g * c.size + at))
            continue
        d, whole = c.whole  # every group's box at once: group g's rows of dimension d
        r = st.refs[0]
        values = np.ndarray(
            (k, *r.shape[:d], n, *r.shape[d:]),
            r.dtype,
            buffer=scratch,
            offset=at,
            strides=(lead, *r.strides[:d], c.size, *r.strides[d:]),
        )
        store_boxes(binary, mem, (*box[:3], whole), k, values.reshape(k, *whole))
        break
    for g, r in c.last:
        array(r, True)[...] = acc[:, g]
