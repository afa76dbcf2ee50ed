"""Queries on the IR that the schedulers and the lowering share: which indices a statement's
output runs over, and how a contraction maps onto the MAC array."""

from __future__ import annotations

from dataclasses import dataclass

from tensorgen.ir.core import Access, BinOp, Const, Expr, Program, Read, Statement


@dataclass(frozen=True)
class MacMapping:
    """How a contraction maps onto the MAC array: acc[m, n] += (a[m, k] - a_zp) * (b[k, n] - b_zp)."""

    m: str | None
    n: str | None
    k: str
    a: Access
    b: Access
    a_zp: int = 0
    b_zp: int = 0

    def swapped(self) -> MacMapping:
        """The other way round: the operand that streamed is held in the array and the other streams
        (acc[n, m] += b[m, k] * a[k, n]): a 128-row activation matrix held, 3072 weight columns streamed."""
        return MacMapping(self.n, self.m, self.k, self.b, self.a, self.b_zp, self.a_zp)


def _mac_operand(e: Expr) -> tuple[Access, int] | None:
    """`X[...]` or `X[...] - zero_point`: what the MAC array's inputs accept."""
    if isinstance(e, Read):
        return e.access, 0
    if (
        isinstance(e, BinOp)
        and e.op == "-"
        and isinstance(e.lhs, Read)
        and isinstance(e.rhs, Const)
        and isinstance(e.rhs.value, int)
        and -256 < e.rhs.value < 256
    ):
        return e.lhs.access, e.rhs.value
    return None


def out_indices(program: Program, stmt: Statement) -> tuple[str, ...]:
    shared = program.shared_names
    out: list[str] = []
    for sub in stmt.lhs.index:
        for name in sub.names:
            if name not in shared and name not in out:
                out.append(name)
    return tuple(out)


def mac_mapping(program: Program, stmt: Statement) -> MacMapping | None:
    """The MAC-array mapping of `lhs += a * b` with 8-bit operands, or None."""
    rhs = stmt.rhs
    if stmt.op != "+=" or not (isinstance(rhs, BinOp) and rhs.op == "*"):
        return None
    ops = _mac_operand(rhs.lhs), _mac_operand(rhs.rhs)
    if None in ops or program.tensor(stmt.lhs.tensor).dtype != "int32":
        return None
    (x, x_zp), (y, y_zp) = ops
    if any(program.tensor(a.tensor).dtype not in ("int8", "uint8") for a in (x, y)):
        return None
    out = set(out_indices(program, stmt))
    red = [i for i in stmt.indices if i not in out and i not in program.shared_names]

    def uses(acc: Access, i: str) -> bool:
        return any(sub.coef(i) for sub in acc.index)

    best = None
    for a, a_zp, b, b_zp in ((x, x_zp, y, y_zp), (y, y_zp, x, x_zp)):
        ks = [i for i in red if uses(a, i) and uses(b, i)]
        ns = [i for i in out if uses(b, i) and not uses(a, i)]
        ms = [i for i in out if uses(a, i) and not uses(b, i)]
        if not ks:
            continue
        cand = MacMapping(_pick(stmt, ms), _pick(stmt, ns), _pick(stmt, ks), a, b, a_zp, b_zp)
        # written order wins ties: `X * W` keeps W stationary in the array and streams X
        score = (cand.n is not None, cand.m is not None, a is x)
        if best is None or score > best[0]:
            best = (score, cand)
    return best[1] if best else None


def _pick(stmt: Statement, cands: list[str]) -> str | None:
    """The longest of `cands`; ties go to the innermost index: unit stride in the usual layouts."""
    if not cands:
        return None
    return max(cands, key=lambda name: (stmt.extent(name), stmt.indices.index(name)))
