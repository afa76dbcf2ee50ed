"""Quantization runs torch at one thread (default threads fight on a loaded machine) and
gives the caller's thread count back, also when it raises."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from tensorgen.frontend import quantize as qz
from tensorgen.frontend.quantize import one_torch_thread


@pytest.fixture
def two_threads():
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def test_one_thread_inside_and_restored_after(two_threads) -> None:
    with one_torch_thread():
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == 2
    with pytest.raises(RuntimeError), one_torch_thread():
        raise RuntimeError("boom")
    assert torch.get_num_threads() == 2


def test_quantize_calibrates_at_one_thread(two_threads, monkeypatch) -> None:
    seen: list[int] = []
    real = qz.prepare_fx

    def prepare(*args, **kwargs):
        prepared = real(*args, **kwargs)
        prepared.register_forward_pre_hook(lambda m, a: seen.append(torch.get_num_threads()))
        return prepared

    monkeypatch.setattr(qz, "prepare_fx", prepare)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU())
    qz.quantize(model, (torch.randn(1, 3, 8, 8),), calibration_batches=2)
    assert seen == [1, 1]
    assert torch.get_num_threads() == 2
