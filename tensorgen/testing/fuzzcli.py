"""Fuzz cases over command lines (the `cli` family): subcommands, positionals and options drawn
from tables of valid and hostile values, run against the files of `fuzzbin.cli_files` (an op.yaml
and its schedule, a binary and its inputs, files that are empty, malformed, directories or not
what their name says); the tables also name files that do not exist."""

from __future__ import annotations

import random

from tensorgen.testing import fuzzbin

SUBCOMMANDS = (
    "emit",
    "check",
    "compile",
    "run",
    "disasm",
    "isa-doc",
    "",
    "chekc",
    "-h",
    "--version",
    "EMIT",
)
POSITIONALS = (
    "{d}/in/op.yaml",
    "{d}/in/x.tgb",
    "{d}/in/missing.yaml",
    "{d}/in/dir",
    "{d}/in/empty",
    "{d}/in/bad.yaml",
    "{d}/in/notmodel.py",
    "{d}/in/missing.py",
    "{d}/in/m.pt2",
    "{d}/in/a.npy",
    "-",
    "",
    "--",
    "x" * 3000,
    "{d}/in/op.yaml:build",
    "{d}/in/notmodel.py:nope",
    "/dev/null",
)
INTS = (
    "0",
    "1",
    "-1",
    "10",
    "1000000000",
    "99999999999999999999",
    "x",
    "",
    "1e3",
    "0x10",
    " 5",
    "-0",
)
VALUES = {
    "--target": (
        "tg1",
        "tiny",
        "nope",
        "{d}/in/bad.yaml",
        "{d}/in/empty",
        "{d}/in/dir",
        "{d}/in/op.yaml",
        "",
        "../tg1",
        "{d}/in/missing.yaml",
    ),
    "--schedule": (
        "auto",
        "default",
        "{d}/in/sched.py",
        "{d}/in/missing.py",
        "{d}/in/op.yaml",
        "{d}/in/dir",
        "",
        "{d}/in/empty",
    ),
    "-o": (
        "{d}/out/x.tgb",
        "{d}/missing/x.tgb",
        "{d}/in/dir",
        "{d}/out/",
        "",
        "{d}/out/x.s",
        "{d}/in",
    ),
    "--asm": ("{d}/out/x.s", "{d}/missing/x.s", "{d}/in/dir", ""),
    "--out": ("{d}/out/res", "{d}/missing/a/b", "{d}/in/x.tgb", "", "{d}/out"),
    "--seed": INTS,
    "--trials": INTS,
    "-p": ("size=4", "x", "=1", "1=2", "a=b", "a=99999999999999999999", "a=1=2", "", " a=1"),
    "--engine": ("qnnpack", "x86", "fbgemm", "onednn", ""),
    "--dump-layers": ("{d}/out/layers", "{d}/missing/x", "{d}/in/x.tgb"),
    "--input": ("{d}/in/a.npy", "{d}/in/missing.npy", "{d}/in/empty", "{d}/in/dir"),
    "--in": (
        "A={d}/in/a.npy",
        "A",
        "=x",
        "Z={d}/in/a.npy",
        "A={d}/in/missing.npy",
        "A={d}/in/empty",
        "A={d}/in/dir",
        "A={d}/in/x.tgb",
        "B={d}/in/b.npy",
    ),
    "--explain": None,
    "--help": None,
    "--bogus": None,
    "-x": None,
}


def cli_case(rng: random.Random, kinds: frozenset[str] | None = None):
    """Random command lines: a subcommand (or a misspelt one, or none), then up to five
    positionals or options, each flag with a value from its table (a valid one or a hostile one)."""
    from tensorgen.testing.fuzz import Case

    argv = [rng.choice(SUBCOMMANDS)] if rng.random() < 0.95 else []
    for _ in range(rng.randrange(6)):
        if rng.random() < 0.35:
            argv.append(rng.choice(POSITIONALS))
        else:
            flag = rng.choice(list(VALUES))
            if flag in ("--help", "-x", "--bogus") and rng.random() < 0.7:
                continue
            argv.append(flag)
            if VALUES[flag] is not None and rng.random() < 0.95:
                argv.append(rng.choice(VALUES[flag]))
    argv = [a for a in argv if a != "" or rng.random() < 0.5]
    files = fuzzbin.cli_files()
    return Case("cli", ("argv",), tuple(argv), files)
