"""DRAM boxes of every iteration of a replayed loop at once (`tensorgen.sim.stacked`): what
`Machine.load_box` / `store_box` do per iteration, over a leading axis, and the check that
doing each box instruction for every iteration in a row touches the DRAM as stepping does;
and the on-chip dependences among a body's effects (`meetings`)."""

from __future__ import annotations

import math

import numpy as np


def write_loaded(dst: np.ndarray, values: np.ndarray) -> None:
    """`Machine.write` of `load_box`'s values, for every iteration."""
    if values.dtype == dst.dtype and values.shape == dst.shape:
        copy_values(dst, values)
        return
    values = np.broadcast_to(values, dst.shape)
    dst[...] = (
        values.astype(np.float32)
        if dst.dtype.kind == "f"
        else values.astype(np.int64).astype(dst.dtype)
    )


# a destination axis this short and closest-strided is copied index by index (`copy_values`)
SHORT_AXIS = 4


def copy_values(dst: np.ndarray, src: np.ndarray) -> None:
    """dst[...] = src. numpy copies along dst's closest-strided axis innermost: when that is a
    few channels packed innermost on chip (an HWC tile loaded from CHW) that src holds far
    apart, each inner run is a handful of elements; one copy per channel instead runs along
    the next axis, contiguous in src (the stem conv's loads: 2.1x faster, measured)."""
    ax = min(range(dst.ndim), key=lambda i: abs(dst.strides[i]), default=None)
    if ax is None or not 1 < dst.shape[ax] <= SHORT_AXIS:
        dst[...] = src
        return
    if abs(src.strides[ax]) <= min(
        abs(st) for st, n in zip(src.strides, src.shape, strict=True) if n > 1
    ):
        dst[...] = src  # src's closest-strided axis too: the one copy runs along both
        return
    lead = (slice(None),) * ax
    for i in range(dst.shape[ax]):
        dst[(*lead, i)] = src[(*lead, i)]


def _box_dtype(t) -> np.dtype:
    dt = np.dtype(t.dtype)
    if dt.kind == "f":
        return np.dtype(np.float32)
    if not np.iinfo(dt).min <= t.pad <= np.iinfo(dt).max:
        return np.dtype(np.int64)
    return dt


def _extent(box, k: int):
    """Per dimension, the least first and the greatest end of the box over the iterations."""
    _, origin, steps, shape = box
    los = [min(o, o + s * (k - 1)) for o, s in zip(origin, steps, strict=True)]
    his = [max(o, o + s * (k - 1)) + n for o, s, n in zip(origin, steps, shape, strict=True)]
    return los, his


def _tensor(binary, mem, ti):
    t = binary.tensors[ti]
    return t, np.ndarray(t.shape, np.dtype(t.dtype), buffer=mem["dram"], offset=t.dram_offset)


def _stack(arr: np.ndarray, los, box, k: int, writeable: bool) -> np.ndarray:
    """Every iteration's box of `arr` (whose index 0 is coordinate `los`)."""
    _, origin, steps, shape = box
    at = tuple(o - lo for o, lo in zip(origin, los, strict=True))
    # `arr` is C-contiguous (a tensor in DRAM, or a padded copy): one constructor over it, not
    # a slice and `as_strided` of it (4x the time); every iteration's box lies in it (`_extent`)
    offset = sum(a * st for a, st in zip(at, arr.strides, strict=True))
    lead = sum(s * st for s, st in zip(steps, arr.strides, strict=True))
    out = np.ndarray(
        (k, *shape), arr.dtype, buffer=arr, offset=offset, strides=(lead, *arr.strides)
    )
    if not writeable:
        out.flags.writeable = False
    return out


def _sparse(los, his, box, k: int) -> bool:
    """Whether the boxes' hull is far larger than the boxes (a crafted stride of 2^40 elements):
    then each iteration's box is taken alone instead of through a padded copy of the hull."""
    hull = math.prod(hi - lo for lo, hi in zip(los, his, strict=True))
    return hull > 4 * k * math.prod(box[3]) + (1 << 16)


def _iteration_box(box, i: int):
    _, origin, steps, shape = box
    lo = [o + s * i for o, s in zip(origin, steps, strict=True)]
    return lo, [a + n for a, n in zip(lo, shape, strict=True)]


def dram_boxes(binary, mem, box, k: int) -> np.ndarray:
    """The values `load_box` gives for every iteration, (k, *shape)."""
    t, arr = _tensor(binary, mem, box[0])
    los, his = _extent(box, k)
    if all(lo >= 0 for lo in los) and all(hi <= n for hi, n in zip(his, t.shape, strict=True)):
        return _stack(arr, [0] * len(los), box, k, False)
    if _sparse(los, his, box, k):
        out = np.full((k, *box[3]), t.pad, _box_dtype(t))
        for i in range(k):
            src, dst = _overlap(*_iteration_box(box, i), t.shape)
            if src is not None:
                out[(i, *dst)] = arr[src]
        return out
    padded = np.full([hi - lo for lo, hi in zip(los, his, strict=True)], t.pad, _box_dtype(t))
    src, dst = _overlap(los, his, t.shape)
    if src is not None:
        padded[dst] = arr[src]
    return _stack(padded, los, box, k, False)


def _overlap(los, his, dims):
    src, dst = [], []
    for lo, hi, n in zip(los, his, dims, strict=True):
        a, b = max(lo, 0), min(hi, n)
        if a >= b:
            return None, None
        src.append(slice(a, b))
        dst.append(slice(a - lo, b - lo))
    return tuple(src), tuple(dst)


def store_boxes(binary, mem, box, k: int, values: np.ndarray) -> None:
    """`store_box` of every iteration's values; the boxes are disjoint (checked)."""
    t, arr = _tensor(binary, mem, box[0])
    if values.dtype.kind == "f":
        values = values.astype(np.float32)
    los, his = _extent(box, k)
    if all(lo >= 0 for lo in los) and all(hi <= n for hi, n in zip(his, t.shape, strict=True)):
        _stack(arr, [0] * len(los), box, k, True)[...] = values.astype(arr.dtype, copy=False)
        return
    if _sparse(los, his, box, k):
        for i in range(k):  # disjoint boxes: any order
            src, dst = _overlap(*_iteration_box(box, i), t.shape)
            if src is not None:
                arr[src] = values[(i, *dst)].astype(arr.dtype)
        return
    src, dst = _overlap(los, his, t.shape)
    if src is None:
        return  # every box wholly outside the tensor: halos
    scratch = np.empty([hi - lo for lo, hi in zip(los, his, strict=True)], arr.dtype)
    scratch[dst] = arr[src]
    _stack(scratch, los, box, k, True)[...] = values.astype(arr.dtype, copy=False)
    arr[src] = scratch[dst]


def dram_order(boxes, k: int, binary) -> list[tuple[int, int]] | None:
    """The order (effect, effect) pairs that running each DRAM effect for every iteration at
    once must keep to touch the DRAM as stepping does, for `boxes` (effect, kind, box) in
    program order; None if no order does. Stepping runs effect i of iteration a before
    effect j > i of iteration b when a <= b, after it otherwise: boxes of one tensor that meet
    (one of them stored) only for a <= b put i first, only for a > b put j first; a STORE
    meeting itself in another iteration, or both cases at once, have no order.

    Every pair of one tensor's boxes is met for all iterations at once (numpy, a row of boxes
    against the later ones), not pair by pair: a default schedule's loop holds hundreds of
    boxes of one tensor."""
    if k > 2048:
        return None
    groups: dict[int, list[int]] = {}
    for x, (_, _, box) in enumerate(boxes):
        groups.setdefault(box[0], []).append(x)
    found = []  # (x, y, later, earlier-or-same, earlier, meet) per pair of boxes, then ordered
    for tensor, xs in groups.items():
        found += _meets(boxes, xs, k, binary.tensors[tensor].shape)
    edges = []
    for x, y, later, upto, ahead, meet in sorted(found):
        i, j = boxes[x][0], boxes[y][0]
        if i == j:
            if later or ahead:
                return None
        elif later and upto:
            return None
        elif meet:
            edges.append((j, i) if later else (i, j))
    return edges


def _meets(boxes, xs: list[int], k: int, shape) -> list[tuple]:
    """For `dram_order`: per pair x <= y of the boxes `xs` of one tensor (not both loads):
    whether y's iteration b meets x's iteration a for some a > b, a <= b, a < b, any."""
    cs = np.arange(k)
    lo = np.empty((len(xs), len(shape), k), np.int64)
    hi = np.empty_like(lo)
    for r, x in enumerate(xs):
        box = boxes[x][2]
        for d, n in enumerate(shape):
            lo[r, d] = np.clip(box[1][d] + box[2][d] * cs, 0, n)
            hi[r, d] = np.clip(box[1][d] + box[2][d] * cs + box[3][d], 0, n)
    load = np.array([boxes[x][1] == "load" for x in xs])
    below, above = cs[:, None] > cs[None, :], cs[:, None] < cs[None, :]
    width = max(1, (1 << 22) // (k * k))  # boxes per block of columns: a few MB of booleans
    out = []
    for r, x in enumerate(xs):
        for c0 in range(r, len(xs), width):
            cols = np.arange(c0, min(c0 + width, len(xs)))
            cols = cols[~(load[r] & load[cols])]
            if not len(cols):
                continue
            meet = np.ones((len(cols), k, k), bool)
            for d in range(len(shape)):
                meet &= (lo[r, d][None, :, None] < hi[cols, d][:, None, :]) & (
                    lo[cols, d][:, None, :] < hi[r, d][None, :, None]
                )
            later = (meet & below).any((1, 2))
            ahead = (meet & above).any((1, 2))
            same = meet[:, cs, cs].any(1)
            for c, lt, ah, sm in zip(cols.tolist(), later, ahead, same, strict=True):
                out.append((x, xs[c], bool(lt), bool(ah or sm), bool(ah), bool(lt or ah or sm)))
    return out


def meetings(accesses, modes) -> list[tuple[int, int, bool]]:
    """For `stacked._Builder._order`: (i, j, i reads the "prev" row) for every pair of accesses of effects i < j that meet
    in one memory, one of them writing, neither of bytes the body never writes ("shared"): a
    dependence of every iteration, found for all pairs at once (numpy) rather than four
    nested Python loops."""
    rows = [
        (i, m, lo, hi, w, modes[r])
        for i, acc in enumerate(accesses)
        for m, lo, hi, w, r, _ in acc
        if modes[r] != "shared"
    ]
    if len(rows) < 2:
        return []
    mems = {m: k for k, m in enumerate(sorted({row[1] for row in rows}))}
    eff = np.array([row[0] for row in rows])
    mem = np.array([mems[row[1]] for row in rows])
    lo = np.array([row[2] for row in rows], np.int64)
    hi = np.array([row[3] for row in rows], np.int64)
    w = np.array([bool(row[4]) for row in rows])
    prev = np.array([row[5] == "prev" for row in rows])
    meet = (
        (eff[:, None] < eff[None, :])
        & (mem[:, None] == mem[None, :])
        & (lo[:, None] < hi[None, :])
        & (lo[None, :] < hi[:, None])
        & (w[:, None] | w[None, :])
    )
    a, b = np.nonzero(meet)
    back = ~w[a] & prev[a]
    return list(zip(eff[a].tolist(), eff[b].tolist(), back.tolist(), strict=True))
