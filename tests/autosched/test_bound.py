"""The search's branch and bound (autosched/bound.py): its bound never exceeds a candidate's
cycles, and the search chooses exactly what costing every candidate and taking the fastest (or
one within TIE of it that moves less DRAM, the first of equals) chooses."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from tensorgen.autosched.bound import Bound
from tensorgen.autosched.layer import recognise
from tensorgen.autosched.search import TIE, Space, auto_schedule
from tensorgen.schedule.cost import Candidate, cost_product
from tensorgen.spec.loader import load_program
from tensorgen.target import load_target

ROOT = Path(__file__).parents[2]
CASES = [("matmul_odd", "tg1"), ("conv1x1", "tg1"), ("depthwise3x3", "tg1"), ("conv1x1", "tiny")]


class _Recording:
    """A bound that cuts nothing and records what it is asked and told."""

    def __init__(self) -> None:
        self.least: list[float] = []
        self.costed: list = []

    def cut(self, least: float) -> bool:
        self.least.append(least)
        return False

    def add(self, cand) -> None:
        self.costed.append(cand)


def _space(name: str, target_name: str) -> Space:
    program = load_program(ROOT / "examples" / f"{name}.yaml")
    return Space.of(program, load_target(target_name), recognise(program))


@pytest.mark.parametrize(("name", "target_name"), CASES)
def test_least_cycles_never_exceed_a_candidates(name: str, target_name: str) -> None:
    space = _space(name, target_name)
    asked = 0
    for shape, order in space.nests():
        rec = _Recording()
        cost_product(*space.probed(shape, order), rec)
        assert len(rec.least) == len(rec.costed)
        for least, cand in zip(rec.least, rec.costed, strict=True):
            assert least <= cand.cycles, (least, cand)
        asked += len(rec.least)
    assert asked > 0


@pytest.mark.parametrize(("name", "target_name"), CASES)
def test_search_chooses_what_costing_everything_chooses(name: str, target_name: str) -> None:
    space = _space(name, target_name)
    every = [(c, shape) for shape, order in space.nests() for c in space.costed(shape, order)]
    fitting = [c for c, _ in every if c.cycles != math.inf]
    fastest = min(c.cycles for c in fitting)
    expected = None
    for c in fitting:  # the first of the least (DRAM, cycles) within TIE of the fastest
        if c.cycles <= fastest * (1 + TIE) and (
            expected is None or (c.dram_bytes, c.cycles) < (expected.dram_bytes, expected.cycles)
        ):
            expected = c
    plan = auto_schedule(space.program, space.target)
    assert plan.chosen == expected
    assert plan.considered.costed() < len(every)  # it skipped some
    assert len(plan.considered) == len(every)
    assert list(plan.considered) == [c for c, _ in every]  # the skipped, costed on reading


def test_a_choice_at_the_threshold_is_costed() -> None:
    bound = Bound(0.005)
    assert not bound.cut(10**9)  # nothing costed yet: nothing is cut
    bound.add(Candidate(("i",), (("A", None),), 400, 600, 0, 0, 0))
    bound.add(Candidate(("i",), (("A", None),), math.inf, 600, 0, 0, 0))  # refused
    assert bound.best == 1000
    assert not bound.cut(1000 * (1 + 0.005))  # at TIE of the fastest: may win on DRAM, or tie
    assert bound.cut(1006)
