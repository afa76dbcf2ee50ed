"""Parse one statement of op.yaml's bracket notation into IR expressions.

The notation is a small subset of Python's expression grammar, so Python's own
parser does the tokenising and precedence; this module only accepts the subset
(affine subscripts, the element-wise functions, integer arithmetic) and turns it
into `tensorgen.ir` values. `max=` is not Python: it is rewritten to `**=`, the
same width, so that column numbers in error messages stay true.
"""

from __future__ import annotations

import ast
import math
import re
from dataclasses import dataclass

from tensorgen.errors import SpecError
from tensorgen.inputs import LIMITS, one_line
from tensorgen.ir import poly
from tensorgen.ir.core import (
    BINOPS,
    CONST_ARGS,
    FUNCTIONS,
    TENSOR_ARGS,
    TENSOR_READS,
    TWO_OPERANDS,
    Access,
    Affine,
    BinOp,
    Call,
    Const,
    Expr,
    Read,
)

_BINOP_NAMES = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.RShift: ">>", ast.LShift: "<<"}


@dataclass(frozen=True)
class ParsedStatement:
    lhs: Access
    op: str
    rhs: Expr


class _Locator:
    """Turns a column inside the statement text into `file:line:col`."""

    def __init__(self, file: str, line: int, col: int, source: str = "") -> None:
        self.file, self.line, self.col, self.source = file, line, col, source.encode()

    def at(self, node: ast.AST | None = None, offset: int | None = None) -> str:
        if offset is None:
            # ast counts UTF-8 bytes; the user's editor counts characters (`Ä[i*j]`)
            offset = len(self.source[: getattr(node, "col_offset", 0)].decode(errors="ignore"))
        return f"{self.file}:{self.line}:{self.col + offset}"


_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# zero points and clamp bounds: integer arguments (by position) of the element-wise functions
_INT_ARGS = {
    "clamp": (1, 2),
    "requant": (2,),
    "quantize": (2,),
    "dequantize": (2,),
    "requant_fma": (2,),
    "add_fbgemm": (7,),
    "add_fbgemm_scalar": (3, 5, 7),
    "requant_fbgemm": (3,),
    "requant_onednn": (5,),
    "rshift_round": (1,),
}


def name_problem(name: str, what: str) -> str | None:
    """Why `name` cannot name a tensor, index or loop, or None: names reach isl's set notation
    and the .tgb tensor table, so they are short ASCII identifiers that are not isl keywords."""
    if not _NAME.fullmatch(name):
        return (
            f"{what} name '{one_line(name, 60)}' is not an identifier (ASCII letters, digits and _)"
        )
    if len(name) > LIMITS.name_chars:
        return f"{what} name '{name[:20]}...' is longer than {LIMITS.name_chars} characters (limit InputLimits.name_chars in tensorgen/inputs.py)"
    if not poly.isl_name_ok(name):
        return f"{what} name '{name}' is reserved (a keyword of isl's set notation)"
    return None


def parse_statement(text: str, file: str, line: int, col: int) -> ParsedStatement:
    """Parse `text`, which starts at 1-based `line`/`col` of `file`."""
    loc = _Locator(file, line, col, text.strip())
    if len(text) > LIMITS.statement_chars:
        raise SpecError(
            f"{loc.at(offset=0)}: statement longer than {LIMITS.statement_chars} characters "
            "(limit InputLimits.statement_chars in tensorgen/inputs.py)"
        )
    if "**=" in text:  # would otherwise pass for max=, which is spelled that way below
        raise SpecError(
            f"{loc.at(offset=text.strip().index('**='))}: expected one of '=', '+=', 'max=', got '**='"
        )
    source = text.replace("max=", " **=")
    if "\n" in source.strip():
        raise SpecError(f"{loc.at(offset=0)}: a statement must fit on one line")
    try:
        tree = ast.parse(source.strip(), mode="exec")
    except SyntaxError as err:
        raise SpecError(
            f"{loc.at(offset=(err.offset or 1) - 1)}: expected a statement like "
            f"'Y[i, j] += A[i, k] * B[k, j]' ({one_line(err.msg, 80)})"
        ) from None
    except (RecursionError, MemoryError):  # CPython's parser on a very deeply nested expression
        raise SpecError(
            f"{loc.at(offset=0)}: expression nested deeper than {LIMITS.expr_depth} levels "
            "(limit InputLimits.expr_depth in tensorgen/inputs.py)"
        ) from None
    if len(tree.body) != 1:
        raise SpecError(f"{loc.at(offset=0)}: expected exactly one statement")
    _check_size(tree.body[0], loc)
    node = tree.body[0]
    if isinstance(node, ast.Assign) and len(node.targets) == 1:
        op, target, value = "=", node.targets[0], node.value
    elif isinstance(node, ast.AugAssign) and type(node.op) in (ast.Add, ast.Pow):
        op = "+=" if isinstance(node.op, ast.Add) else "max="
        target, value = node.target, node.value
    else:
        raise SpecError(
            f"{loc.at(node)}: expected one of '=', '+=', 'max=' with a tensor on the left"
        )
    if not isinstance(target, ast.Subscript):
        raise SpecError(f"{loc.at(target)}: expected a tensor access like 'Y[i, j]' on the left")
    return ParsedStatement(_access(target, loc), op, _expr(value, loc))


def _check_size(stmt: ast.stmt, loc: _Locator) -> None:
    """Depth and node count of the expressions, walked without recursion, so that everything
    after (this module's recursive descent, the code generator, the reference) stays shallow."""
    count, stack = 0, [(child, 1) for child in ast.iter_child_nodes(stmt)]
    while stack:
        node, depth = stack.pop()
        if not isinstance(node, ast.expr):
            continue
        count += 1
        if depth > LIMITS.expr_depth:
            raise SpecError(
                f"{loc.at(node)}: expression nested deeper than {LIMITS.expr_depth} levels "
                "(limit InputLimits.expr_depth in tensorgen/inputs.py)"
            )
        if count > LIMITS.expr_nodes:
            raise SpecError(
                f"{loc.at(node)}: statement with more than {LIMITS.expr_nodes} operators, calls, "
                "reads and constants (limit InputLimits.expr_nodes in tensorgen/inputs.py)"
            )
        stack.extend((child, depth + 1) for child in ast.iter_child_nodes(node))


def _int_constant(node: ast.AST, value: int, loc: _Locator, what: str) -> int:
    if not LIMITS.int_min <= value <= LIMITS.int_max:
        shown = value if value.bit_length() <= 96 else f"of {value.bit_length()} bits"
        raise SpecError(
            f"{loc.at(node)}: {what} {shown} "
            f"is outside the i32 range [{LIMITS.int_min}, {LIMITS.int_max}] (limit InputLimits.int_min/int_max in tensorgen/inputs.py)"
        )
    return value


def _float_constant(node: ast.AST, value: float, loc: _Locator) -> float:
    size = abs(value)
    if not math.isfinite(value) or size > LIMITS.float_abs_max or 0 < size < LIMITS.float_abs_min:
        raise SpecError(
            f"{loc.at(node)}: constant {value!r} is outside the range of scales: 0 or a magnitude in "
            f"[2**-126, 2**31] (limit InputLimits.float_abs_min/float_abs_max in tensorgen/inputs.py)"
        )
    return value


def _access(node: ast.Subscript, loc: _Locator) -> Access:
    if not isinstance(node.value, ast.Name):
        raise SpecError(f"{loc.at(node)}: expected a tensor name before '['")
    problem = name_problem(node.value.id, "tensor")
    if problem:
        raise SpecError(f"{loc.at(node)}: {problem}")
    items = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
    return Access(node.value.id, tuple(_affine(item, loc) for item in items))


def _affine(node: ast.AST, loc: _Locator) -> Affine:
    coefs, const = _affine_terms(node, loc)
    for name, c in coefs.items():
        _int_constant(node, c, loc, f"coefficient of {name}")
    return Affine.of(coefs, _int_constant(node, const, loc, "subscript offset"))


def _affine_terms(node: ast.AST, loc: _Locator) -> tuple[dict[str, int], int]:
    def fail(why: str) -> SpecError:
        return SpecError(
            f"{loc.at(node)}: non-affine subscript '{one_line(ast.unparse(node), 80)}': {why}"
        )

    if isinstance(node, ast.Name):
        problem = name_problem(node.id, "index")
        if problem:
            raise SpecError(f"{loc.at(node)}: {problem}")
        return {node.id: 1}, 0
    if isinstance(node, ast.Constant):
        if isinstance(node.value, bool) or not isinstance(node.value, int):
            raise fail("expected an integer")
        return {}, _int_constant(node, node.value, loc, "subscript constant")
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        c, k = _affine_terms(node.operand, loc)
        sign = -1 if isinstance(node.op, ast.USub) else 1
        return {n: sign * v for n, v in c.items()}, sign * k
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub)):
        c1, k1 = _affine_terms(node.left, loc)
        c2, k2 = _affine_terms(node.right, loc)
        sign = 1 if isinstance(node.op, ast.Add) else -1
        merged = dict(c1)
        for n, v in c2.items():
            merged[n] = merged.get(n, 0) + sign * v
        return merged, k1 + sign * k2
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
        c1, k1 = _affine_terms(node.left, loc)
        c2, k2 = _affine_terms(node.right, loc)
        if c1 and c2:
            raise fail("a product of two indices")
        if c2:
            c1, k1, c2, k2 = c2, k2, c1, k1
        # bounded at every step, so that `2**31 * 2**31 * ...` never builds a huge integer
        return (
            {n: _int_constant(node, v * k2, loc, f"coefficient of {n}") for n, v in c1.items()},
            _int_constant(node, k1 * k2, loc, "subscript offset"),
        )
    raise fail("only +, -, and multiplication by an integer constant are allowed")


def _lut(node: ast.Call, loc: _Locator) -> Call:
    """`lut(X[...], T)`: the element of table T at the low byte of a read of an int8/uint8
    tensor (the loader checks the dtypes and T's shape); T is named bare, being read whole."""
    x, table = node.args
    if not isinstance(x, ast.Subscript):
        raise SpecError(f"{loc.at(x)}: lut(x, T) needs a tensor read as x, like X[i, j]")
    if not isinstance(table, ast.Name):
        raise SpecError(f"{loc.at(table)}: lut(x, T) needs a bare tensor name as T, the table")
    problem = name_problem(table.id, "tensor")
    if problem:
        raise SpecError(f"{loc.at(table)}: {problem}")
    return Call("lut", (Read(_access(x, loc)), Read(Access(table.id, (Affine(),), table=True))))


def _expr(node: ast.AST, loc: _Locator, negate: bool = False) -> Expr:
    if isinstance(node, ast.Subscript):
        return Read(_access(node, loc))
    if (
        isinstance(node, ast.Constant)
        and isinstance(node.value, (int, float))
        and not isinstance(node.value, bool)
    ):
        value = -node.value if negate else node.value  # -2147483648 is in range, its literal is not
        if isinstance(value, int):
            return Const(_int_constant(node, value, loc, "constant"))
        return Const(_float_constant(node, value, loc))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        if isinstance(node.operand, ast.Constant):
            return _expr(node.operand, loc, not negate)
        inner = _expr(node.operand, loc)
        if isinstance(inner, Const):
            if isinstance(inner.value, int):
                return Const(_int_constant(node, -inner.value, loc, "constant"))
            return Const(-inner.value)
        return BinOp("-", Const(0), inner)
    if isinstance(node, ast.BinOp) and type(node.op) in _BINOP_NAMES:
        op = _BINOP_NAMES[type(node.op)]
        assert op in BINOPS
        return BinOp(op, _expr(node.left, loc), _expr(node.right, loc))
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
        fn = node.func.id
        if fn not in FUNCTIONS:
            known = ", ".join(sorted(FUNCTIONS))
            raise SpecError(
                f"{loc.at(node)}: unknown function '{one_line(fn, 60)}' (expected one of {known})"
            )
        if len(node.args) != FUNCTIONS[fn] or node.keywords:
            raise SpecError(f"{loc.at(node)}: {fn}() takes {FUNCTIONS[fn]} argument(s)")
        if fn == "lut":
            return _lut(node, loc)
        args = tuple(_expr(a, loc) for a in node.args)
        for pos in _INT_ARGS.get(fn, ()):
            if not (isinstance(args[pos], Const) and isinstance(args[pos].value, int)):
                raise SpecError(
                    f"{loc.at(node.args[pos])}: {fn}() needs an integer constant as argument "
                    f"{pos + 1} (a zero point, bound or shift)"
                )
        if fn in CONST_ARGS and not all(isinstance(a, Const) for a in args[1:]):
            raise SpecError(f"{loc.at(node)}: {CONST_ARGS[fn]}")
        if fn in TWO_OPERANDS and not all(isinstance(a, Const) for a in args[2:]):
            raise SpecError(f"{loc.at(node)}: {TWO_OPERANDS[fn]}")
        reads = 1 + TENSOR_READS.get(fn, 0)
        if fn in TENSOR_ARGS and not (
            all(isinstance(a, Read) for a in args[1:reads])
            and all(isinstance(a, Const) for a in args[reads:])
        ):
            raise SpecError(f"{loc.at(node)}: {TENSOR_ARGS[fn]}")
        return Call(fn, args)
    if isinstance(node, ast.Name):
        raise SpecError(
            f"{loc.at(node)}: '{one_line(node.id, 60)}' is not a tensor access; write it with subscripts"
        )
    raise SpecError(f"{loc.at(node)}: unsupported expression '{one_line(ast.unparse(node), 80)}'")
