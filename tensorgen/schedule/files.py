"""Schedule files: Python under schedules/ that replays a trace of primitives.

A schedule file defines `def schedule(s):` and calls only the methods of `s` (a
`tensorgen.schedule.api.Schedule`). It runs without imports and with a small set of
builtins; anything that goes wrong becomes one `ScheduleError` line naming the file and
line, never a traceback.
"""

from __future__ import annotations

import builtins
import traceback
from pathlib import Path

from tensorgen.errors import ScheduleError, TensorgenError
from tensorgen.inputs import read_text
from tensorgen.ir.core import Program
from tensorgen.schedule.api import Schedule

_ALLOWED_BUILTINS = ("range", "len", "min", "max", "enumerate", "zip", "list", "tuple", "int", "abs", "print")


def render(schedule: Schedule, doc: str = "") -> str:
    """The schedule file that replays `schedule`'s trace."""
    body = "\n".join(f"    {line}" for line in schedule.trace) or "    pass"
    doc = doc or f"Schedule for {schedule.program.name} (a trace of tensorgen primitives)."
    return f'"""{doc}"""\n\n\ndef schedule(s):\n{body}\n'


def load_schedule(path: str | Path, program: Program, target=None) -> Schedule:
    text = read_text(path, "the schedule file", ScheduleError)
    return replay(text, program, target, str(path))


def replay(text: str, program: Program, target=None, filename: str = "<schedule>") -> Schedule:
    try:
        code = compile(text, filename, "exec")
    except SyntaxError as err:
        raise ScheduleError(f"{filename}:{err.lineno}: syntax error: {err.msg}") from None
    namespace = {"__builtins__": {n: getattr(builtins, n) for n in _ALLOWED_BUILTINS}, "__name__": "schedule"}
    s = Schedule(program, target)
    try:
        exec(code, namespace)  # noqa: S102 - a schedule file is the user's own program text
        fn = namespace.get("schedule")
        if not callable(fn):
            raise ScheduleError(f"{filename}:1: a schedule file must define 'def schedule(s):'")
        fn(s)
    except ScheduleError as err:
        if str(err).startswith(filename):
            raise
        raise ScheduleError(f"{filename}:{_line(err, filename)}: {err}", detail=err.detail) from None
    except TensorgenError as err:
        raise type(err)(f"{filename}:{_line(err, filename)}: {err}") from None
    except ImportError:
        raise ScheduleError(f"{filename}:{_line(None, filename)}: a schedule file cannot import; "
                            f"use the methods of s") from None
    except Exception as err:  # the user's code called something wrong
        raise ScheduleError(f"{filename}:{_line(err, filename)}: {type(err).__name__}: {err}") from None
    return s


def _line(err: BaseException | None, filename: str) -> int:
    import sys

    tb = err.__traceback__ if err is not None else sys.exc_info()[2]
    frames = [f for f in traceback.extract_tb(tb) if f.filename == filename]
    return frames[-1].lineno if frames else 1
