"""The MATMUL groups of an unrolled block loop in a `stacked` plan merged into one product.

A short inner LOOP over output-channel blocks is unrolled by `stacked.effects_of` into one
MATMUL group per block: each reads the same activations and its own block of weights into its
own block of the accumulator. When the blocks of B and of the accumulator follow one another
along N, the groups are one product of N times the width, the activations gathered once, as
the stepped path does for such a loop (`tensorgen.sim.loops`).
"""

from __future__ import annotations

from dataclasses import replace

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
