"""The cycles of each instruction, defined once.

The instruction definitions in `tensorgen.mc.isa` cost their instructions with these functions;
the simulator (tensorgen/sim/machine.py) times a run with them, the automatic scheduler's cost
model (tensorgen/schedule/cost.py) predicts that run with them, and `tensorgen isa-doc`
(tensorgen/mc/doc.py) prints their docstrings as the ISA's timing rules. A timing rule stated
anywhere else is a second definition that can drift from this one.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

import numpy as np

from tensorgen.mc.operands import View

__all__ = [
    "COST_RULES",
    "Channel",
    "Cost",
    "dma_cost",
    "free_cost",
    "matmul_cost",
    "vector_cost",
    "vmac_cost",
    "dma_channel_cycles",
    "dma_cycles",
    "matmul_cycles",
    "matmul_fill",
    "matmul_run_cycles",
    "matmul_stream_start",
    "vector_cycles",
]


@dataclass(frozen=True)
class Cost:
    """What one instruction costs, from the timing rules of tensorgen.mc.timing."""

    cycles: int  # occupancy of the instruction's queue (for DMAs: the setup part)
    dram_bytes: int = 0  # bytes over the shared DRAM channel (timing.dma_channel_cycles)
    macs: int = 0
    vector_ops: int = 0
    bytes: tuple[tuple[str, int], ...] = ()  # (memory, bytes) read + written on chip
    written: tuple[tuple[str, int], ...] = ()  # (memory, bytes) of `bytes` that are written
    fill: int = 0  # of `cycles`, the MAC array's weight fill, which a second weight buffer can hide


def dma_channel_cycles(target, nbytes: int) -> int:
    """`LOAD`/`STORE`: after `dram.dma_setup_cycles` on its queue, a DMA holds the one DRAM
    channel, which every DMA of both queues shares, for `ceil(bytes / dram.bytes_per_cycle)`
    cycles; the queue is busy until the transfer ends (`Channel.book` says when it may start)."""
    return -(-nbytes // target.dram_bytes_per_cycle)


def dma_cycles(target, nbytes: int, dmas: int = 1) -> int:
    """`dmas` DMAs moving `nbytes` in all, one after the other on one queue, with the DRAM
    channel to themselves: each its setup, and the bytes over the bandwidth."""
    return dmas * target.dma_setup_cycles + dma_channel_cycles(target, nbytes)


class Channel:
    """The DRAM channel's bookings: busy intervals, sorted. A transfer takes the first gap, at
    or after the time its DMA is ready, that is free for its whole length: first come first
    served in time, not in program order (an earlier gap left by another queue's setup is
    used)."""

    def __init__(self) -> None:
        self.busy: list[tuple[int, int]] = []

    def book(self, ready: int, cycles: int) -> int:
        """Book `cycles` of the channel from the first time >= `ready` it is free for them;
        returns the end of the transfer."""
        busy = self.busy
        begin = ready
        at = bisect.bisect_left(busy, (ready, ready))
        if at and busy[at - 1][1] > begin:
            begin = busy[at - 1][1]
        while at < len(busy) and busy[at][0] < begin + cycles:
            begin = max(begin, busy[at][1])
            at += 1
        busy.insert(at, (begin, begin + cycles))
        return begin + cycles

    def forget(self, horizon: int) -> None:
        """Drop the bookings that end by `horizon`, before which no DMA can be ready again."""
        busy = self.busy
        drop = 0
        while drop < len(busy) and busy[drop][1] <= horizon:
            drop += 1
        del busy[:drop]


def matmul_fill(target, previous_rows: int | None = None) -> int:
    """`MATMUL` fill: the cycles of weight fill a MATMUL exposes: all `mac_array.fill_cycles` with one
    weight buffer, or when the instruction before it on EX is not a MATMUL (`SYNC`s, which take
    no time, aside); with two (`mac_array.weight_buffers: 2`), its weights load into the second
    buffer while the MATMUL before it streams its `previous_rows` rows, so only what those rows
    leave of the fill shows (none once previous_rows >= fill_cycles), when its tokens are in time
    (`matmul_stream_start`)."""
    if target.weight_buffers < 2 or previous_rows is None:
        return target.fill_cycles
    return max(0, target.fill_cycles - previous_rows)


def matmul_cycles(target, rows: int, previous_rows: int | None = None) -> int:
    """`MATMUL`: `M` streamed rows (the product of a's leading dimensions) plus the fill it
    exposes (`matmul_fill`); `M*N*K` MACs."""
    return rows + matmul_fill(target, previous_rows)


def matmul_run_cycles(target, rows: int, count: int) -> int:
    """`count` MATMULs of `rows` rows each, back to back on EX: the first pays its whole fill,
    the others what the one before leaves exposed."""
    return (
        matmul_cycles(target, rows) + (count - 1) * matmul_cycles(target, rows, rows)
        if count
        else 0
    )


def matmul_stream_start(target, start: int, tokens: int, previous: int | None) -> tuple[int, int]:
    """`MATMUL` start: a MATMUL that may start on EX at `start` (its queue free, its tokens in),
    the last of its tokens (or of those of the `SYNC`s since the MATMUL before it) arriving at
    `tokens`, loads its weights from `start`, or with two weight buffers from the later of
    `tokens` and `previous`, when the MATMUL right before it on EX began to stream; it streams
    `fill_cycles` after its weights begin to load, and not before `start`. Returns (weights
    begin, streaming begins)."""
    begin = start if previous is None or target.weight_buffers < 2 else max(previous, tokens)
    return begin, max(start, begin + target.fill_cycles)


def vector_cycles(target, elements: int) -> int:
    """Vector instructions: `vector.setup_cycles`, then the elements of the destination over
    the `vector.lanes` lanes, `setup + ceil(elements / lanes)` cycles."""
    return target.vector_setup_cycles + -(-elements // target.lanes)


# --- the cost of each instruction (InstructionDef.cost), from the rules above --------------


def _view_bytes(*views: View | None) -> tuple[tuple[str, int], ...]:
    out: dict[str, int] = {}
    for v in views:
        if isinstance(v, View):
            out[v.mem] = out.get(v.mem, 0) + v.nbytes
    return tuple(sorted(out.items()))


def _on_chip(reads: list, writes: list) -> dict:
    return {"bytes": _view_bytes(*reads, *writes), "written": _view_bytes(*writes)}


def dma_cost(target, a) -> Cost:
    """LOAD/STORE: the setup occupies the queue; the bytes then hold the DRAM channel."""
    loads = isinstance(a["dst"], View)
    view = a["dst"] if loads else a["src"]
    return Cost(
        dma_cycles(target, 0),
        dram_bytes=view.nbytes,
        **_on_chip([] if loads else [view], [view] if loads else []),
    )


def matmul_cost(target, a) -> Cost:
    """MATMUL: its rows and whole fill (the simulator hides what a second buffer can)."""
    *ms, k = a["a"].shape
    m = int(np.prod(ms))
    n = a["b"].shape[1]
    reads = [a["a"], a["b"]] + ([a["acc"]] if a["accumulate"] else [])
    return Cost(
        matmul_cycles(target, m),
        macs=m * n * k,
        fill=target.fill_cycles,
        **_on_chip(reads, [a["acc"]]),
    )


def vector_cost(target, a, reads_dst: bool = False) -> Cost:
    """A vector instruction over its destination's elements."""
    n = a["dst"].size
    reads = [v for k, v in a.items() if k != "dst"] + ([a["dst"]] if reads_dst else [])
    return Cost(vector_cycles(target, n), vector_ops=n, **_on_chip(reads, [a["dst"]]))


def vmac_cost(target, a) -> Cost:
    return vector_cost(target, a, reads_dst=True)  # dst += a * b reads its destination


def free_cost(target, a) -> Cost:
    """`SYNC`, `LOOP`, `LOOPB`, `IF`: no cycles (zero-overhead loops, bounds evaluated by the
    sequencer); a SYNC waits for and signals tokens."""
    return Cost(0)


# the rules `tensorgen isa-doc` prints, in order: each function's docstring is its rule
COST_RULES = (
    dma_channel_cycles,
    matmul_cycles,
    matmul_fill,
    matmul_stream_start,
    vector_cycles,
    free_cost,
)
