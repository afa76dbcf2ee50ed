"""The fuzz harness itself: generation is a function of the seed, and the classifier tells each
contract break from a refusal (so that the property tests and benchmarks/fuzz.py can fail)."""

from __future__ import annotations

import random

import pytest

from tensorgen.testing.fuzz import FAMILIES, Case, generate
from tensorgen.testing.fuzzrun import classify, materialize


@pytest.mark.parametrize("family", FAMILIES)
def test_a_seed_names_one_case(family):
    a, b = generate(family, random.Random(11)), generate(family, random.Random(11))

    assert a == b
    assert a.family == family and a.kinds and a.argv
    assert generate(family, random.Random(12)) != a or family == "cli"


def test_kinds_restrict_the_mutators():
    for seed in range(40):
        assert (
            generate("opyaml", random.Random(seed), frozenset({"huge-number"})).kinds[0]
            == "huge-number"
        )
        assert set(generate("tgb", random.Random(seed), frozenset({"truncate"})).kinds) == {
            "truncate"
        }


CASE = Case(
    "cli",
    ("argv",),
    ("emit", "{d}/in/op.yaml", "-o", "{d}/out/x.tgb"),
    (("in/op.yaml", b"x"), ("out", "dir")),
)


@pytest.mark.parametrize(
    "code, err, expected",
    [
        (2, "error: op.yaml:1: bad\n", "refused"),
        (
            2,
            "usage: tensorgen emit [-h] op\n       more usage\ntensorgen emit: error: the following ...\n",
            "refused",
        ),
        (2, "error: a\nsecond line\n", "multi-line"),
        (2, "warning: x\nerror: a\n", "multi-line"),
        (2, "", "multi-line"),
        (3, "Traceback (most recent call last):\nValueError: x\ninternal error: ...\n", "exit-3"),
        (2, "Traceback (most recent call last):\n  File x\nKeyError: 'a'\n", "traceback"),
        (3, "Traceback (most recent call last):\nMemoryError\n", "memory"),
        (None, "", "hang"),
        (-11, "", "signal"),
        (0, "", "bad-output"),
        (5, "", "bad-exit"),
    ],
)
def test_classify_outcomes(tmp_path, code, err, expected):
    before = materialize(CASE, tmp_path)

    outcome = classify(CASE, tmp_path, before, code, "", err, 0.1)

    assert outcome.cls == expected
    assert outcome.broken == (expected != "refused")


def test_an_output_left_on_exit_2_is_stray(tmp_path):
    before = materialize(CASE, tmp_path)
    (tmp_path / "out" / "x.tgb").write_bytes(b"half")

    assert classify(CASE, tmp_path, before, 2, "", "error: x\n", 0.1).cls == "stray-output"


def test_a_file_outside_the_outputs_is_stray_even_on_success(tmp_path):
    before = materialize(CASE, tmp_path)
    (tmp_path / "esc.npy").write_bytes(b"")

    outcome = classify(CASE, tmp_path, before, 0, "ok\n", "", 0.1)

    assert (outcome.cls, outcome.detail) == ("stray-output", "esc.npy (exit 0)")


def test_an_accept_of_an_invalid_input_is_suspicious(tmp_path):
    from dataclasses import replace

    from tensorgen.testing.fuzzbin import bases

    case = replace(
        CASE,
        argv=("disasm", "{d}/in/x.tgb"),
        files=(("in/x.tgb", bases()[0].tgb),),
        expect_refusal=True,
    )
    before = materialize(case, tmp_path)

    assert classify(case, tmp_path, before, 0, ".target tiny\n", "", 0.1).cls == "suspicious-accept"
    assert (
        classify(
            replace(case, expect_refusal=False), tmp_path, before, 0, ".target tiny\n", "", 0.1
        ).cls
        == "ok"
    )


@pytest.mark.slow
def test_a_case_that_spends_a_workers_memory_is_judged_as_a_process(tmp_path):
    # schedule case 8607 of seed 0 prints 2^31 characters: captured in the worker, they outgrow
    # its address space outside the CLI (the worker died, exit 1, "bad-exit"); as a process the
    # CLI refuses it in one line
    from tensorgen.testing.fuzzrun import WorkerPool

    case = generate("schedule", random.Random("0:schedule:8607"))
    assert "print('x' * 2**31)" in dict(case.files)["in/sched.py"].decode()
    outcomes = []
    pool = WorkerPool(1, tmp_path, 20.0, 4 << 30)
    try:
        pool.map([(0, case, False)], lambda i, o: outcomes.append(o))
    finally:
        pool.close()

    assert [o.cls for o in outcomes] == ["refused"]
    # out of memory, or past the schedule's 3 s when the machine is busy: one line either way
    assert "sched.py:12: the schedule ran " in outcomes[0].err
