"""`tensorgen sweep`: the cross product, failed points as rows, resumption, a killed run, Dask."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tensorgen.analysis import sweep as sw
from tensorgen.cli import main

TIMING = set(sw.TIMING_FIELDS)


def _rows(out: Path) -> list[dict]:
    return json.loads((out / "points.json").read_text())


def _stable(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if k not in TIMING} for r in rows]


def test_parse_vary_values():
    v = sw.parse_vary(
        ["mac_array=8x8,16x32", "spad=128K,1M,4096", "clock=400,1000.5", "weight_buffers=1,2"]
    )
    assert v == {
        "mac_array": ["8x8", "16x32"],
        "spad": [131072, 1 << 20, 4096],
        "clock": [400, 1000.5],
        "weight_buffers": [1, 2],
    }
    d = sw.derive(
        sw.load_base("tg1"), {"mac_array": "8x32", "spad": 131072, "lanes": 8, "node": 16}
    )
    assert (d["mac_array"]["rows"], d["mac_array"]["cols"], d["memories"]["spad"]["bytes"]) == (
        8,
        32,
        131072,
    )
    assert (d["vector"]["lanes"], d["technology"]["node_nm"]) == (8, 16)


def test_sweep_rows_failures_and_resume(matmul, tmp_path, capsys):
    out = tmp_path / "sw"
    args = [
        "sweep",
        matmul,
        "--vary",
        "mac_array=8x8,16x16",
        "--vary",
        "spad=16,256K",
        "--jobs",
        "2",
        "-o",
        str(out),
    ]
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert "Pareto set" in printed and "4 points (0 already done)" in printed
    rows = _rows(out)
    assert [(r["mac_array"], r["spad"]) for r in rows] == [
        ("8x8", 16),
        ("8x8", 262144),
        ("16x16", 16),
        ("16x16", 262144),
    ]
    for r in rows:
        if r["spad"] == 16:  # too small: a row with its reason, not a crash
            assert not r["ok"] and "CapacityError" in r["reason"] and "\n" not in r["reason"]
        else:
            assert r["bit_exact"] and r["cycles"] > 0 and r["energy_uj"] > 0 and r["area_mm2"] > 0
    big, small = rows[3], rows[1]
    assert big["cycles"] < small["cycles"] and big["area_mm2"] > small["area_mm2"]
    assert (out / "pareto.png").read_bytes()[:4] == b"\x89PNG"
    assert (out / "points.csv").read_text().count("\n") == 5
    assert len(list((out / "points").glob("*.json"))) == 4
    # rerun: every point from the store, the same rows
    t0 = time.perf_counter()
    assert main(args) == 0
    assert "4 points (4 already done)" in capsys.readouterr().out
    assert time.perf_counter() - t0 < 10
    assert _rows(out) == rows


def test_killed_sweep_loses_no_point(matmul, tmp_path, root):
    out = tmp_path / "k"
    cmd = [
        sys.executable,
        "-m",
        "tensorgen.cli",
        "sweep",
        matmul,
        "--vary",
        "mac_array=4x4,8x8,16x16,32x32",
        "--vary",
        "dram_bytes_per_cycle=4,8",
        "--jobs",
        "1",
        "-o",
        str(out),
    ]
    env = {**os.environ, "PYTHONPATH": str(root), "OPENBLAS_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    deadline = time.time() + 120
    while (
        time.time() < deadline and len(list((out / "points").glob("*.json"))) < 2
        if (out / "points").exists()
        else time.time() < deadline
    ):
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    stored = len(list((out / "points").glob("*.json")))
    assert 2 <= stored < 8, "the sweep should have been killed midway"
    assert not (out / "points.json").exists()
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert f"8 points ({stored} already done)" in done.stdout
    assert len(_rows(out)) == 8 and all(r["bit_exact"] for r in _rows(out))
    assert not [p for p in out.rglob("*") if p.name.endswith(".tmp")]


def test_dask_matches_local(matmul, tmp_path, capsys):
    distributed = pytest.importorskip(
        "distributed", reason="the dask extra (pip install 'tensorgen[dask]') is not installed"
    )
    vary = ["--vary", "mac_array=8x8,16x16", "--vary", "dram_bytes_per_cycle=8,16"]
    assert main(["sweep", matmul, *vary, "--jobs", "1", "-o", str(tmp_path / "local")]) == 0
    with distributed.LocalCluster(
        n_workers=1, threads_per_worker=1, host="127.0.0.1", processes=True, dashboard_address=None
    ) as cluster:
        assert (
            main(
                [
                    "sweep",
                    matmul,
                    *vary,
                    "--executor",
                    "dask",
                    "--scheduler",
                    cluster.scheduler_address,
                    "-o",
                    str(tmp_path / "dask"),
                ]
            )
            == 0
        )
    capsys.readouterr()
    local, dask = _rows(tmp_path / "local"), _rows(tmp_path / "dask")
    assert len(local) == 4 and all(r["bit_exact"] for r in local)
    assert _stable(dask) == _stable(local)


@pytest.mark.parametrize(
    "vary, message",
    [
        ("colour=1,2", "unknown key 'colour'"),
        ("mac_array=16", "bad value '16'"),
        ("spad=12Q", "bad value '12Q'"),
        ("lanes=x", "bad value 'x'"),
        ("lanes", "expected KEY=V1,V2"),
    ],
)
def test_sweep_bad_vary(matmul, tmp_path, error_line, vary, message):
    assert main(["sweep", matmul, "--vary", vary, "-o", str(tmp_path / "o")]) == 2
    assert message in error_line()
    assert not (tmp_path / "o").exists()


def test_sweep_bad_target_output_and_executor(matmul, tmp_path, error_line):
    assert (
        main(
            ["sweep", matmul, "--vary", "lanes=8", "--target", "nosuch", "-o", str(tmp_path / "o")]
        )
        == 2
    )
    assert "unknown target 'nosuch'" in error_line()
    blocker = tmp_path / "file"
    blocker.write_text("x")
    assert main(["sweep", matmul, "--vary", "lanes=8", "-o", str(blocker)]) == 2
    assert f"-o {blocker}: " in error_line()  # a file where the directory should be
    assert (
        main(
            ["sweep", matmul, "--vary", "lanes=8", "--executor", "dask", "-o", str(tmp_path / "d")]
        )
        == 2
    )
    assert "--scheduler" in error_line()
    assert not (tmp_path / "o").exists()


def test_sweep_invalid_target_point_is_a_row(matmul, tmp_path, capsys):
    assert (
        main(["sweep", matmul, "--vary", "lanes=0,16", "--jobs", "1", "-o", str(tmp_path / "z")])
        == 0
    )
    rows = _rows(tmp_path / "z")
    assert (
        not rows[0]["ok"]
        and "vector.lanes" in rows[0]["reason"]
        and "TargetError" in rows[0]["reason"]
    )
    assert rows[1]["bit_exact"]


def test_bad_vary_from_the_shell_is_one_line(matmul, tmp_path, root):
    env = {**os.environ, "PYTHONPATH": str(root)}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "tensorgen.cli",
            "sweep",
            matmul,
            "--vary",
            "rows=4",
            "-o",
            str(tmp_path / "o"),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert (
        done.stderr.count("\n") == 1
        and "unknown key 'rows'" in done.stderr
        and "Traceback" not in done.stderr
    )
    assert not (tmp_path / "o").exists()
