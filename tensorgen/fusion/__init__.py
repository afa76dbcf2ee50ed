"""Fusion of a model's layers: the groups, one program for each, and what fusing saves.

A group is a run of consecutive layers (in the graph's order) that keeps on chip every
activation it both writes and reads: such an activation must be read by no layer outside the
group, be no model output and be read as it was written (not through a flatten or a reshape).
An activation it writes that a later unit reads is its output; a model value that several of
its layers read (the block input of a residual block: the expand conv and the add) is loaded
once. Fused into one program, the layers run one after another, the kept activations staged
whole in the scratchpad, never in DRAM. `fusion_groups` finds the groups greedily, each the
longest run from its first layer whose kept activations fit WHOLE_SHARE of the scratchpad (the
rest is for the layers' own tiles; the lowering checks the real capacities); `fuse_units`
compiles each (the layers' own schedules replayed on the merged program) and keeps it if its
cycles are no higher than its layers' alone, else tries two parts, split where both are groups.
Before them, the groups whose activations do not fit whole are tried per band of their last
layer's rows (tiled.py; with a halo, recomputed per band: recompute.py), and the set of them
that saves the most DRAM bytes while what the whole groups save in cycles pays for what they
add is kept.
"""

from __future__ import annotations

import contextlib
import itertools
import re
from dataclasses import dataclass, field, replace

import numpy as np

from tensorgen.autosched.replay import replay_schedule, structure_key
from tensorgen.autosched.search import auto_schedule
from tensorgen.codegen.scheduled import compile_scheduled
from tensorgen.errors import TensorgenError
from tensorgen.frontend.fx import Graph
from tensorgen.fusion.groups import Group, _Uses, fusion_groups
from tensorgen.fusion.kept import copy_elements, keep, kept_extra_macs
from tensorgen.fusion.program import FusionError, Merged, fused_schedule, merge
from tensorgen.fusion.recompute import band_rows, extra_macs, recompute
from tensorgen.fusion.tiled import BAND, Tile, TileError, check_capacity, row_halo
from tensorgen.ir.verify import verify_program
from tensorgen.mc.binary import Binary, decode, encode
from tensorgen.sim.machine import simulate
from tensorgen.target import Target

__all__ = [
    "FusionError",
    "Group",
    "Merged",
    "Unit",
    "fuse_units",
    "fused_schedule",
    "fusion_groups",
    "merge",
]


# -- the model's units: single layers, and the groups fused ---------------------------------
@dataclass
class Unit:
    """What the linker links: one layer compiled alone, or a fused group (several layers)."""

    layers: list[int]  # indices into graph.layers
    binary: Binary
    bindings: dict[str, str]  # the binary's tensor -> model buffer
    macs: int
    schedule: str  # "auto", "default" or "fused"


def fuse_units(
    graph: Graph, target: Target, singles: list[Unit], schedules: list[tuple | None]
) -> tuple[list[Unit], list[str]]:
    """`singles` (one unit per layer, compiled alone) with fused units: first the groups whose
    activations do not fit whole, fused per band (tiled.py, recompute.py: where most of a
    model's DRAM traffic is), then every group of the other layers that fits the scratchpad;
    and one line per group saying what was fused and why, or why not. A group per band may
    take more cycles than its layers alone (its halos recomputed, its DMAs overlapping less):
    of them, the model keeps the set that saves the most DRAM bytes while what its whole
    groups save pays for the cycles it adds."""
    uses, notes = _Uses(graph), []
    run = _Run(graph, target, uses, singles, schedules, notes, {})
    banded = {u.layers[0]: u for u in _tiled_units(run, list(singles)) if len(u.layers) > 1}
    saves = {k: run.added[tuple(u.layers)][1] for k, u in banded.items()}
    # the groups per band the model keeps: of every set of them (the groups saving the most
    # DRAM bytes, at most BAND_CHOICES of them), the one that saves the most DRAM bytes and
    # adds no more cycles than the whole groups of the other layers save
    choices = sorted(banded, key=lambda k: (-saves[k], k))[:BAND_CHOICES]
    sets = sorted(
        (c for n in range(len(choices) + 1) for c in itertools.combinations(sorted(choices), n)),
        key=lambda c: (-sum(saves[k] for k in c), c),
    )
    for chosen in sets:
        kept = {k: banded[k] for k in chosen}
        units = _whole_units(run, kept)
        whole = [u for u in units if len(u.layers) > 1 and u.layers[0] not in kept]
        saved = -sum(run.added[tuple(u.layers)][0] for u in whole)
        spent = sum(run.added[tuple(u.layers)][0] for u in kept.values())
        if spent <= saved + BAND_SLACK or not kept:
            break
    for k in sorted(set(banded) - set(chosen)):
        names = " -> ".join(run.graph.layers[j].name for j in banded[k].layers)
        notes.append(
            f"not fused per band {names}: its {run.added[tuple(banded[k].layers)][0]} cycles "
            f"with those of the groups per band kept ({spent}) are more than its whole groups "
            f"save ({saved + BAND_SLACK}): the most DRAM bytes saved at no more cycles without it"
        )
    return units, notes


def _whole_units(run: _Run, banded: dict[int, Unit]) -> list[Unit]:
    """The model's units: the groups per band `banded` (by first layer), the whole groups of the
    other layers (fusion_groups, each compiled once: run.fuse remembers), else single layers."""
    taken = frozenset(j for u in banded.values() for j in u.layers)
    start = {}
    for group in fusion_groups(run.graph, run.target, taken):
        first = next(k for k, lay in enumerate(run.graph.layers) if lay.name == group.layers[0])
        start[first] = group
    units, i = [], 0
    while i < len(run.graph.layers):
        group = start.get(i)
        if i in banded:
            units.append(banded[i])
            i += len(banded[i].layers)
        elif group is None:
            units.append(run.singles[i])
            i += 1
        else:
            units.extend(run.fuse(i, i + len(group.layers) - 1))
            i += len(group.layers)
    return units


# the cycles a model's groups fused per band may add beyond what its whole groups save
BAND_SLACK = 0

# how many groups per band (those saving the most DRAM bytes) the model chooses among, every set
# of them tried: 2**BAND_CHOICES sets at most, each group compiled once
BAND_CHOICES = 8

# the most layers a group fused per band may hold (an inverted residual: expand, depthwise,
# project with its residual add)
TILE_LAYERS = 3


def _tiled_units(run: _Run, units: list[Unit]) -> list[Unit]:
    """`units` with runs of single layers whose activations do not fit whole fused per band
    (tiled.py), greedily from the first: the longest group from each layer that compiles so
    and moves fewer DRAM bytes and less energy than its layers alone (its cycles are weighed
    by fuse_units, once all groups are known)."""
    out: list[Unit] = []
    i = 0
    while i < len(units):
        if len(units[i].layers) != 1:
            out.append(units[i])
            i += 1
            continue
        a, last = units[i].layers[0], i
        while last + 1 < len(units) and units[last + 1].layers == [a + last + 1 - i]:
            last += 1
        b_max = min(a + TILE_LAYERS - 1, a + last - i)
        unit = None
        for b in range(b_max, a, -1):
            group = run.uses.group(a, b, run.target)
            if group is None or group.fits:
                continue
            unit, why = _fused_unit(run, group, list(range(a, b + 1)), tiled=True)
            run.notes.append(
                f"{'fused per band' if unit else 'not fused per band'} "
                f"{group.reason(run.target)}{why}"
            )
            if unit is not None:
                break
        if unit is None:
            out.append(units[i])
            i += 1
            continue
        out.append(unit)
        i += len(unit.layers)
    return out


@dataclass
class _Run:
    """The fusion of one model's groups: what each try needs."""

    graph: Graph
    target: Target
    uses: _Uses
    singles: list[Unit]
    schedules: list[tuple | None]
    notes: list[str]
    costs: dict[int, tuple[int, int, float]]  # a single layer's, simulated once each
    blamed: int | None = None  # the layer the last refusal named, where to split
    # per fused group (its layers): the cycles it adds (< 0: saves) and the DRAM bytes it saves
    added: dict[tuple[int, ...], tuple[int, int]] = field(default_factory=dict)
    memo: dict[tuple[int, int], list[Unit]] = field(default_factory=dict)  # fuse(a, b)'s units
    band_plans: dict[tuple, object] = field(default_factory=dict)  # a band's searched schedule

    def fuse(self, a: int, b: int) -> list[Unit]:
        """One fused unit for layers a..b; if they do not compile as one, each part so, split
        where both parts are groups (or single layers): before the layer the refusal named
        (after it if it is the first), else nearest the middle."""
        if (a, b) not in self.memo:
            self.memo[(a, b)] = self._fuse(a, b)
        return self.memo[(a, b)]

    def _fuse(self, a: int, b: int) -> list[Unit]:
        group = self.uses.group(a, b, self.target)
        if group is None:
            return [self.singles[j] for j in range(a, b + 1)]
        self.blamed = None
        unit, why = _fused_unit(self, group, list(range(a, b + 1)))
        self.notes.append(f"{'fused' if unit else 'not fused'} {group.reason(self.target)}{why}")
        if unit is not None:
            return [unit]
        cuts = [m for m in range(a + 1, b + 1) if self._part(a, m - 1) and self._part(m, b)]
        if not cuts:
            return [self.singles[j] for j in range(a, b + 1)]
        blamed = self.blamed if self.blamed is not None and a <= self.blamed <= b else None
        # a cut at m splits before layer m: before the blamed layer, or after it if it is first
        want = a + b + 1 if blamed is None else 2 * max(blamed, a + 1)
        mid = min(cuts, key=lambda m: abs(2 * m - want))
        return self.fuse(a, mid - 1) + self.fuse(mid, b)

    def _part(self, a: int, b: int) -> bool:
        return a == b or self.uses.inner(a, b) is not None

    def alone_cost(self, j: int) -> tuple[int, int, float]:
        if j not in self.costs:
            self.costs[j] = _cost(self.singles[j].binary, self.target)
        return self.costs[j]


def _fused_unit(
    run: _Run, group: Group, idx: list[int], tiled: bool = False
) -> tuple[Unit | None, str]:
    """Layers idx fused into one unit (whole, or per band of the last one's rows), if they
    compile so and cost no more than alone; else None and why."""
    graph, target, singles, schedules = run.graph, run.target, run.singles, run.schedules
    if not (group.fits or tiled):
        return None, ""
    run.blamed = next((j for j in idx if schedules[j] is None), None)
    if run.blamed is not None:
        return None, "; a layer has no schedule to replay (the kernel default)"
    layers = [graph.layers[j] for j in idx]
    merged, halo = None, [""]  # halo[0]: how the group's halos run, once it is known
    try:
        merged = merge(graph, layers, target.name)
        merged, tile = (
            _tile(run, group, merged, schedules[idx[-1]], halo) if tiled else (merged, None)
        )
        alone = [
            (verify_program(lay.program(target.name)), schedules[j])
            for lay, j in zip(layers, idx, strict=True)
        ]
        compiled = _compile_group(run, merged, alone, tile)
    except TileError as err:  # refused before lowering
        run.blamed = _blame(str(err), merged, idx[0])
        return None, f"{halo[0]}; refused before lowering: {err}"
    except TensorgenError as err:
        run.blamed = None if merged is None else _blame(str(err), merged, idx[0])
        return None, f"{halo[0]}; {err}"
    bindings = {}
    for k, j in enumerate(idx):
        for port, buf in singles[j].bindings.items():
            tensor = merged.names[k][port]
            if tensor not in merged.intermediates:
                bindings[tensor] = buf
    _bind_aliases(merged.program.meta, bindings)
    binary = decode(encode(compiled.binary))
    try:
        cost = _cost(binary, target)
    except TensorgenError as err:  # a binary the simulator refuses (too many steps to run)
        return None, f"{halo[0]}; {err}"
    alone = tuple(sum(run.alone_cost(j)[k] for j in idx) for k in range(3))
    said = halo[0] + (
        f"; {cost[0]} cycles, {cost[1]} DRAM B, {cost[2] / 1e6:.2f} uJ fused; {alone[0]} cycles, "
        f"{alone[1]} DRAM B, {alone[2] / 1e6:.2f} uJ layer by layer"
    )
    # whole: DRAM bytes and energy are always lower, its cycles must not rise. Per band (its
    # DMAs overlap less, its input halos and per-band loads add DRAM bytes, its halos may be
    # computed twice) DRAM bytes and energy must fall, and its cycles may rise by what the
    # model's whole groups save (weighed in fuse_units, once all are known): the model's
    # cycles stay no higher than layer by layer
    more = cost[0] - alone[0]
    if tiled and not (cost[1] < alone[1] and cost[2] < alone[2]):
        return None, f"{said}: saves no DRAM bytes or no energy"
    if not tiled and more > 0:
        return None, f"{said}: costs more"
    run.added[tuple(idx)] = (more, alone[1] - cost[1])
    return Unit(idx, binary, bindings, compiled.macs, "fused"), said


def _bind_aliases(meta: dict, bindings: dict[str, str]) -> None:
    """kept.py's ports of the first band and of the others bound where their tensor is."""
    for aliases in ("firsts", "steadies"):
        for tensor, alias in meta.get(aliases, {}).items():
            if tensor in bindings:
                bindings[alias] = bindings[tensor]


def _compile_group(run: _Run, merged: Merged, alone: list, tile: Tile | None):
    """The merged program compiled with the layers' schedules replayed on it: per band, the
    schedules searched for one band first, if they differ and lower, else the image's."""
    tries = [alone]
    if tile is not None and tile.rows is not None:
        band = _band_schedules(run, merged, alone)
        tries = [band, alone] if band != alone else tries

    def lower(schedules):
        sched = fused_schedule(merged, schedules, run.target, tile)
        # a kept halo's producer (kept.py): its first band's buffers are not live with the
        # other bands', counted as another layer's
        steady = merged.program.meta.get("steady", {}).values()
        offsets = tuple(sorted({*merged.offsets, *steady}))
        check_capacity(sched, run.target, offsets, merged.whole)  # before lowering
        return compile_scheduled(merged.program, run.target, sched)

    for schedules in tries[:-1]:
        with contextlib.suppress(TensorgenError):
            return lower(schedules)
    return lower(tries[-1])


# how many times the MACs run again a group per band's DRAM cycles saved must pay for, before
# it is lowered: a band's other costs (its vector instructions over fewer rows, its DMAs
# overlapping less) come on top. Measured at 224: MobileNetV2's inverted residuals save 18-70
# times what their MACs again cost (and still add 3-23 % cycles), ResNet-18's 7x7 conv1 ->
# max pool 3.5 times (and adds 60 %), its 3x3 pairs less than once
RECOMPUTE_MARGIN = 8

# what one band of a group's kept activations may take of the scratchpad (the rest: the
# layers' own tiles, their weights and inputs)
BAND_SHARE = 0.5


def _tile(run: _Run, group: Group, merged: Merged, trace, halo: list[str]) -> tuple[Merged, Tile]:
    """How `merged` runs per band of its last layer's rows: its producers moved into that
    layer's row loop, or, if that layer reads a halo (rows two bands read), the halo kept from
    the band before (kept.py) or recomputed per band (recompute.py), whichever costs fewer
    cycles before lowering (`halo[0]` says which and what each costs)."""
    last = len(merged.offsets) - 1
    why = row_halo(merged.program, merged.intermediates)
    if why is None:
        return merged, Tile(last, merged.whole)
    halo[0] = f"; {why} (a halo)"
    merged, rows, how = _recomputed(run, group, merged, trace)
    halo[0] += how
    return merged, Tile(last, merged.whole, rows)


def _recomputed(run: _Run, group: Group, merged: Merged, trace) -> tuple[Merged, int, str]:
    """`merged` rewritten to run per band, its producers' halos kept (kept.py) or recomputed
    (recompute.py), with the band's rows and what they cost; refused (TileError) before
    anything is lowered if the cycles the halo costs exceed what the DRAM bytes saved pay for."""
    target, first = run.target, merged.offsets[-1]
    room = int(BAND_SHARE * target.spad.bytes)
    saved = group.saved_dram_bytes // target.dram_bytes_per_cycle
    how = ""
    for exact in (False, True):  # first the fewest MACs again bands may take: no isl boxes
        rows = band_rows(merged.program, merged.offsets, trace, merged.whole, room, exact)
        program = recompute(merged.program, merged.offsets, rows)
        extra = extra_macs(merged.program, program, first)
        spent = extra // target.peak_macs_per_cycle
        how = f"{rows} rows a band, {extra} MACs again ({spent} cycles; the DRAM saved {saved})"
        if not exact:  # at least as many rows as the exact: fewer MACs again, fewer copies
            if spent * RECOMPUTE_MARGIN <= saved:
                continue
            if KEEP_HALOS is not False:
                copied = _copied(merged, rows, target)
                if KEEP_HALOS is True or copied * RECOMPUTE_MARGIN <= saved:
                    continue  # kept may pay: weighed at the exact rows
                how = f"{how}; not kept: at least {copied} cycles of copies"
            raise TileError(f"at least {how}: the recomputed rows cost more than they save")
        kept = None
        if KEEP_HALOS is not False:
            kept = _kept(run, merged, (trace, room - _weights(merged)), spent, saved)
        if kept is not None and kept[0] is not None:
            return kept[0], kept[2], f": kept per band, {kept[1]}; recomputed: {how}"
        if kept is not None:
            how = f"{how}; not kept: {kept[1]}"
        if spent * RECOMPUTE_MARGIN > saved:
            raise TileError(f"{how}: the recomputed rows cost more than they save")
    return replace(merged, program=verify_program(program)), rows, f": recomputed per band, {how}"


# whether a group per band keeps its halos from the band before (kept.py): None where that
# costs fewer cycles than recomputing them (the cost model picks), True always, False never
KEEP_HALOS: bool | None = None


def _kept(
    run: _Run, merged: Merged, band: tuple, recomputed: int, saved: int
) -> tuple[Merged | None, str, int]:
    """`merged` run per band with its halos kept (kept.py), what that costs and the band's rows
    (band_rows for `band`: the tile layer's trace, and the room left beside the weights its
    producers hold whole, read in the first band and the others), if it costs fewer cycles than
    recomputing them (`recomputed`): the MACs it runs beyond the layers' (its first band's row
    above the image) and its copies' elements (the carried rows a band, in and out) on the
    vector unit; None (and why) if not, or if that is more than the DRAM cycles `saved` pay for
    (as for recomputed halos), or if the rewrite refuses."""
    try:
        rows = band_rows(merged.program, merged.offsets, band[0], merged.whole, band[1])
        program, offsets = keep(merged.program, merged.offsets, rows)
    except TileError as err:
        return None, f"{err} (beside {_weights(merged)} B of weights)", 0
    target = run.target
    extra = kept_extra_macs(merged.program, program)
    moved = sum(copy_elements(program, name) for name in program.meta["copies"])
    spent = extra // target.peak_macs_per_cycle + moved // target.lanes
    how = f"{rows} rows a band, {extra} MACs more, {moved} elements copied ({spent} cycles)"
    if KEEP_HALOS is None and (spent > recomputed or spent * RECOMPUTE_MARGIN > saved):
        return None, f"{how}: costs more", rows
    return replace(merged, program=verify_program(program), offsets=offsets), how, rows


def _copied(merged: Merged, rows: int, target: Target) -> int:
    """The cycles the copies of a kept halo take on the vector unit with bands of `rows` (0 if
    the rewrite refuses: no cheaper bound then)."""
    try:
        program, _ = keep(merged.program, merged.offsets, rows)
    except TileError:
        return 0
    return sum(copy_elements(program, name) for name in program.meta["copies"]) // target.lanes


def _weights(merged: Merged) -> int:
    """The bytes of the inputs a group's producers read at no row (their weights and biases)."""
    seen = {}
    for st in merged.program.statements[: merged.offsets[-1]]:
        for acc in st.reads:
            t = merged.program.tensor(acc.tensor)
            rowless = len(acc.index) != 4 or not acc.index[2].names
            if t.role == "input" and t.name not in merged.whole and not acc.table and rowless:
                seen[t.name] = t.nbytes
    return sum(seen.values())


def _band_schedules(run: _Run, merged: Merged, alone: list[tuple]) -> list[tuple]:
    """Each producer of a group run per band (recompute.py) with the schedule the automatic
    scheduler finds for the rows it runs per band (its program with those rows only) if that
    runs its band faster than the whole image's schedule does (both simulated on the band):
    over a band's few rows, a depthwise vectorises its channels by its width, not its rows by
    its width (one vector instruction a row for all channels, not one a channel)."""
    out = list(alone)
    ends = (*merged.offsets[1:], len(merged.program.statements))
    bands = dict(merged.program.shared_loops)[BAND]
    for i, (program, trace) in enumerate(alone[:-1]):
        step, start, count = merged.program.meta["band_spans"][i]
        height = program.statements[-1].extent(program.statements[-1].lhs.index[2].bare())
        if start < 0 or step * (bands - 1) + start + count > height:
            continue  # its rows clipped at the image's edges: not one program in every band
        # a kept halo's producer (kept.py): its statements from the second band on, no copy
        copies = set(merged.program.meta.get("copies", ()))
        steady = merged.program.meta.get("steady", {}).get(i, merged.offsets[i])
        banded = [st for st in merged.program.statements[steady : ends[i]] if st.name not in copies]
        statements = []
        for st, new in zip(program.statements, banded, strict=True):
            h = st.lhs.index[2].bare()
            rows = dict(zip(new.indices, new.bounds, strict=True))[h]
            bounds = tuple(
                rows if name == h else b for name, b in zip(st.indices, st.bounds, strict=True)
            )
            statements.append(replace(st, bounds=bounds))
        band = verify_program(replace(program, statements=tuple(statements)))
        key = structure_key(band, run.target)
        if key not in run.band_plans:
            run.band_plans[key] = _faster_band(band, trace, run.target)
        if run.band_plans[key] is not None:
            out[i] = (band, run.band_plans[key])
    return out


def _faster_band(band, trace, target: Target) -> tuple | None:
    """The searched schedule's steps for a layer's `band` program, if its compute (the cycles
    the vector unit and MAC array are busy, simulated: fused, the band's activations are on
    chip, its own loads and stores are not what it costs) is less than that of the whole
    image's schedule (`trace`) replayed on it (or that does not replay); else None."""
    plan = auto_schedule(band, target).schedule
    if plan is None:
        return None
    try:
        ours = _stats(compile_scheduled(band, target, plan).binary, target).busy["EX"]
    except TensorgenError:
        return None
    try:
        theirs = compile_scheduled(band, target, replay_schedule(band, target, trace)).binary
        if _stats(theirs, target).busy["EX"] <= ours:
            return None
    except TensorgenError:
        pass
    return tuple(plan.trace)


_NAMED = re.compile(r"\bS(\d+)\b|\b[A-Za-z]+_(\d+)\b")


def _blame(message: str, merged: Merged, first: int) -> int | None:
    """The layer (its index in the graph) that the first statement `S<k>` or tensor `<port>_<i>`
    of an error about the merged program names, if any."""
    for m in _NAMED.finditer(message):
        if m.group(1) is not None:
            k = int(m.group(1))
            return first + max(i for i, o in enumerate(merged.offsets) if o <= k)
        if int(m.group(2)) < len(merged.names):
            return first + int(m.group(2))
    return None


def _cost(binary: Binary, target: Target) -> tuple[int, int, float]:
    """The simulated cycles, DRAM bytes and energy (pJ) of one unit alone."""
    stats = _stats(binary, target)
    return stats.cycles, stats.dram_bytes, stats.energy_pj


def _stats(binary: Binary, target: Target):
    """The simulator's counters for one unit alone, values-free (none of them depends on the
    values: `simulate(values=False)`), its inputs zeros."""
    zeros = {
        t.name: np.zeros(t.shape, np.dtype(t.dtype)) for t in binary.tensors if t.role == "input"
    }
    return simulate(binary, zeros, target, values=False).stats
