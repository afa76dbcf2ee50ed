"""Fixtures shared by the frontend tests."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
import torch


@pytest.fixture
def engine() -> Iterator[Callable[[str], None]]:
    """Select torch's quantized engine for one test; the previous engine comes back after."""
    saved = torch.backends.quantized.engine

    def use(name: str) -> None:
        torch.backends.quantized.engine = name

    yield use
    torch.backends.quantized.engine = saved
