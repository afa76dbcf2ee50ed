"""The schedule trace as records: steps print as the Python that replays them, round-trip
through JSON to the same schedule and the same microcode, `tile` is one step, and a malformed
JSON trace is one line naming the file and the step."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tensorgen.codegen.scheduled import compile_scheduled
from tensorgen.driver import Job, random_inputs, run_and_compare
from tensorgen.errors import ScheduleError
from tensorgen.mc.binary import encode
from tensorgen.schedule import steps
from tensorgen.schedule.api import Schedule
from tensorgen.schedule.files import compile_schedule_file, load_schedule, replay, save_trace
from tensorgen.schedule.steps import LoopRef, Step
from tensorgen.spec.loader import load_program, parse_program
from tensorgen.target import load_target

ROOT = Path(__file__).parents[2]
TG1 = load_target("tg1")
MATMUL = """tensorgen: 1
tensors:
  A: {shape: [10, 7], dtype: int8, role: input}
  B: {shape: [7, 9], dtype: int8, role: input}
  C: {shape: [10, 9], dtype: int32, role: output}
statements:
  - C[i, j] += A[i, k] * B[k, j]
"""


def test_tile_is_recorded_as_tile_and_prints_as_python() -> None:
    s = Schedule(parse_program(MATMUL), TG1)
    io, jo, ii, ji = s.tile(s.loop("i"), s.loop("j"), 4, 4)
    s.stage("B", jo, "spad", layout=(1, 0))
    assert s.trace == [
        Step("tile", (LoopRef("i"), LoopRef("j"), 4, 4)),
        Step("stage", ("B", LoopRef("j_o"), "spad"), (("layout", (1, 0)),)),
    ]
    assert str(s) == (
        "s.tile(s.loop('i'), s.loop('j'), 4, 4)\ns.stage('B', s.loop('j_o'), 'spad', layout=(1, 0))"
    )
    assert [lp.name for lp in s.loops("S0")] == ["i_o", "j_o", "i_i", "j_i", "k"]


def test_a_refused_tile_leaves_no_step() -> None:
    s = Schedule(parse_program(MATMUL))
    with pytest.raises(ScheduleError, match=r"^tile\(i, j, 0, 4\): factor must be a positive"):
        s.tile(s.loop("i"), s.loop("j"), 0, 4)
    assert s.trace == [] and s.loop_names() == ["i", "j", "k"]


@pytest.mark.parametrize("name", ["matmul_256", "conv3x3_stride2", "rnn_cell", "jacobi1d"])
def test_json_round_trip_gives_the_same_microcode(name: str, tmp_path: Path) -> None:
    program = load_program(ROOT / "examples" / f"{name}.yaml")
    original = replay((ROOT / "schedules" / f"{name}.py").read_text(), program, TG1)
    path = tmp_path / f"{name}.json"
    save_trace(path, original)
    doc = json.loads(path.read_text())
    assert [d["primitive"] for d in doc["steps"]] == [st.primitive for st in original.trace]
    again = load_schedule(path, program, TG1)
    assert again.trace == original.trace and again.stages == original.stages
    assert again.union_map().is_equal(original.union_map())
    compiled = compile_schedule_file(path, program, TG1, compile_scheduled)
    assert encode(compiled.binary) == encode(compile_scheduled(program, TG1, original).binary)
    cmp, _ = run_and_compare(Job(program, TG1, compiled), random_inputs(program, 0))
    assert cmp.exact, cmp.message


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("{", r"^t\.json: not a JSON trace: "),
        ('{"steps": 3}', r'^t\.json: a trace is \{"steps": \[\.\.\.\]\}$'),
        ('{"steps": [{"primitive": "exec", "args": []}]}', r"^t\.json: step 1: no primitive exec$"),
        (
            '{"steps": [{"primitive": "unroll", "args": [{"loop": "k"}]}]}',
            r"^t\.json: step 1: no primitive unroll$",
        ),
        (
            '{"steps": [{"primitive": "split", "args": [{"loop": "k"}, 2]},'
            ' {"primitive": "split", "args": [{"loop": "k"}, 2]}]}',
            r"^t\.json: step 2: loop\('k'\): no such loop .*k was split into k_o and k_i$",
        ),
        (
            '{"steps": [{"primitive": "split", "args": [{"loop": "k"}]}]}',
            r"^t\.json: step 1: split: .*argument",
        ),
        (
            '{"steps": [{"primitive": "split", "args": [{"loop": 3}, 2]}]}',
            r'^t\.json: step 1: a loop is \{"loop": name\}',
        ),
        (
            '{"steps": [{"primitive": "split", "args": [{"loop": "k"}, 2], "kwargs": {"x": 1}}]}',
            r"^t\.json: step 1: split takes no keywords",
        ),
    ],
)
def test_a_malformed_json_trace_is_one_line(text: str, match: str, tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    path.write_text(text)
    with pytest.raises(ScheduleError) as info:
        load_schedule(path, parse_program(MATMUL), TG1)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(str(tmp_path))
    assert re.search(match, message.replace(str(tmp_path) + "/", ""))


def test_steps_replay_checks_every_step_again() -> None:
    program = load_program(ROOT / "examples" / "jacobi1d.yaml")
    illegal = [Step("reorder", (LoopRef("i"), LoopRef("t")))]
    with pytest.raises(ScheduleError, match=r"^reorder\(i, t\): S0\[.*would run before"):
        steps.replay(program, illegal, TG1)
