"""Where float32 may appear in a statement: only at a model's edges.

All arithmetic is integer; a float32 tensor is read only by `quantize(x, ...)` (its `x`) and by
`requant_fbgemm` / `requant_onednn` (their per-channel constants), and written only by a whole
right-hand side `dequantize(...)`. Anything else has no meaning in the integer semantics, and used to end in a
traceback in the reference.
"""

from __future__ import annotations

from tensorgen.errors import SpecError
from tensorgen.ir.core import LUT_ENTRIES, BinOp, Call, Expr, Read, Statement, Tensor

_FLOAT_READS = {
    "quantize": (0,),
    "requant_fbgemm": (1, 2),
    "requant_onednn": (1, 2),
}  # argument positions that read float32


def check_types(stmt: Statement, tensors: dict[str, Tensor]) -> None:
    loc = stmt.location
    lhs_float = tensors[stmt.lhs.tensor].dtype == "float32"
    top_dequant = isinstance(stmt.rhs, Call) and stmt.rhs.fn == "dequantize"
    if lhs_float and not (top_dequant and stmt.op == "="):
        raise SpecError(
            f"{loc}: {stmt.lhs.tensor} is float32: it can only be written by "
            f"'{stmt.lhs} = dequantize(x, scale, zero_point)'"
        )
    if top_dequant and not lhs_float:
        raise SpecError(
            f"{loc}: dequantize() gives float32, but {stmt.lhs.tensor} is "
            f"{tensors[stmt.lhs.tensor].dtype}"
        )
    _check(stmt.rhs, tensors, loc, float_ok=False, top=True)


def _check(
    e: Expr, tensors: dict[str, Tensor], loc: str, float_ok: bool, top: bool = False
) -> None:
    if isinstance(e, Read):
        is_float = tensors[e.access.tensor].dtype == "float32"
        if is_float and not float_ok:
            raise SpecError(
                f"{loc}: {e.access.tensor} is float32: it can only be read by quantize(x, ...) "
                "or as requant_fbgemm()'s / requant_onednn()'s per-channel constants"
            )
        if float_ok and not is_float:
            raise SpecError(
                f"{loc}: expected a float32 tensor in {e.access}, got {tensors[e.access.tensor].dtype}"
            )
    elif isinstance(e, BinOp):
        _check(e.lhs, tensors, loc, False)
        _check(e.rhs, tensors, loc, False)
    elif isinstance(e, Call):
        if e.fn == "lut":
            _check_lut(e, tensors, loc)
        if e.fn == "dequantize" and not top:
            raise SpecError(
                f"{loc}: dequantize() must be the whole right-hand side of its statement"
            )
        floats = _FLOAT_READS.get(e.fn, ())
        for pos, arg in enumerate(e.args):
            if pos in floats and not isinstance(arg, Read):
                raise SpecError(
                    f"{loc}: {e.fn}() needs a float32 tensor read as argument {pos + 1}"
                )
            _check(arg, tensors, loc, pos in floats)


def _check_lut(e: Call, tensors: dict[str, Tensor], loc: str) -> None:
    x, table = (tensors[a.access.tensor] for a in e.args)
    if x.dtype not in ("int8", "uint8"):
        raise SpecError(f"{loc}: lut(x, T) looks up int8/uint8 elements; {x.name} is {x.dtype}")
    if table.dtype not in ("int8", "uint8") or table.shape != (LUT_ENTRIES,):
        raise SpecError(
            f"{loc}: lut(x, T) needs T of shape [{LUT_ENTRIES}] and dtype int8 or uint8; "
            f"{table.name} is {list(table.shape)} {table.dtype}"
        )
