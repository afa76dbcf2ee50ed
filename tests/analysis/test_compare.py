"""`tensorgen compare`: per-layer and total ratios of two designs."""

from __future__ import annotations

import csv

import yaml

from tensorgen.cli import main
from tensorgen.target import ISA_DIR


def test_compare_two_targets(small_cnn, tmp_path, capsys):
    data = yaml.safe_load((ISA_DIR / "tg1.yaml").read_text())
    data["mac_array"].update(rows=8, cols=8)
    small = tmp_path / "tg1_8x8.yaml"
    small.write_text(yaml.safe_dump(data))
    out = tmp_path / "cmp"
    assert (
        main(
            [
                "compare",
                small_cnn,
                "-p",
                "size=16",
                "--target",
                "tg1",
                "--target",
                str(small),
                "-o",
                str(out),
            ]
        )
        == 0
    )
    printed = capsys.readouterr().out
    assert "total: cycles ratio" in printed
    rows = list(csv.DictReader((out / "compare.csv").open()))
    total = rows[-1]
    assert total["layer"] == "total"
    layers = rows[:-1]
    assert sum(int(r["cycles_a"]) for r in layers) == int(total["cycles_a"])
    assert (
        float(total["cycles_ratio"]) == int(total["cycles_b"]) / int(total["cycles_a"]) > 1
    )  # a smaller array
    assert float(total["area_ratio"]) < 1
    shares = [abs(float(r["cycles_share"])) for r in layers]
    assert shares == sorted(
        shares, reverse=True
    )  # the layers that account for most of the difference first
    assert (out / "compare.png").read_bytes()[:4] == b"\x89PNG"


def test_compare_bad_input(matmul, tmp_path, error_line):
    assert main(["compare", matmul, "--target", "tg1"]) == 2
    assert "exactly two targets" in error_line()
    assert main(["compare", matmul, "--target", "tg1", "--target", "nosuch"]) == 2
    assert "unknown target 'nosuch'" in error_line()
    blocker = tmp_path / "f"
    blocker.write_text("x")
    assert (
        main(["compare", matmul, "--target", "tg1", "--target", "tg1", "-o", str(blocker / "x")])
        == 2
    )
    assert "cannot create the output directory" in error_line()
