"""Layers of one structure scheduled once (autosched/replay.py, model.compile_layers), and the
cost model over a whole staging product (cost.cost_product) equal to costing each choice."""

from __future__ import annotations

import pytest

from tensorgen.autosched.layer import build_skeleton, recognise
from tensorgen.autosched.replay import structure_key
from tensorgen.autosched.search import Space
from tensorgen.driver import compile_auto
from tensorgen.mc.binary import encode
from tensorgen.model import compile_layers
from tensorgen.schedule.cost import cost, cost_product
from tensorgen.schedule.steps import LoopRef, Step
from tensorgen.spec.loader import parse_program
from tensorgen.target import load_target

CONV = """tensorgen: 1
name: {name}
tensors:
  X: {{shape: [1, 32, 10, 10], dtype: uint8, role: input}}
  W: {{shape: [{k}, 32, 3, 3], dtype: int8, role: input}}
  B: {{shape: [{k}], dtype: int32, role: input}}
  ACC: {{shape: [1, {k}, 10, 10], dtype: int32}}
  Y: {{shape: [1, {k}, 10, 10], dtype: uint8, role: output}}
statements:
  - "ACC[n, k, h, w] = B[k]"
  - "ACC[n, k, h, w] += X[n, c, h + r - 1, w + s - 1] * W[k, c, r, s]"
  - "Y[n, k, h, w] = clamp(requant(ACC[n, k, h, w], {scale}, {zero}), 0, 255)"
"""


def conv(name="a", k=24, scale=0.0011, zero=3):
    return parse_program(CONV.format(name=name, k=k, scale=scale, zero=zero))


def test_the_key_abstracts_constants_and_names_only():
    tg1 = load_target("tg1")
    a = structure_key(conv(), tg1)
    assert structure_key(conv("b", scale=0.25, zero=7), tg1) == a
    assert structure_key(conv(k=16), tg1) != a  # another shape
    assert structure_key(conv(), load_target("tiny")) != a  # another target


@pytest.mark.parametrize("target", ["tg1", "tiny"])
def test_a_replayed_schedule_is_the_searched_one(target):
    """The second layer replays the first one's schedule: its binary is the one its own search
    gives, so the cache changes only the time."""
    tgt = load_target(target)
    programs = [conv("a"), conv("b", scale=0.5, zero=9), conv("c", k=16)]
    out = compile_layers(programs, tgt)
    for program, got in zip(programs, out, strict=True):
        assert got.binary == encode(compile_auto(program, tgt).compiled.binary)
        assert got.auto
    assert out[1].trace == out[0].trace


def test_a_replay_that_fails_is_searched_afresh():
    tgt = load_target("tg1")
    p = conv("b", scale=0.5, zero=9)
    from tensorgen.model import _compile_layer  # noqa: PLC0415 - the private worker, on purpose

    bad = (Step("split", (LoopRef("nowhere"), 4)),)  # a loop the program does not have
    got = _compile_layer(p, tgt, bad)
    assert got.binary == encode(compile_auto(p, tgt).compiled.binary)
    assert got.trace != bad


@pytest.mark.parametrize("target", ["tg1", "tiny"])
def test_cost_product_is_cost_of_each_choice(target):
    import itertools

    from tensorgen.autosched.layer import accumulator_levels
    from tensorgen.autosched.probe import probe_nest, staging_levels

    tgt = load_target(target)
    program = conv()
    layer = recognise(program)
    space = Space.of(program, tgt, layer)
    checked = 0
    for shape, order in space.nests():
        blocks, _, m_loops, band = shape
        sk = build_skeleton(program, tgt, layer, blocks, order, band, checked=False)
        fold = space.fold(band)
        args = (program, tgt, layer, sk, blocks, order, m_loops, band)
        args += (space.band_kind, space.profiles, fold)
        probe = probe_nest(*args)
        tensors = layer.tensors()
        levels = [staging_levels(program, layer, sk, order, t, fold) for t in tensors]
        levels = accumulator_levels(program, layer, blocks, order, tensors, levels)
        fresh = probe_nest(*args)
        want = [
            cost(fresh, tgt, tensors, choice, pipeline)
            for choice in itertools.product(*levels)
            for pipeline in (False, True)
        ]
        assert cost_product(probe, tgt, tensors, levels) == want
        checked += len(want)
    assert checked > 100
