"""Parse one statement of op.yaml's bracket notation into IR expressions.

The notation is a small subset of Python's expression grammar, so Python's own
parser does the tokenising and precedence; this module only accepts the subset
(affine subscripts, the element-wise functions, integer arithmetic) and turns it
into `tensorgen.ir` values. `max=` is not Python: it is rewritten to `**=`, the
same width, so that column numbers in error messages stay true.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

from tensorgen.errors import SpecError
from tensorgen.ir.core import BINOPS, CONST_ARGS, FUNCTIONS, TENSOR_ARGS, TWO_OPERANDS, Access, Affine, BinOp, Call, Const, Expr, Read

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


def parse_statement(text: str, file: str, line: int, col: int) -> ParsedStatement:
    """Parse `text`, which starts at 1-based `line`/`col` of `file`."""
    loc = _Locator(file, line, col, text.strip())
    if "**=" in text:  # would otherwise pass for max=, which is spelled that way below
        raise SpecError(f"{loc.at(offset=text.strip().index('**='))}: expected one of '=', '+=', 'max=', got '**='")
    source = text.replace("max=", " **=")
    if "\n" in source.strip():
        raise SpecError(f"{loc.at(offset=0)}: a statement must fit on one line")
    try:
        tree = ast.parse(source.strip(), mode="exec")
    except SyntaxError as err:
        raise SpecError(
            f"{loc.at(offset=(err.offset or 1) - 1)}: expected a statement like "
            f"'Y[i, j] += A[i, k] * B[k, j]' ({err.msg})"
        ) from None
    if len(tree.body) != 1:
        raise SpecError(f"{loc.at(offset=0)}: expected exactly one statement")
    node = tree.body[0]
    if isinstance(node, ast.Assign) and len(node.targets) == 1:
        op, target, value = "=", node.targets[0], node.value
    elif isinstance(node, ast.AugAssign) and type(node.op) in (ast.Add, ast.Pow):
        op = "+=" if isinstance(node.op, ast.Add) else "max="
        target, value = node.target, node.value
    else:
        raise SpecError(f"{loc.at(node)}: expected one of '=', '+=', 'max=' with a tensor on the left")
    if not isinstance(target, ast.Subscript):
        raise SpecError(f"{loc.at(target)}: expected a tensor access like 'Y[i, j]' on the left")
    return ParsedStatement(_access(target, loc), op, _expr(value, loc))


def _access(node: ast.Subscript, loc: _Locator) -> Access:
    if not isinstance(node.value, ast.Name):
        raise SpecError(f"{loc.at(node)}: expected a tensor name before '['")
    items = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
    return Access(node.value.id, tuple(_affine(item, loc) for item in items))


def _affine(node: ast.AST, loc: _Locator) -> Affine:
    coefs, const = _affine_terms(node, loc)
    return Affine.of(coefs, const)


def _affine_terms(node: ast.AST, loc: _Locator) -> tuple[dict[str, int], int]:
    def fail(why: str) -> SpecError:
        return SpecError(f"{loc.at(node)}: non-affine subscript '{ast.unparse(node)}': {why}")

    if isinstance(node, ast.Name):
        return {node.id: 1}, 0
    if isinstance(node, ast.Constant):
        if isinstance(node.value, bool) or not isinstance(node.value, int):
            raise fail("expected an integer")
        return {}, node.value
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
        return {n: v * k2 for n, v in c1.items()}, k1 * k2
    raise fail("only +, -, and multiplication by an integer constant are allowed")


def _expr(node: ast.AST, loc: _Locator) -> Expr:
    if isinstance(node, ast.Subscript):
        return Read(_access(node, loc))
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(
        node.value, bool
    ):
        return Const(node.value)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        inner = _expr(node.operand, loc)
        if isinstance(inner, Const):
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
            raise SpecError(f"{loc.at(node)}: unknown function '{fn}' (expected one of {known})")
        if len(node.args) != FUNCTIONS[fn] or node.keywords:
            raise SpecError(f"{loc.at(node)}: {fn}() takes {FUNCTIONS[fn]} argument(s)")
        args = tuple(_expr(a, loc) for a in node.args)
        if fn in CONST_ARGS and not all(isinstance(a, Const) for a in args[1:]):
            raise SpecError(f"{loc.at(node)}: {CONST_ARGS[fn]}")
        if fn in TWO_OPERANDS and not all(isinstance(a, Const) for a in args[2:]):
            raise SpecError(f"{loc.at(node)}: {TWO_OPERANDS[fn]}")
        if fn in TENSOR_ARGS and not (all(isinstance(a, Read) for a in args[1:-1]) and isinstance(args[-1], Const)):
            raise SpecError(f"{loc.at(node)}: {TENSOR_ARGS[fn]}")
        return Call(fn, args)
    if isinstance(node, ast.Name):
        raise SpecError(f"{loc.at(node)}: '{node.id}' is not a tensor access; write it with subscripts")
    raise SpecError(f"{loc.at(node)}: unsupported expression '{ast.unparse(node)}'")
