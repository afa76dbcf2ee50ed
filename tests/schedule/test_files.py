"""Schedule files are trusted Python with a time limit; an exit or any other exception in one is
a one-line refusal naming the file and line, never a success, and so is a schedule that replays
but cannot be lowered."""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path

import pytest

from tensorgen.driver import compile_file, random_inputs, run_and_compare
from tensorgen.errors import ScheduleError
from tensorgen.schedule.files import replay
from tensorgen.spec.loader import load_program
from tensorgen.target import load_target

ROOT = Path(__file__).parents[2]
JACOBI = ROOT / "examples" / "jacobi1d.yaml"
TG1 = load_target("tg1")
FOREVER = "def schedule(s):\n    s.vectorize(s.loop('i'))\n    while True:\n        pass\n"


def _cli(capsys, *argv: str) -> tuple[int, list[str], str]:
    from tensorgen.cli import main

    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.err.strip().splitlines(), out.out


def test_schedule_files_are_ordinary_python_with_imports(tmp_path: Path) -> None:
    # trusted Python (docs/schedules.md): imports and the ordinary builtins, no pretend sandbox
    f = tmp_path / "s.py"
    f.write_text(
        "import builtins\nimport math\n\n\ndef schedule(s):\n    assert open is builtins.open\n"
        "    s.vectorize(s.loop('i' * math.factorial(1)))\n"
    )
    small = tmp_path / "jacobi.yaml"
    small.write_text(
        JACOBI.read_text().replace("[17, 256]", "[5, 12]").replace("{t: 16}", "{t: 4}")
    )
    job = compile_file(small, schedule=str(f))
    cmp, _ = run_and_compare(job, random_inputs(job.program, 0))
    assert cmp.exact, cmp.message


@pytest.mark.parametrize(
    "body",
    [
        "    raise SystemExit(0)\n",
        "    import sys\n    sys.exit(0)\n",
        # the way out of the builtins filter that earlier versions pretended was a sandbox
        "    raise s.__class__.__init__.__globals__['__builtins__']['SystemExit'](0)\n",
    ],
)
def test_exit_from_a_schedule_is_an_error_not_a_success(tmp_path: Path, capsys, body: str) -> None:
    f = tmp_path / "s.py"
    f.write_text("def schedule(s):\n" + body)
    out = tmp_path / "o.tgb"
    code, err, stdout = _cli(capsys, "emit", str(JACOBI), "-o", str(out), "--schedule", str(f))
    line = len(body.splitlines()) + 1
    assert (code, err) == (2, [f"error: {f}:{line}: the schedule called exit"]) and not out.exists()
    code, err, stdout = _cli(capsys, "check", str(JACOBI), "--schedule", str(f))
    assert (code, err, stdout) == (2, [f"error: {f}:{line}: the schedule called exit"], "")


def test_other_base_exceptions_are_one_line_and_ctrl_c_stays_an_interrupt() -> None:
    program = load_program(JACOBI)
    with pytest.raises(ScheduleError, match=r"^f.py:2: GeneratorExit: $"):
        replay("def schedule(s):\n    raise GeneratorExit()\n", program, TG1, "f.py")
    with pytest.raises(KeyboardInterrupt):
        replay("def schedule(s):\n    raise KeyboardInterrupt\n", program, TG1, "f.py")


def test_a_schedule_that_never_ends_hits_its_time_limit() -> None:
    program = load_program(JACOBI)
    before = signal.getsignal(signal.SIGALRM)
    start = time.monotonic()
    with pytest.raises(ScheduleError) as err:
        replay(FOREVER, program, TG1, "f.py", time_limit=0.3)
    assert str(err.value) == (
        "f.py:3: the schedule ran longer than its time limit of 0.3 s "
        "(time_limit= of tensorgen.schedule.files.load_schedule)"
    )
    assert time.monotonic() - start < 5
    # the timer is gone and the previous handler back: nothing fires later
    assert signal.getsignal(signal.SIGALRM) is before and signal.getitimer(signal.ITIMER_REAL) == (
        0.0,
        0.0,
    )
    assert replay(
        "def schedule(s):\n    s.vectorize(s.loop('i'))\n", program, TG1, "f.py", time_limit=0.3
    ).trace


def test_the_time_limit_holds_outside_the_main_thread_too() -> None:
    program = load_program(JACOBI)
    caught: list[BaseException] = []

    def run() -> None:
        try:
            replay(FOREVER, program, TG1, "f.py", time_limit=0.3)
        except BaseException as err:  # noqa: BLE001 - whatever escapes, the assertion below names it
            caught.append(err)
        # a schedule that finishes in time is not hit by a late expiry
        replay(
            "def schedule(s):\n    s.vectorize(s.loop('i'))\n", program, TG1, "g.py", time_limit=0.3
        )
        time.sleep(0.5)

    worker = threading.Thread(target=run)
    worker.start()
    worker.join(20)
    assert not worker.is_alive()
    assert len(caught) == 1 and isinstance(caught[0], ScheduleError)
    assert str(caught[0]).startswith("f.py:3: the schedule ran longer than its time limit of 0.3 s")


def test_time_limit_through_the_cli(tmp_path: Path, capsys) -> None:
    f = tmp_path / "s.py"
    f.write_text(FOREVER)
    out = tmp_path / "o.tgb"
    code, err, _ = _cli(
        capsys,
        "emit",
        str(JACOBI),
        "-o",
        str(out),
        "--schedule",
        str(f),
        "--schedule-time-limit",
        "0.3",
    )
    assert code == 2 and len(err) == 1 and not out.exists()
    assert err[0].startswith(f"error: {f}:3: the schedule ran longer than its time limit of 0.3 s")


@pytest.mark.parametrize(
    "text, line, message",
    [
        # replays, but the lowering refuses it: the line of `def schedule`
        (
            "\n\ndef schedule(s):\n    s.vectorize(s.loop('k'))\n",
            3,
            "vectorize: S0 reduces along the vector lanes; vectorize a loop that indexes its output",
        ),
        (
            "def schedule(s):\n    s.stage('B', s.loop('k'), 'spad')\n    s.split(s.loop('k'), 1000)\n"
            "    s.split(s.loop('j'), 0)\n",
            4,
            "split(j, 0): factor must be a positive integer",
        ),
        (
            "def schedule(s):\n    s.stage('B', s.loop('j'), 'dram')\n",
            2,
            "stage(B, j, dram): memory must be one of",
        ),
        (
            "import no_such_module_xyz\n",
            1,
            "ModuleNotFoundError: No module named 'no_such_module_xyz'",
        ),
        ("def schedule(s):\n    raise ValueError('a\\nb')\n", 2, "ValueError: a b"),
        ("def schedule(s):\n    s.loop('k\\x1b[2J')\n", 2, "loop('k\\x1b[2J'): no such loop"),
    ],
)
def test_every_refusal_names_the_file_and_line(
    tmp_path: Path, capsys, text: str, line: int, message: str
) -> None:
    f = tmp_path / "s.py"
    f.write_text(text)
    out = tmp_path / "o.tgb"
    code, err, _ = _cli(
        capsys,
        "emit",
        str(ROOT / "examples" / "matmul_odd.yaml"),
        "-o",
        str(out),
        "--schedule",
        str(f),
    )
    assert code == 2 and len(err) == 1 and not out.exists(), err
    assert err[0].startswith(f"error: {f}:{line}: {message}"), err


def test_a_schedule_calling_unroll_is_one_line_through_the_cli(tmp_path: Path, capsys) -> None:
    f = tmp_path / "s.py"
    f.write_text("def schedule(s):\n    s.vectorize(s.loop('i'))\n    s.unroll(s.loop('t'))\n")
    out = tmp_path / "o.tgb"
    code, err, stdout = _cli(capsys, "emit", str(JACOBI), "-o", str(out), "--schedule", str(f))
    assert code == 2 and len(err) == 1 and not out.exists()
    assert err[0].startswith(f"error: {f}:3: unroll was removed: ")


def test_a_json_trace_through_the_cli(tmp_path: Path, capsys) -> None:
    from tensorgen.schedule.files import load_schedule, save_trace

    program = load_program(JACOBI)
    trace = tmp_path / "jacobi.json"
    save_trace(trace, load_schedule(ROOT / "schedules" / "jacobi1d.py", program, TG1))
    code, err, stdout = _cli(capsys, "check", str(JACOBI), "--schedule", str(trace))
    assert (code, err) == (0, []) and "BIT-EXACT" in stdout
    trace.write_text('{"steps": [{"primitive": "vectorize", "args": [{"loop": "t"}]}]}')
    out = tmp_path / "o.tgb"
    code, err, _ = _cli(capsys, "emit", str(JACOBI), "-o", str(out), "--schedule", str(trace))
    assert code == 2 and len(err) == 1 and not out.exists()
    assert err[0].startswith(f"error: {trace}: step 1: vectorize(t): ")
