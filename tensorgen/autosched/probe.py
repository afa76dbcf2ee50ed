"""What the cost model needs to know of one loop nest of the search (a `Probe`): the footprint
of every tensor at every loop it may be staged at, the cycles of the contraction's band and of
a tile's fused vector work, and the loops whose last iteration is partial. These re-derive the
facts the lowering will use (staged boxes, fills, compaction) from the nest's unchecked
skeleton, once per nest; the cost model then costs every staging choice from them.
"""

from __future__ import annotations

import itertools
import math
from functools import cache

from tensorgen.autosched.layer import Geometry, Layer, Skeleton
from tensorgen.ir.core import Program, Statement
from tensorgen.ir.queries import out_indices
from tensorgen.mc import isa
from tensorgen.schedule.compaction import compacted_size, row_compaction
from tensorgen.schedule.cost import Footprint, Probe, vector_cycles
from tensorgen.schedule.fold import KFold
from tensorgen.schedule.passes import loop_passes
from tensorgen.target import Target


def staging_levels(
    program: Program, layer: Layer, sk: Skeleton, order, tensor: str, fold: KFold | None = None
) -> list[str | None]:
    """Where `tensor` may be staged: at a loop that encloses every statement accessing it.
    A temporary of a fused layer lives in the innermost tile loop: nothing is gained higher.
    A window fold's streamed operand is one kernel-wide column: staged inside its column loop."""
    if fold is not None and fold.column and tensor == fold.streamed:
        return list(order[order.index(fold.column) :])
    written = {s.lhs.tensor for s in layer.statements}
    if layer.others and tensor in written and program.tensor(tensor).role == "none":
        return [sk.fused[-1] if sk.fused else None]
    if any(s is not layer.contraction for s in layer.accessing(tensor)):
        return [None] + list(sk.fused)
    return [None] + list(order)


def probe_nest(
    program: Program,
    target: Target,
    layer: Layer,
    sk: Skeleton,
    blocks,
    order,
    m_loops,
    band,
    kind: str,
    profiles,
    fold: KFold | None = None,
) -> Probe:
    """The probe of the loop nest `sk` (its `blocks` split, `order` outside the `band`, whose
    M loops are `m_loops`) on the unit `kind` ("array" or "vector")."""
    stmt = layer.contraction
    geo = Geometry.of(stmt, blocks)
    written = {x.lhs.tensor for x in layer.statements}
    stored = {t for t in written if program.tensor(t).role != "none"}
    sizes = _footprints(program, target, layer, sk, order, band, kind, fold)
    if kind == "array":
        per_block = fold.matmuls if fold else 1
        band_cycles = _matmul_band_cycles(target, layer, geo, sk, order, m_loops, per_block)
        band_temps = 0
        parts = _band_elements(geo, order, m_loops)
        band_parts = {k: per_block * isa.matmul_cycles(target, e, e) for k, e in parts.items()}
    else:
        instructions, slots = profiles[stmt.name]
        blocks_v = geo.blocks(list(order), band)
        band_cycles = instructions * sum(n * vector_cycles(target, e) for n, e in blocks_v)
        band_temps = slots * _align(4 * max(e for _, e in blocks_v))
        parts = _band_elements(geo, order, band)
        band_parts = {k: instructions * vector_cycles(target, e) for k, e in parts.items()}
    tile_work = _tile_work(target, layer, geo, sk, profiles)
    extents = {i: stmt.extent(i) for i in stmt.indices}
    memory = {t: "spad" for t in layer.tensors()}
    if kind == "array":
        memory[stmt.lhs.tensor] = "acc"
    out = out_indices(program, stmt)
    reductions = tuple(x for x in order if geo.base[x] not in out and geo.trips[x] > 1)
    return Probe(
        tuple(order),
        sk.fused,
        {x: geo.trips[x] for x in order},
        sizes,
        band_cycles,
        band_temps,
        tile_work,
        _ragged(stmt, blocks),
        memory,
        written,
        stored,
        reductions=reductions,
        passes=loop_passes(extents, blocks, order),
        splits=(extents, tuple(map(tuple, blocks))),
        band_parts=band_parts,
    )


def _footprints(
    program: Program, target: Target, layer: Layer, sk: Skeleton, order, band, kind: str, fold
) -> dict[tuple[str, str | None], Footprint | None]:
    """The footprint of every tensor at every level it may be staged at; None for a temporary
    whose box at that level is not fresh (it cannot be staged there)."""
    stmt, s = layer.contraction, sk.schedule
    written = {x.lhs.tensor for x in layer.statements}
    stored = {t for t in written if program.tensor(t).role != "none"}

    @cache
    def overwrites() -> (
        bool
    ):  # whether the first MATMUL of each accumulator element may overwrite it
        return s.overwriting_blocks(stmt.name, s.position(sk.loops[band[0]])) is not None

    sizes: dict[tuple[str, str | None], Footprint | None] = {}
    for t in layer.tensors():
        tensor = program.tensor(t)
        for lv in staging_levels(program, layer, sk, order, t, fold):
            box = s.staged_box(t, sk.loops[lv].name if lv else None)
            if box is None:
                sizes[(t, lv)] = Footprint(0, 0, False, False)
                continue
            comp = row_compaction(box, tensor.itemsize, target, t in written)
            elements = math.prod(compacted_size(box.size, comp))
            fill = box.fresh and (s.zeros_read(t) or (t in stored and not box.covered))
            refill = (
                box.fresh and not fill and s.initial_value_read(t)
            )  # the first writes overwrite
            temp = t in written and tensor.role == "none"
            first = box.first.count if box.first else 0
            accumulator = kind == "array" and t == stmt.lhs.tensor
            zeroed = bool(first) and not (box.first.covered and accumulator and overwrites())
            sizes[(t, lv)] = (
                None
                if temp and not box.fresh
                else Footprint(
                    elements * tensor.itemsize,
                    elements,
                    box.fresh,
                    fill or zeroed,
                    first,
                    box.disjoint_in_loop,
                    refill,
                    comp[2] if comp else 1,
                    math.prod(box.size) * tensor.itemsize,
                )
            )
    return sizes


def _tile_work(target: Target, layer: Layer, geo: Geometry, sk: Skeleton, profiles) -> list:
    """(cycles, temporaries' bytes) of the fused vector statements of one tile, for each count
    of the innermost own loops vectorized (0, 1, ...); [(0, 0)] when nothing is fused."""
    if not layer.others:
        return [(0, 0)]
    own = sk.own_names
    tile_work = []
    for v in range(len(own) + 1):
        blocks_t = geo.blocks(list(sk.fused) + own[: len(own) - v], own[len(own) - v :])
        cycles = sum(
            profiles[x.name][0] * sum(n * vector_cycles(target, e) for n, e in blocks_t)
            for x in layer.others
        )
        temps = max(profiles[x.name][1] for x in layer.others) * _align(
            4 * max(e for _, e in blocks_t)
        )
        tile_work.append((cycles, temps))
    return tile_work


def _matmul_band_cycles(
    target: Target, layer: Layer, geo: Geometry, sk: Skeleton, order, m_loops, per_block: int
) -> int:
    """The contraction's MATMULs (`per_block` per block of M rows), costed by isa.matmul_cycles:
    back to back on EX, each hides what it can of the next one's fill (two weight buffers),
    except the first of each tile of a fused layer, which follows the vector unit's work."""
    blocks = geo.blocks(list(order), m_loops)
    cycles = per_block * sum(n * isa.matmul_cycles(target, rows, rows) for n, rows in blocks)
    runs = math.prod(geo.trips[x] for x in sk.fused) if layer.others else 1
    rows = max(r for _, r in blocks)
    return cycles + runs * (isa.matmul_cycles(target, rows) - isa.matmul_cycles(target, rows, rows))


def _band_elements(geo: Geometry, order, inside) -> dict[frozenset[str], int]:
    """The elements of the band's blocks over its loops `inside` at one point of the outer
    loops `order`, by which outer loops of ragged splits of those loops are at their last,
    partial iteration there (the keys): what the cost model times each pass by."""
    shrink = [geo.outer[x] for x in inside if geo.partial.get(x) and geo.outer[x] in order]
    parts = {}
    for k in range(len(shrink) + 1):
        for low in itertools.combinations(shrink, k):
            sizes = [geo.partial[x] if geo.outer.get(x) in low else geo.trips[x] for x in inside]
            parts[frozenset(low)] = math.prod(sizes)
    return parts


def _align(n: int) -> int:
    return -(-n // 16) * 16


def _ragged(stmt: Statement, blocks) -> set[str]:
    """Outer loops of splits whose last iteration is partial: isl peels such an iteration out
    of its loop, and a peeled iteration is not pipelined."""
    extent = {i: stmt.extent(i) for i in stmt.indices}
    varies: set[str] = set()
    ragged: set[str] = set()
    for name, size in blocks:
        e = extent.get(name, size)
        if e <= size:
            continue
        extent[f"{name}_o"], extent[f"{name}_i"] = -(-e // size), size
        if e % size or name in varies:
            ragged.add(f"{name}_o")
            varies.add(f"{name}_i")
    return ragged
