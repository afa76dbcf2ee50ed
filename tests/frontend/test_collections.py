"""model.fewer_collections raises the youngest generation's threshold while a model compiles
and restores the thresholds afterwards, also when the compile raises."""

from __future__ import annotations

import gc

import pytest

from tensorgen.model import YOUNG_COLLECTION, fewer_collections


def test_threshold_raised_inside_and_restored_after() -> None:
    old = gc.get_threshold()
    try:
        gc.set_threshold(700, 10, 10)
        with fewer_collections():
            assert gc.get_threshold() == (YOUNG_COLLECTION, 10, 10)
            with fewer_collections():  # a worker's compile inside compile_model's
                assert gc.get_threshold() == (YOUNG_COLLECTION, 10, 10)
            assert gc.get_threshold() == (YOUNG_COLLECTION, 10, 10)
        assert gc.get_threshold() == (700, 10, 10)
        gc.set_threshold(50_000, 5, 5)  # a caller's higher threshold is kept
        with fewer_collections():
            assert gc.get_threshold() == (50_000, 5, 5)
        with pytest.raises(ValueError), fewer_collections():
            raise ValueError
        assert gc.get_threshold() == (50_000, 5, 5)
    finally:
        gc.set_threshold(*old)
