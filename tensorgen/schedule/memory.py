"""Memory primitives: stage a tensor's footprint in an on-chip memory, double-buffer it, and
the capacity check that both (and `fuse`, which widens a staging loop) must pass."""

from __future__ import annotations

from dataclasses import replace

from tensorgen.errors import CapacityError, ScheduleError
from tensorgen.ir.core import Program
from tensorgen.schedule.boxes import staged_box
from tensorgen.schedule.state import MEMORIES, Loop, Stage, State, resolve


def footprint_bytes(program: Program, state: State, stage: Stage) -> int:
    """Bytes of the largest per-iteration footprint of `stage.tensor` under its loop (isl),
    padding halo included, twice over if double-buffered."""
    box = staged_box(program, state, stage.tensor, stage.loop or None, overlaps=False)
    if box is None:
        return 0
    elements = 1
    for n in box.size:
        elements *= n
    itemsize = program.tensor(stage.tensor).itemsize
    return elements * itemsize * (2 if stage.double_buffered else 1)


def check_capacity(program: Program, state: State, target, prim: str) -> None:
    """Refuse `state` if the buffers staged in one memory exceed what `target` has."""
    if target is None:
        return
    caps = {"spad": target.spad.bytes, "acc": target.acc.bytes}
    for mem in MEMORIES:
        live = [
            (st, footprint_bytes(program, state, st)) for st in state.stages if st.memory == mem
        ]
        total = sum(b for _, b in live)
        if total > caps[mem]:
            what = ", ".join(
                f"{st.tensor} at {st.loop or 'the program'} ({b} B"
                f"{', double-buffered' if st.double_buffered else ''})"
                for st, b in live
            )
            raise CapacityError(
                f"{prim}: {mem} holds {total} B but has {caps[mem]} B "
                f"({total - caps[mem]} B over): {what}"
            )


def stage(
    program: Program,
    state: State,
    tensor: str,
    at: Loop | None,
    memory: str,
    layout: tuple[int, ...] | None,
    prim: str,
) -> State:
    """`state` with `tensor` staged at `at` (None: the program); a default `layout` is None."""
    try:
        rank = len(program.tensor(tensor).shape)
    except KeyError:
        raise ScheduleError(f"{prim}: no tensor {tensor}") from None
    if memory not in MEMORIES:
        raise ScheduleError(f"{prim}: memory must be one of {', '.join(MEMORIES)}")
    if layout is not None:
        layout = tuple(int(d) for d in layout)
        if sorted(layout) != list(range(rank)):
            raise ScheduleError(
                f"{prim}: layout must order the {rank} dimensions of {tensor} "
                f"(a permutation of 0..{rank - 1}), got {layout}"
            )
        if layout == tuple(range(rank)):
            layout = None
    loop = ""
    if at is not None:
        lid = resolve(state, at, prim, modify=False)[0]
        loop = state.loops[lid].name
    return replace(state, stages=(*state.stages, Stage(tensor, loop, memory, layout=layout)))


def double_buffer(state: State, tensor: str, prim: str) -> State:
    idx = next((i for i, s in enumerate(state.stages) if s.tensor == tensor), None)
    if idx is None:
        raise ScheduleError(f"{prim}: stage {tensor} first")
    stages = list(state.stages)
    stages[idx] = replace(stages[idx], double_buffered=True)
    return replace(state, stages=tuple(stages))
