"""verify._constants reads a constant row off an explicit equality where it can; it gives what
isl's projection gives (the slow path, with the equality reading turned off), maps of several pieces too."""

from __future__ import annotations

from pathlib import Path

import islpy as isl
import pytest

from tensorgen.autosched.layer import recognise
from tensorgen.autosched.search import Space
from tensorgen.schedule import verify
from tensorgen.schedule.state import LoopInfo, State
from tensorgen.spec.loader import load_program
from tensorgen.target import load_target

ROOT = Path(__file__).parents[2]


def _slow(state: State, monkeypatch) -> dict:
    with monkeypatch.context() as m:
        m.setattr(verify, "fixed_by_equality", lambda sched, pos: None)
        return verify._constants(state)


@pytest.mark.parametrize("name", ["matmul_odd", "conv1x1", "depthwise3x3"])
def test_constants_of_the_search_skeletons(name: str, monkeypatch) -> None:
    program = load_program(ROOT / "examples" / f"{name}.yaml")
    space = Space.of(program, load_target("tg1"), recognise(program))
    for shape, order in space.nests():
        space.probed(shape, order)
    states = [sk.schedule.state for sk in space.skeletons.values()]
    assert states
    for st in states:
        fast = verify._constants(st)
        assert fast == _slow(st, monkeypatch)
        assert any(v is not None for v in fast.values())


def test_constants_of_hand_maps(monkeypatch) -> None:
    maps = {
        "S0": isl.Map("{ S0[i, j] -> [0, i, 3, j] : 0 <= i < 4 and 0 <= j < 5 }"),
        "S1": isl.Map("{ S1[i] -> [1, i, 2 * i, 7] : 0 <= i < 3 }"),
        "S2": isl.Map("{ S2[i] -> [2, i, 2, 0] : 0 <= i < 4 and 2 * i = 3 * (i // 2) * 2 }"),
        "S3": isl.Map("{ S3[i] -> [3, i, 4, 1] : 0 <= i < 2; S3[i] -> [3, i, 4, 1] : i = 5 }"),
    }
    dims = (
        {s: None for s in maps},
        {s: 1 for s in maps},
        {s: None for s in maps},
        {"S0": 2, "S1": None, "S2": None, "S3": None},
    )
    st = State(maps, dims, {1: LoopInfo("i", frozenset(maps)), 2: LoopInfo("j", frozenset())})
    fast = verify._constants(st)
    assert fast == _slow(st, monkeypatch)
    assert fast["S0", 2] == 3 and fast["S2", 2] == 2 and fast["S1", 2] is None
