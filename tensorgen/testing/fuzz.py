"""Fuzz cases for the CLI: seeded mutators of op.yaml files, schedule files, .tgb binaries, `--in`
arrays and command lines (five families: the binaries' and arrays' in `fuzzbin`, the command
lines' in `fuzzcli`), each case a command plus the files it reads.

A `Case` is a value: its files are materialized in a fresh directory by `tensorgen.testing.fuzzrun`,
where `{d}` in its arguments stands for that directory. Generators are plain functions of a
`random.Random`, so a seed names a case (the tests draw seeds with hypothesis; the benchmark counts
them). Each mutator has a name (`Case.kinds`), so that a test can target the classes already fixed.
Schedule files are trusted Python by design: their mutations stay within the schedule API.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from tensorgen.testing import fuzzbin, fuzzcli

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
SCHEDULES = ROOT / "schedules"
FAMILIES = ("opyaml", "schedule", "tgb", "npy", "cli")
SCHEDULE_LIMIT = ("--schedule-time-limit", "3")


@dataclass(frozen=True)
class Case:
    family: str
    kinds: tuple[str, ...]  # the mutators applied, in order
    argv: tuple[str, ...]  # `{d}` stands for the case directory
    files: tuple[tuple[str, bytes | str], ...]  # path under {d} -> bytes, or "fifo" / "dir"
    outputs: tuple[str, ...] = ("out",)  # paths under {d} that a successful command may create
    expect_refusal: bool = False  # the input is invalid: exit 0 is a suspicious accept
    forbidden: tuple[str, ...] = ()  # absolute paths that must not exist afterwards

    def describe(self) -> str:
        return f"{self.family}[{'+'.join(self.kinds)}]"


def generate(family: str, rng: random.Random, kinds: frozenset[str] | None = None) -> Case:
    """One case of `family`; `kinds` restricts the mutators to a subset (None: all)."""
    return {
        "opyaml": opyaml_case,
        "schedule": schedule_case,
        "tgb": fuzzbin.tgb_case,
        "npy": fuzzbin.npy_case,
        "cli": fuzzcli.cli_case,
    }[family](rng, kinds)


def pick(rng: random.Random, table: dict[str, float], kinds: frozenset[str] | None) -> str:
    """A name from `table` (name -> weight), among `kinds` if given."""
    names = [n for n in table if kinds is None or n in kinds] or list(table)
    return rng.choices(names, [table[n] for n in names])[0]


@cache
def example_texts() -> tuple[tuple[str, str], ...]:
    return tuple((p.stem, p.read_text()) for p in sorted(EXAMPLES.glob("*.yaml")))


# Tensor dimensions of the examples mapped to small ones, the same everywhere (so that a conv's
# input, weights and output stay consistent): a mutated program that is accepted is compiled,
# simulated and checked against PyTorch, and at the examples' sizes that costs up to 7 CPU-s a
# case instead of a tenth of one. FULL_SIZE of the cases keep the examples' own sizes.
SMALL = {"14": "4", "28": "4", "32": "8", "56": "8", "64": "8", "128": "16", "256": "16"}
FULL_SIZE = 0.1


def small(text: str) -> str:
    """`text` with the dimensions in its `shape: [...]` lists replaced by `SMALL`."""
    return re.sub(
        r"shape: \[([^\]]*)\]",
        lambda m: "shape: [" + re.sub(r"\d+", lambda d: SMALL.get(d[0], d[0]), m[1]) + "]",
        text,
    )


def base_text(rng: random.Random, texts: tuple[tuple[str, str], ...]) -> tuple[str, str]:
    name, text = rng.choice(texts)
    return name, text if rng.random() < FULL_SIZE else small(text)


# --- op.yaml -------------------------------------------------------------------------------

TOKENS = (
    "[",
    "]",
    "{",
    "}",
    ":",
    ",",
    "-",
    " ",
    "\n",
    "+=",
    "max=",
    "=",
    "*",
    ">>",
    "<<",
    "(",
    ")",
    "i",
    "j",
    "k",
    "t",
    "A",
    "B",
    "C",
    "X",
    "S",
    "0",
    "1",
    "-1",
    "16",
    "int8",
    "int32",
    "uint8",
    "float32",
    "role: input",
    "role: inout",
    "where:",
    "loops:",
    "stmt:",
    "requant(",
    "relu(",
    "max(",
    "min(",
    "shape:",
    "dtype:",
    "tensors:",
    "statements:",
    "target:",
    "tg1",
    "tiny",
    "name:",
    "schedule:",
    "auto",
    "null",
    "~",
    "true",
    "&a",
    "*a",
    "'",
    '"',
    "#",
    "|",
    ">",
    "---",
    "...",
    "%YAML 1.1\n",
)
HUGE = (
    "9223372036854775807",
    "9223372036854775808",
    "18446744073709551616",
    "1" + "0" * 30,
    "0",
    "-1",
    "-9223372036854775809",
    "4294967296",
    "65536",
    "1e309",
    "0x7fffffffffffffff",
    "1_000_000",
    "0o777",
    ".inf",
    "-.inf",
    ".nan",
    "99999999999",
    "4611686018427387904",
    "1000000",
)
TAGS = (
    "!!int ",
    "!!float ",
    "!!str ",
    "!!binary ",
    "!!timestamp ",
    "!!bool ",
    "!!null ",
    "!!set ",
    "!!omap ",
    "!!python/object/apply:os.system ",
    "!custom ",
    "!!int 0x",
    "&x ",
    "*x ",
    "!!seq ",
    "!!map ",
)
CONTROL = (
    "\x00",
    "\x01",
    "\x07",
    "\x08",
    "\x0b",
    "\x0c",
    "\x1b",
    "\x7f",
    "\x85",
    "\u2028",
    "\u2029",
    "\ufeff",
    "\t",
    "\r",
)
NON_UTF8 = (b"\xff", b"\xc3", b"\xed\xa0\x80", b"\xfe\xff", b"\x80\x80", b"\xf4\x90\x80\x80")


def _tokens(text: str) -> list[str]:
    return re.findall(r"\w+|\s+|[^\w\s]", text)


def _tok_insert(rng, text):
    toks = _tokens(text)
    toks.insert(rng.randrange(len(toks) + 1), rng.choice(TOKENS))
    return "".join(toks)


def _tok_delete(rng, text):
    toks = _tokens(text)
    del toks[rng.randrange(len(toks))]
    return "".join(toks)


def _tok_replace(rng, text):
    toks = _tokens(text)
    toks[rng.randrange(len(toks))] = rng.choice(TOKENS + tuple(toks))
    return "".join(toks)


def _char_edit(rng, text):
    i = rng.randrange(len(text) + 1)
    op = rng.randrange(3)
    ch = chr(rng.choice((rng.randrange(32, 127), rng.randrange(0x80, 0x3000))))
    if op == 0:
        return text[:i] + ch + text[i:]
    if op == 1:
        return text[:i] + text[i + 1 :]
    return text[:i] + ch + text[i + 1 :]


def _huge_number(rng, text):
    nums = list(re.finditer(r"\d+", text))
    if not nums:
        return text + rng.choice(HUGE)
    m = rng.choice(nums)
    return text[: m.start()] + rng.choice(HUGE) + text[m.end() :]


def _yaml_tag(rng, text):
    spots = [m.end() for m in re.finditer(r": |\[|, ", text)]
    i = rng.choice(spots) if spots else 0
    return text[:i] + rng.choice(TAGS) + text[i:]


def _deep_nesting(rng, text):
    n = rng.choice((40, 200, 3000))
    spots = [m.end() for m in re.finditer(r": ", text)] or [0]
    i = rng.choice(spots)
    line_end = text.find("\n", i) % (len(text) + 1)
    return text[:i] + "[" * n + "1" + "]" * n + text[line_end:]


def _statement_lines(text: str) -> list[int]:
    lines = text.split("\n")
    return [n for n, line in enumerate(lines) if line.startswith("  - ")]


def _deep_expression(rng, text):
    lines = text.split("\n")
    stmts = [n for n in _statement_lines(text) if re.search(r"\+=|max=|=", lines[n])]
    if not stmts:
        return _tok_insert(rng, text)
    n = rng.choice(stmts)
    depth = rng.choice((50, 300, 3000))
    lhs, sep, rhs = re.split(r"(\+=|max=|=)", lines[n], maxsplit=1)
    if rng.random() < 0.5:
        rhs = " " + "(" * depth + rhs.strip().strip('"') + ")" * depth
    else:
        rhs = " " + " + ".join([rhs.strip().strip('"')] * depth)
    lines[n] = lhs + sep + rhs
    return "\n".join(lines)


def _many_statements(rng, text):
    lines = text.split("\n")
    n = rng.choice(_statement_lines(text) or [len(lines) - 1])
    lines[n : n + 1] = [lines[n]] * rng.choice((100, 2000, 20000))
    return "\n".join(lines)


def _huge_loop(rng, text):
    extent = rng.choice(
        ("4611686018427387904", "9223372036854775807", "1000000000", "100000", "0", "-3")
    )
    if "loops:" in text:
        return re.sub(r"loops: \{(\w+): \d+\}", rf"loops: {{\1: {extent}}}", text)
    return text.replace("statements:", f"loops: {{t: {extent}}}\nstatements:", 1)


def _control_char(rng, text):
    i = rng.randrange(len(text) + 1)
    return text[:i] + rng.choice(CONTROL) + text[i:]


def _line_edit(rng, text):
    lines = text.split("\n")
    a, b = rng.randrange(len(lines)), rng.randrange(len(lines))
    op = rng.randrange(3)
    if op == 0:
        del lines[a]
    elif op == 1:
        lines.insert(a, lines[b])
    else:
        lines[a], lines[b] = lines[b], lines[a]
    return "\n".join(lines)


def _where_clause(rng, text):
    lines = text.split("\n")
    if not _statement_lines(text):
        return _tok_insert(rng, text)
    n = rng.choice(_statement_lines(text))
    var = rng.choice(re.findall(r"\b([a-z])\b", lines[n]) or ["i"])
    lo, hi = rng.randrange(-2, 4), rng.randrange(0, 40)
    stmt = lines[n][4:].strip().strip('"')
    lines[n] = f'  - {{stmt: "{stmt}", where: "{lo} <= {var} < {hi}"}}'
    return "\n".join(lines)


def _billion_laughs(rng, text):
    head = "x0: &a0 [1, 1, 1, 1, 1, 1, 1, 1, 1, 1]\n"
    for n in range(1, 9):
        head += f"x{n}: &a{n} [" + ", ".join([f"*a{n - 1}"] * 10) + "]\n"
    return head + text


TEXT_MUTATORS = {
    "tok-insert": _tok_insert,
    "tok-delete": _tok_delete,
    "tok-replace": _tok_replace,
    "char": _char_edit,
    "huge-number": _huge_number,
    "yaml-tag": _yaml_tag,
    "deep-nesting": _deep_nesting,
    "deep-expression": _deep_expression,
    "many-statements": _many_statements,
    "huge-loop": _huge_loop,
    "control-char": _control_char,
    "line": _line_edit,
    "where": _where_clause,
    "billion-laughs": _billion_laughs,
}
BYTE_MUTATORS = ("non-utf8",)


def mutate_opyaml(
    rng: random.Random, text: str, kinds: frozenset[str] | None
) -> tuple[bytes, tuple[str, ...]]:
    applied = []
    names = [n for n in (*TEXT_MUTATORS, *BYTE_MUTATORS) if kinds is None or n in kinds]
    data = None
    for _ in range(rng.choice((1, 1, 1, 2, 3))):
        name = rng.choice(names)
        applied.append(name)
        if name == "non-utf8":
            raw = text.encode()
            i = rng.randrange(len(raw) + 1)
            data = raw[:i] + rng.choice(NON_UTF8) + raw[i:]
            break
        text = TEXT_MUTATORS[name](rng, text)
    return (data if data is not None else text.encode("utf-8", "surrogatepass")), tuple(applied)


def opyaml_case(rng: random.Random, kinds: frozenset[str] | None = None) -> Case:
    _, text = base_text(rng, example_texts())
    data, applied = mutate_opyaml(rng, text, kinds)
    extra = rng.choice(
        ((), (), ("--target", "tiny"), ("--schedule", "auto"), ("--schedule", "default"))
    )
    if rng.random() < 0.25:
        argv = ("emit", "{d}/in/op.yaml", "-o", "{d}/out/op.tgb", *extra)
    else:
        argv = ("check", "{d}/in/op.yaml", *extra)
    return Case("opyaml", applied, argv, (("in/op.yaml", data), ("out", "dir")))


# --- schedule files ----------------------------------------------------------------------------


def _names(text: str) -> tuple[list[str], list[str]]:
    """(loop names, tensor names) of an example op.yaml, by pattern (good enough to mutate with)."""
    tensors = re.findall(r"^  (\w+):", text, re.M)
    loops = sorted(set(re.findall(r"[\[,] *([a-z])\b", text)))
    n_stmts = len(_statement_lines(text))
    return loops + [f"S{s}.{v}" for s in range(n_stmts) for v in loops], tensors


CALLS = (
    "s.split(s.loop({L}), {F})",
    "s.reorder(s.loop({L}), s.loop({L2}))",
    "s.tile(s.loop({L}), s.loop({L2}), {F}, {F2})",
    "s.skew(s.loop({L}), s.loop({L2}), {F})",
    "s.fuse(s.loop({L}), s.loop({L2}))",
    "s.distribute(s.loop({L}), 'S0')",
    "s.unroll(s.loop({L}), {F})",
    "s.unroll(s.loop({L}))",
    "s.vectorize(s.loop({L}))",
    "s.tensorize(s.loop({L}), s.loop({L2}), s.loop({L3}))",
    "s.stage({T}, s.loop({L}))",
    "s.stage({T}, None, {M})",
    "s.stage({T}, s.loop({L}), {M})",
    "s.double_buffer({T})",
    "s.loops('S0')",
    "s.staged_box({T}, {L})",
    "s.check()",
    "s.reorder(s.loop({L}))",
    "s.tensorize(s.loop({L}), s.loop({L2}), (s.loop({L3}),))",
)
FACTORS = (
    "0",
    "-1",
    "1",
    "2",
    "3",
    "7",
    "16",
    "1000000",
    "2**31",
    "2**63",
    "3.5",
    "'16'",
    "None",
    "True",
    "s",
    "s.loop('i')",
    "[16]",
)
BAD_NAMES = (
    "'zz'",
    "''",
    "'" + "i" * 300 + "'",
    "'S9.i'",
    "'i.o'",
    "'io'",
    "'k_o'",
    "None",
    "16",
    "'S0'",
)
MEMORIES = ("'spad'", "'acc'", "'dram'", "'l2'", "''", "None", "3")
HOSTILE = (
    "raise SystemExit(0)",
    "raise SystemExit(3)",
    "1 / 0",
    "s.nonexistent()",
    "return 5",
    "print('x' * 100)",
    "s.loop()",
    "s.split()",
)


def _fill(rng, template: str, loops: list[str], tensors: list[str]) -> str:
    def name() -> str:
        return rng.choice(BAD_NAMES) if rng.random() < 0.2 else repr(rng.choice(loops))

    return template.format(
        L=name(),
        L2=name(),
        L3=name(),
        F=rng.choice(FACTORS[:12]),
        F2=rng.choice(FACTORS[:12]),
        M=rng.choice(MEMORIES),
        T=repr(rng.choice(tensors + ["Q"])) if tensors else "'A'",
    )


def mutate_schedule(
    rng: random.Random, text: str, optext: str, kinds: frozenset[str] | None
) -> tuple[str, tuple[str, ...]]:
    loops, tensors = _names(optext)
    head, sep, body = text.partition("def schedule(s):\n")
    lines = [ln for ln in body.split("\n") if ln.strip()] or ["    pass"]
    applied = []
    table = {
        "loop-name": 1,
        "factor": 1,
        "arg-type": 1,
        "reorder-calls": 1,
        "delete-call": 1,
        "duplicate-call": 1,
        "insert-call": 1,
        "hostile": 1,
        "endless-loop": 0.1,
    }
    for _ in range(rng.choice((1, 1, 2, 3))):
        name = pick(rng, table, kinds)
        applied.append(name)
        n = rng.randrange(len(lines))
        if name == "loop-name":
            lines[n] = re.sub(
                r"s\.loop\((f?\"[^\"]*\"|f?'[^']*')\)",
                lambda m: f"s.loop({rng.choice(BAD_NAMES + tuple(map(repr, loops)))})",
                lines[n],
            )
        elif name == "factor":
            lines[n] = re.sub(r"\b\d+\b", lambda m: rng.choice(FACTORS), lines[n], count=1)
        elif name == "arg-type":
            lines[n] = re.sub(
                r"s\.loop\([^()]*\)",
                lambda m: rng.choice(("16", "'i'", "None", "s", "(1, 2)")),
                lines[n],
                count=1,
            )
        elif name == "reorder-calls":
            m = rng.randrange(len(lines))
            lines[n], lines[m] = lines[m], lines[n]
        elif name == "delete-call" and len(lines) > 1:
            del lines[n]
        elif name == "duplicate-call":
            lines.insert(n, lines[n])
        elif name == "insert-call":
            lines.insert(n, "    " + _fill(rng, rng.choice(CALLS), loops, tensors))
        elif name == "hostile":
            lines.insert(n, "    " + rng.choice(HOSTILE))
        elif name == "endless-loop":  # the schedule file's time limit must end it
            lines.insert(n, "    while True: pass")
    return head + sep + "\n".join(lines) + "\n", tuple(applied)


@cache
def schedule_pairs() -> tuple[tuple[str, str, str], ...]:
    return tuple(
        (p.stem, (EXAMPLES / f"{p.stem}.yaml").read_text(), p.read_text())
        for p in sorted(SCHEDULES.glob("*.py"))
        if (EXAMPLES / f"{p.stem}.yaml").exists()
    )


def schedule_case(rng: random.Random, kinds: frozenset[str] | None = None) -> Case:
    _, optext, text = rng.choice(schedule_pairs())
    optext = optext if rng.random() < FULL_SIZE else small(optext)  # every schedule fits both
    mutated, applied = mutate_schedule(rng, text, optext, kinds)
    extra = rng.choice(((), (), ("--target", "tiny")))
    # a short time limit: an endless schedule is a one-line refusal in 3 s, well inside the
    # harness's own limit, which still counts a case that really hangs as a hang
    argv = ("check", "{d}/in/op.yaml", "--schedule", "{d}/in/sched.py", *extra, *SCHEDULE_LIMIT)
    return Case(
        "schedule",
        applied,
        argv,
        (("in/op.yaml", optext.encode()), ("in/sched.py", mutated.encode())),
    )
