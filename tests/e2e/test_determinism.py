"""Same input, same binary: a model's .tgb does not depend on the run, on how many processes
compile its layers (--jobs), or on how fast the machine is (the search is bounded by counts)."""

from __future__ import annotations

import itertools
import time
import warnings
from pathlib import Path

import pytest

from tensorgen.cli import main
from tensorgen.frontend.quantize import load_factory
from tensorgen.mc.binary import encode
from tensorgen.model import compile_model
from tensorgen.target import load_target

MODELS = Path(__file__).parents[2] / "examples" / "models"

warnings.filterwarnings("ignore", category=UserWarning)


def _compile(tmp_path: Path, name: str, *options: str) -> bytes:
    out = tmp_path / f"{name}.tgb"
    assert (
        main(["compile", str(MODELS / "resnet18.py"), "-p", "size=32", "-o", str(out), *options])
        == 0
    )
    return out.read_bytes()


def test_resnet18_same_bytes_across_runs_and_jobs(tmp_path, capsys):
    first = _compile(tmp_path, "a")
    assert _compile(tmp_path, "b", "--jobs", "2") == first
    assert _compile(tmp_path, "c", "--jobs", "3") == first
    assert "25 layers" in capsys.readouterr().out


def test_a_slow_machine_gives_the_same_bytes(monkeypatch):
    """Every clock jumps an hour per reading, as if each step of the search took that long: a
    budget in seconds would cut the search short and choose differently."""
    model, example = load_factory(str(MODELS / "small_cnn.py"), {})
    target = load_target("tg1")
    quick = encode(compile_model(model, example, target).binary)
    ticks = itertools.count()
    for clock in ("perf_counter", "process_time", "monotonic", "time"):
        monkeypatch.setattr(time, clock, lambda: 3600.0 * next(ticks))
    slow = encode(compile_model(model, example, target).binary)
    monkeypatch.undo()
    assert next(ticks) > 10  # the clocks were read, and ran fast
    assert slow == quick


@pytest.mark.parametrize("jobs", ["0", "x"])
def test_bad_jobs_is_one_line_exit_2(jobs, capsys, tmp_path):
    with pytest.raises(SystemExit) as err:
        main(["compile", str(MODELS / "mlp.py"), "-o", str(tmp_path / "m.tgb"), "--jobs", jobs])
    assert err.value.code == 2
    assert "--jobs" in capsys.readouterr().err
