"""The schedule trace as records: one `Step(primitive, args)` per primitive a schedule took.

A step prints as the Python call that replays it (`s.split(s.loop('i'), 4)`), so a trace is
the body of a schedule file, and saves as JSON (`dumps`/`loads`); `replay` rebuilds a
schedule from steps by calling its primitives (checked again), without running any text.
Loops are named by `LoopRef` (the name the loop had when the step ran, which `s.loop(name)`
finds again in a replay).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tensorgen.errors import ScheduleError
from tensorgen.inputs import one_line

if TYPE_CHECKING:
    from tensorgen.schedule.api import Schedule

# the primitives a trace may hold, with the keyword arguments each may take
PRIMITIVES = {
    "split": (),
    "tile": (),
    "reorder": (),
    "skew": (),
    "fuse": (),
    "distribute": (),
    "pack": (),
    "compute_at": (),
    "vectorize": (),
    "tensorize": (),
    "stage": ("layout",),
    "double_buffer": (),
}


@dataclass(frozen=True)
class LoopRef:
    """A loop in a step: `s.loop(name)` in a replay."""

    name: str

    def __repr__(self) -> str:
        return f"s.loop({self.name!r})"


@dataclass(frozen=True)
class Step:
    """One primitive call: its name, positional arguments and keyword arguments (sorted)."""

    primitive: str
    args: tuple = ()
    kwargs: tuple[tuple[str, object], ...] = ()

    def __str__(self) -> str:
        parts = [_python(a) for a in self.args] + [f"{k}={_python(v)}" for k, v in self.kwargs]
        return f"s.{self.primitive}({', '.join(parts)})"

    def to_json(self) -> dict:
        out: dict = {"primitive": self.primitive, "args": [_encode(a) for a in self.args]}
        if self.kwargs:
            out["kwargs"] = {k: _encode(v) for k, v in self.kwargs}
        return out


def _python(value) -> str:
    if isinstance(value, tuple):
        inner = ", ".join(_python(v) for v in value)
        return f"({inner},)" if len(value) == 1 else f"({inner})"
    return repr(value)


def _encode(value):
    if isinstance(value, LoopRef):
        return {"loop": value.name}
    if isinstance(value, tuple):
        return [_encode(v) for v in value]
    return value


def _decode(value, where: str):
    if isinstance(value, dict):
        if set(value) != {"loop"} or not isinstance(value["loop"], str):
            raise ScheduleError(f'{where}: a loop is {{"loop": name}}, got {one_line(value)}')
        return LoopRef(value["loop"])
    if isinstance(value, list):
        return tuple(_decode(v, where) for v in value)
    if value is None or isinstance(value, (int, str)) and not isinstance(value, bool):
        return value
    raise ScheduleError(f"{where}: unexpected argument {one_line(value)}")


def dumps(steps) -> str:
    """The trace as JSON text: a list of {"primitive", "args"[, "kwargs"]}."""
    return json.dumps({"steps": [s.to_json() for s in steps]}, indent=1) + "\n"


def loads(text: str, filename: str = "<trace>") -> tuple[Step, ...]:
    """The steps of a JSON trace (see `dumps`); a malformed one is one ScheduleError line."""
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError) as err:
        raise ScheduleError(f"{filename}: not a JSON trace: {one_line(err)}") from None
    items = doc.get("steps") if isinstance(doc, dict) else None
    if not isinstance(items, list):
        raise ScheduleError(f'{filename}: a trace is {{"steps": [...]}}')
    return tuple(_step(item, f"{filename}: step {n + 1}") for n, item in enumerate(items))


def _step(item, where: str) -> Step:
    if not isinstance(item, dict) or not isinstance(item.get("args", []), list):
        raise ScheduleError(f'{where}: a step is {{"primitive": name, "args": [...]}}')
    prim = item.get("primitive")
    if prim not in PRIMITIVES:
        raise ScheduleError(f"{where}: no primitive {one_line(prim)}")
    kwargs = item.get("kwargs", {})
    if not isinstance(kwargs, dict) or not set(kwargs) <= set(PRIMITIVES[prim]):
        raise ScheduleError(f"{where}: {prim} takes no keywords {one_line(kwargs)}")
    args = tuple(_decode(a, where) for a in item.get("args", []))
    return Step(prim, args, tuple(sorted((k, _decode(v, where)) for k, v in kwargs.items())))


def _resolve(schedule: Schedule, value):
    if isinstance(value, LoopRef):
        return schedule.loop(value.name)
    if isinstance(value, tuple) and any(isinstance(v, LoopRef) for v in value):
        return tuple(_resolve(schedule, v) for v in value)
    return value


def apply(schedule: Schedule, step: Step) -> None:
    """Run `step` on `schedule` (through its public primitive, checked as ever)."""
    if step.primitive not in PRIMITIVES:
        raise ScheduleError(f"replay: no primitive {step.primitive!r}")
    method = getattr(schedule, step.primitive)
    method(
        *(_resolve(schedule, a) for a in step.args),
        **{k: _resolve(schedule, v) for k, v in step.kwargs},
    )


def replay(program, steps, target=None) -> Schedule:
    """The schedule that `steps` build on `program`."""
    from tensorgen.schedule.api import Schedule  # api records steps: it imports this module

    s = Schedule(program, target)
    for step in steps:
        apply(s, step)
    return s
