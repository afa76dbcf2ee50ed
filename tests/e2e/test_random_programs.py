"""Hypothesis: random small programs compile to what the reference computes, bit for bit.

The programs are the kind where accepted-but-wrong results hid: shared `loops:` (recurrences),
`where:` restrictions on shared and on own loops (boxes, and triangles that need the general
backend), temporaries that start at zero and carry their value from one step to the next,
`+=`/`max=` onto tensors written by earlier statements, reads at shifted subscripts (padding),
self-dependent statements (scans, stencils over time), MAC-array contractions and narrow
stores. Each is compiled for tg1 and tiny under the default and the automatic schedule,
simulated, and compared with the PyTorch reference.

The default profile draws a few dozen programs; `--hypothesis-profile=programs-500` (registered
in tests/e2e/conftest.py, test-only) draws 500, e.g.
`pytest tests/e2e/test_random_programs.py --hypothesis-profile=programs-500 --hypothesis-seed=1`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tensorgen.driver import Job, compile_auto, compile_default, random_inputs, run_and_compare
from tensorgen.spec.loader import parse_program
from tensorgen.target import load_target

TARGETS = {name: load_target(name) for name in ("tg1", "tiny")}
# a few dozen programs (each compiled four times) by default; a profile given on the command line
# (tests/e2e/conftest.py registers programs-500) sets the number instead
EXAMPLES = 60 if settings.get_current_profile_name() == "default" else settings.default.max_examples
SETTINGS = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))


@dataclass(frozen=True)
class Shape:
    t: int  # steps of t: a shared loop (`loops:`), or each statement's own index (for the auto-scheduler)
    shared: bool
    u: int  # steps of a second shared loop u (0: none), which only repeats the steps of t
    n: int  # extent of the own index i
    k: int  # extent of the contraction index k


# int32 tensors the expressions read and write; X and H are indexed by the step t
TEMPS = ("P", "Q")  # role none: start at zero, carried across steps


def _leaf(draw, shape: Shape, written: set[str]) -> str:
    # temporaries and outputs may be read before anything writes them (they start at zero)
    choices = ["X", "X", "C", "P", "Q", "Y", "H"] + (["Z"] if "Z" in written else [])
    name = draw(st.sampled_from(choices))
    if name == "C":
        return str(draw(st.integers(-5, 9)))
    shift = draw(st.sampled_from(["", "", " + 1", " - 1"]))
    if name == "X":
        return f"X[t, i{shift}]"
    if name == "H":
        return f"H[t, i{shift}]"
    return f"{name}[i{shift}]"


def _expr(draw, shape: Shape, written: set[str], depth: int) -> str:
    if depth == 0 or draw(st.integers(0, 2)) == 0:
        return _leaf(draw, shape, written)
    a = _expr(draw, shape, written, depth - 1)
    b = _expr(draw, shape, written, depth - 1)
    form = draw(st.sampled_from(["+", "-", "*", ">>", "max", "min", "relu", "clamp"]))
    if form == ">>":
        return f"({a} >> {draw(st.integers(0, 3))})"
    if form in ("max", "min"):
        return f"{form}({a}, {b})"
    if form == "relu":
        return f"relu({a})"
    if form == "clamp":
        return f"clamp({a}, -100, 100)"
    return f"({a} {form} {b})"


def _where(draw, shape: Shape, has_t: bool, on_t: bool, own: bool) -> str:
    cons = []
    if has_t and on_t and shape.t > 1:
        lo = draw(st.integers(0, shape.t - 1))
        hi = draw(st.integers(lo, shape.t - 1))
        cons.append(f"{lo} <= t <= {hi}")
    if own and shape.n > 1:
        if not has_t or draw(st.booleans()):
            lo = draw(st.integers(0, shape.n - 1))
            hi = draw(st.integers(lo, shape.n - 1))
            cons.append(f"{lo} <= i <= {hi}")
        else:  # a triangle over (t, i): not a box
            cons.append(f"i <= t + {draw(st.integers(0, shape.n - 1))}")
    return " and ".join(cons)


def _statement(draw, shape: Shape, written: set[str]) -> str:
    """A statement writing one of P, Q, Y, H, Z, or a MAC-array contraction."""
    kind = draw(st.sampled_from(["temp", "temp", "Y", "H", "Z", "mac", "scan"]))
    op = draw(st.sampled_from(["=", "+=", "max="]))
    rhs = _expr(draw, shape, written, 2)
    if kind == "temp":
        lhs = f"{draw(st.sampled_from(TEMPS))}[i]"
    elif kind == "Y":
        lhs = "Y[i]"
    elif kind == "H":
        lhs = "H[t + 1, i]"
    elif kind == "Z":
        lhs, rhs = "Z[i]", draw(st.sampled_from([f"requant({rhs}, 0.03, 2)", f"int8({rhs})", rhs]))
    elif kind == "mac":
        lhs, op = f"{draw(st.sampled_from(TEMPS + ('Y',)))}[i]", "+="
        rhs = draw(st.sampled_from(["XQ[t, k] * WQ[i, k]", "WQ[i, k] * (XQ[t, k] - 3)"]))
    else:  # a scan: reads what it writes, one element back
        lhs, op = "Y[i]", "="
        rhs = f"(Y[i - 1] + {_leaf(draw, shape, written)})"
    return f"{lhs} {op} {rhs}"


def _tensors(shape: Shape, used: set[str], out_role: str) -> list[str]:
    t, n, k = shape.t, shape.n, shape.k
    decl = {
        "X": f"{{shape: [{t}, {n}], dtype: int32, role: input}}",
        "XQ": f"{{shape: [{t}, {k}], dtype: int8, role: input}}",
        "WQ": f"{{shape: [{n}, {k}], dtype: int8, role: input}}",
        "P": f"{{shape: [{n}], dtype: int32}}",
        "Q": f"{{shape: [{n}], dtype: int32}}",
        "Y": f"{{shape: [{n}], dtype: int32, role: {out_role}}}",
        "H": f"{{shape: [{t + 1}, {n}], dtype: int32, role: inout}}",
        "Z": f"{{shape: [{n}], dtype: int8, role: output}}",
    }
    return [f"  {name}: {spec}" for name, spec in decl.items() if name in used]


def _mentions_t(text: str) -> bool:
    return re.search(r"\bt\b", text) is not None


@st.composite
def programs(draw) -> str:
    shared = draw(st.integers(0, 3)) > 0
    shape = Shape(
        draw(st.integers(1, 4)),
        shared,
        draw(st.sampled_from([0, 0, 0, 2])) if shared else 0,
        draw(st.integers(1, 6)),
        draw(st.integers(1, 5)),
    )
    written: set[str] = set()
    stmts = []
    for _ in range(draw(st.integers(1, 4))):
        text = _statement(draw, shape, written)
        stmts.append(
            (
                text,
                _where(
                    draw,
                    shape,
                    _mentions_t(text),
                    draw(st.booleans()),
                    draw(st.integers(0, 3)) == 0,
                ),
            )
        )
        written.add(text.split("[", 1)[0])
    if not written & {"Y", "H", "Z"}:  # something must come out
        stmts.append(("Y[i] = P[i] + Q[i]" if written else "Y[i] = X[t, i]", ""))
        written.add("Y")
    lines = []
    for text, where in stmts:
        if not shared and _mentions_t(text):  # t is the statement's own index: bound it
            where = " and ".join(w for w in (where, f"0 <= t <= {shape.t - 1}") if w)
        lines.append(f'  - {{stmt: "{text}", where: "{where}"}}' if where else f"  - {text}")
    body = "\n".join(lines)
    used = {name for name in ("X", "XQ", "WQ", "P", "Q", "Y", "H", "Z") if f"{name}[" in body}
    loops = f"{{t: {shape.t}, u: {shape.u}}}" if shape.u else f"{{t: {shape.t}}}"
    loops = f"loops: {loops}\n" if shared else ""
    out_role = (
        draw(st.sampled_from(["output", "inout"])) if "Y" in written else "inout"
    )  # read, not written
    tensors = "\n".join(_tensors(shape, used, out_role))
    return f"tensorgen: 1\nname: random\ntensors:\n{tensors}\n{loops}statements:\n{body}\n"


def _check(text: str, seed: int) -> None:
    program = parse_program(text, "<random>")
    inputs = random_inputs(program, seed)
    for name, target in TARGETS.items():
        for schedule in ("default", "auto"):
            if schedule == "default":
                compiled = compile_default(program, target)
            else:
                compiled = compile_auto(program, target).compiled
            cmp, _ = run_and_compare(Job(program, target, compiled), inputs)
            assert cmp.exact, f"{name}, {schedule} schedule: {cmp.message}\n{text}"


@SETTINGS
@given(text=programs(), seed=st.integers(0, 2**16))
def test_random_programs_are_bit_exact(text: str, seed: int) -> None:
    _check(text, seed)
