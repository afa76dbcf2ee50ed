"""Instruction selection: a statement instance (or a band of them) as vector
instructions or MATMULs over views of its buffers."""

from __future__ import annotations

import numpy as np

from tensorgen.codegen.compiled import align, row_major
from tensorgen.codegen.emitter import _expr
from tensorgen.codegen.lowering.walk import BAND_LEVEL
from tensorgen.codegen.vector import VectorExpr
from tensorgen.errors import CapacityError, CodegenError
from tensorgen.ir.core import Access, Statement
from tensorgen.ir.queries import mac_mapping
from tensorgen.mc import isa
from tensorgen.mc.operands import ITEMSIZE, LoopAffine, View


class _InstructionSelection:
    """Methods of the scheduled lowering (tensorgen.codegen.scheduled._Lowering), one pass."""

    # -- statements -------------------------------------------------------------------------
    def _user(self, call, env, band) -> None:
        ast_name = call.get_op_arg(0).get_id().get_name()
        stmt = self.by_name[self.piece_of.get(ast_name, ast_name)]
        values = {}
        for i, index in enumerate(stmt.indices):
            values[index] = _expr(call.get_op_arg(i + 1), env)
        kinds = {
            b[0]
            for b in self.bands
            if any(f"c{p}" in band for p in b[1]) and self._banded(ast_name, b)
        }
        if "array" in kinds:
            self._matmul(stmt, values, band, ast_name not in self.overwriting)
            return
        shape = tuple(n for _, n in sorted(band.values())) or (1,)

        def view_of(acc: Access) -> View:
            return self._view(acc, values, band)

        def temp(slot: int) -> View:
            nbytes = align(4 * int(np.prod(shape)))
            base = self.temp_base + slot * nbytes
            if base + nbytes > self.target.spad.bytes:
                raise CapacityError(
                    f"vector temporaries overflow the scratchpad of {self.target.name}"
                )
            return View("spad", "int32", LoopAffine.make(base), shape, row_major(shape))

        if band:
            lhs = self._view(stmt.lhs, values, band)
            if 0 in lhs.strides and stmt.op != "=":
                raise CodegenError(
                    f"vectorize: {stmt.name} reduces along the vector lanes; vectorize a loop "
                    f"that indexes its output"
                )
        VectorExpr(
            self.em, self.program, stmt, view_of, temp, overwrite=ast_name in self.overwriting
        ).statement()

    def _view(self, acc: Access, values: dict[str, LoopAffine], band) -> View:
        if self.active.get(acc.tensor) is None:
            raise CodegenError(f"{acc.tensor} is accessed outside the loop it is staged at")
        mem, base, origin, size = self.active[acc.tensor]
        t = self.program.tensor(acc.tensor)
        strides = self._strides(acc.tensor, size)
        addr = LoopAffine.make(base)
        comp = self.compact.get(acc.tensor)
        for d, sub in enumerate(acc.index):
            elem = LoopAffine.make(sub.const) + origin[d].scale(-1)
            for name, c in sub.terms:
                elem = elem + values[name].scale(c)
            if comp is not None and d == comp[0]:  # the row among the accessed rows
                step = comp[1]
                if elem.const % step or any(c % step for c in elem.coefs):
                    raise CodegenError(
                        f"{acc} does not step by {step} along dimension {d} of {acc.tensor}"
                    )
                elem = LoopAffine.make(elem.const // step, tuple(c // step for c in elem.coefs))
            addr = addr + elem.scale(strides[d] * t.itemsize)
        coefs = list(addr.coefs) + [0] * (BAND_LEVEL + 8 - len(addr.coefs))
        lane_strides = []
        for _, (slot, _) in sorted(band.items(), key=lambda kv: kv[1][0]):
            c = coefs[BAND_LEVEL + slot]
            if c % t.itemsize:
                raise CodegenError(f"unaligned lane stride for {acc}")
            lane_strides.append(c // t.itemsize)
            coefs[BAND_LEVEL + slot] = 0
        base_aff = LoopAffine.make(addr.const, tuple(coefs[:BAND_LEVEL]))
        if not band:
            return View(mem, t.dtype, base_aff, (1,), (1,))
        shape = tuple(n for _, (_, n) in sorted(band.items(), key=lambda kv: kv[1][0]))
        return View(mem, t.dtype, base_aff, shape, tuple(lane_strides))

    def _strides(self, tensor: str, size: tuple[int, ...]) -> tuple[int, ...]:
        """Element strides of a buffer of `tensor` holding a box of `size`: row-major in the
        order its stage's layout gives (the tensor's own order by default)."""
        order = self.layouts.get(tensor, tuple(range(len(size))))
        strides = [0] * len(size)
        step = 1
        for d in reversed(order):
            strides[d] = step
            step *= size[d]
        return tuple(strides)

    def _matmul(self, stmt: Statement, values, band, accumulate: bool = True) -> None:
        """A band of `stmt` tensorized as MATMULs: its loops are M, N or K by which operands they
        move, the K loops one run of addresses cut into chunks of the array's rows; the first
        chunk overwrites the accumulator unless `accumulate`."""
        mp = mac_mapping(self.program, stmt)
        if mp is None or not band:
            raise CodegenError(
                f"tensorize: {stmt.name} is not an 8-bit contraction 'acc += a * b' over the band"
            )
        acc = self._view(stmt.lhs, values, band)
        a, b = self._view(mp.a, values, band), self._view(mp.b, values, band)
        ms, n, k = _band_roles(stmt.name, acc, a, b, len(band))
        if (
            self._declared_n(stmt, band) in ms
        ):  # tensorize named a loop of the usual M as N: swap the roles
            mp, a, b, ms, n = mp.swapped(), b, a, n, ms
        # isl emits no loop for a band loop of one iteration (a single row of M): it is a slot of size 1
        ms, n = ms or [None], n or [None]
        if len(n) != 1:
            raise CodegenError(
                f"tensorize: the band of {stmt.name} is not (m.., n, k..) of a matmul"
            )
        (n,) = n
        a_k, b_k, depth = _coalesced_k(a, b, k)
        self._check_fits_array(stmt, a, b, k, n, depth)
        acc_v, a_v, b_v = _pick(acc, *ms, n), _pick(a, *ms, None), _pick(b, None, n)
        for lo in range(0, depth, self.target.rows):
            rows = min(self.target.rows, depth - lo)
            # a block that holds the first update of all it writes overwrites with its first MATMUL
            self.em.emit(
                isa.make(
                    "MATMUL",
                    acc=acc_v,
                    a=_k_chunk(a_v, -1, lo, rows, a_k),
                    b=_k_chunk(b_v, 0, lo, rows, b_k),
                    accumulate=int(lo > 0 or accumulate),
                    a_zp=mp.a_zp,
                    b_zp=mp.b_zp,
                )
            )

    def _check_fits_array(self, stmt: Statement, a: View, b: View, k, n, depth) -> None:
        """Refuse a band whose K loops are not one run of addresses in both operands, or whose N
        is wider than the array (a K deeper than it is cut into chunks, but only one K loop)."""
        if depth is None:
            raise CodegenError(
                f"tensorize: the K loops of {stmt.name} are not one run of addresses in both "
                f"operands' buffers (strides {[a.strides[x] for x in k]} and "
                f"{[b.strides[x] for x in k]}); stage them with a layout that makes them one"
            )
        if _pick(b, n).shape[0] > self.target.cols:
            raise CodegenError(
                f"tensorize: N={_pick(b, n).shape[0]} exceeds the {self.target.cols} columns of "
                f"the array; split first"
            )
        if len(k) == 1 and depth > self.target.rows:
            raise CodegenError(
                f"tensorize: K={depth} exceeds the {self.target.rows} rows of the array; split first"
            )


def _band_roles(
    name: str, acc: View, a: View, b: View, slots: int
) -> tuple[list[int], list[int], list[int]]:
    """The band's slots as the M, N and K of a matmul, by the operands each moves: K moves a and
    b but not acc, M moves acc and a, N moves acc and b."""
    ms, n, k = [], [], []
    for slot in range(slots):
        moves = (acc.strides[slot] != 0, a.strides[slot] != 0, b.strides[slot] != 0)
        role = {(False, True, True): k, (True, True, False): ms, (True, False, True): n}.get(moves)
        if role is None:
            raise CodegenError(
                f"tensorize: a loop of the band of {name} is not m, n or k of a matmul"
            )
        role.append(slot)
    return ms, n, k


def _pick(v: View, *slots: int | None) -> View:
    """The view over the band slots `slots` only, in that order; None is a dimension of one."""
    return View(
        v.mem,
        v.dtype,
        v.base,
        tuple(1 if x is None else v.shape[x] for x in slots),
        tuple(0 if x is None else v.strides[x] for x in slots),
    )


def _k_chunk(v: View, axis: int, lo: int, rows: int, stride: int) -> View:
    """Rows lo..lo+rows of the coalesced K run of an operand, its dimension `axis` (the last of
    a, the first of b), whose element stride is `stride`: one MATMUL's share of K."""
    shape, strides = list(v.shape), list(v.strides)
    shape[axis], strides[axis] = rows, stride
    return View(
        v.mem, v.dtype, v.base + lo * stride * ITEMSIZE[v.dtype], tuple(shape), tuple(strides)
    )


def _coalesced_k(a: View, b: View, k: list[int | None]) -> tuple[int, int, int | None]:
    """The element strides in `a` and `b` of the run of addresses the K slots `k` make together,
    and its length; length None when they do not make one run in both (a slot's stride must be
    the next inner slot's stride times its extent, in both operands)."""
    slots = [x for x in k if x is not None]
    if not slots:
        return 0, 0, 1
    order = sorted(slots, key=lambda x: (abs(a.strides[x]), abs(b.strides[x])))
    inner = order[0]
    sa, sb, depth = a.strides[inner], b.strides[inner], a.shape[inner]
    for x in order[1:]:
        if a.strides[x] != sa * depth or b.strides[x] != sb * depth:
            return sa, sb, None
        depth *= a.shape[x]
    return sa, sb, depth
