"""Vector instructions for one statement over a block of its instances (`VectorExpr`)."""

from __future__ import annotations

import numpy as np

from tensorgen.codegen.emitter import Emitter
from tensorgen.errors import CodegenError
from tensorgen.ir.core import (
    LUT_ENTRIES,
    BinOp,
    Call,
    Const,
    Expr,
    Program,
    Read,
    Statement,
    dtype_range,
)
from tensorgen.mc import isa
from tensorgen.mc.operands import View


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


_REQUANTS = {"requant": "VREQUANT", "requant_fma": "VREQUANTZ"}


class VectorExpr:
    """Lowers one statement over a block of its instances to vector instructions.

    `view_of(access)` gives the operand view of a tensor access over the block, `temp(slot)` an
    int32 scratch view of the block's shape; the instruction selection of the lowering uses it.
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
        self._call(e, x, dst)

    def _call(self, e: Call, x: View, dst: View) -> None:
        """A function of the IR over the view `x` of its first argument, into `dst`."""
        emit = self.em.emit
        if e.fn == "relu":
            emit(isa.make("VMAX", dst=dst, a=x, b=None, imm=0))
        elif e.fn == "clamp":
            emit(isa.make("VCLAMP", dst=dst, a=x, lo=int(e.args[1].value), hi=int(e.args[2].value)))
        elif e.fn in ("int8", "uint8"):
            lo, hi = dtype_range(e.fn)
            emit(isa.make("VCLAMP", dst=dst, a=x, lo=lo, hi=hi))
        elif e.fn == "int32":
            emit(isa.make("VADD", dst=dst, a=x, b=None, imm=0))
        elif e.fn in _REQUANTS:  # float32 multiply; requant_fma: x86's fused multiply-add
            lo, hi = self.dst_range
            emit(
                isa.make(
                    _REQUANTS[e.fn],
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
        else:
            self._call_fused(e, x, dst)

    def _call_fused(self, e: Call, x: View, dst: View) -> None:
        """The fused requantizations and integer helpers of the frontend's numerics."""
        emit = self.em.emit
        if e.fn == "requant_fbgemm":
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
        elif e.fn == "requant_onednn":
            self._requant_onednn(e, x, dst)
        elif e.fn == "add_fbgemm":
            y = self.value(e.args[1])
            if not isinstance(y, View):
                raise CodegenError(f"{self.stmt.location}: add_fbgemm() of a constant")
            s_a, off_a, s_b, off_b, inv = (float(np.float32(c.value)) for c in e.args[2:7])
            emit(
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
        elif e.fn == "add_fbgemm_scalar":
            self._add_scalar(e, x, dst)
        elif e.fn == "rshift_round":
            emit(isa.make("VSHRR", dst=dst, a=x, **_b(self.value(e.args[1]))))
        elif e.fn == "lut":
            self._lut(e, x, dst)
        else:
            raise CodegenError(f"{self.stmt.location}: cannot lower {e.fn}()")

    def _add_scalar(self, e: Call, x: View, dst: View) -> None:
        """fbgemm's scalar-path quantized add (the tail of a vectorised run): VADDQS."""
        y = self.value(e.args[1])
        if not isinstance(y, View):
            raise CodegenError(f"{self.stmt.location}: add_fbgemm_scalar() of a constant")
        s_a, s_b, inv = (float(np.float32(e.args[i].value)) for i in (2, 4, 6))
        zp_a, zp_b, zp = (int(e.args[i].value) for i in (3, 5, 7))
        self.em.emit(
            isa.make(
                "VADDQS", dst=dst, a=x, b=y, s_a=s_a, zp_a=zp_a, s_b=s_b, zp_b=zp_b, inv=inv, zp=zp
            )
        )

    def _requant_onednn(self, e: Call, x: View, dst: View) -> None:
        lo, hi = self.dst_range
        s_src, d = (float(np.float32(c.value)) for c in e.args[3:5])
        wei, bias = self.value(e.args[1]), self.value(e.args[2])
        zp = int(e.args[5].value)
        self.em.emit(
            isa.make(
                "VREQUANTO", dst=dst, a=x, wei=wei, bias=bias, s_src=s_src, d=d, zp=zp, lo=lo, hi=hi
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
