"""Schedule files: Python under schedules/ that replays a trace of primitives.

A schedule file defines `def schedule(s):` and calls the methods of `s` (a
`tensorgen.schedule.api.Schedule`). It is trusted Python, like a `conftest.py` or a
`setup.py`: it runs in this process with the ordinary builtins and may import what it likes,
so run only schedule files you would run as a program. No sandbox is promised, because
in-process Python cannot keep one (any object leads back to the real builtins).

What tensorgen does guarantee:

- a time limit (`time_limit`, 60 s by default, passed explicitly; None or 0: none) on running
  the file; its expiry is one `ScheduleError` line naming the file and the limit. In the main
  thread it is a SIGALRM timer (signal.setitimer); elsewhere, or when a real-time timer is
  already armed, a timer thread raises the expiry in the schedule's thread. Either is seen
  between Python bytecodes: a long call into C (one huge isl computation) finishes first;
- `SystemExit` (and any other BaseException but KeyboardInterrupt, which stays an interrupt)
  raised by a schedule is a `ScheduleError`, never a silent success;
- every refusal, raised while replaying or while lowering the schedule, is one line that
  starts `file:line:`; a lowering refusal names the line of `def schedule`, since it is the
  schedule as a whole that cannot be lowered.

A trace saved as JSON (`save_trace`, a file ending `.json`; see steps.py) loads the same way,
without running any Python: its steps are replayed through the primitives, and a refusal is
one line `file: step N: ...`.
"""

from __future__ import annotations

import ctypes
import re
import signal
import sys
import threading
import traceback
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tensorgen.errors import ScheduleError, TensorgenError
from tensorgen.inputs import one_line, read_text
from tensorgen.ir.core import Program
from tensorgen.schedule import steps
from tensorgen.schedule.api import Schedule

DEFAULT_TIME_LIMIT_S = (
    60.0  # a schedule file takes well under a second; this catches a loop that never ends
)


class _Expired(BaseException):
    """The time limit ran out (a BaseException, so that a schedule's `except Exception` does not
    swallow it)."""


def render(schedule: Schedule, doc: str = "") -> str:
    """The schedule file that replays `schedule`'s trace."""
    body = "\n".join(f"    {step}" for step in schedule.trace) or "    pass"
    doc = doc or f"Schedule for {schedule.program.name} (a trace of tensorgen primitives)."
    return f'"""{doc}"""\n\n\ndef schedule(s):\n{body}\n'


def save_trace(path: str | Path, schedule: Schedule) -> None:
    """Write `schedule`'s trace as JSON (whole or not at all), loadable by `load_schedule`."""
    from tensorgen.outputs import write_atomic

    write_atomic(path, steps.dumps(schedule.trace).encode())


def load_schedule(
    path: str | Path, program: Program, target=None, time_limit: float | None = DEFAULT_TIME_LIMIT_S
) -> Schedule:
    text = read_text(path, "the schedule file", ScheduleError)
    return _build(text, program, target, str(path), time_limit)[0]


def _build(text: str, program: Program, target, filename: str, time_limit) -> tuple[Schedule, int]:
    """A schedule file or, for a name ending `.json`, a saved trace (line 1 for lowering errors)."""
    if not filename.endswith(".json"):
        return _replay(text, program, target, filename, time_limit)
    s = Schedule(program, target)
    for n, step in enumerate(steps.loads(text, filename)):
        where = f"{filename}: step {n + 1}"
        try:
            with _time_limit(time_limit):
                steps.apply(s, step)
        except _Expired:
            raise ScheduleError(f"{where}: ran longer than the time limit") from None
        except TensorgenError as err:
            raise type(err)(f"{where}: {one_line(err, limit=400)}", err.detail) from None
        except (TypeError, ValueError) as err:  # arguments a primitive does not take
            raise ScheduleError(f"{where}: {step.primitive}: {one_line(err)}") from None
    return s, 1


def compile_schedule_file(
    path: str | Path,
    program: Program,
    target,
    lower: Callable[[Program, Any, Schedule], Any],
    time_limit: float | None = DEFAULT_TIME_LIMIT_S,
):
    """`lower(program, target, schedule)` under the schedule file at `path`: a refusal of the
    lowering is a line `path:N: ...` too, N the line of `def schedule`. The caller passes the
    lowering (codegen's compile_scheduled) because codegen sits above this package."""
    text = read_text(path, "the schedule file", ScheduleError)
    s, line = _build(text, program, target, str(path), time_limit)
    try:
        return lower(program, target, s)
    except TensorgenError as err:
        raise _located(err, str(path), line) from None


def replay(
    text: str,
    program: Program,
    target=None,
    filename: str = "<schedule>",
    time_limit: float | None = DEFAULT_TIME_LIMIT_S,
) -> Schedule:
    """The schedule that the schedule file `text` builds (see the module docstring)."""
    return _replay(text, program, target, filename, time_limit)[0]


def _replay(text: str, program: Program, target, filename: str, time_limit) -> tuple[Schedule, int]:
    """The schedule and the line of its `def schedule`."""
    try:
        code = compile(text, filename, "exec")
    except SyntaxError as err:
        raise ScheduleError(
            f"{filename}:{err.lineno or 1}: syntax error: {one_line(err.msg)}"
        ) from None
    except (
        ValueError,
        RecursionError,
        MemoryError,
    ) as err:  # null bytes; nesting too deep to compile
        raise ScheduleError(
            f"{filename}:1: cannot compile: {type(err).__name__}: {one_line(err)}"
        ) from None
    namespace = {"__name__": "schedule", "__file__": filename}  # exec adds the ordinary builtins
    s = Schedule(program, target)
    try:
        with _time_limit(time_limit):
            exec(code, namespace)  # noqa: S102 - a schedule file is trusted Python (module docstring)
            fn = namespace.get("schedule")
            if not callable(fn):
                raise ScheduleError(f"{filename}:1: a schedule file must define 'def schedule(s):'")
            fn(s)
    except _Expired as err:
        raise ScheduleError(
            f"{filename}:{_line(err, filename)}: the schedule ran longer than its time limit "
            f"of {time_limit:g} s (time_limit= of tensorgen.schedule.files.load_schedule)"
        ) from None
    except TensorgenError as err:
        raise _located(err, filename, _line(err, filename)) from None
    except SystemExit as err:
        raise ScheduleError(
            f"{filename}:{_line(err, filename)}: the schedule called exit"
        ) from None
    except KeyboardInterrupt:
        raise
    except MemoryError:
        raise ScheduleError(
            f"{filename}:{_line(sys.exc_info()[1], filename)}: the schedule ran out of memory "
            "(MemoryError)"
        ) from None
    except BaseException as err:  # noqa: BLE001 - the user's code called something wrong, or raised anything
        raise ScheduleError(
            f"{filename}:{_line(err, filename)}: {type(err).__name__}: {one_line(err)}"
        ) from None
    code_of = getattr(fn, "__code__", None)
    return (
        s,
        code_of.co_firstlineno if code_of is not None and code_of.co_filename == filename else 1,
    )


def _located(err: TensorgenError, filename: str, line: int) -> TensorgenError:
    """`err` as one line that starts `filename:line:` (unless it already names the file)."""
    message = one_line(err, limit=400)
    if re.match(re.escape(filename) + r":\d+: ", message):
        return type(err)(message, err.detail)
    return type(err)(f"{filename}:{line}: {message}", err.detail)


def _line(err: BaseException, filename: str) -> int:
    frames = [f for f in traceback.extract_tb(err.__traceback__) if f.filename == filename]
    return frames[-1].lineno or 1 if frames else 1


@contextmanager
def _time_limit(seconds: float | None):
    """Raise `_Expired` in this thread once `seconds` have passed (None or <= 0: no limit)."""
    if not seconds or seconds <= 0:
        yield
        return
    alarm = (
        threading.current_thread() is threading.main_thread()
        and hasattr(signal, "setitimer")
        and signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
    )
    with _alarm(seconds) if alarm else _timer_thread(seconds):
        yield


@contextmanager
def _alarm(seconds: float):
    def expire(signum, frame):
        raise _Expired()

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@contextmanager
def _timer_thread(seconds: float):
    """Off the main thread (no signals there): a timer thread raises `_Expired` asynchronously in
    this one (CPython's PyThreadState_SetAsyncExc); a lock keeps it from firing once we are done."""
    target = ctypes.c_ulong(threading.get_ident())
    lock, state = threading.Lock(), {"done": False, "fired": False}

    def fire() -> None:
        with lock:
            if not state["done"]:
                state["fired"] = True
                ctypes.pythonapi.PyThreadState_SetAsyncExc(target, ctypes.py_object(_Expired))

    timer = threading.Timer(seconds, fire)
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        with lock:
            state["done"] = True
        timer.cancel()
        if state["fired"]:  # clear an expiry not yet delivered: we are past the schedule
            ctypes.pythonapi.PyThreadState_SetAsyncExc(target, None)
