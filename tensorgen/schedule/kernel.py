"""Kernels (fused statement groups), their MAC-array mapping and staged buffers.

A kernel is a run of consecutive statements that write over the same output
indices and depend on each other only point-wise (checked with isl), so they
can run together tile by tile: init, contraction and epilogue of a layer.
Each tensor a kernel touches is staged in an on-chip buffer whose size is the
isl footprint of its accesses over one tile.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import islpy as isl

from tensorgen.errors import CodegenError
from tensorgen.ir import poly
from tensorgen.ir.core import Access, Call, Const, Expr, Program, Read, Statement
from tensorgen.ir.queries import MacMapping, mac_mapping, out_indices
from tensorgen.poly import deps as depmod
from tensorgen.poly.footprint import FootprintBox, footprint

__all__ = [
    "Kernel",
    "MacMapping",
    "form_kernels",
    "mac_mapping",
    "out_indices",
]  # the IR queries: ir.queries


@dataclass(frozen=True)
class Kernel:
    statements: tuple[Statement, ...]
    out: tuple[str, ...]  # output indices, tiled, in the first statement's LHS order
    shared: tuple[str, ...]
    tiles: tuple[tuple[str, int], ...]  # tile size of every non-shared index

    def tile(self, name: str) -> int:
        return dict(self.tiles)[name]

    def reductions(self, stmt: Statement) -> tuple[str, ...]:
        return tuple(i for i in stmt.indices if i not in self.out and i not in self.shared)

    def with_tiles(self, tiles: dict[str, int]) -> Kernel:
        merged = {**dict(self.tiles), **tiles}
        return Kernel(self.statements, self.out, self.shared, tuple(sorted(merged.items())))


@dataclass(frozen=True)
class Buffer:
    """An on-chip staging buffer of one tensor.

    level "tile": resident for the whole output tile (written by the kernel);
    level <statement name>: streamed in for each reduction tile of that statement.
    """

    key: str
    tensor: str
    mem: str
    dtype: str
    level: str
    uses: tuple[tuple[Statement, Access], ...]
    load: bool
    store: bool


def form_kernels(program: Program) -> list[Kernel]:
    """Group consecutive statements into kernels that can be fused tile by tile."""
    deps = depmod.dependences(program).all
    shared = program.shared_names
    groups: list[list[Statement]] = []
    for stmt in program.statements:
        out = out_indices(program, stmt)
        _check_lhs(program, stmt)
        if not depmod.pointwise(program, deps, stmt.name, stmt.name, shared, out):
            raise CodegenError(
                f"{stmt.location}: {stmt.name} depends on itself across its output indices (a scan or an "
                f"in-place stencil); the default lowering cannot vectorise it yet"
            )
        if groups and _can_join(program, deps, groups[-1], stmt, out):
            groups[-1].append(stmt)
        else:
            groups.append([stmt])
    return [Kernel(tuple(g), out_indices(program, g[0]), shared, ()) for g in groups]


def _bounds(stmt: Statement, names) -> tuple:
    return tuple(stmt.bounds[stmt.indices.index(n)] for n in names)


def _can_join(program: Program, deps, group: list[Statement], stmt: Statement, out) -> bool:
    first = group[0]
    if set(out) != set(out_indices(program, first)) or _bounds(stmt, out) != _bounds(first, out):
        return False
    # a kernel runs at the shared-loop values of its statements (one guard for all of them)
    if _bounds(stmt, program.shared_names) != _bounds(first, program.shared_names):
        return False
    # a tensor written through two different subscripts (two slices of a concatenation) would
    # share one tile buffer whose box covers both slices and the rows between them
    if any(g.lhs.tensor == stmt.lhs.tensor and g.lhs != stmt.lhs for g in group):
        return False
    return all(
        depmod.pointwise(program, deps, g.name, stmt.name, program.shared_names, out) for g in group
    )


def _check_lhs(program: Program, stmt: Statement) -> None:
    box = isl.Set("{ " + poly.domain_text(replace(stmt, where="")) + " }")
    if stmt.where and not poly.domain(stmt).is_equal(box):
        raise CodegenError(
            f"{stmt.location}: non-rectangular domains (where: {stmt.where}) are not lowered yet"
        )
    shared = program.shared_names
    seen = set()
    for sub in stmt.lhs.index:
        own = [n for n in sub.names if n not in shared]
        if len(own) > 1 or (own and sub.coef(own[0]) != 1) or (own and own[0] in seen):
            raise CodegenError(
                f"{stmt.location}: the written subscript '{sub}' must be one index plus a constant"
            )
        seen.update(own)


def plan_buffers(program: Program, kernel: Kernel) -> list[Buffer]:
    """Which buffers the kernel stages, in which memory, loaded and stored when."""
    in_kernel = {s.name for s in kernel.statements}
    written: set[str] = set()
    resident: dict[str, dict] = {}
    streamed: list[Buffer] = []
    pre_reads: set[str] = set()
    for stmt in kernel.statements:
        lhs = stmt.lhs.tensor
        self_reads = [a for a in stmt.reads if a.tensor == lhs]
        if lhs not in resident:
            on_array = any(
                s.lhs.tensor == lhs and mac_mapping(program, s) for s in kernel.statements
            )
            resident[lhs] = {
                "mem": "acc" if on_array else "spad",
                "uses": [],
                "load": stmt.op != "=" or bool(self_reads),
            }
        resident[lhs]["uses"].append((stmt, stmt.lhs))
        for acc in stmt.reads:
            if acc.tensor in written or acc.tensor == lhs:
                resident[acc.tensor]["uses"].append((stmt, acc))
            else:
                pre_reads.add(acc.tensor)
                streamed.append(
                    Buffer(
                        f"{stmt.name}:{acc.tensor}:{len(streamed)}",
                        acc.tensor,
                        "spad",
                        program.tensor(acc.tensor).dtype,
                        stmt.name,
                        ((stmt, acc),),
                        True,
                        False,
                    )
                )
        written.add(lhs)
    out = []
    for name, r in resident.items():
        tensor = program.tensor(name)
        read_elsewhere = any(
            a.tensor == name for s in program.statements if s.name not in in_kernel for a in s.reads
        )
        # a temporary the kernel loads (accumulates onto, or reads before writing) carries its value
        # from one shared-loop iteration to the next: the next iteration loads what this one stores
        carried = bool(program.shared_loops) and r["load"]
        store = tensor.role != "none" or read_elsewhere or name in pre_reads or carried
        out.append(
            Buffer(name, name, r["mem"], tensor.dtype, "tile", tuple(r["uses"]), r["load"], store)
        )
    return out + streamed


def use_sizes(
    kernel: Kernel, buf: Buffer, stmt: Statement, tiles: dict[str, int]
) -> tuple[tuple[str, int], ...]:
    """Tile sizes per index of `stmt` as seen by `buf`: resident buffers span whole reductions."""
    out = []
    for name in stmt.indices:
        if name in kernel.shared:
            out.append((name, 1))
        elif name in kernel.out or buf.level != "tile":
            out.append((name, tiles[name]))
        else:
            out.append((name, stmt.extent(name)))
    return tuple(out)


def buffer_box(kernel: Kernel, buf: Buffer, tiles: dict[str, int]) -> FootprintBox:
    return footprint(tuple((s, a, use_sizes(kernel, buf, s, tiles)) for s, a in buf.uses))


def write_box(kernel: Kernel, buf: Buffer, tiles: dict[str, int]) -> FootprintBox:
    return footprint(
        tuple((s, a, use_sizes(kernel, buf, s, tiles)) for s, a in buf.uses if a is s.lhs)
    )


def expr_nodes(expr: Expr) -> int:
    if isinstance(expr, (Read, Const)):
        return 1
    if isinstance(expr, Call):
        return 1 + sum(expr_nodes(a) for a in expr.args)
    return 1 + expr_nodes(expr.lhs) + expr_nodes(expr.rhs)


def footprint_bytes(program: Program, kernel: Kernel) -> dict[str, int]:
    """Bytes each memory needs for one full tile of the kernel (buffers + vector temporaries)."""
    tiles = dict(kernel.tiles)
    need = {"spad": 0, "acc": 0}
    for buf in plan_buffers(program, kernel):
        box = buffer_box(kernel, buf, tiles)
        need[buf.mem] += _align(box.elements * program.tensor(buf.tensor).itemsize)
    out_elems = 1
    for name in kernel.out:
        out_elems *= tiles[name]
    temps = max(
        (expr_nodes(s.rhs) for s in kernel.statements if not mac_mapping(program, s)), default=0
    )
    need["spad"] += temps * _align(out_elems * 4)
    return need


def _align(n: int, to: int = 16) -> int:
    return -(-n // to) * to
