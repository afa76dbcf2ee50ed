"""The explanation of an automatic scheduler's plan (`Plan.explain`, `check --explain`): the
chosen schedule as a replayable schedule file, then the cost model's figures for it, what is
fused, where each tensor is staged, and its neighbours (the candidates one choice away) with
their cycles.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from tensorgen.autosched.objective import variable_pj
from tensorgen.schedule.files import render

if TYPE_CHECKING:
    from tensorgen.autosched.search import Plan
    from tensorgen.schedule.cost import Candidate
    from tensorgen.target import Target

HEADER = "# the schedule chosen by `schedule: auto`, as a replayable schedule file"


def explain(plan: Plan, target: Target) -> str:
    """What `plan` chose and why, or why it fell back to the default schedule."""
    if plan.schedule is None:
        return f"auto: {plan.reason}; using the default schedule"
    name = plan.schedule.program.name
    if plan.chosen is None:  # outside the search: the primitive-built schedule, measured
        text = render(plan.schedule, f"Built from the primitives for {name}.")
        return "\n".join([HEADER, "", text, f"auto: {plan.reason}"])
    text = render(plan.schedule, f"Chosen by tensorgen's automatic scheduler for {name}.")
    lines = [HEADER, "", text, *_figures(plan, target)]
    if plan.fold:
        lines.append(plan.fold)
    if plan.layer is not None and plan.layer.others:
        lines += _fusion_lines(plan)
    return "\n".join(lines + _staging_lines(plan) + _neighbour_lines(plan))


def _name(plan: Plan, loop: str | None) -> str:
    return plan.loop_names.get(loop, loop) if loop else "the program"


def _figures(plan: Plan, target: Target) -> list[str]:
    """The cost model's cycles, DRAM traffic and capacities of the chosen candidate."""
    c = plan.chosen
    return [
        f"model: {c.cycles} cycles = {c.compute_cycles} MAC/vector + {c.dma_cycles} exposed DMA "
        f"({'inner loads overlapped' if c.pipelined else 'queues serialized'}); DRAM {c.dram_bytes} B; "
        f"searched {len(plan.considered)} candidates "
        f"in {plan.search_s * 1e3:.0f} ms",
        f"bottleneck: {'compute' if c.compute_cycles >= c.dma_cycles else 'DMA'}",
        f"capacity: spad {c.spad_bytes} / {target.spad.bytes} B, acc {c.acc_bytes} / {target.acc.bytes} B",
        *_objective_lines(plan, target),
    ]


def _objective_lines(plan: Plan, target: Target) -> list[str]:
    """Under the energy objective: its estimate of what differs between candidates, against the
    fastest's."""
    if plan.objective == "cycles":
        return []
    fastest = min((c for c in plan.considered if c.cycles != math.inf), key=lambda c: c.cycles)
    return [
        f"objective: {plan.objective}: DRAM and leakage {variable_pj(plan.chosen, target) / 1e6:.2f} uJ "
        f"estimated; the fastest candidate {fastest.cycles} cycles, "
        f"{variable_pj(fastest, target) / 1e6:.2f} uJ, DRAM {fastest.dram_bytes} B"
    ]


def _fusion_lines(plan: Plan) -> list[str]:
    layer, c = plan.layer, plan.chosen
    init = f"{layer.init.name} (init)" if layer.init else None
    epi = f"{', '.join(s.name for s in layer.epilogue)} (epilogue)" if layer.epilogue else None
    where = f"each iteration of {plan.fused_at}" if plan.fused_at else "the whole program"
    temps = [
        t
        for t, _ in c.stages
        if t != layer.accumulator and plan.schedule.program.tensor(t).role == "none"
    ]
    return [
        f"fused: {' and '.join(x for x in (init, epi) if x)} with the contraction "
        f"{layer.contraction.name}, on {where}: {layer.accumulator}"
        f"{' and ' + ', '.join(temps) if temps else ''} never {'leave' if temps else 'leaves'} the chip",
        f"  their vector instructions: {c.vector_cycles} cycles over the {c.vector_loops} innermost loops "
        f"of a tile",
    ]


def _staging_lines(plan: Plan) -> list[str]:
    c = plan.chosen
    lines = ["staging (tensor: the loop whose iterations each hold one footprint):"]
    for tensor, loop in c.stages:
        lines.append(f"  {tensor} at {_name(plan, loop)}")
    if c.pipelined:
        lines.append(
            "  the innermost staging loop double-buffers its tensors: their loads and stores overlap "
            "compute"
        )
    return lines


def _neighbour_lines(plan: Plan) -> list[str]:
    """The candidates one choice away from the chosen one, what differs and their cycles."""
    c = plan.chosen
    lines = ["neighbours (one choice changed):"]
    for other in _neighbours(plan):
        diff = [
            f"{t}: {_name(plan, a)} -> {_name(plan, b)}"
            for (t, a), (_, b) in zip(c.stages, other.stages, strict=False)
            if a != b
        ]
        if other.order != c.order:
            diff.append(f"order {' '.join(_name(plan, x) for x in other.order)}")
        if other.pipelined != c.pipelined:
            diff.append("double-buffered" if other.pipelined else "single-buffered")
        cost_text = (
            "over capacity"
            if other.cycles == math.inf
            else f"{other.cycles} cycles ({other.cycles / c.cycles:.2f}x)"
        )
        lines.append(f"  {', '.join(diff)}: {cost_text}")
    return lines


def _neighbours(plan: Plan) -> list[Candidate]:
    c = plan.chosen
    out = []
    for other in plan.considered:
        changes = (
            sum(a != b for a, b in zip(c.stages, other.stages, strict=False))
            + (other.order != c.order)
            + (other.pipelined != c.pipelined)
        )
        if changes == 1:
            out.append(other)
    return sorted(out, key=lambda o: o.cycles)[:6]
