"""The copy of a replayed LOAD's boxes into their on-chip rows (`tensorgen.sim.boxes.copy_values`):
whatever the two layouts -- a few channels packed innermost on chip from a tensor that holds
them far apart (HWC from CHW), or any other order -- the same bytes as numpy's one copy. The
order of a replayed loop's DRAM effects (`boxes.dram_order`, all pairs of boxes met at once) is
the one a pair-by-pair reading of its rule gives."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from tensorgen.sim import boxes


@settings(max_examples=80, deadline=None)
@given(
    shape=st.lists(st.integers(1, 6), min_size=1, max_size=4),
    order=st.randoms(use_true_random=False),
    seed=st.integers(0, 2**16),
)
def test_the_copy_of_boxes_is_numpys_whatever_the_layouts(shape, order, seed) -> None:
    rng = np.random.default_rng(seed)
    src = rng.integers(0, 256, shape).astype(np.uint8)
    axes = list(range(len(shape)))
    order.shuffle(axes)  # dst's memory order of the axes: a permutation of src's
    memory = np.zeros([shape[a] for a in axes], np.uint8)
    dst = memory.transpose(np.argsort(axes))
    assert dst.shape == src.shape
    boxes.copy_values(dst, src)
    np.testing.assert_array_equal(dst, src)


def test_channels_innermost_on_chip_are_copied_channel_by_channel() -> None:
    """The stem conv's LOAD: (3, 229, 7) of a CHW tensor into an HWC tile."""
    src = np.arange(3 * 229 * 9, dtype=np.int64).astype(np.uint8).reshape(3, 229, 9)[:, :, 1:8]
    tile = np.zeros((229, 7, 3), np.uint8)
    dst = tile.transpose(2, 0, 1)
    assert dst.strides[0] == 1 and dst.shape[0] <= boxes.SHORT_AXIS and src.strides[-1] == 1
    boxes.copy_values(dst, src)
    np.testing.assert_array_equal(tile, src.transpose(1, 2, 0))


def _pairwise_order(spec, k, shape):
    """dram_order's rule read literally: every pair of boxes, every pair of iterations."""
    edges = []
    for x, (i, kind_i, box_i) in enumerate(spec):
        for j, kind_j, box_j in spec[x:]:
            if kind_i == kind_j == "load":
                continue
            meet = np.zeros((k, k), bool)
            for a in range(k):
                for b in range(k):
                    ends = [
                        [min(max(bx[1][d] + bx[2][d] * c + e * bx[3][d], 0), n) for e in (0, 1)]
                        for bx, c in ((box_i, a), (box_j, b))
                        for d, n in enumerate(shape)
                    ]
                    dims = len(shape)
                    meet[a, b] = all(
                        ends[d][0] < ends[dims + d][1] and ends[dims + d][0] < ends[d][1]
                        for d in range(dims)
                    )
            later, ahead = np.tril(meet, -1).any(), np.triu(meet, 1).any()
            if i == j:
                if later or ahead:
                    return None
            elif later and np.triu(meet).any():
                return None
            elif meet.any():
                edges.append((j, i) if later else (i, j))
    return edges


_BOX = st.tuples(
    st.lists(st.integers(-3, 9), min_size=2, max_size=2),
    st.lists(st.integers(-2, 4), min_size=2, max_size=2),
    st.lists(st.integers(0, 5), min_size=2, max_size=2),
)


@settings(max_examples=150, deadline=None)
@given(
    spec=st.lists(st.tuples(st.sampled_from(["load", "store"]), _BOX), min_size=1, max_size=6),
    k=st.integers(1, 6),
)
def test_the_dram_order_is_the_pairwise_rule_whatever_the_boxes(spec, k) -> None:
    """Boxes of one 2-D tensor (8 x 6) that step, stand still, reach outside it or are empty;
    effects numbered in program order, two boxes now and then of one effect."""
    shape = (8, 6)
    listed = [
        (x // 2 * 2 if x % 3 == 2 else x, kind, (0, tuple(lo), tuple(step), tuple(ext)))
        for x, (kind, (lo, step, ext)) in enumerate(spec)
    ]
    binary = SimpleNamespace(tensors=[SimpleNamespace(shape=shape)])
    assert boxes.dram_order(listed, k, binary) == _pairwise_order(listed, k, shape)
