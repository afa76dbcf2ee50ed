"""Recurrences (shared `loops:`) under the default and automatic schedules: values carried from
one step to the next through a temporary, and statements restricted to some steps by `where:`.

Both were wrong results, accepted silently: the kernel lowering dropped a temporary's value at
the end of each step (never stored it), and ran every statement at every step of the shared
loop whatever its `where:` said.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tensorgen.driver import Job, compile_auto, compile_default, random_inputs, run_and_compare
from tensorgen.spec.loader import parse_program
from tensorgen.target import load_target

EXAMPLES = Path(__file__).parents[2] / "examples"
JACOBI = "  - A[t + 1, i] = (A[t, i - 1] + 2 * A[t, i] + A[t, i + 1]) >> 2\n"


def _rnn_without_init() -> str:
    text = (EXAMPLES / "rnn_cell.yaml").read_text()
    assert "  - ACC[b, j] = B[j]\n" in text
    return text.replace("  - ACC[b, j] = B[j]\n", "")


def _jacobi_where(op: str) -> str:
    text = (EXAMPLES / "jacobi1d.yaml").read_text()
    assert JACOBI in text
    stmt = JACOBI.strip()[2:].replace(" = ", f" {op} ", 1)
    return text.replace(JACOBI, f'  - {{stmt: "{stmt}", where: "0 <= t < 3"}}\n')


def _check(text: str, target: str, schedule: str) -> Job:
    program = parse_program(text, "<recurrence>")
    tgt = load_target(target)
    compiled = (
        compile_default(program, tgt)
        if schedule == "default"
        else compile_auto(program, tgt).compiled
    )
    job = Job(program, tgt, compiled)
    for seed in (0, 1):
        cmp, _ = run_and_compare(job, random_inputs(program, seed))
        assert cmp.exact, f"{target}/{schedule}: {cmp.message}"
    return job


@pytest.mark.parametrize("schedule", ["default", "auto"])
@pytest.mark.parametrize("target", ["tg1", "tiny"])
def test_temporary_accumulates_across_time_steps(target: str, schedule: str) -> None:
    job = _check(_rnn_without_init(), target, schedule)
    # ACC starts at zero and is carried from step to step: it lives in DRAM between the steps
    assert any(t.name == "ACC" for t in job.compiled.binary.tensors)


@pytest.mark.parametrize("schedule", ["default", "auto"])
@pytest.mark.parametrize("target", ["tg1", "tiny"])
@pytest.mark.parametrize("op", ["=", "+="])
def test_where_on_a_shared_loop_runs_those_steps_only(op: str, target: str, schedule: str) -> None:
    _check(_jacobi_where(op), target, schedule)


TWO_STEPS = """tensorgen: 1
tensors:
  X: {{shape: [6, 8], dtype: int32, role: input}}
  Y: {{shape: [8], dtype: int32, role: inout}}
  Z: {{shape: [8], dtype: int32, role: inout}}
loops: {{t: 6}}
statements:
  - {{stmt: "Y[i] += X[t, i]", where: "{w0}"}}
  - {{stmt: "Z[i] max= Y[i] - X[t, i]", where: "{w1}"}}
"""


def test_statements_restricted_to_different_steps_are_guarded_apart() -> None:
    job = _check(TWO_STEPS.format(w0="t >= 2", w1="t <= 4"), "tiny", "default")
    code = job.compiled.binary.code
    assert [i.arg("count") for i in code if i.mnemonic == "LOOP"][0] == 6
    assert sum(i.mnemonic == "IF" for i in code) == 2


def test_shared_loop_runs_only_the_steps_some_statement_runs_at() -> None:
    job = _check(TWO_STEPS.format(w0="1 <= t <= 3", w1="1 <= t < 4"), "tiny", "default")
    code = job.compiled.binary.code
    assert [i.arg("count") for i in code if i.mnemonic == "LOOP"][0] == 3
    assert not any(i.mnemonic == "IF" for i in code)
