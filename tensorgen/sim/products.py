"""Exact tile products for the simulator's MATMUL fast paths (`tensorgen.sim.batch`): int8
operands multiplied by `torch._int_mm` into int32, or float32 BLAS under the 2**24 bound.

The MAC array's accumulator is int32 with two's-complement wrap, so a product is only ever
needed modulo 2**32, and arithmetic modulo 2**32 is a ring: an int8 x int8 -> int32 product
whose sums wrap is exact for it however large K is. uint8 operands are gathered as int8 with
their top bit flipped (x - 128), and each operand's zero point enters as a correction:
with a = a' + da and b = b' + db over a span of K (da = shift - a_zp, likewise db),
  sum (a - a_zp)(b - b_zp) = a' @ b' + da * colsum(b') + db * rowsum(a') + K * da * db,
every term in wrapping int32.

`torch._int_mm` is trusted only after a probe with operands that overflow int16 pair sums
and int32 accumulators gives the exact wrapped integers: oneDNN's kernels for CPUs without
VNNI (ONEDNN_MAX_CPU_ISA=AVX2, measured with torch 2.13) give wrong integers, and then this
module multiplies in float32 instead (`exact_product`), as it does for small products, where
the call's overhead outweighs its speed, and when torch is not installed. Nor is it used
where it is slower than float32 BLAS (`_int_mm_pays`): oneDNN's exact kernels for CPUs
without VNNI run int8 products at a fraction of float32's speed (an AVX2 EPYC, torch 2.13:
256^3 in 22 ms, float32 BLAS in 1 ms, measured), and both give the same integers.
"""

from __future__ import annotations

import contextlib
import functools
import sys
import time

import numpy as np

# float32 holds every integer below 2**24 exactly: a sum of products stays exact below it
FLOAT32_EXACT = 1 << 24
# products of fewer multiply-accumulates than this stay on numpy's float32 BLAS
MIN_INT_MACS = 1 << 16
# tests set this to False to take the float32 path whatever the probe says
ENABLED = True
# tests set this to False to take torch._int_mm where it is exact but slower than float32
ONLY_WHERE_FASTER = True
# the product both arithmetics are timed on (`_int_mm_pays`): a few ms where int8 is slow
SPEED_PROBE_SHAPE = (128, 128, 128)


class Scratch:
    """The result buffers of one gather layout's float32 products (`batch._Layout`), kept
    from one call to the next: a fresh multi-megabyte result, and its int32 cast, cost a
    page fault per 4 KiB each call (pw_16to96_112's one (96, 16) @ (16, 12544): 4.5 ms with
    both fresh, 1.7 ms for the multiply alone, measured). Its owner uses each result before
    the next product."""

    def __init__(self) -> None:
        self._buffers: dict[tuple, np.ndarray] = {}

    def get(self, shape: tuple[int, ...], dtype, role: str = "") -> np.ndarray:
        """The buffer of `shape` and `dtype` for `role` (two buffers one call uses at once
        have two roles, even where their shapes and dtypes agree)."""
        key = (shape, np.dtype(dtype), role)
        buf = self._buffers.get(key)
        if buf is None:
            buf = self._buffers[key] = np.empty(shape, dtype)
        return buf


def exact_product(
    x: np.ndarray, w: np.ndarray, term: int, scratch: Scratch | None = None
) -> np.ndarray:
    """int32 (wrapped) x @ w of integer-valued float32 matrices (or stacks of them) whose
    elementwise products are at most `term` in magnitude: float32 BLAS over chunks of K short
    enough to stay exact, each chunk's integers cast and added in wrapping int32 in one pass.
    With `scratch`, the result is one of its buffers (a chunked K too: fresh ones there cost
    a 3x3 conv's K of 1152 more than its two GEMMs, measured)."""
    k = x.shape[-1]
    chunk = max(1, (FLOAT32_EXACT - 1) // max(term, 1))
    if x.shape[:-2] == w.shape[:-2]:  # np.broadcast_shapes costs ~10 us a call
        shape = x.shape[:-1] + w.shape[-1:]
    else:
        shape = np.broadcast_shapes(x.shape[:-2], w.shape[:-2]) + (x.shape[-2], w.shape[-1])
    scratch = Scratch() if scratch is None else scratch
    floats, out = scratch.get(shape, np.float32), scratch.get(shape, np.int32)
    for s in range(0, k, chunk):
        _float_matmul(x[..., s : s + chunk], w[..., s : s + chunk, :], floats)
        if s == 0:
            out[...] = floats  # integers below 2**24: exact
        else:  # cast to int32 (exact) and added wrapping, as the accumulator does
            np.add(out, floats, out=out, dtype=np.int32, casting="unsafe")
    return out


# a single float32 product goes to torch's GEMM with at least this many rows and K: MKL is
# faster than OpenBLAS there, not on skinny or short ones (M = 16, K = 147, M = 112), measured
TORCH_MIN_ROWS = 192


def _float_matmul(x: np.ndarray, w: np.ndarray, out: np.ndarray) -> None:
    """out = x @ w in float32 (integers below 2**24: exact in any order of the sums): on
    torch's float32 GEMM (MKL) when torch is loaded and at one thread (as `simulate` holds
    it), for a stack or a product with TORCH_MIN_ROWS rows and K; numpy's BLAS otherwise,
    whose call is cheaper. numpy multiplies a stack one matrix at a time, and OpenBLAS is
    slower on these shapes: a 3x3 conv's (4, 16, 576) @ (4, 576, 230) 1.2 ms on numpy, 0.7
    on torch; matmul_256's (256, 256) @ (256, 112) 1.5 and 0.4; (240, 1023) @ (1023, 49)
    1.4 and 0.8 (measured, one thread)."""
    torch = sys.modules.get("torch")
    big = out.ndim > 2 or min(x.shape[-2:]) >= TORCH_MIN_ROWS
    if big and torch is not None and torch.get_num_threads() == 1:
        torch.matmul(torch.from_numpy(x), torch.from_numpy(w), out=torch.from_numpy(out))
    else:
        np.matmul(x, w, out=out)


def integer(m: int, k: int, n: int) -> bool:
    """Whether an (m, k) @ (k, n) product of int8/uint8 operands runs on `torch._int_mm`:
    gather its operands as int8 (`fill`) and multiply them with `product`."""
    if not ENABLED or m * k * n < MIN_INT_MACS or min(m, k, n) <= 0:
        return False
    # the timing first: its few ms spare the exactness probe's seconds where int8 is slow
    return (not ONLY_WHERE_FASTER or _int_mm_pays()) and _int_mm() is not None


def buffer(shape: tuple[int, ...], integral: bool) -> np.ndarray:
    return np.empty(shape, np.int8 if integral else np.float32)


def k_order(b: np.ndarray, lead: int = 1) -> tuple[int, ...] | None:
    """For B, (`lead` axes.., K.., N), stored output-channel-major (its N stride the widest:
    a conv's weights), its K axes in memory order (strides descending): A's and B's K axes
    permuted alike give the same dot products, and B gathered N-major in that order reads
    runs of memory (layer4's 3x3 weights 591 -> 27 us, measured). None otherwise."""
    ks = [abs(st) for st in b.strides[lead:-1]]
    if not ks or abs(b.strides[-1]) <= max(ks):
        return None
    return tuple(sorted(range(len(ks)), key=lambda i: -ks[i]))


def side_by_side(bs: list[np.ndarray], ks: list[int], integral: bool):
    """The gather of a batch's B (each (batch, K.., N), K spans of `ks`) side by side as one
    (K, batch * N) matrix (`batch._shared_a`): that matrix, and per B (the order its K axes
    are gathered in, the view of the buffer its fill writes, the view of B that fill reads,
    a function of B). B stored N-major (`k_order`) is gathered N-major, (batch * N, K), its K
    axes in memory order; any other K-major, (K, batch, N), its K axes in order."""
    batch, n = bs[0].shape[0], bs[0].shape[-1]
    perms = [k_order(b) for b in bs]
    n_major = all(perms)
    if n_major:
        w = buffer((batch * n, sum(ks)), integral)
        matrix = w.T
    else:
        perms = [tuple(range(b.ndim - 2)) for b in bs]
        w = buffer((sum(ks), batch, n), integral)
        matrix = w.reshape(sum(ks), batch * n)
    at, parts = 0, []
    for b, k, perm in zip(bs, ks, perms, strict=True):
        nd = b.ndim
        if n_major:  # (batch, N, K..)
            axes, ws = (0, nd - 1, *(1 + i for i in perm)), w[:, at : at + k]
        else:  # (K.., batch, N): `np.moveaxis(b, 0, -2)` at a tenth of the cost
            axes, ws = (*range(1, nd - 1), 0, nd - 1), w[at : at + k]
        src = functools.partial(np.transpose, axes=axes)
        parts.append((perm, ws.reshape(src(b).shape), src))
        at += k
    return matrix, parts


def stacked(bs: list[np.ndarray], ks, lead: tuple[int, ...], integral: bool, shared=False):
    """The gather of B (each (lead.., K.., N), K spans of `ks`; `shared`: each a stack of
    one B, (batch, K.., N) with stride 0, read once) as one (lead.., K, N) operand
    (`batch._general`, `batch._shared_b`): that operand, and per B (the order its K axes are
    gathered in, the view of the buffer its fill writes, the view of B that fill reads: a
    function of B, or None for B itself). B stored N-major (`k_order`) is gathered N-major,
    (lead.., N, K), its K axes in memory order; any other as it is."""
    mats = [b[0] for b in bs] if shared else bs
    nl, n = len(lead), mats[0].shape[-1]
    perms = [k_order(b, nl) for b in mats]
    n_major = all(perms)
    if not n_major:
        perms = [tuple(range(b.ndim - nl - 1)) for b in mats]
    w = buffer((*lead, n, sum(ks)) if n_major else (*lead, sum(ks), n), integral)
    at, parts = 0, []
    for b, k, perm in zip(mats, ks, perms, strict=True):
        if n_major:  # (lead.., N, K..)
            axes, ws = (*range(nl), b.ndim - 1, *(nl + i for i in perm)), w[..., at : at + k]
        else:
            axes, ws = tuple(range(b.ndim)), w[..., at : at + k, :]
        src = None
        if shared or n_major:
            src = functools.partial(_first if shared else np.transpose, axes=axes)
        parts.append((perm, ws.reshape(b.transpose(axes).shape), src))
        at += k
    return (w.swapaxes(-1, -2) if n_major else w), parts


def _first(a: np.ndarray, axes) -> np.ndarray:
    return a[0].transpose(axes)


def fill(dst: np.ndarray, src: np.ndarray, zp: int) -> int:
    """Copy the int8/uint8 values `src` into `dst` (a view of a `buffer`, same shape): as
    float32 minus the zero point (returns 0), or as int8 (uint8 with its top bit flipped),
    returning the correction da = shift - zp, wrapped to int32."""
    if dst.dtype == np.float32:
        if zp:  # gathered and shifted in one pass, exact: small integers
            np.subtract(src, np.float32(zp), out=dst, dtype=np.float32)
        else:
            np.copyto(dst, src, casting="unsafe")
        return 0
    if src.dtype == np.uint8:
        # x - 128, as int8, gathered and flipped in one pass (a copy and then an in-place
        # flip read the gathered bytes twice)
        np.bitwise_xor(src, np.uint8(0x80), out=dst.view(np.uint8))
        return _wrap(128 - zp)
    np.copyto(dst, src)
    return _wrap(-zp)


def product(
    x: np.ndarray,
    w: np.ndarray,
    term: int,
    spans,
    scratch: Scratch | None = None,
    ones: bool = False,
) -> np.ndarray:
    """int32 (wrapped) (x - zp) @ (w - zp) of (stacks of) gathered operands: float32 ones
    (`exact_product`, zero points already subtracted, the result in `scratch` if given) or
    int8 ones with `spans`, one (k_lo, k_hi, da, db) per stretch of K gathered by `fill`.
    With `ones` (int8), x's last row is all ones and not an operand's: its products are w's
    column sums (exact, as every product of `_int_mm`), which the correction then takes
    instead of computing them, and the result leaves that row out."""
    if x.dtype == np.float32:
        return exact_product(x, w, term, scratch)
    mm = _int_mm()
    torch = _torch()
    threads = torch.get_num_threads()
    if threads != 1:
        torch.set_num_threads(1)  # the simulator's products are many: one thread each
    try:
        if x.ndim == 2:
            out = mm(_tensor(torch, x), _tensor(torch, w)).numpy()
        else:
            out = np.empty(x.shape[:-1] + w.shape[-1:], np.int32)
            for i in np.ndindex(*x.shape[:-2]):
                out[i] = mm(_tensor(torch, x[i]), _tensor(torch, w[i])).numpy()
    finally:
        if threads != 1:
            torch.set_num_threads(threads)
    sums = None
    if ones:
        sums, out, x = out[..., -1, :], out[..., :-1, :], x[..., :-1, :]
    _correct(out, x, w, spans, sums)
    return out


def _correct(out: np.ndarray, x: np.ndarray, w: np.ndarray, spans, sums=None) -> None:
    """out += the zero points' corrections of every span (`product`): the column sums of B
    and the row sums of A over adjacent spans of one correction taken in one pass, all of
    them summed into one vector of each before the one add of it into `out` -- the same
    integers (wrapping int32 arithmetic is a ring), a pass over `out` each, not one a span.
    `sums`: B's column sums over all of K, taken when one correction spans all of it."""
    col = row = None
    const = 0
    stretches = _stretches([(lo, hi, da) for lo, hi, da, _ in spans])
    if sums is not None and len(stretches) == 1 and stretches[0][:2] == (0, w.shape[-2]):
        col = np.multiply(sums, np.int32(stretches[0][2]), dtype=np.int32)
        stretches = []
    for lo, hi, d in stretches:
        c = np.multiply(_sums(w[..., lo:hi, :], False), np.int32(d), dtype=np.int32)
        col = c if col is None else np.add(col, c, out=col)
    for lo, hi, d in _stretches([(lo, hi, db) for lo, hi, _, db in spans]):
        r = np.multiply(_sums(x[..., lo:hi], True), np.int32(d), dtype=np.int32)
        row = r if row is None else np.add(row, r, out=row)
    for lo, hi, da, db in spans:
        const = _wrap(const + (hi - lo) * da * db)
    if col is not None:
        out += col[..., None, :]
    if row is not None:
        if const:  # one pass over `out` fewer: the constant goes into the row term
            row += np.int32(const)
        out += row[..., None]
    elif const:
        out += np.int32(const)


def _sums(a: np.ndarray, rows: bool) -> np.ndarray:
    """The int32 sums of (a stack of) int8 matrices along K -- each row's (`rows`: of A,
    (.., M, K)) or each column's (of B, (.., K, N)) -- as products with a vector of ones on
    `torch._int_mm` (exact, as its probe shows; 3-5x faster than numpy's int8 -> int32
    reduction, measured), one per matrix of the stack: a matrix alone without the stack's
    loop and its result (11 -> 6 us for (256, 16), measured)."""
    mm, torch = _int_mm(), _torch()
    k = a.shape[-1] if rows else a.shape[-2]
    ones = _ones(k, rows)
    if a.ndim == 2:
        t = _tensor(torch, a)
        return (mm(t, ones) if rows else mm(ones, t)).numpy().reshape(-1)
    out = np.empty(a.shape[:-1] if rows else a.shape[:-2] + a.shape[-1:], np.int32)
    for i in np.ndindex(*a.shape[:-2]):
        t = _tensor(torch, a[i])
        out[i] = (mm(t, ones) if rows else mm(ones, t)).numpy().reshape(-1)
    return out


@functools.lru_cache(maxsize=64)
def _ones(k: int, column: bool):
    """A (k, 1) or (1, k) int8 tensor of ones (`_sums`)."""
    return _torch().ones((k, 1) if column else (1, k), dtype=_torch().int8)


def _stretches(spans: list[tuple[int, int, int]]) -> list[tuple[int, int, int]]:
    """(lo, hi, d) of the nonzero corrections `d`, adjacent spans of the same one merged."""
    out: list[tuple[int, int, int]] = []
    for lo, hi, d in spans:
        if not d:
            continue
        if out and out[-1][1] == lo and out[-1][2] == d:
            out[-1] = (out[-1][0], hi, d)
        else:
            out.append((lo, hi, d))
    return out


@contextlib.contextmanager
def one_thread():
    """torch at one thread meanwhile, if it is loaded (`simulate`): `product`'s calls then
    need not set it each (15 us a call, measured)."""
    torch = sys.modules.get("torch")
    threads = torch.get_num_threads() if torch is not None else 1
    if threads != 1:
        torch.set_num_threads(1)
    try:
        yield
    finally:
        if threads != 1:
            torch.set_num_threads(threads)


def _tensor(torch, a: np.ndarray):
    """A 2-D operand as a tensor with the strides of a row-major or a column-major matrix:
    a view whose one row or column has another stride (a (K, 1) buffer's transpose, strides
    (1, 1)) gives wrong integers from torch._int_mm (torch 2.13, measured), so such a view
    gets its canonical strides, and anything else strided is copied."""
    (m, n), isz = a.shape, a.itemsize
    if m > 1 and n > 1 and a.strides in ((n * isz, isz), (isz, m * isz)):
        return torch.from_numpy(a)
    if a.flags.c_contiguous:
        a = np.lib.stride_tricks.as_strided(a, (m, n), (n * isz, isz))
    elif a.flags.f_contiguous:
        a = np.lib.stride_tricks.as_strided(a, (m, n), (isz, m * isz))
    else:
        a = np.ascontiguousarray(a)
    return torch.from_numpy(a)


def _wrap(v: int) -> int:
    return (v + (1 << 31)) % (1 << 32) - (1 << 31)


@functools.lru_cache(maxsize=1)
def _torch():
    import torch  # only when a product is large enough to use it

    return torch


@functools.lru_cache(maxsize=1)
def _int_mm():
    """`torch._int_mm` if it gives exact wrapped int32 products here, else None."""
    try:
        torch = _torch()
        mm = torch._int_mm
    except (ImportError, AttributeError):
        return None
    return mm if _probe(torch, mm) else None


@functools.lru_cache(maxsize=1)
def _int_mm_pays() -> bool:
    """Whether `torch._int_mm` multiplies int8 faster than numpy's float32 BLAS does the
    same integers, at one thread: which of the two exact arithmetics `integer` picks (if the
    probe trusts it), a choice that changes no value and no counter. False without torch or
    its `_int_mm`. Each is warmed up a few calls first (oneDNN's first two calls of a shape
    cost 5 ms and 3x the rest, measured), then timed interleaved with the other, the least of
    several runs each: one warm-up and three runs in a row saw a 3x faster int8 (15 vs 46 us,
    AVX512-VNNI) lose to float32 in one process in three on a loaded machine."""
    try:
        torch = _torch()
        mm = torch._int_mm
    except (ImportError, AttributeError):
        return False
    m, k, n = SPEED_PROBE_SHAPE
    rng = np.random.default_rng(0)
    a = rng.integers(-128, 128, (m, k), dtype=np.int8)
    b = rng.integers(-128, 128, (k, n), dtype=np.int8)
    ta, tb = torch.from_numpy(a), torch.from_numpy(b)
    fa, fb = a.astype(np.float32), b.astype(np.float32)
    with one_thread():
        ints, floats = _best(
            (lambda: mm(ta, tb).numpy(), lambda: (fa @ fb).astype(np.int32)), PROBE_RUNS
        )
    return ints < floats


# warm-up calls and timed runs of each arithmetic (`_int_mm_pays`)
PROBE_WARMUP, PROBE_RUNS = 3, 7


def _best(calls, runs: int) -> list[float]:
    """The least wall time of `runs` calls of each of `calls`, timed in turns, after
    PROBE_WARMUP untimed calls of each."""
    for call in calls:
        for _ in range(PROBE_WARMUP):
            call()
    best = [float("inf")] * len(calls)
    for _ in range(runs):
        for i, call in enumerate(calls):
            t0 = time.perf_counter()
            call()
            best[i] = min(best[i], time.perf_counter() - t0)
    return best


def _probe(torch, mm) -> bool:
    """The exact, wrapped integers for extreme operands (pair sums beyond int16, totals
    beyond int32) and random ones, over shapes that take different kernels."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    rng = np.random.default_rng(0)
    try:
        for m, k, n in ((1, 8, 8), (7, 3, 5), (17, 100, 9), (64, 64, 64), (300, 576, 64)):
            for va, vb in ((-128, -128), (127, 127), (-128, 127), (127, -128), (None, None)):
                if va is None:
                    a = rng.integers(-128, 128, (m, k), dtype=np.int8)
                    b = rng.integers(-128, 128, (k, n), dtype=np.int8)
                    want = (a.astype(np.int64) @ b.astype(np.int64)).astype(np.int32)
                else:
                    a, b = np.full((m, k), va, np.int8), np.full((k, n), vb, np.int8)
                    want = np.full((m, n), _wrap(va * vb * k), np.int32)
                got = mm(torch.from_numpy(a), torch.from_numpy(b)).numpy()
                if got.dtype != np.int32 or not np.array_equal(got, want):
                    return False
        a = np.full((16, 140_000), -128, np.int8)
        b = np.full((140_000, 8), -128, np.int8)
        got = mm(torch.from_numpy(a), torch.from_numpy(b)).numpy()
        return bool((got == _wrap(16384 * 140_000)).all())  # int32 wrap, not saturation
    except (RuntimeError, TypeError, ValueError):
        return False
    finally:
        torch.set_num_threads(threads)
