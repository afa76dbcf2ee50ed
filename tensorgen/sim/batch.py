"""The simulator's fast path for MATMULs: operands decoded once, exact narrow arithmetic, and
runs of MATMULs into one accumulator (a peeled `accumulate=0` MATMUL and the LOOP/LOOPB nest
around the accumulating one after it) computed as one BLAS call.

Values are exact: int8/uint8 operands are multiplied as int8 on torch._int_mm with their zero
points as int32 corrections, or minus their zero points in float32 while every partial sum
stays below 2**24 (chunked over K beyond that) -- `tensorgen.sim.products` chooses; the int32
accumulator wraps in place. Timing, counters, hazards and trace events are computed per MATMUL exactly as
stepping them one by one would (`tensorgen.sim.machine.Simulator._step_run`).
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from tensorgen.mc import isa
from tensorgen.mc.operands import ITEMSIZE, View
from tensorgen.sim import products, rowruns

# a batched run's gathered operands stay this small; a larger run computes MATMUL by MATMUL
MAX_BATCH_ELEMENTS = 1 << 22
NARROW = {"int8": (-128, 127), "uint8": (0, 255)}


@dataclass(frozen=True)
class Decoded:
    """A view with everything but its base address precomputed (bytes throughout)."""

    mem: str
    dtype: np.dtype
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    const: int
    coefs: tuple[int, ...]
    lo: int  # first byte touched, relative to the base
    hi: int  # one past the last byte touched, relative to the base

    @staticmethod
    def of(view: View) -> Decoded:
        isz = ITEMSIZE[view.dtype]
        strides = tuple(s * isz for s in view.strides)
        lo = sum(min(0, (n - 1) * s) for n, s in zip(view.shape, strides, strict=True))
        hi = sum(max(0, (n - 1) * s) for n, s in zip(view.shape, strides, strict=True)) + isz
        dt = np.dtype(view.dtype)
        return Decoded(view.mem, dt, view.shape, strides, view.base.const, view.base.coefs, lo, hi)

    def base(self, counters: tuple[int, ...]) -> int:
        if len(self.coefs) > len(counters):
            raise IndexError("an address uses the counter of a loop that does not enclose it")
        b = self.const
        for c, n in zip(self.coefs, counters, strict=False):
            b += c * n
        return b

    def array(self, memory: np.ndarray, base: int) -> np.ndarray:
        return np.ndarray(self.shape, self.dtype, buffer=memory, offset=base, strides=self.strides)


@dataclass(frozen=True)
class MatmulOp:
    """One static MATMUL, decoded: its operands and the bound on |product terms|."""

    acc: Decoded
    a: Decoded
    b: Decoded
    accumulate: int
    a_zp: int
    b_zp: int
    term: int  # the largest |(a - a_zp) * (b - b_zp)|

    @staticmethod
    def of(ins: isa.Instruction) -> MatmulOp | None:
        """None when the fast kernel does not apply (operands other than int8/uint8 into an
        int32 accumulator, a crafted shape or zero points): the instruction's own semantics
        run then."""
        f = dict(ins.args)
        a, b, acc = f["a"], f["b"], f["acc"]
        if a.dtype not in NARROW or b.dtype not in NARROW or acc.dtype != "int32":
            return None
        if len(b.shape) != 2 or not a.shape or a.shape[-1] != b.shape[0]:
            return None
        if math.prod(acc.shape) != math.prod(a.shape[:-1]) * b.shape[1]:
            return None
        xa = max(abs(v - f["a_zp"]) for v in NARROW[a.dtype])
        xb = max(abs(v - f["b_zp"]) for v in NARROW[b.dtype])
        if xa * xb >= products.FLOAT32_EXACT:
            return None  # crafted zero points: not even one product is exact in float32
        return MatmulOp(
            Decoded.of(acc),
            Decoded.of(a),
            Decoded.of(b),
            int(f["accumulate"]),
            int(f["a_zp"]),
            int(f["b_zp"]),
            xa * xb,
        )

    def operands(self) -> tuple[tuple[str, Decoded, bool], ...]:
        """(field, view, written) in the order the instruction's semantics touch them."""
        reads = (("a", self.a, False), ("b", self.b, False))
        if self.accumulate:
            return (*reads, ("acc", self.acc, False), ("acc", self.acc, True))
        return (*reads, ("acc", self.acc, True))


@dataclass(frozen=True)
class Piece:
    """Operands of part of a run's reduction: `a` (M.., K..) and `b` (K.., N) arrays whose
    K axes, flattened in order, line up; their zero points and product bound."""

    a: np.ndarray
    b: np.ndarray
    a_zp: int
    b_zp: int
    term: int

    @property
    def k(self) -> int:
        return self.b.size // self.b.shape[-1]


def piece(op: MatmulOp, mem: dict[str, np.ndarray], bases: tuple[int, int, int]) -> Piece:
    """One MATMUL's operands at byte bases (acc, a, b)."""
    a = op.a.array(mem[op.a.mem], bases[1])
    b = op.b.array(mem[op.b.mem], bases[2])
    return Piece(a, b, op.a_zp, op.b_zp, op.term)


def box_piece(
    op: MatmulOp,
    mem: dict[str, np.ndarray],
    bases: tuple[int, int, int],
    dims: tuple[int, ...],
    levels: tuple[int, ...],
    lead: tuple[int, int, int] | None = None,
) -> Piece:
    """The operands of the MATMULs of a rectangular nest (`dims` iterations of loop `levels`,
    counters from the corner whose operand bases are `bases`): the loop axes are more
    reduction depth, (M.., dims.., K) against (dims.., K, N). With `lead` (count, a step, b
    step), both have a leading axis of `count` such nests that many bytes apart
    (`batched_piece`)."""
    a_co = tuple(op.a.coefs[lv] if lv < len(op.a.coefs) else 0 for lv in levels)
    b_co = tuple(op.b.coefs[lv] if lv < len(op.b.coefs) else 0 for lv in levels)
    nm = len(op.a.shape) - 1  # a's loop axes go between its M axes and its K axis
    shape_a, strides_a = op.a.shape[:nm] + dims + op.a.shape[nm:], op.a.strides[:nm] + a_co
    shape_b, strides_b = dims + op.b.shape, b_co + op.b.strides
    strides_a += op.a.strides[nm:]
    if lead is not None:
        shape_a, strides_a = (lead[0], *shape_a), (lead[1], *strides_a)
        shape_b, strides_b = (lead[0], *shape_b), (lead[2], *strides_b)
    a = np.ndarray(shape_a, op.a.dtype, buffer=mem[op.a.mem], offset=bases[1], strides=strides_a)
    b = np.ndarray(shape_b, op.b.dtype, buffer=mem[op.b.mem], offset=bases[2], strides=strides_b)
    return Piece(a, b, op.a_zp, op.b_zp, op.term)


def reduce_into(acc: np.ndarray, pieces: list[Piece], accumulate: int, batch: int = 0) -> None:
    """acc (+)= the sum of the pieces' products, exactly, wrapping like int32: one product over
    the concatenated K (`tensorgen.sim.products`: int8 on torch._int_mm, or float32 chunked
    under the 2**24 bound). With `batch`, acc and every operand have a leading axis of that
    many independent reductions (`batched`), computed as one stacked product."""
    if batch and all(p.a.strides[0] == 0 for p in pieces):
        _reduce_shared(acc, pieces, accumulate, batch)
        return
    if batch and all(p.b.strides[0] == 0 for p in pieces):
        _reduce_shared_b(acc, pieces, accumulate, batch)
        return
    _run(acc, pieces, accumulate, _layout(_general, acc.shape, pieces, batch))


@dataclass(frozen=True)
class _Layout:
    """How one geometry of a reduction is gathered and multiplied, built once (`_layout`):
    per piece (k_lo, k_hi, the view of the gather buffer its A fills, the view of A it
    reads (a function of the piece's A, or None for A itself), likewise for B), and `product`
    (spans -> the product, shaped like acc). The buffers are the layout's own, used again by
    every reduction of that geometry: each call fills all of them before it multiplies."""

    parts: tuple[tuple, ...]
    product: Callable[[list], np.ndarray]
    nbytes: int


# layouts by geometry (shapes, strides, dtypes, zero points of acc and the pieces), and the
# bytes their buffers hold: cleared beyond the limit (a new geometry is only slower)
_LAYOUTS: dict[tuple, _Layout] = {}
_LAYOUT_BYTES = [0]
LAYOUT_CACHE_BYTES = 64 << 20


def _layout(build: Callable, shape: tuple[int, ...], pieces: list[Piece], batch: int) -> _Layout:
    key = (build, shape, batch, products.ENABLED, products.MIN_INT_MACS)
    key += (products.ONLY_WHERE_FASTER,) + tuple(
        (p.a.shape, p.a.strides, p.a.dtype, p.b.shape, p.b.strides, p.b.dtype, p.a_zp, p.b_zp)
        + (p.term,)
        for p in pieces
    )
    lay = _LAYOUTS.get(key)
    if lay is None:
        lay = build(shape, pieces, batch)
        if _LAYOUT_BYTES[0] + lay.nbytes > LAYOUT_CACHE_BYTES:
            _LAYOUTS.clear()
            _LAYOUT_BYTES[0] = 0
        _LAYOUTS[key] = lay
        _LAYOUT_BYTES[0] += lay.nbytes
    return lay


def _run(acc: np.ndarray, pieces: list[Piece], accumulate: int, lay: _Layout) -> None:
    fill, spans = products.fill, []
    for p, (lo, hi, xd, src_a, wd, src_b) in zip(pieces, lay.parts, strict=True):
        da = fill(xd, p.a if src_a is None else src_a(p.a), p.a_zp)
        spans.append((lo, hi, da, fill(wd, p.b if src_b is None else src_b(p.b), p.b_zp)))
    prod = lay.product(spans)
    if accumulate:
        acc += prod  # int32 in place: wraps as the hardware's accumulator does
    else:
        acc[...] = prod


def _general(shape: tuple[int, ...], pieces: list[Piece], batch: int) -> _Layout:
    """`reduce_into`'s layout without a shared operand: (lead.., M, K) @ (lead.., K, N), or
    the transposed product when A's M axis is its contiguous one (`_transposed`)."""
    lead = (batch,) if batch else ()
    n = pieces[0].b.shape[-1]
    m = math.prod(shape) // n // (batch or 1)
    ks = [p.b.size // n // (batch or 1) for p in pieces]
    ints = products.integer(m, sum(ks), n)
    if _m_contiguous(pieces[0], len(lead)):
        return _transposed(shape, pieces, lead, (n, m, ks), ints)
    x, xf = _gather_a((*lead, m, sum(ks)), ints, -2)
    w, b_parts = products.stacked([p.b for p in pieces], ks, lead, ints)
    at, parts = 0, []
    for p, k, (perm, wd, src_b) in zip(pieces, ks, b_parts, strict=True):
        nd, nk = p.a.ndim, len(perm)  # (lead.., M.., K..), its K axes in B's gather order
        src_a = None
        if perm != tuple(range(nk)):
            src_a = functools.partial(
                np.transpose, axes=(*range(nd - nk), *(nd - nk + i for i in perm))
            )
        a = p.a if src_a is None else src_a(p.a)
        parts.append((at, at + k, _view(x[..., at : at + k], a.shape), src_a, wd, src_b))
        at += k
    term, scratch = max(p.term for p in pieces), products.Scratch()
    return _Layout(
        tuple(parts),
        lambda spans: products.product(xf, w, term, spans, scratch, ints).reshape(shape),
        xf.nbytes + w.nbytes,
    )


def _gather_a(shape: tuple[int, ...], ints: bool, axis: int) -> tuple[np.ndarray, np.ndarray]:
    """A's gather buffer of `shape` (`products.buffer`; `axis` its M axis) and the array the
    product takes: itself in float32; in int8 the buffer it is a view of, one row longer along
    M, that row all ones -- its products with B are B's column sums, which the zero points'
    correction needs (`products.product`'s `ones`), computed in the GEMM itself rather than
    in one small GEMM per matrix after it. No fill writes that row."""
    if not ints:
        x = products.buffer(shape, False)
        return x, x
    axis %= len(shape)
    full = products.buffer((*shape[:axis], shape[axis] + 1, *shape[axis + 1 :]), True)
    at = (slice(None),) * axis
    full[(*at, -1)] = 1
    return full[(*at, slice(0, shape[axis]))], full


def _view(a: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """`a` reshaped, necessarily a view (a fill writes through it into a gather buffer)."""
    return np.reshape(a, shape, copy=False)


def _m_contiguous(p: Piece, lead: int) -> bool:
    """Whether A's last M axis is closer-strided than its last K axis (channel-major
    activations): its copy is then cheaper K-major, for the transposed product."""
    nk = p.b.ndim - lead - 1
    return p.a.ndim - lead - nk > 0 and abs(p.a.strides[-1]) > abs(p.a.strides[-1 - nk])


def _transposed(shape, pieces: list[Piece], lead, dims, ints) -> _Layout:
    """`reduce_into`'s general case with A gathered K-major, (lead.., K, M), for A whose M
    axis is the contiguous one (`_m_contiguous`): in float32 the product B^T @ A^T, (lead..,
    N, K) @ (lead.., K, M); in int8 A^T's transposed view against B. The same integers: the
    same dot products over the same K, int32 sums wrapping alike. A's last two M axes are
    gathered as one run when the rows of a padded tile make that cheaper (`rowruns.rows_merge`)."""
    n, m, ks = dims
    nl = len(lead)
    merge = rowruns.rows_merge([(p.a, p.b.ndim - nl - 1) for p in pieces], nl)
    if merge is not None:
        m = m // (merge[0] * merge[1]) * merge[3]
    x, xf = _gather_a((*lead, sum(ks), m), ints, -1)
    w, b_parts = products.stacked([p.b for p in pieces], ks, lead, ints)
    at, parts = 0, []
    for p, k, (perm, wd, src_b) in zip(pieces, ks, b_parts, strict=True):
        xs, nk, nd = x[..., at : at + k, :], len(perm), p.a.ndim
        # (lead.., M.., K..) -> (lead.., K.., M..), the K axes in B's gather order
        axes = (*range(nl), *(nd - nk + i for i in perm), *range(nl, nd - nk))
        if merge is None:
            src = functools.partial(np.transpose, axes=axes)
        else:
            src = functools.partial(rowruns.merged_transpose, axes=axes, merge=merge)
        parts.append((at, at + k, _view(xs, src(p.a).shape), src, wd, src_b))
        at += k
    term, scratch = max(p.term for p in pieces), products.Scratch()
    xt, wt = xf.swapaxes(-1, -2), w.swapaxes(-1, -2)

    def product(spans) -> np.ndarray:
        if ints:
            prod = products.product(xt, w, term, spans, ones=True)
        else:
            prod = products.product(wt, x, term, spans, scratch).swapaxes(-1, -2)
        if merge is not None:
            prod = rowruns.unmerged(prod, merge)
        return prod.reshape(shape)

    return _Layout(tuple(parts), product, xf.nbytes + w.nbytes)


def _reduce_shared(acc: np.ndarray, pieces: list[Piece], accumulate: int, batch: int) -> None:
    """`reduce_into` of a batch sharing A (a conv's activations against each output-channel
    block's weights): A against the batch's B side by side, (M, K) @ (K, batch * N); a K-major
    A's padded tile rows gathered as one run each (`rowruns.rows_merge`: 14x14 rows of 16, 4.0x)."""
    _run(acc, pieces, accumulate, _layout(_shared_a, acc.shape, pieces, batch))


def _shared_a(shape, pieces: list[Piece], batch: int) -> _Layout:
    n = pieces[0].b.shape[-1]
    m = math.prod(shape) // n // batch
    ks = [p.b.size // n // batch for p in pieces]
    ints = products.integer(m, sum(ks), batch * n)
    t = _m_contiguous(pieces[0], 1)  # then x is (K, M), for the transposed product
    merge = rowruns.rows_merge([(p.a[0], p.b.ndim - 2) for p in pieces], 0) if t else None
    m = m if merge is None else m // (merge[0] * merge[1]) * merge[3]  # as `_transposed`
    x, xf = _gather_a((sum(ks), m) if t else (m, sum(ks)), ints, 1 if t else 0)
    w2, b_parts = products.side_by_side([p.b for p in pieces], ks, ints)
    at, parts = 0, []
    for p, k, (perm, wd, src_b) in zip(pieces, ks, b_parts, strict=True):
        xs = x[at : at + k] if t else x[:, at : at + k]
        nm = p.a.ndim - 1 - len(perm)  # a[0]'s M axes, then its K axes in B's gather order
        kax = tuple(nm + i for i in perm)
        a_axes = (*kax, *range(nm)) if t else (*range(nm), *kax)  # (K.., M..) or (M.., K..)
        src_a = functools.partial(_first, axes=a_axes, merge=merge)
        parts.append((at, at + k, _view(xs, src_a(p.a).shape), src_a, wd, src_b))
        at += k
    term, xt, scratch = max(p.term for p in pieces), xf.T, products.Scratch()

    def product(spans) -> np.ndarray:
        if t and not ints:  # (batch * N, K) @ (K, M)
            prod = products.product(w2.T, x, term, spans, scratch)
            prod = prod.reshape(batch, n, m).swapaxes(1, 2)
        else:
            prod = products.product(xt if t else xf, w2, term, spans, scratch, ints)
            prod = prod.reshape(m, batch, n).transpose(1, 0, 2)
        if merge is not None:
            prod = rowruns.unmerged(prod, merge)
        return prod.reshape(shape)

    return _Layout(tuple(parts), product, xf.nbytes + w2.nbytes)


def _first(a: np.ndarray, axes, merge=None) -> np.ndarray:
    """a[0] (shared by the stack), axes reordered, its last two merged (`rowruns.rows_merge`)."""
    a = a[0].transpose(axes)
    return a if merge is None else rowruns.merged(a, merge)


def _reduce_shared_b(acc: np.ndarray, pieces: list[Piece], accumulate: int, batch: int) -> None:
    """`reduce_into` of a batch whose B operands are the same in every reduction (the
    iterations of a loop over activations against the same weights): one product of the
    batch's A stacked on M against B, (batch * M, K) @ (K, N), B gathered once; when A's M
    axis is its contiguous one (channel-major activations), A is gathered K-major so that its
    copy reads memory along the contiguous M axis instead of a stride per element (5x cheaper
    for a 1x1 conv over channel-major activations), and in float32 the product is
    transposed, B^T @ A^T, (N, K) @ (K, batch * M). The same integers either way: every dot
    product is over the same K, and int32 sums wrap alike."""
    _run(acc, pieces, accumulate, _layout(_shared_b, acc.shape, pieces, batch))


def _shared_b(shape, pieces: list[Piece], batch: int) -> _Layout:
    n = pieces[0].b.shape[-1]
    m = math.prod(shape) // n // batch
    ks = [p.b.size // n // batch for p in pieces]
    ints = products.integer(batch * m, sum(ks), n)
    first = pieces[0]
    nk = first.b.ndim - 2  # K axes, last in A
    k_major = first.a.ndim - 1 - nk > 0 and abs(first.a.strides[-1]) > abs(first.a.strides[-1 - nk])
    # a K-major A's padded tile rows gathered as one run each, as `_transposed` does (layer1's
    # 3x3 convs: rows of 56 of 58, one copy of 230 bytes for four of 56)
    merge = rowruns.rows_merge([(p.a, p.b.ndim - 2) for p in pieces], 1) if k_major else None
    m = m if merge is None else m // (merge[0] * merge[1]) * merge[3]
    # the batch's M rows as one axis of the buffer (`_gather_a`'s row of ones after them)
    flat, xk = _gather_a(
        (sum(ks), batch * m) if k_major else (batch * m, sum(ks)), ints, int(k_major)
    )
    x = _view(flat, (sum(ks), batch, m) if k_major else (batch, m, sum(ks)))
    w, b_parts = products.stacked([p.b for p in pieces], ks, (), ints, shared=True)
    at, parts = 0, []
    for p, k, (perm, wd, src_b) in zip(pieces, ks, b_parts, strict=True):
        nd, nk = p.a.ndim, len(perm)  # A's K axes in B's gather order
        kax = tuple(nd - nk + i for i in perm)
        if k_major and merge is not None:  # (batch, M.., K..) -> (K.., batch, M.. merged)
            axes = (*kax, *range(nd - nk))
            src_a = functools.partial(rowruns.merged_transpose, axes=axes, merge=merge)
            xs = x[at : at + k]
        elif k_major:  # (batch, M.., K..) -> (K.., batch, M..)
            src_a = functools.partial(np.transpose, axes=(*kax, *range(nd - nk)))
            xs = x[at : at + k]
        else:
            src_a = functools.partial(np.transpose, axes=(*range(nd - nk), *kax))
            xs = x[..., at : at + k]
        parts.append((at, at + k, _view(xs, src_a(p.a).shape), src_a, wd, src_b))
        at += k
    term, scratch = max(p.term for p in pieces), products.Scratch()

    def product(spans) -> np.ndarray:
        if k_major and not ints:
            prod = products.product(w.T, xk, term, spans, scratch).T
        elif k_major:
            prod = products.product(xk.T, w, term, spans, ones=True)
        else:
            prod = products.product(xk, w, term, spans, scratch, ints)
        if merge is not None:
            prod = rowruns.unmerged(prod, merge)
        return prod.reshape(shape)

    return _Layout(tuple(parts), product, xk.nbytes + w.nbytes)


def batched(d: Decoded, memory: np.ndarray, base: int, count: int, step: int) -> np.ndarray:
    """View `d` of `memory` at `count` bases `step` bytes apart from `base`, stacked on a
    leading axis: the operand of every iteration of a loop, bounds checked by the caller. One
    constructor (`np.lib.stride_tricks.as_strided` of a view costs 4x as much)."""
    return np.ndarray(
        (count, *d.shape), d.dtype, buffer=memory, offset=base, strides=(step, *d.strides)
    )


def batched_piece(
    op: MatmulOp, mem: dict[str, np.ndarray], bases, count: int, a_step: int, b_step: int
) -> Piece:
    """`piece` of every iteration of a loop (`batched`)."""
    a = batched(op.a, mem[op.a.mem], bases[1], count, a_step)
    b = batched(op.b, mem[op.b.mem], bases[2], count, b_step)
    return Piece(a, b, op.a_zp, op.b_zp, op.term)


@dataclass(frozen=True)
class Nest:
    """A chain of LOOP/LOOPB around one instruction (each loop's body the rest of the chain)."""

    head: int  # pc of the outermost loop
    body: int  # pc of the instruction inside
    depth: int  # loop levels around the head
    outer_levels: tuple[int, ...]  # outer counters the LOOPB bounds read

    @staticmethod
    def at(code: list[isa.Instruction], pc: int, depth: int) -> Nest | None:
        start, levels = pc, []
        while pc < len(code) and code[pc].mnemonic in ("LOOP", "LOOPB"):
            ins = code[pc]
            if ins.arg("body") != 0 and pc + ins.arg("body") + 1 > len(code):
                return None
            if ins.mnemonic == "LOOPB":
                for bound in (ins.arg("lower"), ins.arg("upper")):
                    for aff, _ in bound.terms:
                        levels += [lv for lv, c in enumerate(aff.coefs) if c and lv < depth]
            pc += 1
        n = pc - start
        if not n or pc >= len(code) or depth + n > 8:
            return None
        if any(code[start + i].arg("body") != n - i for i in range(n)):
            return None
        return Nest(start, pc, depth, tuple(sorted(set(levels))))

    def points(self, code: list[isa.Instruction], counters: tuple[int, ...]):
        """(inner counters of every iteration in order as an (n, levels) array, loop
        iterations as stepping counts them)."""
        pts: list[tuple[int, ...]] = []
        iterations = 0

        def walk(i: int, cs: tuple[int, ...]) -> None:
            nonlocal iterations
            if self.head + i == self.body:
                pts.append(cs[len(counters) :])
                return
            ins = code[self.head + i]
            if ins.mnemonic == "LOOP":
                rng = range(ins.arg("count"))
            else:
                lo = max(ins.arg("lower").values(cs))
                hi = min(ins.arg("upper").values(cs))
                rng = range(lo, hi + 1)
            iterations += max(len(rng), 0)
            for c in rng:
                walk(i + 1, cs + (c,))

        walk(0, counters)
        levels = self.body - self.head
        return np.array(pts, np.int64).reshape(-1, levels), iterations


def box_of(points: np.ndarray) -> tuple[np.ndarray, tuple[int, ...], np.ndarray | None] | None:
    """(corner, dims, the one missing point or None) when `points` (distinct, in order) fill
    a box or all of a box but one point; None otherwise."""
    if not len(points):
        return None
    lo, hi = points.min(axis=0), points.max(axis=0)
    dims = tuple(int(n) for n in hi - lo + 1)
    size = math.prod(dims)
    if size == len(points):
        return lo, dims, None
    if size != len(points) + 1:
        return None
    present = {tuple(p) for p in points.tolist()}
    for p in itertools.product(*(range(int(a), int(b) + 1) for a, b in zip(lo, hi, strict=True))):
        if p not in present:
            return lo, dims, np.array(p, np.int64)
    return None


@dataclass(frozen=True)
class VectorOp:
    """A VMUL (dst = a * (b or imm)) or VMAC (dst += a * b) into an int32 destination,
    decoded: int32 arithmetic in place is exact, as every result wraps modulo 2**32 anyway."""

    mnemonic: str
    dst: Decoded
    a: Decoded
    b: Decoded | None
    imm: int
    b_narrow: Decoded | None = None  # b with the axes it broadcasts along (stride 0) cut to 1

    @staticmethod
    def of(ins: isa.Instruction) -> VectorOp | None:
        if ins.mnemonic not in ("VMUL", "VMAC"):
            return None
        f = dict(ins.args)
        dst, a, b = f["dst"], f["a"], f.get("b")
        ints = ("int8", "uint8", "int32")
        if dst.dtype != "int32" or a.dtype not in ints or (b is not None and b.dtype not in ints):
            return None
        if a.shape != dst.shape or (b is not None and b.shape != dst.shape):
            return None
        db = Decoded.of(b) if b is not None else None
        narrow = None
        if db is not None:  # the same values under broadcasting; a cast of it casts each once
            shape = tuple(1 if st == 0 else n for n, st in zip(db.shape, db.strides, strict=True))
            narrow = Decoded(db.mem, db.dtype, shape, db.strides, db.const, db.coefs, db.lo, db.hi)
        return VectorOp(
            ins.mnemonic, Decoded.of(dst), Decoded.of(a), db, int(f.get("imm", 0)), narrow
        )

    def operands(self) -> tuple[tuple[str, Decoded, bool], ...]:
        """(field, view, written) in the order the instruction's semantics touch them."""
        ab = (("a", self.a, False),) + ((("b", self.b, False),) if self.b is not None else ())
        if self.mnemonic == "VMAC":
            return (("dst", self.dst, False), *ab, ("dst", self.dst, True))
        return (*ab, ("dst", self.dst, True))

    def run(self, mem: dict[str, np.ndarray], bases: dict[str, int]) -> None:
        a = self.a.array(mem[self.a.mem], bases["a"])
        if self.b_narrow is not None:
            b = self.b_narrow.array(mem[self.b.mem], bases["b"]).astype(np.int32)
        else:
            b = np.int32(np.int64(self.imm).astype(np.int32))
        prod = np.multiply(a, b, dtype=np.int32)  # in int32: wraps
        dst = self.dst.array(mem[self.dst.mem], bases["dst"])
        if self.mnemonic == "VMAC":
            dst += prod
        else:
            dst[...] = prod


def compact(x: np.ndarray) -> np.ndarray:
    """`x` with every axis it broadcasts along (stride 0) cut to length 1: the same values
    under broadcasting against its shape, and a cast of it touches only the distinct ones (a
    depthwise tap's one weight, not a weight per output element)."""
    if all(st or n == 1 for n, st in zip(x.shape, x.strides, strict=True)):
        return x
    return x[tuple(slice(0, 1) if st == 0 else slice(None) for st in x.strides)]
