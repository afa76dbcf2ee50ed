from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def root() -> Path:
    return ROOT


@pytest.fixture
def matmul() -> str:
    return str(ROOT / "examples" / "matmul_odd.yaml")


@pytest.fixture
def small_cnn() -> str:
    return str(ROOT / "examples" / "models" / "small_cnn.py")


@pytest.fixture
def error_line(capsys) -> Callable[[], str]:
    """The one line a bad input printed on stderr (asserting there is exactly one)."""

    def get() -> str:
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1, err
        assert err[0].startswith("error: ")
        return err[0]

    return get
