"""What the simulator knows of a binary before running it, kept across runs of the same one.

Verifying a binary and decoding its instructions (fields, costs, views, the fast paths'
forms and plans) depend only on the binary, the target and the limits; a `Binary` is
immutable (frozen, of tuples), so a second `simulate` of the same object reuses them. Only
what would be computed anyway is kept: a miss is a fresh decode, never a different result.
"""

from __future__ import annotations

import weakref

from tensorgen.mc.verify import verify_binary
from tensorgen.sim.state import Transfer

# binaries whose decode is kept (the most recent ones)
KEEP = 8


class Static:
    """Per-binary caches, filled as the simulator needs them."""

    def __init__(self, binary, target) -> None:
        self.fields = [dict(ins.args) for ins in binary.code]
        self.queues = [ins.queue for ins in binary.code]
        self.executes = [ins.defn.execute for ins in binary.code]  # semantics, or None
        self.costs = [
            ins.defn.cost(target, f) if ins.defn.cost else None
            for ins, f in zip(binary.code, self.fields, strict=False)
        ]
        # per instruction: whether it computes and touches nothing (`Simulator._sync`)
        self.syncs = [
            ins.defn.execute is None
            and ins.queue is not None
            and c is not None
            and not c.dram_bytes
            for ins, c in zip(binary.code, self.costs, strict=True)
        ]
        self.transfers = [Transfer.of(ins, binary) for ins in binary.code]  # LOAD/STORE
        self.nests: dict = {}  # Simulator._reduction_nest
        self.replays: dict = {}  # replay.form
        self.plans: dict = {}  # replay: stacked.plan per (pc, counters, iterations)
        self.runs: dict[str, dict] = {}  # runs.MatmulRuns' caches by name
        self.decoded: dict = {}  # state.Machine's views
        self.spare: dict | None = None  # memories a finished run left (`simulate`)
        self.energy: tuple | None = None  # (counters, target, energy_breakdown) of the last run


_CACHE: dict[int, tuple] = {}


def static(binary, target, limits) -> Static:
    """The verified binary's `Static` (`verify_binary` raises first if it is refused)."""
    hit = _CACHE.get(id(binary))
    if (
        hit is not None
        and hit[0]() is binary
        and hit[2] == limits
        and (hit[1][0] is target or hit[1][1] == target.hash)  # the hash costs ~3 ms
    ):
        return hit[3]
    verify_binary(binary, target, limits)  # before anything is allocated or run
    s = Static(binary, target)
    if len(_CACHE) >= KEEP:
        _CACHE.pop(next(iter(_CACHE)))
    _CACHE[id(binary)] = (weakref.ref(binary), (target, target.hash), limits, s)
    return s
