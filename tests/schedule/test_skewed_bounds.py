"""Schedules that pass the legality check but whose loop bounds isl writes with negations and
divisions (skews by negative factors, then splits) compile and are bit-exact."""

from __future__ import annotations

from pathlib import Path

import pytest

from tensorgen.codegen.scheduled import compile_scheduled
from tensorgen.driver import Job, random_inputs, run_and_compare
from tensorgen.schedule.files import replay
from tensorgen.spec.loader import parse_program
from tensorgen.target import load_target

ROOT = Path(__file__).parents[2]
JACOBI = (
    (ROOT / "examples" / "jacobi1d.yaml")
    .read_text()
    .replace("[17, 256]", "[7, 40]")
    .replace("{t: 16}", "{t: 6}")
)
TRMM = (ROOT / "examples" / "trmm_triangular.yaml").read_text().replace("[16, 16]", "[9, 9]")

SCHEDULES = {
    # the issue's: "unsupported expression '-((c4 + 3) / 4)' in the schedule's loop nest"
    "skew -1, split 4": (
        JACOBI,
        's.skew(s.loop("i"), s.loop("t"), -1)\n    s.split(s.loop("i"), 4)',
    ),
    "skew -2, split 3": (
        JACOBI,
        's.skew(s.loop("i"), s.loop("t"), -2)\n    io, ii = s.split(s.loop("i"), 3)',
    ),
    "skew -3, split 7 and 2": (
        JACOBI,
        's.skew(s.loop("i"), s.loop("t"), -3)\n'
        '    io, ii = s.split(s.loop("i"), 7)\n    s.split(ii, 2)',
    ),
    "skew 2, split 5, reorder": (
        JACOBI,
        's.skew(s.loop("i"), s.loop("t"), 2)\n'
        '    io, ii = s.split(s.loop("i"), 5)\n    s.reorder(io, s.loop("t"))',
    ),
    "trmm: skew j by -2 along i, split 4": (
        TRMM,
        's.skew(s.loop("j"), s.loop("i"), -2)\n    s.split(s.loop("j"), 4)',
    ),
}


@pytest.mark.parametrize("target", ["tg1", "tiny"])
@pytest.mark.parametrize("name", sorted(SCHEDULES))
def test_skewed_and_split_schedules_are_bit_exact(name: str, target: str) -> None:
    text, body = SCHEDULES[name]
    program = parse_program(text.replace("target: tg1", f"target: {target}"))
    tgt = load_target(target)
    s = replay(f"def schedule(s):\n    {body}\n", program, tgt)
    job = Job(program, tgt, compile_scheduled(program, tgt, s))
    for seed in (0, 1):
        cmp, _ = run_and_compare(job, random_inputs(program, seed))
        assert cmp.exact, f"{name} on {target}: {cmp.message}"


def test_a_bound_the_hardware_cannot_take_is_one_line_naming_the_file(
    tmp_path: Path, capsys
) -> None:
    # isl guards this nest with a remainder (c1 % 2), which no floor(affine / d) term is
    from tensorgen.cli import main

    op = tmp_path / "trmm.yaml"
    op.write_text(TRMM)
    f = tmp_path / "s.py"
    f.write_text(
        'def schedule(s):\n    s.skew(s.loop("k"), s.loop("i"), -1)\n    s.split(s.loop("k"), 2)\n'
    )
    out = tmp_path / "o.tgb"
    code = main(["emit", str(op), "-o", str(out), "--schedule", str(f)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and not out.exists(), err
    assert err[0] == (
        f"error: {f}:1: the schedule's loop nest has a bound 'c1 % 2' that the hardware loops cannot "
        f"take (a max of floor(affine / constant) terms); choose other split factors or skews"
    )
