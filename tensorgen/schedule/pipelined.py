"""The cycles of one pass of a double-buffered loop, timed as the lowering orders its DMAs and
compute (tensorgen/codegen/lowering/pipeline.py) on the simulator's own DRAM channel
(timing.Channel): the cost model's (tensorgen/schedule/cost.py) timing of a pipelined loop."""

from __future__ import annotations

from functools import lru_cache

from tensorgen.mc import isa

PASS_PREFIX = 12  # iterations of a pipelined loop timed one by one (even: periods of two repeat)


@lru_cache(maxsize=1 << 14)
def pipelined_pass(
    loads: tuple,
    stores: tuple,
    e: float,
    n: int,
    late_fill: int,
    ahead: bool,
    first: float | None = None,
) -> float:
    """The cycles of one pass of `n` iterations of a double-buffered loop (one_pass); past
    PASS_PREFIX iterations, the period of the last two (the lowering alternates two buffers)
    repeats."""
    if n <= PASS_PREFIX:
        return one_pass(loads, stores, e, n, late_fill, ahead, first)
    whole = one_pass(loads, stores, e, PASS_PREFIX, late_fill, ahead, first)
    period = (whole - one_pass(loads, stores, e, PASS_PREFIX - 2, late_fill, ahead, first)) / 2
    return whole + (n - PASS_PREFIX) * period


def one_pass(
    loads: tuple,
    stores: tuple,
    e: float,
    n: int,
    late_fill: int,
    ahead: bool,
    first: float | None = None,
) -> float:
    """The cycles of one pass of `n` iterations of a double-buffered loop, timed as the lowering
    orders it: iteration i's compute (`e` cycles on EX) waits for its loads and for the stores
    of iteration i - 2 (which used the same buffers); the loads of iteration i + 1 are issued
    before it, once the compute of i - 1 has freed their buffers; its stores follow it. Each DMA
    is its setup on its queue, then its bytes on the DRAM channel that both DMA queues share
    (timing.Channel, the simulator's). `late_fill`: with two weight buffers, the MATMUL fill that
    a compute whose tokens arrive after EX is free exposes (timing.matmul_stream_start); `e`
    counts it hidden. `ahead`: a tensor is loaded and stored (scheduled._pipelined_ahead): a
    buffer is loaded once the store of iteration i - 1 has emptied it, and the stores of
    iteration i wait for the loads of i + 1. `first`: the compute of iteration 0, if not `e`."""
    channel = isa.Channel()
    ld = ex = st = 0.0
    loaded = [0.0] * n
    computed = [0.0] * n
    stored = [0.0] * n

    def load(i: int) -> None:
        nonlocal ld
        ld = max(ld, (stored if ahead else computed)[i - 2] if i >= 2 else 0.0)
        for setup, cycles, dmas in loads:
            for _ in range(dmas):
                ld = channel.book(ld + setup, cycles / dmas)
        loaded[i] = ld

    load(0)
    for i in range(n):
        if i + 1 < n:
            load(i + 1)
        tokens = max(loaded[i], stored[i - 2] if i >= 2 else 0.0)
        start = max(ex, tokens)
        if i:
            ex = start + e + min(late_fill, max(0.0, tokens + late_fill - ex))
        else:
            ex = start + (e if first is None else first)
        computed[i] = ex
        st = max(st, ex, loaded[i + 1] if ahead and i + 1 < n else 0.0)
        for setup, cycles, dmas in stores:
            for _ in range(dmas):
                st = channel.book(st + setup, cycles / dmas)
        stored[i] = st
    return max(ld, ex, st)
