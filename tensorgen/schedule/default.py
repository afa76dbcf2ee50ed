"""The default schedule: always legal, always fits.

Kernels come from `form_kernels` (isl-checked point-wise fusion). Tile sizes
start from the MAC array's shape (N <= cols, K <= rows, M streamed whole) and
are halved, most memory-hungry first, until every staged footprint (computed
by isl) fits its memory.
"""

from __future__ import annotations

from tensorgen.errors import CapacityError
from tensorgen.ir.core import Program
from tensorgen.schedule.kernel import Kernel, footprint_bytes, form_kernels, mac_mapping
from tensorgen.target import Target


def default_schedule(program: Program, target: Target) -> list[Kernel]:
    return [choose_tiles(program, target, k) for k in form_kernels(program)]


def _capacities(target: Target) -> dict[str, int]:
    return {"spad": target.spad.bytes, "acc": target.acc.bytes}


def fits(program: Program, target: Target, kernel: Kernel) -> tuple[bool, dict[str, int]]:
    need = footprint_bytes(program, kernel)
    return all(need[m] <= cap for m, cap in _capacities(target).items()), need


def choose_tiles(program: Program, target: Target, kernel: Kernel) -> Kernel:
    extents: dict[str, int] = {}
    for stmt in kernel.statements:
        for name in stmt.indices:
            if name not in kernel.shared:
                extents[name] = stmt.extent(name)
    tiles = {name: (extents[name] if name not in kernel.out else 1) for name in extents}
    maps = [m for m in (mac_mapping(program, s) for s in kernel.statements) if m]
    order: list[str] = []
    for m in maps:
        for name, cap in ((m.m, None), (m.n, target.cols), (m.k, target.rows)):
            if name is not None:
                tiles[name] = min(extents[name], cap) if cap else extents[name]
    if not maps and kernel.out:
        _grow_vector_tile(program, target, kernel, tiles, extents)
    # shrink the streamed M first, then whole reductions, then the rest
    order = [m.m for m in maps if m.m] + [
        n for n in extents if n not in kernel.out and all(n != m.k for m in maps)
    ]
    order += (
        list(reversed(kernel.out))
        + [m.k for m in maps]
        + [m.n for m in maps if m.n]
        + list(extents)
    )
    while True:
        candidate = kernel.with_tiles(tiles)
        ok, need = fits(program, target, candidate)
        if ok:
            return candidate
        shrink = next((n for n in order if tiles[n] > 1), None)
        if shrink is None:
            names = ", ".join(s.name for s in kernel.statements)
            over = {m: need[m] - cap for m, cap in _capacities(target).items() if need[m] > cap}
            detail = "; ".join(
                f"{m} needs {need[m]} B of {_capacities(target)[m]} B ({o} B over)"
                for m, o in over.items()
            )
            raise CapacityError(
                f"kernel {names}: even the minimal tile does not fit target {target.name}: {detail}"
            )
        tiles[shrink] = (tiles[shrink] + 1) // 2


def _grow_vector_tile(
    program: Program, target: Target, kernel: Kernel, tiles: dict[str, int], extents: dict[str, int]
) -> None:
    """An element-wise or pooling kernel runs on the vector unit, where every instruction and
    every DMA pays a setup: make its tile as large as a quarter of each memory allows, growing the
    output dimensions from the innermost out (whole rows, then planes, ...), so the loads stay
    contiguous and the setups are amortised."""
    budget = {m: cap // 4 for m, cap in _capacities(target).items()}

    def small_enough(t: dict[str, int]) -> bool:
        need = footprint_bytes(program, kernel.with_tiles(t))
        return all(need[m] <= budget[m] for m in budget)

    for name in reversed(kernel.out):
        lo, hi = tiles[name], extents[name]
        while lo < hi:  # the largest size of this dimension that stays within the budget
            mid = (lo + hi + 1) // 2
            if small_enough({**tiles, name: mid}):
                lo = mid
            else:
                hi = mid - 1
        tiles[name] = lo
        if lo < extents[name]:
            break
