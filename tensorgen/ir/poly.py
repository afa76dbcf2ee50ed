"""The isl view of an IR program: iteration domains, access relations, order.

Domains and access relations are cached on the (immutable) statements: isl objects are
values too, and every later question reuses them.

This is where `tensorgen.ir` values become islpy objects; layers above talk in
tensorgen's own types and ask `tensorgen.poly` their integer-set questions.
"""

from __future__ import annotations

from functools import lru_cache

import islpy as isl

from tensorgen.ir.core import LUT_ENTRIES, Access, Affine, Program, Statement, Tensor


@lru_cache(maxsize=4096)
def isl_name_ok(name: str) -> bool:
    """Whether isl reads `name` (an ASCII identifier) as a name in every place tensorgen puts one:
    a tuple, a set dimension and a parameter. isl's keywords (`max`, `mod`, `exists`, `infty`,
    `true`, ...) are not names."""
    try:
        s = isl.Set(f"{{ {name}[{name}] : {name} >= 0 }}")
        p = isl.Set(f"[{name}] -> {{ [x] : x = {name} }}")
    except isl.Error:
        return False
    return (
        s.get_tuple_name() == name
        and s.get_dim_name(isl.dim_type.set, 0) == name
        and p.get_dim_name(isl.dim_type.param, 0) == name
    )


def affine_text(a: Affine) -> str:
    parts = [f"{c}*{n}" for n, c in a.terms]
    parts.append(str(a.const))
    return " + ".join(parts)


def domain_text(stmt: Statement, name: str | None = None) -> str:
    cons = [f"{lo} <= {i} <= {hi}" for i, (lo, hi) in zip(stmt.indices, stmt.bounds, strict=False)]
    if stmt.where:
        cons.append(f"({stmt.where})")
    return f"{name or stmt.name}[{', '.join(stmt.indices)}] : {' and '.join(cons)}"


@lru_cache(maxsize=1024)
def domain(stmt: Statement) -> isl.Set:
    return isl.Set("{ " + domain_text(stmt) + " }")


@lru_cache(maxsize=4096)
def access_map(stmt: Statement, access: Access) -> isl.Map:
    idx, cons = access_text(access, stmt.indices)
    return isl.Map(
        f"{{ {stmt.name}[{', '.join(stmt.indices)}] -> {access.tensor}[{idx}] : {cons} }}"
    ).intersect_domain(domain(stmt))


def access_text(access: Access, indices: tuple[str, ...]) -> tuple[str, str]:
    """The subscripts of `access` in isl notation and the constraints on them: a lookup table
    is read whole by every instance (`lut(x, T)`), over a name none of `indices` has."""
    if access.table:
        name = "lut_entry"
        while any(n.endswith(name) for n in indices):
            name = "l" + name
        return name, f"0 <= {name} < {LUT_ENTRIES}"
    return ", ".join(affine_text(a) for a in access.index), "true"


def tensor_box(tensor: Tensor) -> isl.Set:
    return _box(tensor.name, tuple(tensor.shape))


@lru_cache(maxsize=1024)
def _box(name: str, shape: tuple[int, ...]) -> isl.Set:
    """The elements of a tensor: parsed once per name and shape (islpy's sets are values)."""
    names = [f"d{i}" for i in range(len(shape))]
    cons = " and ".join(f"0 <= {n} < {s}" for n, s in zip(names, shape, strict=False)) or "true"
    return isl.Set(f"{{ {name}[{', '.join(names)}] : {cons} }}")


def schedule_map(program: Program) -> isl.UnionMap:
    """The original program order: shared loops, then statement order, then own indices."""
    depth = max(len(s.indices) for s in program.statements)
    nshared = len(program.shared_loops)
    parts = []
    for pos, stmt in enumerate(program.statements):
        own = list(stmt.indices[nshared:])
        out = list(stmt.indices[:nshared]) + [str(pos)] + own + ["0"] * (depth - len(stmt.indices))
        parts.append(f"{stmt.name}[{', '.join(stmt.indices)}] -> [{', '.join(out)}]")
    return isl.UnionMap("{ " + "; ".join(parts) + " }").intersect_domain(union_domain(program))


def union_domain(program: Program) -> isl.UnionSet:
    result = isl.UnionSet("{ }")
    for stmt in program.statements:
        result = result.union(isl.UnionSet.from_set(domain(stmt)))
    return result


def accesses(program: Program, kind: str) -> isl.UnionMap:
    """All reads (`kind="read"`) or writes (`"write"`) as one union map, in-bounds elements only.

    Reads of padding (out-of-bounds elements) touch no memory, so they carry no dependence.
    """
    result = isl.UnionMap("{ }")
    for stmt in program.statements:
        accs = stmt.reads if kind == "read" else [stmt.lhs]
        for acc in accs:
            m = access_map(stmt, acc).intersect_range(tensor_box(program.tensor(acc.tensor)))
            result = result.union(isl.UnionMap.from_map(m))
    return result
