"""The automatic scheduler's cost model: the cycles of the microcode the lowering emits.

Every DMA costs its setup plus its bytes over DRAM bandwidth; every MATMUL its M rows plus
the array's fill, less what the MATMUL before it hides with two weight buffers; every vector
instruction the vector unit's setup plus its elements over the lanes (the instructions' cycles
are isa.py's definitions, `matmul_cycles` and `vector_cycles`; how many instructions a
statement takes comes from the instruction selection itself).
The lowering serialises its queues, so these add up, except in a double-buffered loop, whose
loads and stores overlap its compute: a pass of it is timed by the lowering's tokens on the
simulator's own DRAM channel (`pipelined.one_pass`), each kind of pass with its own compute
(a ragged split outside the loop makes the passes in its last iteration compute less:
`passes.pass_kinds`). Iterations are counted as the loops run them after ragged splits
(`passes.loop_passes`). A buffer whose boxes meet across iterations (partial sums
of a chunk of the reduction) is loaded and stored, except that the iterations that are the first
to touch their box zero it instead of loading it.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import NamedTuple

from tensorgen.mc import isa
from tensorgen.schedule.passes import pass_kinds
from tensorgen.schedule.pipelined import pipelined_pass
from tensorgen.schedule.sums import Memory, memory_of, product_sums
from tensorgen.target import Target

ALIGN = 16  # the lowering's buffer alignment, in bytes


@dataclass(frozen=True)
class Candidate:
    order: tuple[str, ...]  # outer loops (outside the band), outermost first
    stages: tuple[tuple[str, str | None], ...]  # tensor -> loop name or None (whole program)
    dma_cycles: int
    compute_cycles: int
    dram_bytes: int
    spad_bytes: int
    acc_bytes: int
    pipelined: bool = False  # the innermost staging loop double-buffers its inputs
    vector_cycles: int = 0  # of compute_cycles: the init and epilogue on the vector unit
    vector_loops: int = 0  # how many of a tile's innermost loops the init and epilogue vectorize

    @property
    def cycles(self) -> int:
        return self.dma_cycles + self.compute_cycles


@dataclass(frozen=True)
class Footprint:
    nbytes: int
    elements: int
    fresh: bool  # starts as zeros (no load)
    fill: bool  # ... and must be zeroed, because some element is read before it is written (not
    # fresh: the iterations that are the first to touch their box zero it)
    skipped: int = 0  # not fresh: iterations that are the first to touch their box (no load)
    pipelinable: bool = False  # not fresh, written: the boxes of one pass of the loop are disjoint,
    # so the buffer may be double-buffered (loaded and stored while others compute)
    refill: bool = False  # fresh: must be zeroed unless its first writes overwrite, which a staging
    # loop inside a reduction loop prevents (isl peels the reduction's first iteration out of that loop)
    dmas: int = 1  # DMAs per transfer (a box loaded one accessed row at a time: row_compaction)
    held: int = 0  # bytes the schedule's capacity check counts, if not nbytes (the whole box of a compacted one)


@dataclass
class Probe:
    """What one loop nest (blocks and loop order) offers the choices of staging levels."""

    order: tuple[str, ...]
    fused: tuple[str, ...]  # the tile loops shared by every statement of a fused layer
    trips: dict[str, int]
    sizes: dict[
        tuple[str, str | None], Footprint | None
    ]  # None: a temporary that would leave the chip
    band_cycles: int  # the contraction's MATMULs or vector instructions
    band_temps: int  # bytes of int32 temporaries the contraction's vector instructions need
    tile_work: list[
        tuple[int, int]
    ]  # per number of vectorized tile loops: (cycles, temporary bytes)
    ragged: set[str] = field(default_factory=set)
    memory: dict[str, str] = field(default_factory=dict)  # tensor -> "spad" or "acc"
    written: set[str] = field(default_factory=set)
    stored: set[str] = field(default_factory=set)  # written tensors whose buffers are stored
    reductions: tuple[str, ...] = ()  # the loops of `order` over reduction indices of >1 trips
    table: dict = field(default_factory=dict)  # (tensor, level) -> _Staged, filled by cost()
    # loop -> ((trips, passes), ...): how often the loop runs with each trip count (loop_passes);
    # a loop not in it runs trips[loop] times per iteration of the loops outside it
    passes: dict[str, tuple[tuple[int, int], ...]] = field(default_factory=dict)
    # the splits of the contraction's indices: (extents, blocks), for pass_kinds ((): none known)
    splits: tuple = ()
    # outer loops of ragged splits at their last iteration -> the band's cycles at one point
    # (those loops shrink the band's blocks there); {} : the band is the same at every point
    band_parts: dict = field(default_factory=dict)

    @property
    def first_reduction(self) -> int:
        """Position in `order` of the outermost reduction loop of >1 trips (10**6: none)."""
        return self.order.index(self.reductions[0]) if self.reductions else 10**6


def _iterations(probe: Probe, level: str) -> int:
    """Iterations of `level` over the whole program."""
    if level in probe.passes:
        return sum(trips * passes for trips, passes in probe.passes[level])
    order = probe.order
    return math.prod(probe.trips[o] for o in order[: order.index(level) + 1])


def _band_cycles(probe: Probe) -> int:
    """The band's cycles over the iterations the outer loops really run: the probe counts every
    loop at its widest trip count, which a ragged split shortens for the loops inside it."""
    if "band" not in probe.table:
        order = probe.order
        nominal = math.prod(probe.trips[o] for o in order)
        real = _iterations(probe, order[-1]) if order else 1
        probe.table["band"] = round(probe.band_cycles * real / nominal) if nominal else 0
    return probe.table["band"]


def vector_cycles(target: Target, elements: int) -> int:
    return isa.vector_cycles(target, elements)  # the instruction's own cost, defined once


def _align(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


@dataclass(frozen=True)
class _Staged:
    """What staging one tensor at one level costs, precomputed once per probe."""

    count: int  # iterations of the level (buffers filled)
    written: bool
    fresh: bool
    fill: int  # cycles of one zero fill (0: none)
    refill: int  # cycles of one zero fill if its first writes cannot overwrite (0: none)
    fills: int  # zero fills over all iterations
    loads: int  # loads over all iterations
    stores: int  # stores over all iterations
    pipelinable: bool
    one: int  # cycles of one DMA
    channel: int  # cycles of one DMA's bytes on the DRAM channel
    dmas: int  # DMAs per transfer
    nbytes: int
    footprint: int  # bytes taken in its memory
    in_acc: bool
    serial: int = 0  # cycles of its fills and transfers when they do not overlap compute
    refills: int = 0  # cycles of its refills over all iterations (inside a reduction loop)
    traffic: int = 0  # DRAM bytes its transfers move


def _mergeable(probe: Probe, level: str) -> bool:
    """Whether isl may emit `level` as two siblings (see _merged): a ragged loop of two
    iterations, outer part of a split, peeled."""
    if not (level in probe.ragged and probe.trips[level] == 2 and level.endswith("_o")):
        return False
    # isl peels its partial iteration out of the loop only when the band inside needs constant
    # bounds: no loop of its inner part is outside the band
    inner = level[:-1] + "i"
    return not any(x == inner or x.startswith(inner + "_") for x in probe.order)


def _merged(probe: Probe, stages) -> set[str]:
    """The staging levels whose two iterations share one staging of their tensors: isl emits a
    loop of two iterations whose last is partial as two siblings (no loop), and the lowering
    stages them together when the boxes of every tensor staged there are the same in both
    (scheduled._walk_nodes) -- a box is when it is as large as at the loop around."""

    def invariant(tensor: str, level: str) -> bool:
        at = probe.order.index(level)
        here = probe.sizes.get((tensor, level))
        outer = probe.sizes.get((tensor, probe.order[at - 1] if at else None))
        return here is not None and outer is not None and outer.nbytes == here.nbytes

    levels = {lv for _, lv in stages if lv is not None and _mergeable(probe, lv)}
    return {lv for lv in levels if all(invariant(t, lv) for t, x in stages if x == lv)}


def _staged(
    probe: Probe, target: Target, tensor: str, level: str | None, merged: bool = False
) -> _Staged | None:
    key = (tensor, level, merged)
    if key not in probe.table:
        fp = probe.sizes[(tensor, level)]
        if fp is None:
            probe.table[key] = None
        else:
            count = _iterations(probe, level) if level else 1
            if merged:
                count //= 2
            written = tensor in probe.written
            loads = 0 if written and fp.fresh else count - fp.skipped
            stores = count if written and tensor in probe.stored else 0
            fills = (count if fp.fresh else fp.skipped) if fp.fill else 0
            channel = isa.dma_channel_cycles(target, fp.nbytes)
            fill = vector_cycles(target, fp.elements) if fp.fill else 0
            one = isa.dma_cycles(target, fp.nbytes, fp.dmas)
            probe.table[key] = _Staged(
                count,
                written,
                fp.fresh,
                fill,
                vector_cycles(target, fp.elements) if fp.refill else 0,
                fills,
                loads,
                stores,
                fp.pipelinable,
                one,
                channel,
                fp.dmas,
                fp.nbytes,
                _align(fp.held or fp.nbytes),
                probe.memory.get(tensor) == "acc",
                fills * fill + (loads + stores) * one,
                count * (vector_cycles(target, fp.elements) if fp.refill else 0),
                (loads + stores) * fp.nbytes,
            )
    return probe.table[key]


def cost(
    probe: Probe, target: Target, tensors: list[str], choice: tuple, pipeline: bool = False
) -> Candidate:
    """The cycles of the microcode the lowering emits for staging each tensor at its level in
    `choice`. Serialized: every DMA and every compute instruction adds up. With `pipeline`, the
    innermost staging loop has two buffers of each of its tensors, and its loads and stores
    overlap its compute (_pipelined_total)."""
    order = probe.order
    stages = tuple(zip(tensors, choice, strict=False))
    inner = max((lv for lv in choice if lv), key=order.index, default=None)
    merged = _merged(probe, stages)
    staged = [_staged(probe, target, t, lv, lv in merged) for t, lv in stages]
    memory = memory_of(staged, stages, inner)
    first = _first_blocks(probe, stages, staged)
    return _candidate(probe, target, stages, staged, inner, pipeline, memory, first)


def cost_product(probe: Probe, target: Target, tensors: list[str], levels, bound=None) -> list:
    """`cost` of every choice of `itertools.product(*levels)`, single- then double-buffered, in
    that order: what the two share (staged tensors, innermost and merged levels, buffers, first
    blocks) worked out once, levels that cannot merge skipped without asking, a choice whose single
    buffers overflow a memory refused twice uncosted (double buffers only add), and with `bound`
    (autosched/bound.py) None for a choice whose least cycles it cuts, and for both of a choice
    refused so (the search's Considered costs them as refused when they are read)."""
    order = probe.order
    rank = {lv: order.index(lv) for lvs in levels for lv in lvs if lv}
    mergeable = {lv for lv in rank if _mergeable(probe, lv)}
    spad_room = target.spad.bytes - _least_temps(probe)
    acc_room, floor = target.acc.bytes, _band_cycles(probe) + min(w[0] for w in probe.tile_work)
    plain = [  # each tensor's _Staged at each of its levels, unmerged
        {lv: _staged(probe, target, t, lv) for lv in lvs}
        for t, lvs in zip(tensors, levels, strict=True)
    ]
    sums = product_sums(plain, levels, rank, spad_room, acc_room)  # memory_of, all at once
    acc_at = _accumulator_at(probe, tensors)
    out = []
    for k, choice in enumerate(itertools.product(*levels)):
        staged = memory = None
        if sums is None or (mergeable and mergeable.intersection(choice)):
            stages, inner, staged, memory = _choice(probe, target, tensors, choice, rank)
            fits = memory is not None and memory.acc <= acc_room and memory.spad <= spad_room
            serial, serial_inner = (memory.serial, memory.serial_inner) if fits else (0, 0)
        else:
            fits, serial, serial_inner = sums.fits[k], sums.serial[k], sums.serial_inner[k]
        if not fits:
            if bound is not None:  # the search takes no refused choice: its Considered costs
                out += [None, None]  # them (math.inf cycles) when something reads them
                continue
            stages = tuple(zip(tensors, choice, strict=True))
            out += [_refused(probe, stages, False), _refused(probe, stages, True)]
            continue
        first = None  # the least cycles: serial transfers (not overlapped), band, fewest tile
        for pipe, least in ((False, serial), (True, serial - serial_inner)):
            if bound is not None and bound.cut(floor + least):
                out.append(None)
                continue
            if memory is None:
                stages = tuple(zip(tensors, choice, strict=True))
                inner = max((lv for lv in choice if lv), key=rank.__getitem__, default=None)
                staged = [at[lv] for at, lv in zip(plain, choice, strict=True)]
                memory = Memory(*sums.memory(k))
            first = first or _first_blocks(probe, stages, staged, acc_at)
            out.append(_candidate(probe, target, stages, staged, inner, pipe, memory, first))
            bound is None or bound.add(out[-1])
    return out


def _choice(probe: Probe, target: Target, tensors, choice, rank) -> tuple:
    """(stages, innermost level, _Staged of each tensor, memory_of) of one choice."""
    stages = tuple(zip(tensors, choice, strict=True))
    inner = max((lv for lv in choice if lv), key=rank.__getitem__, default=None)
    merged = _merged(probe, stages)
    staged = [_staged(probe, target, t, lv, lv in merged) for t, lv in stages]
    return stages, inner, staged, memory_of(staged, stages, inner)


def _candidate(
    probe: Probe, target: Target, stages, staged, inner, pipeline: bool, memory, first
) -> Candidate:
    """`cost` of `stages`, whose tensors' _Staged are `staged`, innermost level `inner`,
    buffers `memory` (memory_of, None: one cannot be staged there) and overwriting first
    blocks `first` (_first_blocks)."""
    order, trips = probe.order, probe.trips
    # isl peels the last, partial iteration of a ragged loop out of it: that one runs alone
    peeled = pipeline and inner in probe.ragged
    if pipeline and (inner is None or trips[inner] - peeled < 2):
        return _refused(probe, stages, pipeline)
    # a loop whose trip count differs between passes, or that the overwriting first blocks leave
    # (_first_blocks), has bounds that vary (LOOPB): the lowering double-buffers only loops of
    # constant bounds
    if pipeline and (len(probe.passes.get(inner, ())) > 1 or inner == first.varying):
        return _refused(probe, stages, pipeline)
    if memory is None:
        return _refused(probe, stages, pipeline)
    m = memory
    # over capacity, whatever else: refused before it is costed
    spad, acc = m.spad + m.spad_inner * pipeline, m.acc + m.acc_inner * pipeline
    if acc > target.acc.bytes or spad + _least_temps(probe) > target.spad.bytes:
        return _refused(probe, stages, pipeline)
    # a staging loop inside a reduction loop: its first writes are not whole iterations of it
    deep = inner is not None and order.index(inner) >= probe.first_reduction
    if pipeline:  # the innermost level's transfers overlap compute; the others' add up
        piped = _piped_once(probe, target, stages, staged, inner, deep)
        if piped is None:
            return _refused(probe, stages, pipeline)
        dma = m.serial - m.serial_inner + (m.refills - m.refills_inner if deep else 0)
    else:
        dma = m.serial + (m.refills if deep else 0)
    dma += first.cycles
    if not pipeline:
        dma += _token_fills(probe, target, stages, staged)
    # the init and epilogue vectorize as many of a tile's loops as their temporaries leave room for
    room = target.spad.bytes - spad
    v = 0  # the most loops whose temporaries fit (the fewest do: checked above)
    for k, need in enumerate(_temps(probe)):
        if need <= room:
            v = k
    tile, temps = probe.tile_work[v]
    spad += max(temps, probe.band_temps)
    compute = _band_cycles(probe) + tile
    if pipeline:
        dma += _pipelined_once(probe, target, inner, peeled, compute, tile, piped, first)
    return Candidate(
        order,
        stages,
        dma,
        compute,
        m.traffic + first.traffic,
        spad,
        acc,
        pipelined=pipeline,
        vector_cycles=tile,
        vector_loops=v,
    )


def _piped_once(probe: Probe, target: Target, stages, staged, inner, deep: bool) -> _Piped | None:
    """_piped, worked out once per probe for the same tensors staged at `inner` (the choices of
    a product differ mostly in the levels outside it)."""
    memo = probe.table.setdefault("piped", {})
    here = tuple(id(st) for st, (_, lv) in zip(staged, stages, strict=True) if lv == inner)
    key = (inner, deep, here)
    if key not in memo:  # the _Staged live in probe.table: their ids are not reused
        memo[key] = _piped(target, stages, staged, inner, deep)
    return memo[key]


def _pipelined_once(
    probe: Probe, target: Target, inner, peeled, compute, tile, piped, first
) -> int:
    """_pipelined_total rounded, worked out once per probe for the same arguments."""
    memo = probe.table.setdefault("pipelined", {})
    key = (inner, peeled, compute, tile, id(piped), first)
    if key not in memo:  # the _Piped live in the "piped" memo: their ids are not reused
        total = _pipelined_total(probe, target, inner, peeled, compute, tile, piped, first)
        memo[key] = int(round(total))
    return memo[key]


class _FirstBlocks(NamedTuple):
    """What the overwriting first blocks of a reloaded accumulator add (_first_blocks)."""

    cycles: int = 0  # the extra transfers, serial
    traffic: int = 0  # their DRAM bytes
    varying: str | None = None  # the loop whose bounds they make vary
    blocks: int = 0  # how many (each one block of the band, run before the loops of `tail`)
    tail: tuple[str, ...] = ()  # the reduction loops inside the innermost other loop


_NO_FIRST_BLOCKS = _FirstBlocks()


def _accumulator_at(probe: Probe, tensors) -> int | None:
    """The index of the tensor staged in the accumulators among `tensors`, if one is."""
    return next((k for k, t in enumerate(tensors) if probe.memory.get(t) == "acc"), None)


def _first_blocks(probe: Probe, stages, staged, acc: int | None = -1) -> _FirstBlocks:
    """An accumulator staged inside its reduction loops and reloaded there is not zeroed: the
    MATMULs that first touch it overwrite it (the lowering's `S__w` pieces). They are the first
    iteration of every reduction loop, which isl emits apart, before the reduction loops inside
    the innermost other loop (`tail`), leaving the innermost reduction loop bounds that vary. An
    iteration of a staging loop of `tail` with a reduction loop inside it that holds such a
    block is then staged twice, around the block and around the rest (scheduled._walk_nodes): one more load of each loaded tensor staged there and
    one more store of each stored one, per such iteration. Nothing when the accumulator is
    zeroed instead, or not staged inside a reduction loop. `acc`: the accumulator's index in
    `stages` (_accumulator_at), if known."""
    order, reductions = probe.order, probe.reductions
    if acc == -1:
        acc = _accumulator_at(probe, [t for t, _ in stages])
    if acc is None or stages[acc][1] is None:
        return _NO_FIRST_BLOCKS
    st = staged[acc]
    if order.index(stages[acc][1]) < probe.first_reduction or st.fresh or st.fills:
        return _NO_FIRST_BLOCKS
    if st.loads == st.count:  # no iteration is the first to touch its box
        return _NO_FIRST_BLOCKS
    tail = max((k + 1 for k, x in enumerate(order) if x not in reductions), default=0)
    cycles = traffic = 0
    for k, (st, (_, level)) in enumerate(zip(staged, stages, strict=True)):
        at = order.index(level) if level is not None else -1
        if at < tail or at == len(order) - 1:
            continue  # staged outside the tail, or no reduction loop inside its level
        times = math.prod(probe.trips[x] for x in order[: at + 1] if x not in reductions)
        moves = (bool(st.loads) and k != acc) + bool(st.stores)
        cycles += times * moves * st.one
        traffic += times * moves * st.nbytes
    blocks = math.prod(probe.trips[x] for x in order if x not in reductions)
    varying = reductions[-1] if len(reductions) > 1 else None
    return _FirstBlocks(cycles, traffic, varying, blocks, order[tail:])


def _token_fills(probe: Probe, target: Target, stages, staged) -> int:
    """With two weight buffers, a MATMUL whose load token arrives after the MATMUL before it
    began to stream loads its weights only then, exposing the fill the band's cycles count
    hidden (timing.matmul_stream_start): once per iteration of the innermost level that loads
    a tensor, but for the first of the program (the band counts its fill)."""
    if target.weight_buffers < 2 or "acc" not in probe.memory.values():
        return 0
    loading = [
        (probe.order.index(lv), st.loads)
        for st, (_, lv) in zip(staged, stages, strict=True)
        if lv and st.loads
    ]
    if not loading:
        return 0
    loads = max(loading)[1]
    return target.fill_cycles * max(0, loads - 1)


def _refused(probe: Probe, stages, pipeline: bool) -> Candidate:
    """A candidate that does not fit or cannot double-buffer: infinitely many cycles."""
    return Candidate(probe.order, stages, math.inf, probe.band_cycles, 0, 0, 0, pipelined=pipeline)


def _piped(target: Target, stages, staged, inner, deep: bool) -> _Piped | None:
    """What the tensors staged at the pipelined level `inner` move per iteration, or None when
    one of them cannot be double-buffered."""
    overlapped = stored = fill = 0  # per iteration of a pipelined loop
    ahead = False  # a pipelined tensor is loaded and stored: its loads and stores take turns
    piped_loads: list[tuple[float, float, int]] = []  # (setup, channel, DMAs) per iteration
    piped_stores: list[tuple[float, float, int]] = []
    for st, (_, level) in zip(staged, stages, strict=True):
        if level != inner:
            continue
        if st.written and not st.fresh and not st.pipelinable:
            return None
        # per iteration, on average (the first to touch their box load nothing)
        fill += st.fill * st.fills / st.count + (st.refill if deep else 0)
        if st.loads:
            piped_loads.append(_transfers(target, st, st.loads / st.count))
        if st.stores:
            piped_stores.append(_transfers(target, st, st.stores / st.count))
        if st.loads or st.stores:
            ahead = ahead or bool(st.loads and st.stores)
            stored += st.one * st.stores / st.count
            overlapped += st.one * st.loads / st.count
    return _Piped(tuple(piped_loads), tuple(piped_stores), overlapped, stored, fill, ahead)


def _temps(probe: Probe) -> tuple[int, ...]:
    """Per number of vectorized tile loops, the bytes of temporaries they and the band need."""
    if "needs" not in probe.table:
        probe.table["needs"] = tuple(max(w[1], probe.band_temps) for w in probe.tile_work)
    return probe.table["needs"]


def _least_temps(probe: Probe) -> int:
    """The fewest bytes of temporaries the init, epilogue and band need in the scratchpad."""
    if "temps" not in probe.table:
        probe.table["temps"] = min(max(w[1], probe.band_temps) for w in probe.tile_work)
    return probe.table["temps"]


def _transfers(target: Target, st: _Staged, share: float) -> tuple[float, float, int]:
    """(setup, channel cycles, DMAs) of one transfer of a tensor in a pipelined loop, `share` of
    whose iterations move it (the first to touch their box load nothing)."""
    return (share * isa.dma_cycles(target, 0), share * st.channel, st.dmas)


@dataclass(frozen=True)
class _Piped:
    """What the tensors of a double-buffered loop move per iteration, on average."""

    loads: tuple  # (setup, channel cycles, DMAs) per loaded tensor
    stores: tuple  # ... per stored tensor
    load_cycles: float  # the loads' DMAs one after the other
    store_cycles: float
    fill: float  # zero fills on EX
    ahead: bool  # a tensor is loaded and stored (scheduled._pipelined_ahead)


def _pipelined_total(
    probe: Probe,
    target: Target,
    inner: str,
    peeled: bool,
    compute: int,
    tile: int,
    p: _Piped,
    first: _FirstBlocks,
) -> float:
    """The exposed DMA cycles of a candidate whose loop `inner` double-buffers: each pass of the
    loop timed as the lowering's tokens order it (pipelined.pipelined_pass), a last, partial
    iteration that isl peels off running alone, passes of fewer than two iterations serial; with two weight
    buffers, a compute that waits for its loads exposes the fill that the band's cycles count
    hidden (not after the vector work of a fused tile, where it is counted); the overwriting first
    blocks of a reloaded accumulator (`first`) run before the loops of their tail, serial."""
    order = probe.order
    depth = order.index(inner)
    kinds = _pass_kinds(probe, inner)
    in_loop = _band_cycles(probe) + (tile if depth < len(probe.fused) else 0)
    scale = in_loop / sum(times * sum(work) for work, times in kinds)
    # the overwriting first blocks run before a reduction loop, each taking its block out of the
    # first iteration of a pass
    short = first.blocks if inner in first.tail else 0
    block = _band_cycles(probe) / _iterations(probe, order[-1]) if short else 0.0
    in_loop -= short * block
    late = (
        target.fill_cycles
        if target.weight_buffers > 1
        and "acc" in probe.memory.values()
        and depth >= len(probe.fused)
        else 0
    )
    passes = sum(times for _, times in kinds)
    mean = sum(times * sum(work) for work, times in kinds) / sum(
        times * len(work) for work, times in kinds
    )
    total = (compute - in_loop) + late * (passes - 1)
    for work, times in kinds:
        n = len(work)
        alone = [p.load_cycles + scale * w + p.fill + p.store_cycles for w in work]
        if n - peeled < 2:
            total += times * sum(alone)
            continue
        e = scale * sum(work[: n - peeled]) / (n - peeled) + p.fill
        steady = pipelined_pass(p.loads, p.stores, e, n - peeled, late, p.ahead)
        total += times * (steady + (alone[-1] if peeled else 0))
        if short:  # of these passes, their share of those whose first iteration lacks its
            # first block, a block as much smaller as the band is in their iterations
            less = block * work[0] / mean
            lacking = pipelined_pass(p.loads, p.stores, e, n - peeled, late, p.ahead, e - less)
            total += short * times / passes * (lacking - steady)
    return total - compute


def _pass_kinds(probe: Probe, inner: str) -> tuple[tuple[tuple[float, ...], int], ...]:
    """The passes of the loop `inner` by the compute of their iterations, in shares of the band
    (passes.pass_kinds); without the splits, every iteration alike."""
    if not probe.splits:
        trips = probe.trips
        depth = probe.order.index(inner)
        passes = probe.passes.get(inner) or (
            (trips[inner], math.prod(trips[o] for o in probe.order[:depth])),
        )
        return tuple(((1.0,) * n, times) for n, times in passes)
    extents, blocks = probe.splits
    return pass_kinds(extents, blocks, probe.order, inner, probe.band_parts)
