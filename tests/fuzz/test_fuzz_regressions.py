"""Regressions for the classes `benchmarks/fuzz.py --count 100 --seed 7` still found: a `where:`
that sent the PyTorch reference into isl point enumeration (49 s, a hang), and endless schedule
files that ran into the 60 s default time limit (a hang for the harness). Each: the exit code,
exactly one stderr line, no output file left; and `check --max-steps`."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import islpy as isl
import pytest
import torch

from tensorgen.cli import main

ROOT = Path(__file__).resolve().parents[2]
MATMUL = (ROOT / "examples" / "matmul_odd.yaml").read_text()


def _cli(capsys, *argv) -> tuple[int, str, list[str]]:
    code = main([str(a) for a in argv])
    cap = capsys.readouterr()
    return code, cap.out, cap.err.splitlines()


def _op(tmp_path: Path, where: str) -> Path:
    path = tmp_path / "op.yaml"
    stmt = "  - C[i, j] += A[i, k] * B[k, j]"
    path.write_text(
        MATMUL.replace(stmt, f'  - {{stmt: "C[i, j] += A[i, k] * B[k, j]", where: "{where}"}}')
    )
    return path


TRIANGLE = """tensorgen: 1
name: tri
tensors:
  X: {shape: [16, 24], dtype: int8, role: input}
  Y: {shape: [16, 24], dtype: int32, role: output}
statements:
  - {stmt: "Y[i, j] = X[i, j] + 1", where: "j <= i + 3"}
target: tg1
"""


@pytest.mark.parametrize("where", ["0 <= i < 17", "k <= 20 and 3 <= j"])
def test_a_bounds_only_where_checks_bit_exact_without_enumerating(tmp_path, capsys, where):
    # was: a hang (seed 7, case 69): `where: "0 <= h < 17"` on conv3x3_stride2 made the reference
    # enumerate 35 million isl points in Python; a bounds-only where: now takes the aten op
    code, out, err = _cli(capsys, "check", _op(tmp_path, where))

    assert (code, err) == (0, []), err
    assert "trial 1 (seed 0): BIT-EXACT" in out


def test_a_triangular_where_checks_bit_exact(tmp_path, capsys):
    (tmp_path / "tri.yaml").write_text(TRIANGLE)

    code, out, err = _cli(capsys, "check", tmp_path / "tri.yaml")

    assert (code, err) == (0, []), err
    assert "trial 1 (seed 0): BIT-EXACT" in out


def _isl_points(where: str, bounds) -> set[tuple[int, ...]]:
    """The old way (the reference's isl point enumeration): slow, but the definition."""
    box = " and ".join(f"{lo} <= {n} <= {hi}" for n, (lo, hi) in zip("ijk", bounds, strict=True))
    points: set[tuple[int, ...]] = set()
    isl.Set(f"{{ S[i, j, k] : {box} and ({where}) }}").foreach_point(
        lambda p: points.add(
            tuple(p.get_coordinate_val(isl.dim_type.set, d).to_python() for d in range(3))
        )
    )
    return points


def test_the_where_mask_is_the_isl_set(tmp_path):
    from tensorgen.reference.torch_ref import _where_mask
    from tensorgen.spec.loader import load_program

    stmt = load_program(_op(tmp_path, "0 <= i < 10")).statements[0]
    for where in (
        "i mod 3 = 0 or j > i",
        "exists e: 2e = i + j + k",
        "floor(i/2) = j and k <= 4",
        "exists a, b: i = 2a + 3b and a >= 1 and b >= 1 and a + b <= j",
        "not (i < 3) and i + 2j - k < 11",
        "i >= 100",
    ):
        s = dataclasses.replace(stmt, where=where)
        mesh = torch.meshgrid(*(torch.arange(lo, hi + 1) for lo, hi in s.bounds), indexing="ij")
        grids = {i: m.reshape(-1) for i, m in zip(s.indices, mesh, strict=True)}
        points = _isl_points(where, s.bounds)
        coords = torch.stack([grids[i] for i in s.indices], 1).tolist()

        assert _where_mask(s, grids).tolist() == [tuple(c) in points for c in coords], where


def test_the_reference_refuses_more_points_than_its_limit(tmp_path, capsys, monkeypatch):
    import tensorgen.inputs

    monkeypatch.setattr(
        tensorgen.inputs,
        "LIMITS",
        dataclasses.replace(tensorgen.inputs.LIMITS, reference_points=100),
    )
    (tmp_path / "tri.yaml").write_text(TRIANGLE)

    code, _, err = _cli(capsys, "check", tmp_path / "tri.yaml")

    assert code == 2 and len(err) == 1, err
    assert err[0].startswith("error: S0 'Y[i, j] = X[i, j] + 1': the PyTorch reference would ")
    assert (
        "304 points" in err[0] and "over the limit of 100 (InputLimits.reference_points" in err[0]
    )


def test_the_reference_refuses_too_many_shared_loop_steps_before_simulating(tmp_path, capsys):
    # was: a hang (tests/fuzz seed 881, line+huge-loop): `loops: {t: 100000}` around trmm_triangular
    # simulated for minutes, then the reference would have run 100,000 Python steps
    text = (ROOT / "examples" / "trmm_triangular.yaml").read_text()
    (tmp_path / "op.yaml").write_text(
        text.replace("statements:", "loops: {t: 100000}\nstatements:")
    )

    code, out, err = _cli(capsys, "check", tmp_path / "op.yaml")

    assert code == 2 and len(err) == 1, err
    assert err[0] == (
        "error: the PyTorch reference would run 100,000 statement steps (shared-loop steps times "
        "statements), over the limit of 16,384 (InputLimits.reference_steps in tensorgen/inputs.py)"
    )
    assert "trial" not in out


FOREVER = "def schedule(s):\n    while True:\n        pass\n"


@pytest.mark.parametrize("command", ["check", "emit"])
def test_an_endless_schedule_ends_at_the_command_lines_time_limit(tmp_path, capsys, command):
    # was: a hang for the harness (three cases of seed 7): the default limit is 60 s
    (tmp_path / "s.py").write_text(FOREVER)
    op = tmp_path / "op.yaml"
    op.write_text(MATMUL)
    out_file = tmp_path / "x.tgb"
    extra = ["-o", out_file] if command == "emit" else []

    code, _, err = _cli(
        capsys, command, op, "--schedule", tmp_path / "s.py", "--schedule-time-limit", "0.5", *extra
    )

    assert code == 2 and len(err) == 1, err
    assert err[0] == (
        f"error: {tmp_path / 's.py'}:2: the schedule ran longer than its time limit of 0.5 s "
        "(time_limit= of tensorgen.schedule.files.load_schedule)"
    )
    assert not out_file.exists()


@pytest.mark.parametrize("value", ["0", "-1", "x", "inf", "nan"])
def test_a_schedule_time_limit_must_be_positive_seconds(tmp_path, capsys, value):
    with pytest.raises(SystemExit) as exc:
        main(["check", str(ROOT / "examples" / "matmul_odd.yaml"), "--schedule-time-limit", value])
    err = capsys.readouterr().err.splitlines()

    assert exc.value.code == 2 and err[0].startswith("usage: ")
    assert err[-1].startswith("tensorgen check: error: argument --schedule-time-limit: ")


def test_check_has_run_s_instruction_limit(capsys):
    code, out, err = _cli(
        capsys, "check", ROOT / "examples" / "matmul_odd.yaml", "--max-steps", "10"
    )

    assert code == 2 and len(err) == 1, err
    assert err[0].startswith(
        "error: the program executes 37 instructions, over the simulator's limit of 10"
    )
    assert "BIT-EXACT" not in out
    assert _cli(capsys, "check", ROOT / "examples" / "matmul_odd.yaml", "--max-steps", "0")[2] == [
        "error: --max-steps 0: at least one instruction"
    ]
    code, out, _ = _cli(capsys, "check", ROOT / "examples" / "matmul_odd.yaml", "--max-steps", "59")
    assert code == 0 and "BIT-EXACT" in out
