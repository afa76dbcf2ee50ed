"""Lowering of scheduled kernels to microcode.

`compile_program` is the whole pipeline after the schedule, as named passes:
DRAM layout, then per kernel: buffer allocation, the tile nest (isl AST),
loads, compute (MAC array or vector unit), stores; then the binary.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tensorgen.codegen.emitter import Dim, Emitter, tile_nest
from tensorgen.errors import CapacityError, CodegenError
from tensorgen.ir import poly
from tensorgen.ir.core import (
    LUT_ENTRIES,
    Access,
    BinOp,
    Call,
    Const,
    Expr,
    Program,
    Read,
    Statement,
    dtype_range,
)
from tensorgen.ir.queries import mac_mapping
from tensorgen.mc import isa
from tensorgen.mc.binary import Binary, TensorEntry
from tensorgen.mc.operands import Bound, Box, LoopAffine, View
from tensorgen.poly.footprint import FootprintBox
from tensorgen.schedule.default import default_schedule
from tensorgen.schedule.kernel import (
    Buffer,
    Kernel,
    buffer_box,
    plan_buffers,
    write_box,
)
from tensorgen.target import Target

ALIGN = 16
Origins = dict[str, tuple[LoopAffine, int]]


@dataclass(frozen=True)
class Compiled:
    binary: Binary
    kernels: tuple[Kernel, ...]
    macs: int  # useful multiply-accumulates of the program


def compile_program(
    program: Program, target: Target, kernels: list[Kernel] | None = None
) -> Compiled:
    kernels = kernels if kernels is not None else default_schedule(program, target)
    plans = [plan_buffers(program, k) for k in kernels]
    tensors, dram = dram_layout(program, plans)
    index = {t.name: i for i, t in enumerate(tensors)}
    em = Emitter()
    # the shared loops run over the values at which some statement runs (a where: may narrow them)
    shared = [Dim(name, lo, hi - lo + 1, 1) for name, (lo, hi) in shared_ranges(program).items()]

    def program_body(origins: Origins) -> None:
        for kernel, plan in zip(kernels, plans, strict=False):
            KernelLowering(program, target, kernel, plan, index, em).emit(origins)

    tile_nest(em, shared, program_body)
    binary = Binary(target.name, target.hash, tuple(tensors), tuple(em.finish()), dram)
    return Compiled(binary, tuple(kernels), useful_macs(program))


def shared_ranges(program: Program) -> dict[str, tuple[int, int]]:
    """Per shared loop, the hull of its values at which any statement runs."""
    out = {}
    for name in program.shared_names:
        bounds = [s.bounds[s.indices.index(name)] for s in program.statements]
        out[name] = (min(lo for lo, _ in bounds), max(hi for _, hi in bounds))
    return out


def useful_macs(program: Program) -> int:
    total = 0
    for stmt in program.statements:
        if stmt.op == "+=" and isinstance(stmt.rhs, BinOp) and stmt.rhs.op == "*":
            if stmt.where:  # isl enumerates; only small non-rectangular domains get here
                total += int(poly.domain(stmt).count_val().to_python())
            else:
                total += int(np.prod([hi - lo + 1 for lo, hi in stmt.bounds], dtype=np.int64))
    return total


def dram_layout(program: Program, plans: list[list[Buffer]]) -> tuple[list[TensorEntry], int]:
    """Every tensor that lives in DRAM: the program's inputs and outputs, and spilled temporaries."""
    staged = {b.tensor for plan in plans for b in plan if b.load or b.store}
    entries, offset = [], 0
    for t in program.tensors:
        if t.role == "none" and t.name not in staged:
            continue
        role = "temp" if t.role == "none" else t.role
        entries.append(TensorEntry(t.name, t.dtype, t.shape, role, offset, t.pad))
        offset += -(-t.nbytes // 64) * 64
    return entries, offset


class KernelLowering:
    def __init__(
        self,
        program: Program,
        target: Target,
        kernel: Kernel,
        plan: list[Buffer],
        tensor_index: dict[str, int],
        em: Emitter,
    ) -> None:
        self.program, self.target, self.kernel, self.plan = program, target, kernel, plan
        self.tensor_index, self.em = tensor_index, em
        self.tiles = dict(kernel.tiles)
        self.base: dict[str, int] = {}
        self.strides: dict[str, tuple[int, ...]] = {}
        self.serving: dict[tuple[str, Access], Buffer] = {}
        self._allocate()

    # -- buffers ------------------------------------------------------------------------
    def _allocate(self) -> None:
        top = {"spad": 0, "acc": 0}
        for buf in self.plan:
            box = buffer_box(self.kernel, buf, self.tiles)
            self.base[buf.key] = top[buf.mem]
            self.strides[buf.key] = _row_major(box.size)
            top[buf.mem] += _align(box.elements * np.dtype(buf.dtype).itemsize)
            for stmt, acc in buf.uses:
                self.serving[(stmt.name, acc)] = buf
        out_elems = int(np.prod([self.tiles[o] for o in self.kernel.out], dtype=np.int64))
        self.temp_base, self.temp_bytes = top["spad"], _align(out_elems * 4)
        self.temp_limit = self.target.spad.bytes
        for mem, cap in (("spad", self.target.spad.bytes), ("acc", self.target.acc.bytes)):
            if top[mem] > cap:
                raise CapacityError(
                    f"kernel {', '.join(s.name for s in self.kernel.statements)}: staged buffers "
                    f"need {top[mem]} B of {mem}, target {self.target.name} has {cap} B"
                )

    def _box(self, buf: Buffer, sizes: dict[str, int]) -> FootprintBox:
        return buffer_box(self.kernel, buf, {**self.tiles, **sizes})

    def _use_origins(self, buf: Buffer, origins: Origins) -> dict[str, LoopAffine]:
        """Origins of each index as the buffer's footprint sees them: a resident buffer spans
        whole reductions, so its reduction indices start at their lower bound."""
        out = {}
        for stmt, _ in buf.uses:
            for name in stmt.indices:
                if name in origins and (
                    buf.level != "tile" or name in self.kernel.out or name in self.kernel.shared
                ):
                    out[name] = origins[name][0]
                else:
                    out[name] = LoopAffine.make(stmt.bounds[stmt.indices.index(name)][0])
        return out

    def _offset(self, box: FootprintBox, origins: dict[str, LoopAffine]) -> list[LoopAffine]:
        result = []
        for const, coefs in box.offset:
            acc = LoopAffine.make(const)
            for name, c in coefs:
                acc = acc + origins[name].scale(c)
            result.append(acc)
        return result

    def _sizes(self, origins: Origins) -> dict[str, int]:
        return {n: s for n, (_, s) in origins.items()}

    # -- the tile nest --------------------------------------------------------------------
    def emit(self, shared: Origins) -> None:
        dims = []
        stmt0 = self.kernel.statements[0]
        for name in self.kernel.out:
            lo, hi = stmt0.bounds[stmt0.indices.index(name)]
            dims.append(Dim(name, lo, hi - lo + 1, self.tiles[name]))
        guard = self._shared_guard(shared)
        if guard:  # the kernel's statements run at some values of the shared loops only (where:)
            with self.em.block("IF", cond=Bound(guard)):
                tile_nest(self.em, dims, lambda tiles: self._tile({**shared, **tiles}))
        else:
            tile_nest(self.em, dims, lambda tiles: self._tile({**shared, **tiles}))

    def _shared_guard(self, shared: Origins) -> tuple[tuple[LoopAffine, int], ...]:
        """Conditions (each >= 0) on the shared-loop counters under which the kernel runs: its
        statements' bounds on the shared loops (form_kernels joins only equal ones), where they
        are narrower than the loops."""
        stmt0 = self.kernel.statements[0]
        terms = []
        for name, (nest_lo, nest_hi) in shared_ranges(self.program).items():
            lo, hi = stmt0.bounds[stmt0.indices.index(name)]
            value = shared[name][0]
            if lo > nest_lo:
                terms.append((value + LoopAffine.make(-lo), 1))
            if hi < nest_hi:
                terms.append((LoopAffine.make(hi) + value.scale(-1), 1))
        return tuple(terms)

    def _tile(self, origins: Origins) -> None:
        for buf in self.plan:
            if buf.level == "tile" and buf.load:
                self._load(buf, origins)
        for stmt in self.kernel.statements:
            reds = self.kernel.reductions(stmt)
            dims = []
            for name in reds:
                lo, hi = stmt.bounds[stmt.indices.index(name)]
                dims.append(Dim(name, lo, hi - lo + 1, self.tiles[name]))
            tile_nest(self.em, dims, lambda red, s=stmt: self._statement(s, {**origins, **red}))
        for buf in self.plan:
            if buf.level == "tile" and buf.store:
                self._store(buf, origins)

    def _statement(self, stmt: Statement, origins: Origins) -> None:
        for buf in self.plan:
            if buf.level == stmt.name:
                self._load(buf, origins)
        mapping = mac_mapping(self.program, stmt)
        if mapping is not None:
            self._matmul(stmt, mapping, origins)
        else:
            self._vector(stmt, origins)

    # -- DMA --------------------------------------------------------------------------------
    def _load(self, buf: Buffer, origins: Origins) -> None:
        sizes = self._sizes(origins)
        box = self._box(buf, sizes)
        offset = self._offset(box, self._use_origins(buf, origins))
        dst = View(
            buf.mem, buf.dtype, LoopAffine.make(self.base[buf.key]), box.size, self.strides[buf.key]
        )
        src = Box(self.tensor_index[buf.tensor], tuple(offset), box.size)
        self.em.emit(isa.make("LOAD", dst=dst, src=src))

    def _store(self, buf: Buffer, origins: Origins) -> None:
        sizes = self._sizes(origins)
        full, written = self._box(buf, sizes), write_box(self.kernel, buf, {**self.tiles, **sizes})
        use_o = self._use_origins(buf, origins)
        full_off, w_off = self._offset(full, use_o), self._offset(written, use_o)
        isz = np.dtype(buf.dtype).itemsize
        base = LoopAffine.make(self.base[buf.key])
        for d, cs in enumerate(self.strides[buf.key]):
            base = base + (w_off[d] + full_off[d].scale(-1)).scale(cs * isz)
        src = View(buf.mem, buf.dtype, base, written.size, self.strides[buf.key])
        self.em.emit(
            isa.make(
                "STORE", dst=Box(self.tensor_index[buf.tensor], tuple(w_off), written.size), src=src
            )
        )

    # -- operands ---------------------------------------------------------------------------
    def _operand(
        self,
        stmt: Statement,
        acc: Access,
        actual: dict[str, LoopAffine],
        origins: Origins,
        dims: list[tuple[str | None, int]],
    ) -> View:
        """View of `acc` with one dimension per (index, size) of `dims`, starting at `actual`."""
        buf = self.serving[(stmt.name, acc)]
        sizes = self._sizes(origins)
        box = self._box(buf, sizes)
        offset = self._offset(box, self._use_origins(buf, origins))
        cs = self.strides[buf.key]
        isz = np.dtype(buf.dtype).itemsize
        base = LoopAffine.make(self.base[buf.key])
        for d, sub in enumerate(acc.index):
            elem = LoopAffine.make(sub.const)
            for name, c in sub.terms:
                elem = elem + actual[name].scale(c)
            base = base + (elem + offset[d].scale(-1)).scale(cs[d] * isz)
        strides = tuple(
            sum(cs[d] * sub.coef(name) for d, sub in enumerate(acc.index)) if name else 0
            for name, _ in dims
        )
        return View(buf.mem, buf.dtype, base, tuple(n for _, n in dims), strides)

    def _point_nest(self, stmt: Statement, origins: Origins, tensorized: set[str], body) -> None:
        """Hardware loops over the indices of `stmt` that are not mapped onto the instruction."""
        looped = [
            n
            for n in stmt.indices
            if n not in tensorized and n not in self.kernel.shared and origins[n][1] > 1
        ]
        dims = [Dim(n, 0, origins[n][1], 1) for n in looped]

        def inner(points: Origins) -> None:
            actual = {n: o for n, (o, _) in origins.items()}
            for n, (p, _) in points.items():
                actual[n] = actual[n] + p
            body(actual)

        tile_nest(self.em, dims, inner, queue="EX")

    # -- compute ----------------------------------------------------------------------------
    def _matmul(self, stmt: Statement, mp, origins: Origins) -> None:
        size = lambda n: origins[n][1] if n else 1  # noqa: E731
        if size(mp.k) > self.target.rows or size(mp.n) > self.target.cols:
            raise CodegenError(
                f"{stmt.name}: MAC tile K={size(mp.k)} N={size(mp.n)} exceeds the "
                f"{self.target.rows}x{self.target.cols} array"
            )

        def body(actual: dict[str, LoopAffine]) -> None:
            m, n, k = (mp.m, size(mp.m)), (mp.n, size(mp.n)), (mp.k, size(mp.k))
            acc = self._operand(stmt, stmt.lhs, actual, origins, [m, n])
            a = self._operand(stmt, mp.a, actual, origins, [m, k])
            b = self._operand(stmt, mp.b, actual, origins, [k, n])
            self.em.emit(
                isa.make("MATMUL", acc=acc, a=a, b=b, accumulate=1, a_zp=mp.a_zp, b_zp=mp.b_zp)
            )

        self._point_nest(stmt, origins, {mp.m, mp.n, mp.k} - {None}, body)

    def _vector(self, stmt: Statement, origins: Origins) -> None:
        dims = [(o, origins[o][1]) for o in self.kernel.out]

        def body(actual: dict[str, LoopAffine]) -> None:
            shape = tuple(n for _, n in dims)
            ev = VectorExpr(
                self.em,
                self.program,
                stmt,
                lambda acc: self._operand(stmt, acc, actual, origins, dims),
                lambda slot: self.temp(slot, shape),
            )
            ev.statement()

        self._point_nest(stmt, origins, set(self.kernel.out), body)

    def temp(self, slot: int, shape: tuple[int, ...]) -> View:
        base = self.temp_base + slot * self.temp_bytes
        if base + self.temp_bytes > self.temp_limit:
            raise CapacityError(f"vector temporaries overflow the scratchpad of {self.target.name}")
        return View("spad", "int32", LoopAffine.make(base), shape, _row_major(shape))


def _b(val) -> dict:
    return {"b": val, "imm": 0} if isinstance(val, View) else {"b": None, "imm": int(val)}


_VOPS = {
    "+": "VADD",
    "-": "VSUB",
    "*": "VMUL",
    ">>": "VSHR",
    "<<": "VSHL",
    "max": "VMAX",
    "min": "VMIN",
}


class VectorExpr:
    """Lowers one statement over a block of its instances to vector instructions.

    `view_of(access)` gives the operand view of a tensor access over the block, `temp(slot)` an
    int32 scratch view of the block's shape; both backends (kernels, general schedules) use it.
    """

    def __init__(
        self, em: Emitter, program: Program, stmt: Statement, view_of, temp, overwrite: bool = False
    ) -> None:
        self.em, self.program, self.stmt = em, program, stmt
        self.overwrite = overwrite  # a `+=` that writes its element first: `=` (VMUL for VMAC)
        self.view_of, self.temp_of = view_of, temp
        self.dst_range = dtype_range(program.tensor(stmt.lhs.tensor).dtype)
        self.next_slot = 0

    def statement(self) -> None:
        stmt, rhs = self.stmt, self.stmt.rhs
        dst = self.view_of(stmt.lhs)
        if stmt.op == "=" or (self.overwrite and stmt.op == "+="):
            self.into(rhs, dst)
        elif (
            stmt.op == "+="
            and isinstance(rhs, BinOp)
            and rhs.op == "*"
            and isinstance(rhs.lhs, Read)
            and isinstance(rhs.rhs, Read)
        ):
            self.em.emit(isa.make("VMAC", dst=dst, a=self.view(rhs.lhs), b=self.view(rhs.rhs)))
        else:
            val = self.value(rhs)
            op = "VADD" if stmt.op == "+=" else "VMAX"
            self.em.emit(isa.make(op, dst=dst, a=dst, **_b(val)))

    def view(self, e: Read) -> View:
        return self.view_of(e.access)

    def _temp(self) -> View:
        v = self.temp_of(self.next_slot)
        self.next_slot += 1
        return v

    def value(self, e: Expr) -> View | int:
        """A view holding `e`, or a Python int if `e` is constant."""
        if isinstance(e, Read):
            return self.view(e)
        if isinstance(e, Const):
            if not isinstance(e.value, int):
                raise CodegenError(
                    f"{self.stmt.location}: float constant {e.value} outside requant()"
                )
            return e.value
        dst = self._temp()
        self.into(e, dst)
        return dst

    def into(self, e: Expr, dst: View) -> None:
        emit = self.em.emit
        if isinstance(e, (Read, Const)):
            val = self.value(e)
            if isinstance(val, View):
                emit(isa.make("VADD", dst=dst, a=val, b=None, imm=0))
            else:
                emit(isa.make("VFILL", dst=dst, imm=_wrap32(val)))
            return
        if isinstance(e, BinOp) or (isinstance(e, Call) and e.fn in ("min", "max")):
            op, left, right = (e.op, e.lhs, e.rhs) if isinstance(e, BinOp) else (e.fn, *e.args)
            a, b = self.value(left), self.value(right)
            if not isinstance(a, View) and op in ("+", "*", "max", "min"):
                a, b = b, a
            if not isinstance(a, View):
                if not isinstance(b, View):
                    emit(isa.make("VFILL", dst=dst, imm=_fold(op, a, b)))
                    return
                t = self._temp()
                emit(isa.make("VFILL", dst=t, imm=_wrap32(a)))
                a = t
            emit(isa.make(_VOPS[op], dst=dst, a=a, **_b(b)))
            return
        assert isinstance(e, Call)
        x = self.value(e.args[0])
        if not isinstance(x, View):
            t = self._temp()
            emit(isa.make("VFILL", dst=t, imm=_wrap32(x)))
            x = t
        if e.fn == "relu":
            emit(isa.make("VMAX", dst=dst, a=x, b=None, imm=0))
        elif e.fn == "clamp":
            emit(isa.make("VCLAMP", dst=dst, a=x, lo=int(e.args[1].value), hi=int(e.args[2].value)))
        elif e.fn in ("int8", "uint8"):
            lo, hi = dtype_range(e.fn)
            emit(isa.make("VCLAMP", dst=dst, a=x, lo=lo, hi=hi))
        elif e.fn == "int32":
            emit(isa.make("VADD", dst=dst, a=x, b=None, imm=0))
        elif e.fn == "requant":
            lo, hi = self.dst_range
            emit(
                isa.make(
                    "VREQUANT",
                    dst=dst,
                    a=x,
                    scale=float(np.float32(e.args[1].value)),
                    zp=int(e.args[2].value),
                    lo=lo,
                    hi=hi,
                )
            )
        elif e.fn == "quantize":
            lo, hi = self.dst_range
            # RN(1/s) in float32, as PyTorch's quantize_per_tensor computes it (NUMERICS.md)
            inv = np.float32(1.0) / np.float32(e.args[1].value)
            emit(
                isa.make(
                    "VQUANT",
                    dst=dst,
                    a=x,
                    inv_scale=float(inv),
                    zp=int(e.args[2].value),
                    lo=lo,
                    hi=hi,
                )
            )
        elif e.fn == "dequantize":
            emit(
                isa.make(
                    "VDEQUANT",
                    dst=dst,
                    a=x,
                    scale=float(np.float32(e.args[1].value)),
                    zp=int(e.args[2].value),
                )
            )
        elif e.fn == "requant_fbgemm":
            lo, hi = self.dst_range
            emit(
                isa.make(
                    "VREQUANTF",
                    dst=dst,
                    a=x,
                    bias=self.value(e.args[1]),
                    mult=self.value(e.args[2]),
                    zp=int(e.args[3].value),
                    lo=lo,
                    hi=hi,
                )
            )
        elif e.fn == "requant_fma":
            lo, hi = self.dst_range
            emit(
                isa.make(
                    "VREQUANTZ",
                    dst=dst,
                    a=x,
                    scale=float(np.float32(e.args[1].value)),
                    zp=int(e.args[2].value),
                    lo=lo,
                    hi=hi,
                )
            )
        elif e.fn == "add_fbgemm":
            self._add_fbgemm(e, x, dst)
        elif e.fn == "rshift_round":
            emit(isa.make("VSHRR", dst=dst, a=x, **_b(self.value(e.args[1]))))
        elif e.fn == "lut":
            self._lut(e, x, dst)
        else:
            raise CodegenError(f"{self.stmt.location}: cannot lower {e.fn}()")

    def _add_fbgemm(self, e: Call, x: View, dst: View) -> None:
        y = self.value(e.args[1])
        if not isinstance(y, View):
            raise CodegenError(f"{self.stmt.location}: add_fbgemm() of a constant")
        s_a, off_a, s_b, off_b, inv = (float(np.float32(c.value)) for c in e.args[2:7])
        self.em.emit(
            isa.make(
                "VADDQF",
                dst=dst,
                a=x,
                b=y,
                s_a=s_a,
                off_a=off_a,
                s_b=s_b,
                off_b=off_b,
                inv=inv,
                zp=int(e.args[7].value),
            )
        )

    def _lut(self, e: Call, x: View, dst: View) -> None:
        t = self.value(e.args[1])  # the table's view starts at its entry 0: the whole row
        table = View(t.mem, t.dtype, t.base, (LUT_ENTRIES,), (1,))
        self.em.emit(isa.make("VLUT", dst=dst, a=x, table=table))


def _wrap32(v: int) -> int:
    return int(np.int64(v).astype(np.int32))


def _fold(op: str, a: int, b: int) -> int:
    ops = {
        "+": lambda: a + b,
        "-": lambda: a - b,
        "*": lambda: a * b,
        "max": lambda: max(a, b),
        "min": lambda: min(a, b),
        ">>": lambda: a >> min(max(b, 0), 31),
        "<<": lambda: a << min(max(b, 0), 31),
    }
    return _wrap32(ops[op]())


def _row_major(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides, acc = [], 1
    for n in reversed(shape):
        strides.append(acc)
        acc *= n
    return tuple(reversed(strides))


def _align(n: int) -> int:
    return -(-n // ALIGN) * ALIGN
