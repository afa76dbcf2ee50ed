"""Tile-level fusion: a group whose activations do not fit the scratchpad whole, run per band of
its consumer's output rows.

The consumer (the group's tile layer) keeps the row loop its own schedule tiles its output
with (`h_o`, or `h` untiled: one row a band); the layers before it are moved into that loop
with `compute_at` (isl places each producer instance in the first band that reads it), and the
activations they write are staged at the loop: one band on chip at a time, never in DRAM. A
band's buffer must hold what that band alone writes and reads (isl: the boxes of two bands
meet nowhere): a producer whose rows two bands read (a 3x3 consumer's halo) would need the
rows of the band before kept, which the lowering cannot stage (its buffer's origin would move
per band), so such a group's program is rewritten to recompute them per band instead
(recompute.py: a shared `band` loop, no compute_at); a band whose boxes still meet, or that does
not fit the memories, is refused here, before anything is lowered.
"""

from __future__ import annotations

from dataclasses import dataclass

from tensorgen.errors import TensorgenError
from tensorgen.schedule.api import Schedule
from tensorgen.schedule.state import Loop

BAND = "band"  # the shared loop over bands of a group whose producers recompute (recompute.py)


class TileError(TensorgenError):
    """A group that cannot be fused per band (refused before it is lowered)."""


@dataclass(frozen=True)
class Tile:
    """The band loop's layer (its index in the group) and the tensors staged per band; `rows`:
    the bands are the shared loop `band` over that many of its output rows, the producers
    recomputing their halos (recompute.py), else the tile layer's own row loop (compute_at)."""

    layer: int
    banded: frozenset[str]
    rows: int | None = None


def row_halo(program, kept: frozenset[str]) -> str | None:
    """A statement of `program` that reads a row of a kept 4-D activation (NCHW) other than
    the row it writes (a 3x3 or strided consumer: a halo two bands read), from the text of its
    accesses alone: such a group recomputes its halos (recompute.py), decided before any
    schedule is built. isl's check in `tile_group` is the authoritative one."""
    for st in program.statements:
        if len(st.lhs.index) != 4:
            continue
        fixed = {i: lo for i, (lo, hi) in zip(st.indices, st.bounds, strict=True) if lo == hi}
        for acc in st.reads:
            if acc.tensor not in kept or len(acc.index) != 4:
                continue
            row, own = _rows(acc.index[2], fixed), _rows(st.lhs.index[2], fixed)
            if row != own:
                return f"{st.name} reads {acc.tensor}'s rows as {_text(acc.index[2])}"
    return None


def _rows(a, fixed: dict[str, int]) -> tuple:
    """An index expression with the indices of one value (a 1x1 kernel's `r`) folded in."""
    const = a.const + sum(c * fixed[v] for v, c in a.terms if v in fixed)
    return tuple((v, c) for v, c in a.terms if v not in fixed), const


def _text(a) -> str:
    text = " + ".join(f"{c}*{v}" if c != 1 else v for v, c in a.terms) or "0"
    return text if not a.const else f"{text} {'-' if a.const < 0 else '+'} {abs(a.const)}"


def is_row_loop(loop) -> bool:
    """A loop (or a LoopRef) over output rows or their blocks: `h`, `h_o` of any statement."""
    return loop is not None and loop.name.split(".", 1)[-1] in ("h", "h_o")


def band_loop(fused: Schedule, statement: str) -> Loop:
    """The loop over blocks of output rows of `statement`'s layer: its first loop over `h` (or
    `h_o`), with only loops of one iteration (the image) outside it."""
    for loop in fused.loops(statement):
        if is_row_loop(loop):
            return loop
        if fused.trips(loop) != 1:
            break
    raise TileError(f"{statement}'s layer runs no loop over its output rows outermost")


def tile_group(
    fused: Schedule, tile: Tile, first: str, moved: list[str], layouts: dict | None = None
) -> Loop:
    """`moved` (the statements of the layers before the tile layer, whose first statement is
    `first`) computed per band of the tile layer's rows (or, with `tile.rows`, the program run
    per band already: recompute.py), and `tile.banded` staged at the band loop (an input several
    layers read: loaded per band, its halo again) in `layouts` (tensor -> its buffer's
    dimension order, default the tensor's); refused if the buffer of an activation would have
    to keep another band's rows."""
    if tile.rows is not None:  # the program runs per band already: `for band: producers; ...`
        loop = fused.loop(BAND)
    else:
        loop = band_loop(fused, first)
        try:
            fused.compute_at(loop, *moved)
        except TensorgenError as err:
            raise TileError(f"the producers do not run per band: {err}") from None
    written = {st.lhs.tensor for st in fused.program.statements}
    for tensor in sorted(tile.banded & written):
        box = fused.staged_box(tensor, loop.name)
        if box is None or not box.fresh:
            raise TileError(
                f"{tensor}'s rows are read by two bands of {loop.name} (a halo, or a box "
                f"whose origin is not affine): the band before's rows are not kept on chip"
            )
    try:
        fused.check()  # the dependences, once: what the lowering's verify_schedule would say
    except TensorgenError as err:
        raise TileError(f"the producers do not run per band: {err}") from None
    for tensor in sorted(tile.banded):
        fused.stage(tensor, loop, "spad", layout=(layouts or {}).get(tensor))
    return loop


def check_capacity(fused: Schedule, target, offsets: tuple[int, ...], kept: frozenset[str]) -> None:
    """The staged buffers' footprints (isl, before lowering) against the target's memories, as
    a lower bound of what the lowering's buffer plan needs: the buffers of `kept` (whole, or one
    band) with those of the one layer (its statements from `offsets`) that needs the most; the
    plan may share the others' space between layers, which run one after another."""
    program = fused.program
    first = {
        st.name: max(i for i, o in enumerate(offsets) if o <= int(st.name[1:]))
        for st in program.statements
    }
    users: dict[str, set[int]] = {}
    for st in program.statements:
        for acc in [st.lhs, *st.reads]:
            users.setdefault(acc.tensor, set()).add(first[st.name])
    for memory, cap in (("spad", target.spad.bytes), ("acc", target.acc.bytes)):
        shared, per = 0, [0] * len(offsets)
        for stage in fused.stages:
            if stage.memory != memory:
                continue
            size = fused.footprint_bytes(stage)
            if stage.tensor in kept:
                shared += size
                continue
            for i in users.get(stage.tensor, ()):
                per[i] += size
        if shared + max(per) > cap:
            worst = per.index(max(per))
            raise TileError(
                f"{memory} needs at least {shared + max(per)} B of its {cap} B before lowering: "
                f"{shared} B kept for the group and {max(per)} B of layer {worst}'s buffers"
            )


def restage(fused: Schedule, band: Loop, deferred: list[tuple[str, Loop, str, bool]]) -> None:
    """The stagings a moved layer made at its own row loop (one iteration per band now), at
    the loop just outside that one inside the band (its blocks of channels), else the band;
    an input the layer only reads, at the band (its rows loaded once per band)."""
    at = fused.position(band)
    written = {st.lhs.tensor for st in fused.program.statements}
    for tensor, loop, memory, double in deferred:
        if tensor not in written:  # an input: its band's rows once, not once per block
            fused.stage(tensor, band, memory)
            if double:
                fused.double_buffer(tensor)
            continue
        here = fused.loops(min(fused.statements_of(loop)))
        inner = [i for i, lp in enumerate(here) if lp.name == loop.name]
        outside = [lp for lp in here[: inner[0]] if fused.position(lp) > at] if inner else []
        fused.stage(tensor, outside[-1] if outside else band, memory)
        if double:
            fused.double_buffer(tensor)
