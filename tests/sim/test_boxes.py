"""The copy of a replayed LOAD's boxes into their on-chip rows (`tensorgen.sim.boxes.copy_values`):
whatever the two layouts -- a few channels packed innermost on chip from a tensor that holds
them far apart (HWC from CHW), or any other order -- the same bytes as numpy's one copy."""

from __future__ import annotations

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
