"""Running fuzz cases through the CLI and classifying what happened against its contract.

The contract (tensorgen/cli/__init__.py): exit 0 (or 1 for a check that found a mismatch) with valid output,
or exit 2 with exactly one `error: ...` line on stderr and no output file; never exit 3, a
traceback, a hang, a signal or exhausted memory. argparse's usage lines above its own error line
are the ecosystem's convention and count as one error.

`run_inprocess` calls `tensorgen.cli.main(argv)` with stdout and stderr captured, a limit on CPU
time (so that a loaded machine does not turn slow cases into hangs) and a longer one on wall-clock
time (for a read that blocks), both interval timers: they interrupt Python code, not a C call that
never returns, which the benchmark's worker pool covers by killing the worker; optionally an
address-space limit. `run_process` runs `python -m tensorgen.cli` under RLIMIT_AS, RLIMIT_CPU
and a timeout.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from tensorgen.testing.fuzz import Case

OK, REFUSED = "ok", "refused"
BREAKS = (
    "exit-3",
    "traceback",
    "hang",
    "signal",
    "memory",
    "multi-line",
    "stray-output",
    "suspicious-accept",
    "mismatch",
    "bad-output",
    "bad-exit",
)
CLASSES = (OK, REFUSED, *BREAKS)
PKG_ROOT = Path(__file__).resolve().parents[2]
_USAGE_ERROR = re.compile(r"^tensorgen( [\w-]+)?: error: ")


@dataclass(frozen=True)
class Outcome:
    cls: str
    code: int | None  # None: no exit code (a hang, or a signal)
    out: str
    err: str
    seconds: float
    detail: str = ""  # what broke: the exception line, the stray path, the stderr lines

    @property
    def broken(self) -> bool:
        return self.cls in BREAKS


class CaseTimeout(BaseException):
    """Raised by the interval timer; a BaseException, so that no `except Exception` swallows it."""


def _sub(s: str, d: Path) -> str:
    return s.replace("{d}", str(d))


def argv_of(case: Case, d: Path) -> list[str]:
    return [_sub(a, d) for a in case.argv]


def materialize(case: Case, d: Path) -> set[str]:
    """Write the case's files under `d`; returns the relative paths that exist before the run."""
    for rel, content in case.files:
        path = d / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if content == "dir":
            path.mkdir(exist_ok=True)
        elif content == "fifo":
            os.mkfifo(path)
        else:
            path.write_bytes(content)
    return _tree(d)


def _tree(d: Path) -> set[str]:
    return {str(p.relative_to(d)) for p in d.rglob("*")}


def wall_limit(cpu: float) -> float:
    """The wall-clock limit that goes with a CPU-time limit: generous, for a machine under load
    (a case that needs one CPU second can take ten on two cores shared by a dozen processes)."""
    return max(20 * cpu, 120.0)


def run_inprocess(case: Case, d: Path, limit: float = 20.0, memory: int | None = None) -> tuple:
    """(exit code or None past `limit` CPU seconds or `wall_limit(limit)` seconds, stdout, stderr,
    seconds), the CLI run in this process."""
    from tensorgen.cli import main

    fired = []

    def alarm(signum, frame):
        fired.append(signum)  # a C library may swallow the exception (islpy's callbacks): remember
        raise CaseTimeout

    argv = argv_of(case, d)
    out, err = io.StringIO(), io.StringIO()
    old_handlers = [signal.signal(sig, alarm) for sig in (signal.SIGALRM, signal.SIGPROF)]
    old_cwd = os.getcwd()
    old_as = resource.getrlimit(resource.RLIMIT_AS)
    code: int | None
    t0 = time.perf_counter()
    try:
        os.chdir(d)
        if memory is not None:
            resource.setrlimit(resource.RLIMIT_AS, (memory, old_as[1]))
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            signal.setitimer(signal.ITIMER_PROF, limit)
            signal.setitimer(signal.ITIMER_REAL, wall_limit(limit))
            try:
                code = main(argv)
            except SystemExit as exc:  # argparse, or a schedule file's SystemExit escaping main
                code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
                signal.setitimer(signal.ITIMER_PROF, 0)
    except CaseTimeout:
        code = None
    finally:
        signal.signal(signal.SIGALRM, old_handlers[0])
        if fired:
            code = None
        signal.signal(signal.SIGPROF, old_handlers[1])
        resource.setrlimit(resource.RLIMIT_AS, old_as)
        os.chdir(old_cwd)
    return code, out.getvalue(), err.getvalue(), time.perf_counter() - t0


def run_process(case: Case, d: Path, limit: float = 20.0, memory: int = 4 << 30) -> tuple:
    """(exit code, negative for a signal, or None past the limits; stdout; stderr; seconds) of a
    real process; `limit` is CPU seconds beyond the interpreter's start (SIGXCPU is a hang)."""

    def limits() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
        resource.setrlimit(resource.RLIMIT_CPU, (int(limit) + 5, int(limit) + 10))

    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(PKG_ROOT), os.environ.get("PYTHONPATH", "")])
    )
    t0 = time.perf_counter()
    try:
        p = subprocess.run(
            [sys.executable, "-m", "tensorgen.cli", *argv_of(case, d)],
            cwd=d,
            env=env,
            capture_output=True,
            timeout=wall_limit(limit),
            preexec_fn=limits,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired as exc:
        return (
            None,
            (exc.stdout or b"").decode(errors="replace"),
            (exc.stderr or b"").decode(errors="replace"),
            wall_limit(limit),
        )
    return (
        None if p.returncode == -signal.SIGXCPU else p.returncode,
        p.stdout.decode(errors="replace"),
        p.stderr.decode(errors="replace"),
        time.perf_counter() - t0,
    )


def _last_exception(err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln and not ln.startswith((" ", "internal error"))]
    return lines[-1][:200] if lines else ""


def _one_error(err: str) -> bool:
    lines = err.splitlines()
    if len(lines) == 1:
        return lines[0].startswith("error: ")
    # argparse: a usage block (first line "usage: ..."), then "tensorgen CMD: error: ..."
    return len(lines) > 1 and lines[0].startswith("usage: ") and bool(_USAGE_ERROR.match(lines[-1]))


def _stray(case: Case, d: Path, before: set[str], code: int | None) -> str:
    for path in case.forbidden:
        if os.path.lexists(path):
            return path
    new = sorted(_tree(d) - before)
    if code != 0:
        return new[0] if new else ""
    allowed = tuple(case.outputs)
    for rel in new:
        if not any(rel == a or rel.startswith(a + "/") for a in allowed):
            return rel
    return ""


def _valid_output(case: Case, d: Path, out: str) -> str:
    """Why the output of a successful command is not valid ('' if it is)."""
    import numpy as np

    from tensorgen.mc.binary import decode

    cmd = case.argv[0] if case.argv else ""
    if "-h" in case.argv or "--help" in case.argv:
        return "" if "usage:" in out else "help without usage"
    if cmd == "check":
        return (
            "" if "BIT-EXACT" in out and "MISMATCH" not in out else "check exit 0 without BIT-EXACT"
        )
    if cmd in ("emit", "compile"):
        argv = argv_of(case, d)
        for flag in ("-o", "--output"):
            if flag in argv and argv.index(flag) + 1 < len(argv):
                try:
                    decode(Path(argv[argv.index(flag) + 1]).read_bytes())
                except Exception as exc:  # noqa: BLE001 - any failure means the output is not valid
                    return f"-o file does not decode ({type(exc).__name__})"
        return ""
    if cmd == "run":
        res = d / "out" / "res"
        files = list(res.glob("*.npy")) if res.is_dir() else []
        if not files:
            return "run exit 0 without output arrays"
        for f in files:
            try:
                np.load(f, allow_pickle=False)
            except Exception as exc:  # noqa: BLE001
                return f"{f.name} does not load ({type(exc).__name__})"
        return ""
    return "" if out else f"{cmd} exit 0 with no output"


def classify(
    case: Case, d: Path, before: set[str], code: int | None, out: str, err: str, seconds: float
) -> Outcome:
    def result(cls: str, detail: str = "") -> Outcome:
        return Outcome(cls, code, out, err, seconds, detail)

    both = out + err
    if code is None:
        return result("hang", f"stopped after {seconds:.0f} s")
    if code < 0:
        kind = "memory" if "bad_alloc" in both else "signal"
        return result(kind, f"signal {-code} ({signal.Signals(-code).name})")
    if code == 2 and _one_error(err) and "the schedule ran out of memory" in err:
        return result(REFUSED)  # a schedule file is trusted Python: its own allocation, reported
    if "MemoryError" in both or "bad_alloc" in both or "Cannot allocate memory" in both:
        return result("memory", _last_exception(err))
    if code == 3:
        return result("exit-3", _last_exception(err))
    if "Traceback (most recent call last)" in both:
        return result("traceback", _last_exception(err))
    stray = _stray(case, d, before, code)
    if stray:
        return result("stray-output", f"{stray} (exit {code})")
    if code == 2:
        return (
            result(REFUSED)
            if _one_error(err)
            else result("multi-line", " | ".join(err.splitlines())[:300])
        )
    if code == 1 and case.argv[:1] == ("check",):
        return result(
            "mismatch", next((ln for ln in out.splitlines() if "MISMATCH" in ln), "exit 1")[:300]
        )
    if code == 0:
        why = _valid_output(case, d, out)
        if why:
            return result("bad-output", why)
        if case.expect_refusal:
            return result("suspicious-accept", "exit 0 on an input that must be refused")
        return result(OK)
    return result("bad-exit", f"exit {code}")


def execute(
    case: Case, workdir: Path, limit: float = 20.0, memory: int | None = None, process: bool = False
) -> Outcome:
    """Materialize `case` in a fresh directory under `workdir`, run it, classify, clean up."""
    d = Path(workdir)
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    try:
        before = materialize(case, d)
        if process:
            code, out, err, secs = run_process(case, d, limit, memory or (4 << 30))
        else:
            code, out, err, secs = run_inprocess(case, d, limit, memory)
        return classify(case, d, before, code, out, err, secs)
    finally:
        for path in case.forbidden:
            with contextlib.suppress(OSError):
                os.unlink(path)
        shutil.rmtree(d, ignore_errors=True)


def save_reproducer(case: Case, outcome: Outcome, d: Path) -> None:
    """A directory a person can triage from: the files, the command (`cmd.sh`), what it printed."""
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    materialize(case, d)
    argv = [a.replace("{d}", ".") for a in case.argv]
    quoted = " ".join("'" + a.replace("'", "'\\''") + "'" for a in argv)
    (d / "cmd.sh").write_text(
        f"# {case.describe()}: {outcome.cls} {outcome.detail}\n"
        f'cd "$(dirname "$0")" && python -m tensorgen.cli {quoted}\n'
    )
    (d / "stdout.txt").write_text(outcome.out)
    (d / "stderr.txt").write_text(outcome.err)


# --- a pool of worker processes (the benchmark) ----------------------------------------------------


# A worker runs this many cases, then exits and is replaced: what the cases leave behind
# (fragmented memory under RLIMIT_AS, caches) never becomes the next case's MemoryError.
RECYCLE = 200
RECYCLE_EXIT = 86


def warm_up() -> None:
    """Import what a check imports (torch: seconds) before the first case, so that no case's time
    limit or time per case pays for it."""
    import tensorgen.cli
    import tensorgen.reference.torch_ref  # noqa: F401


def _worker(conn, workdir: str, limit: float, memory: int) -> None:
    """Run cases sent over `conn` in this process under RLIMIT_AS, and send back their outcomes."""
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C stops the benchmark, which then stops us
    warm_up()
    for _ in range(RECYCLE):
        try:
            task = conn.recv()
        except EOFError:
            return
        except MemoryError:  # this process's address space is spent: the pool starts a fresh one
            os._exit(RECYCLE_EXIT)
        if task is None:
            return
        index, case, process = task
        try:
            outcome = execute(case, Path(workdir), limit, None, process)
        except MemoryError:  # the case's output or state outgrew the address space (a schedule
            # printing gigabytes into the captured stdout): the pool runs it as a process of its own
            os._exit(RECYCLE_EXIT)
        conn.send(
            (
                index,
                Outcome(
                    outcome.cls,
                    outcome.code,
                    outcome.out[-20000:],
                    outcome.err[-20000:],
                    outcome.seconds,
                    outcome.detail,
                ),
            )
        )


class WorkerPool:
    """Workers that each run one case at a time; a worker silent past the limit (a hang in C code)
    is killed and replaced, one that dies is reported with its signal."""

    def __init__(self, jobs: int, workdir: Path, limit: float, memory: int) -> None:
        import multiprocessing

        self.ctx = multiprocessing.get_context("spawn")
        self.workdir, self.limit, self.memory = workdir, limit, memory
        self.slots = [self._start(n) for n in range(jobs)]
        self.retried: set[int] = set()

    def _start(self, n: int) -> dict:
        parent, child = self.ctx.Pipe()
        proc = self.ctx.Process(
            target=_worker,
            args=(child, str(self.workdir / f"w{n}"), self.limit, self.memory),
            daemon=True,
        )
        proc.start()
        child.close()
        return {"n": n, "proc": proc, "conn": parent, "task": None, "t0": 0.0}

    def map(self, tasks: list[tuple[int, Case, bool]], done) -> None:
        """Run every task; `done(index, outcome)` as each finishes (in any order)."""
        from multiprocessing.connection import wait

        pending = list(reversed(tasks))
        while pending or any(s["task"] for s in self.slots):
            for s in self.slots:
                if s["task"] is None and pending:
                    self._send(s, pending.pop())
            busy = [s for s in self.slots if s["task"]]
            ready = wait([s["conn"] for s in busy], timeout=1.0)
            for s in busy:
                grace = wall_limit(self.limit) * (2 if s["task"][2] else 1) + 10
                if s["conn"] in ready:
                    try:
                        index, outcome = s["conn"].recv()
                    except (EOFError, OSError):
                        s["proc"].join(5)
                        code = s["proc"].exitcode
                        task = s["task"]
                        # recycled, or spent before the case ran: once more in a fresh worker
                        if code in (0, RECYCLE_EXIT) and task[0] not in self.retried:
                            self.retried.add(task[0])
                            self._replace(s)
                            self._send(s, task)
                            continue
                        index = s["task"][0]
                        self._replace(s)
                        if code == RECYCLE_EXIT:  # a case too large to reach a fresh worker
                            # under its address-space limit: run as a process of its own
                            outcome = execute(
                                task[1], self.workdir / "parent", self.limit, self.memory, True
                            )
                        else:
                            outcome = Outcome(
                                "signal" if code and code < 0 else "bad-exit",
                                code,
                                "",
                                "",
                                time.perf_counter() - s["t0"],
                                f"worker died (exit {code})",
                            )
                    s["task"] = None
                    done(index, outcome)
                elif time.perf_counter() - s["t0"] > grace:
                    index = s["task"][0]
                    s["proc"].kill()
                    self._replace(s)
                    s["task"] = None
                    done(
                        index,
                        Outcome("hang", None, "", "", grace, f"worker killed after {grace:.0f} s"),
                    )

    def _send(self, s: dict, task) -> None:
        """Give `task` to the worker of slot `s`; one that has exited is replaced first."""
        for _ in range(3):
            try:
                s["conn"].send(task)
                break
            except (BrokenPipeError, OSError):
                self._replace(s)
        s["task"], s["t0"] = task, time.perf_counter()

    def _replace(self, s: dict) -> None:
        s["proc"].join(5)
        s["conn"].close()
        s.update(self._start(s["n"]))

    def close(self) -> None:
        for s in self.slots:
            with contextlib.suppress(OSError, BrokenPipeError):
                s["conn"].send(None)
            s["proc"].join(5)
            if s["proc"].is_alive():
                s["proc"].kill()
