"""Sums of shifted products in one pass per tap: the values of a run of VMUL/VMACs into one
destination whose sources are one int8/uint8 view at shifted addresses, each times a weight
(per row of a stack: `stacked`'s iterations) -- a depthwise convolution's taps.

Stepped, each tap is a multiply into a temporary and an add into the destination, and each
reads its int8 source and casts it again. Here the bytes every tap reads are cast to int32
once (`Taps.span` per row), the taps' views are strided views of that one cast, and each tap
is one fused multiply-add (torch's `addcmul_`) into a fresh int32 sum, added into the
destination at the end in wrapping int32 (numpy). The sum is exact: `bound` checks on the
weights of every call that no partial sum can reach 2**31, so nothing wraps before that last
add, and int32 wrap-around makes the order of the additions irrelevant to it.

A view whose innermost moving axis has a stride s > 1 (a strided convolution's taps) is cast
de-interleaved: each plane (the axes whose strides are multiples of s; the others lead) into
s phases, phase q holding the plane's bytes q, q + s, q + 2s ... Every tap's view then lies in
one phase (its base mod s) with stride 1 innermost, where torch's multiply-add is fast (on the
strided bytes it was slower than tap by tap). Anything else (a negative stride, views so
sparse in their span that its cast reads more than the taps do, sources other than
int8/uint8, a weight that could overflow) is None: tap by tap.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from tensorgen.sim.batch import compact
from tensorgen.sim.blocks import span
from tensorgen.sim.products import _torch

# tests set this to False to compute tap by tap
ENABLED = True
SOURCES = {np.dtype(np.int8): 128, np.dtype(np.uint8): 255}  # the largest |value|
INT32_EXACT = 1 << 31
# the largest |weight| of a narrow weight dtype: its bound needs no look at the values
_WIDEST = {np.dtype(np.int8): 128, np.dtype(np.uint8): 255, np.dtype(np.int16): 1 << 15}


@dataclass(frozen=True)
class Taps:
    """The static part of a tap run: the byte span of each row that every tap reads, and
    where each tap's view starts in it."""

    low: int  # the first byte any tap reads, in the source's memory (row 0)
    span: int  # bytes from `low` to one past the last byte any tap reads
    offsets: tuple[int, ...]  # each tap's base, relative to `low`
    shape: tuple[int, ...]
    strides: tuple[int, ...]  # bytes (= elements: int8/uint8)
    dtype: np.dtype
    phases: int = 1  # s > 1: the innermost moving axis's stride, the cast de-interleaved
    leading: int = 0  # with phases: the axes before the plane (a stride not a multiple of s)
    plane: int = 0  # with phases: the bytes of one plane, from `low`


def plan(shape, strides, bases, dtype) -> Taps | None:
    """The tap run of views of `shape`/`strides` (bytes) at byte `bases`, or None."""
    if np.dtype(dtype) not in SOURCES or len(bases) < 2 or any(s < 0 for s in strides):
        return None
    moving = [s if n > 1 else 0 for n, s in zip(shape, strides, strict=True)]
    inner = [s for s in moving if s][-1:]
    extent = sum((n - 1) * s for n, s in zip(shape, moving, strict=True)) + 1
    low = min(bases)
    span = max(bases) - low + extent
    offsets = tuple(b - low for b in bases)
    if inner in ([], [1]):
        if span > len(bases) * math.prod(shape):
            return None  # the views are sparse in their span: one cast reads more than all taps
        return Taps(low, span, offsets, tuple(shape), tuple(strides), dtype)
    phases, leading = inner[0], len(shape)
    while leading and moving[leading - 1] % phases == 0:
        leading -= 1  # the plane: the axes whose strides are multiples of the phases
    rest = zip(shape[leading:], moving[leading:], strict=True)
    plane = max(offsets) + sum((n - 1) * s for n, s in rest) + 1
    if math.prod(shape[:leading]) * plane > len(bases) * math.prod(shape):
        return None  # sparse, as above: the cast of every plane reads more than all taps
    return Taps(low, span, offsets, tuple(shape), tuple(moving), dtype, phases, leading, plane)


def bound(taps: Taps, weights) -> bool:
    """Whether no partial sum of the taps can reach 2**31 in magnitude (`weights`: an
    integer array per tap, broadcastable to the views)."""
    widest = max(_WIDEST.get(np.asarray(w).dtype, INT32_EXACT) for w in weights)
    if len(weights) * widest * SOURCES[np.dtype(taps.dtype)] < INT32_EXACT:
        return True  # int8/uint8 weights: no sum of their products can (9 taps: 294,912 at most)
    if all(np.size(w) == 1 for w in weights):  # a scalar each (one row): Python integers
        total = sum(abs(int(np.ravel(w)[0])) for w in weights)
    else:
        total = int(np.max(sum(np.abs(np.asarray(w, np.int64)) for w in weights)))
    return total * SOURCES[np.dtype(taps.dtype)] < INT32_EXACT


def tap_sum(taps: Taps, buf: np.ndarray, first: int, count: int, lead: int, weights, scratch=None):
    """sum_t weights[t] * (tap t's view) as an int32 array (count, *shape): rows `lead` bytes
    apart in `buf` from byte `first` (row 0's `low`); `weights` each an integer array
    broadcastable to (count, *shape) that passes `bound`. None (nothing computed) when the
    span leaves `buf` or this path is off. With `scratch` (a `products.Scratch`), the cast
    and the sum are its kept buffers, used before the next call: fresh ones cost a page
    fault per 4 KiB each call. The first tap is a multiply into the sum, not an add into
    zeros: a pass over the sum fewer."""
    last = first + (count - 1) * lead + taps.span - 1
    if not ENABLED or first < 0 or lead < 0 or last >= buf.nbytes or not buf.flags.c_contiguous:
        return None
    torch = _torch()
    if taps.phases > 1:
        x, views = _phased(taps, buf, first, count, lead, scratch, torch)
    else:
        x, views = _flat(taps, buf, first, count, lead, scratch, torch)
    size = (count, *taps.shape)
    acc = (
        torch.empty(size, dtype=torch.int32)
        if scratch is None
        else torch.from_numpy(scratch.get(size, np.int32, "sum"))
    )
    scalar = all(np.size(w) == 1 for w in weights)
    for i, (view, w) in enumerate(zip(views, weights, strict=True)):
        view = x.as_strided(*view)
        # one weight for every row: a Python integer, no tensor to make
        w = int(np.ravel(w)[0]) if scalar else torch.from_numpy(np.ascontiguousarray(w, np.int32))
        if i == 0:
            torch.mul(view, w, out=acc)
        elif scalar:
            acc.add_(view, alpha=w)
        else:
            acc.addcmul_(view, w)
    return acc.numpy()


def _flat(taps: Taps, buf, first, count, lead, scratch, torch):
    """The cast of each row's span (count, span), and each tap's view in it (size, strides,
    offset)."""
    raw = np.ndarray((count, taps.span), taps.dtype, buffer=buf, offset=first, strides=(lead, 1))
    if scratch is None:
        cast = raw.astype(np.int32)
    else:
        cast = scratch.get(raw.shape, np.int32, "cast")
        np.copyto(cast, raw)
    size, strides = (count, *taps.shape), (taps.span, *taps.strides)
    return torch.from_numpy(cast), [(size, strides, off) for off in taps.offsets]


def _phased(taps: Taps, buf, first, count, lead, scratch, torch):
    """The de-interleaved cast (phases, count, *leading, per phase) of every row's planes,
    and each tap's view in its phase (size, strides, offset)."""
    s, n, plane = taps.phases, taps.leading, taps.plane
    ahead, rest = taps.shape[:n], taps.shape[n:]
    planes = np.ndarray(
        (count, *ahead, plane),
        taps.dtype,
        buffer=buf,
        offset=first,
        strides=(lead, *taps.strides[:n], 1),
    )
    width = -(-plane // s)
    shape = (s, count, *ahead, width)
    cast = np.empty(shape, np.int32) if scratch is None else scratch.get(shape, np.int32, "cast")
    for q in range(s):  # phase q's last element is stale where plane - q is no multiple of s
        np.copyto(cast[q, ..., : -(-(plane - q) // s)], planes[..., q::s])
    x = torch.from_numpy(cast)
    into = x.stride()
    strides = (into[1], *into[2 : 2 + n], *(st // s for st in taps.strides[n:]))
    size = (count, *ahead, *rest)
    return x, [(size, strides, (off % s) * into[0] + off // s) for off in taps.offsets]


# --- the runs of `stacked`'s plans ------------------------------------------------------


def runs_of(effects) -> dict[int, tuple[int, Taps]]:
    """The runs of `stacked.Effect`s of VMUL/VMACs that are one sum of shifted products: into one
    destination (a VMUL or VMAC, then VMACs), sources of one view at shifted offsets,
    neither a source nor a weight meeting the destination. First effect -> (last + 1, its
    taps)."""
    out, i = {}, 0
    while i < len(effects):
        j = i + 1
        if effects[i].kind in ("VMUL", "VMAC"):
            dst = effects[i].refs[0]
            while (
                j < len(effects)
                and effects[j].kind == "VMAC"
                and effects[j].refs[0] == dst
                and _tap_like(effects[j], effects[i])
            ):
                j += 1
        if j - i > 1 and _tap_like(effects[i], effects[i]):
            a = effects[i].refs[1]
            bases = [e.refs[1].offset for e in effects[i:j]]
            t = plan(a.shape, a.strides, bases, a.dtype)
            if t is not None:
                out[i] = (j, t)
        i = j
    return out


def _tap_like(e, first) -> bool:
    """Whether `e` is a tap of the run `first` begins: its source `first`'s view shifted,
    neither it nor its weight meeting the destination."""
    dst, a, b = e.refs
    a0 = first.refs[1]
    if (a.mem, a.mode, a.step, a.dtype, a.shape, a.strides) != (
        a0.mem,
        a0.mode,
        a0.step,
        a0.dtype,
        a0.shape,
        a0.strides,
    ):
        return False
    lo, hi = span(dst)
    return not any(
        r is not None and r.mem == dst.mem and span(r)[0] < hi and lo < span(r)[1] for r in (a, b)
    )


def run_stacked(effects, t: Taps, array, locate, k: int, scratch=None) -> bool:
    """The run's values for the `k` stacked iterations of a `stacked.Plan` (`array`, `locate`:
    its operands' arrays and buffers; `scratch`: its kept buffers, `tap_sum`); False (nothing
    written) to compute it effect by effect."""
    buf, first, lead = locate(effects[0].refs[1], t.low)
    weights = [
        np.int64(e.imm).astype(np.int32) if e.refs[2] is None else compact(array(e.refs[2]))
        for e in effects
    ]  # an immediate wrapped, as `stacked_run._vector`'s; a weight view with its broadcast axes cut
    if not bound(t, weights):
        return False
    out = tap_sum(t, buf, first, k, lead, weights, scratch)
    if out is None:
        return False
    dst = array(effects[0].refs[0], True)
    if effects[0].kind == "VMAC":
        np.add(dst, out, out=dst)  # int32: wraps
    else:
        dst[...] = out
    return True
