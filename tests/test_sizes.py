"""Modules of tensorgen/ stay at most 600 lines and functions at most 60 (ast: a function from
its `def` to its last line, nested functions counted on their own), so that each can be read in
one sitting. An offender would be listed in KNOWN with why (none is today); the list may only
shrink (an entry that now fits fails too), and an entry may not grow."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "tensorgen"
MAX_MODULE, MAX_FUNCTION = 600, 60

# (path under tensorgen/, function or None for the module): the size it has today, and why.
# Empty: every module and function fits; an exception must be added here with its reason.
KNOWN: dict[tuple[str, str | None], tuple[int, str]] = {}


def sizes(root: Path = ROOT) -> dict[tuple[str, str | None], int]:
    """Every module over MAX_MODULE lines and every function over MAX_FUNCTION: its size."""
    found = {}
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        text = path.read_text()
        if len(text.splitlines()) > MAX_MODULE:
            found[(rel, None)] = len(text.splitlines())
        for node in ast.walk(ast.parse(text, rel)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION:
                    found[(rel, node.name)] = max(n, found.get((rel, node.name), 0))
    return found


def test_modules_and_functions_are_small():
    over = {k: n for k, n in sizes().items() if k not in KNOWN or n > KNOWN[k][0]}
    assert not over, "\n".join(
        f"tensorgen/{path}{':' + fn if fn else ''}: {n} lines (at most "
        f"{MAX_FUNCTION if fn else MAX_MODULE}{', known at ' + str(KNOWN[(path, fn)][0]) if (path, fn) in KNOWN else ''})"
        for (path, fn), n in sorted(over.items(), key=str)
    )


def test_known_exceptions_only_shrink():
    fits = sorted(set(KNOWN) - set(sizes()), key=str)
    assert not fits, f"these fit now, remove them from KNOWN: {fits}"
