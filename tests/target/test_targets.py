"""The bundled targets load; a malformed target description is refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from tensorgen.errors import TargetError
from tensorgen.target import load_target

ROOT = Path(__file__).parents[2]


def test_bundled_targets() -> None:
    tg1, tiny = load_target("tg1"), load_target("tiny")
    assert (tg1.rows, tg1.cols, tg1.spad.bytes, tg1.acc.bytes) == (16, 16, 256 * 1024, 64 * 1024)
    assert (tiny.rows, tiny.cols, tiny.spad.bytes) == (4, 4, 2048)
    assert tg1.hash != tiny.hash and len(tg1.hash) == 8
    assert "Horowitz" in dict(tg1.energy.sources)["energy"]


def test_bad_targets_are_refused(tmp_path: Path) -> None:
    with pytest.raises(TargetError, match="unknown target 'nope'"):
        load_target("nope")
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        (ROOT / "tensorgen" / "target" / "isa" / "tiny.yaml")
        .read_text()
        .replace("rows: 4", "rows: -4")
    )
    with pytest.raises(TargetError, match="'mac_array.rows' must be positive"):
        load_target(str(bad))
    bad.write_text("name: x\n")
    with pytest.raises(TargetError, match="missing 'energy.source'"):
        load_target(str(bad))
