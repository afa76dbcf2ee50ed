"""What the automatic scheduler minimises over the candidates that fit: `cycles` (the default) or
`energy`.

- `cycles`: the fastest candidate, unless one within TIE of it moves less DRAM, whose energy
  dominates (BERT's FFN down-projection chunked: 0.2 % more cycles, 23 % less DRAM).
- `energy`: the candidate of least estimated energy, the fastest of equals. Of a layer's energy
  (target/energy.py) the MACs and vector operations are the same for every candidate; what
  differs is its DRAM traffic (each byte crosses the interface and is written to, or read from,
  the scratchpad) and its leakage over its cycles. A 3x3 conv of 64 channels at 56x56 on tg1 is
  the example: the fastest candidate keeps 16 output channels in the accumulator per block of
  rows and reads its input four times (1,485,056 DRAM B, 518,576 cycles); the one of least
  energy keeps the block of rows and streams the channel blocks past it (549,632 B, 536,016
  cycles: 3 % slower, half the energy).

The cycles bound (bound.py) is only sound for `cycles`: under `energy` a slower candidate may
win, so every candidate is costed.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from tensorgen.target.energy import action_energy

if TYPE_CHECKING:
    from collections.abc import Sequence

    from tensorgen.schedule.cost import Candidate
    from tensorgen.target import Target

OBJECTIVES = ("cycles", "energy")
# candidates whose cycles are within this share of the fastest's count as ties (objective cycles)
TIE = 0.005


def check_objective(objective: str) -> str:
    """`objective`, if the scheduler knows it; else a ValueError naming the ones it knows."""
    if objective not in OBJECTIVES:
        raise ValueError(
            f"unknown schedule objective {objective!r}: one of {', '.join(OBJECTIVES)}"
        )
    return objective


def bound_tie(objective: str) -> float:
    """The share above the fastest cycles so far past which a choice cannot win (bound.py):
    TIE for `cycles`, none (every choice costed) for `energy`."""
    return TIE if check_objective(objective) == "cycles" else math.inf


def variable_pj(cand: Candidate, target: Target) -> float:
    """The part of `cand`'s energy that differs between candidates, in pJ: its DRAM bytes (the
    interface and the scratchpad side of each transfer) and its leakage over its cycles."""
    e = action_energy(target)
    per_byte = e["dram"] + e[f"{target.spad.name}_write"]
    return cand.dram_bytes * per_byte + cand.cycles * e["static_per_cycle"]


def choose(fitting: Sequence[tuple[Candidate, tuple]], target: Target, objective: str):
    """The (candidate, shape) of `fitting` that `objective` picks (see the module's docstring)."""
    if check_objective(objective) == "energy":
        return min(fitting, key=lambda x: (variable_pj(x[0], target), x[0].cycles))
    fastest = min(c.cycles for c, _ in fitting)
    return min(
        (x for x in fitting if x[0].cycles <= fastest * (1 + TIE)),
        key=lambda x: (x[0].dram_bytes, x[0].cycles),
    )
