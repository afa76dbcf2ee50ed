"""`tensorgen report`: per-layer table, plots and a Chrome trace that adds up to the simulator's counters."""

from __future__ import annotations

import csv
import json

import pytest

from tensorgen.analysis.core import analyze
from tensorgen.analysis.trace import DRAM_TID, trace_events
from tensorgen.cli import main
from tensorgen.mc import isa
from tensorgen.target import load_target
from tensorgen.target.energy import energy_breakdown


@pytest.mark.parametrize("which", ["matmul", "small_cnn"])
def test_trace_durations_equal_busy_counters(which, request):
    source = request.getfixturevalue(which)
    tgt = load_target("tg1")
    a = analyze(source, tgt, {"size": 16} if which == "small_cnn" else None, record=True)
    assert a.exact, a.message
    events = trace_events(a)
    names = {e["tid"]: e["args"]["name"] for e in events if e.get("name") == "thread_name"}
    assert sorted(names.values()) == sorted([*isa.QUEUES, "DRAM channel", "layers"])
    tid = {v: k for k, v in names.items()}
    for q in isa.QUEUES:
        dur = sum(e["dur"] for e in events if e["ph"] == "X" and e["tid"] == tid[q])
        assert round(dur * tgt.clock_mhz) == a.stats.busy[q]
    dram = sum(e["dur"] for e in events if e["ph"] == "X" and e["tid"] == DRAM_TID) * tgt.clock_mhz
    assert round(dram) == sum(e - b for b, e in a.recorder.channel)
    assert (
        round(dram) >= a.stats.dram_bytes / tgt.dram_bytes_per_cycle
    )  # every byte crossed the channel
    stalls = {
        q: sum(s - r for qq, r, s, _e, _pc, _m in a.recorder.events if qq == q) for q in isa.QUEUES
    }
    assert stalls == a.stats.stalled
    # per-layer rows partition the run: their cycles and energy add up to the totals
    assert sum(r.cycles for r in a.layers) == a.stats.cycles
    total = sum(energy_breakdown(tgt, a.stats).values())
    assert sum(r.energy_pj for r in a.layers) == pytest.approx(total, rel=1e-9)


def test_report_writes_table_plots_and_trace(small_cnn, tmp_path, capsys):
    out = tmp_path / "rep"
    # fused by default: small_cnn's convolutions are one unit, fc another
    assert main(["report", small_cnn, "-p", "size=16", "-o", str(out), "--layer", "fc"]) == 0
    printed = capsys.readouterr().out
    assert "BIT-EXACT" in printed and "average power" in printed
    for name in ("roofline.png", "energy.png", "timeline.png"):
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    rows = list(csv.DictReader((out / "layers.csv").open()))
    doc = json.loads((out / "layers.json").read_text())
    assert [r["layer"] for r in rows] == [r["layer"] for r in doc["layers"]]
    assert sum(int(r["cycles"]) for r in rows) == doc["summary"]["cycles"]
    assert {r["bound"] for r in rows if int(r["macs"])} <= {"compute", "DRAM"}
    trace = json.load((out / "trace.json").open())
    layers = [e for e in trace["traceEvents"] if e.get("cat") == "layer"]
    assert [e["name"] for e in layers] == [r["layer"] for r in rows]
    assert not list(out.glob(".*.tmp"))


def test_report_bad_layer_and_target(matmul, tmp_path, error_line):
    assert main(["report", matmul, "-o", str(tmp_path / "a"), "--layer", "nope"]) == 2
    assert "--layer nope" in error_line()
    assert not list((tmp_path / "a").iterdir())
    assert main(["report", matmul, "--target", "nosuch", "-o", str(tmp_path / "b")]) == 2
    assert "unknown target 'nosuch'" in error_line()
    blocker = tmp_path / "file"
    blocker.write_text("x")
    assert main(["report", matmul, "-o", str(blocker / "sub")]) == 2
    assert "cannot create the output directory" in error_line()


def test_recorder_is_off_by_default_and_changes_nothing(matmul):
    from tensorgen.driver import compile_file, random_inputs
    from tensorgen.sim.machine import simulate

    job = compile_file(matmul, schedule="auto")
    inputs = random_inputs(job.program, 0)
    plain = simulate(job.compiled.binary, inputs, job.target)
    recorded = simulate(job.compiled.binary, inputs, job.target, record=True)
    assert plain.recorder is None and recorded.recorder is not None and recorded.recorder.events
    assert plain.stats.as_dict() == recorded.stats.as_dict()
    assert all((plain.outputs[k] == recorded.outputs[k]).all() for k in plain.outputs)
