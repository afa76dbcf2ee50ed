"""Dependences of a program from isl's dataflow analysis: flow, anti and output."""

from __future__ import annotations

from dataclasses import dataclass

import islpy as isl

from tensorgen.ir import poly
from tensorgen.ir.core import Program


@dataclass(frozen=True)
class Dependences:
    flow: isl.UnionMap  # write -> later read of the same element (last writer)
    anti: isl.UnionMap  # read -> later write
    output: isl.UnionMap  # write -> later write

    @property
    def all(self) -> isl.UnionMap:
        return self.flow.union(self.anti).union(self.output)


def dependences(program: Program) -> Dependences:
    sched = poly.schedule_map(program)
    reads, writes = poly.accesses(program, "read"), poly.accesses(program, "write")
    flow = (
        isl.UnionAccessInfo.from_sink(reads)
        .set_must_source(writes)
        .set_schedule_map(sched)
        .compute_flow()
        .get_may_dependence()
    )
    anti = (
        isl.UnionAccessInfo.from_sink(writes)
        .set_may_source(reads)
        .set_schedule_map(sched)
        .compute_flow()
        .get_may_dependence()
    )
    output = (
        isl.UnionAccessInfo.from_sink(writes)
        .set_may_source(writes)
        .set_schedule_map(sched)
        .compute_flow()
        .get_may_dependence()
    )
    return Dependences(flow, anti, output)


def pointwise(
    program: Program,
    deps: isl.UnionMap,
    src: str,
    dst: str,
    shared: tuple[str, ...],
    indices: tuple[str, ...],
) -> bool:
    """Whether every dependence src -> dst at equal shared-loop values links equal `indices`.

    This is what lets two statements run fused, tile by tile, over `indices`.
    """
    s = next(x for x in program.statements if x.name == src)
    d = next(x for x in program.statements if x.name == dst)
    same_step = " and ".join(f"{n} = {n}'" for n in shared) or "true"
    s_idx = ", ".join(s.indices)
    d_idx = ", ".join(f"{n}'" for n in d.indices)
    rel = isl.Map(f"{{ {src}[{s_idx}] -> {dst}[{d_idx}] : {same_step} }}")
    dep = deps.extract_map(rel.get_space()).intersect(rel)
    if dep.is_empty():
        return True
    equal = " and ".join(f"{n} = {n}'" for n in indices) or "true"
    return dep.is_subset(isl.Map(f"{{ {src}[{s_idx}] -> {dst}[{d_idx}] : {equal} }}"))
