"""Imports run one way: the layering of tensorgen, checked on the source (AST, so that
function-level imports count too).

Every package of tensorgen/ (and every top-level module, a package of its own) has a rank;
a module may import only what ranks strictly lower, or its own package. From the bottom:

  0 errors      1 inputs      2 target (the machine description, read by both sides)
  3 mc          the machine: ISA, binary format, its arithmetic and verifier
  4 sim         the simulator: runs what mc describes
  5 ir          the program everything reads
  6 reference   evaluates the IR with torch (extra rule below)
  6 spec, poly  the op.yaml loader; dependences, footprints, legality over the IR
  7 frontend    PyTorch models -> op.yaml programs (spec, ir, mc's numerics)
  7 schedule    the schedule representation and its choosers
  9 codegen     lowers a schedule to mc
  10 autosched  an auto-scheduler that needs lowering facts lives above codegen (issue 12)
  11 driver     the pipeline: load, verify, schedule, lower, simulate, compare
  12 model      whole models: per-layer compiles linked into one binary
  13 analysis   sweeps, reports, plots over compiles
  14 cli        the command line
  15 testing    fuzzers, which drive the CLI and the driver

This is the issue's order frontend/spec -> ir -> poly -> schedule -> (auto-scheduler) ->
codegen -> mc read as a stack: later passes import earlier ones' products, with ir (the data
every pass reads) and mc (what codegen writes) at the bottom. Besides the ranks:

- `sim` and `mc` never import the compiler (spec, ir, poly, schedule, codegen, frontend),
  implied by the ranks and stated on its own so the message says why;
- `reference` imports only the program it evaluates (`tensorgen.ir.core`, its data classes)
  , `tensorgen.errors` and `tensorgen.inputs` (the limits on how much work an input may ask
  for): neither sim, mc nor the compiler's logic, so that it shares no code
  with what it checks;
- `codegen` lowers the schedule it is given: of schedule/ it imports the representation and
  the facts shared with the search (`schedule.api` and its parts, `schedule.compaction`),
  never a module that chooses a schedule (`SCHEDULE_CHOOSERS`);
- no private name (`_x`) crosses a package: neither `from tensorgen.a import _x` from another
  package, nor `obj._x` on an attribute only another package defines.

A package not in `RANKS` fails: place it. `KNOWN` lists today's violations in files other
helpers are rewriting; it must only shrink (a listed edge that is gone fails too).
"""

from __future__ import annotations

import ast
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "tensorgen"

RANKS = {
    "errors": 0,
    "inputs": 1,
    "outputs": 1,
    "target": 2,
    "mc": 3,
    "sim": 4,
    "ir": 5,
    "reference": 6,
    "spec": 6,
    "poly": 6,
    "frontend": 7,
    "schedule": 7,
    "codegen": 9,
    "autosched": 10,
    "driver": 11,
    "fusion": 11,  # which layers could be fused: reads the frontend's graph and the target
    "model": 12,
    "analysis": 13,
    "cli": 14,
    "testing": 15,
    "__init__": 0,  # tensorgen/__init__.py imports nothing of tensorgen
}
COMPILER = {"spec", "ir", "poly", "schedule", "codegen", "frontend", "autosched"}
REFERENCE_MAY_IMPORT = {"tensorgen.ir.core", "tensorgen.errors", "tensorgen.inputs"}
# the modules of schedule/ that choose a schedule (the lowering takes one, it never picks one)
SCHEDULE_CHOOSERS = {
    f"tensorgen.schedule.{m}" for m in ("default", "auto", "files", "cost", "layer", "fold")
}

# Today's violations, each in a file another helper is rewriting this session; the lead empties
# this list at merge. (importer, imported or "attr:<name>", why it is still here)
KNOWN = {
    # the reference enumerates `where:` domains with the compiler's isl code (fuzz2 rewrites it)
    ("tensorgen.reference.torch_ref", "tensorgen.ir.poly"),
}


def _module_name(root: Path, path: Path) -> str:
    parts = path.relative_to(root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def package_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _is_module(root: Path, dotted: str) -> bool:
    path = root.parent.joinpath(*dotted.split("."))
    return path.is_dir() or path.with_suffix(".py").is_file()


def _imports(
    root: Path, tree: ast.AST, module: str, is_package: bool
) -> list[tuple[int, str, list[str]]]:
    """(line, imported module, imported names) of every tensorgen import, wherever it sits."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [
                (node.lineno, a.name, []) for a in node.names if a.name.startswith("tensorgen")
            ]
        elif isinstance(node, ast.ImportFrom):
            target = node.module or ""
            if node.level:  # relative: resolve against this module's package
                base = module.split(".")[: len(module.split(".")) - node.level + is_package]
                target = ".".join(base + ([node.module] if node.module else []))
            if target.startswith("tensorgen"):
                names = [a.name for a in node.names]
                # `from tensorgen.mc import isa` imports the module tensorgen.mc.isa
                subs = [n for n in names if _is_module(root, f"{target}.{n}")]
                found += [(node.lineno, f"{target}.{n}", []) for n in subs]
                rest = [n for n in names if n not in subs]
                if rest or not subs:
                    found.append((node.lineno, target, rest))
    return found


def _private_defs(tree: ast.AST) -> set[str]:
    """Private names a module defines: functions, classes, and attributes it sets on self/cls."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            names.add(node.attr)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return {n for n in names if n.startswith("_") and not n.startswith("__")}


def _private_uses(tree: ast.AST) -> list[tuple[int, str]]:
    return [
        (node.lineno, node.attr)
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and node.attr.startswith("_")
        and not node.attr.startswith("__")
        and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))
    ]


def _edge_problem(module: str, target: str, names: list[str]) -> str | None:
    src, dst = package_of(module), package_of(target)
    if src == dst:
        return None
    if dst not in RANKS:
        return f"package '{dst}' has no layer: place it in RANKS"
    if src in ("sim", "mc") and dst in COMPILER:
        return f"{src} never imports the compiler"
    if src == "reference" and target not in REFERENCE_MAY_IMPORT:
        return (
            "the reference imports only the IR's data classes (ir.core), errors and inputs' limits"
        )
    if src == "codegen" and target in SCHEDULE_CHOOSERS:
        return "codegen lowers the schedule it is given; it never imports a schedule chooser"
    if RANKS[dst] >= RANKS[src]:
        return f"back edge: {src} (rank {RANKS[src]}) imports {dst} (rank {RANKS[dst]})"
    return None


def layering_violations(root: Path = ROOT) -> dict[tuple[str, str], str]:
    """{(importer, imported module / module.private name / "attr:_x"): "file:line: why"}."""
    trees = {}
    for path in sorted(root.rglob("*.py")):
        trees[_module_name(root, path)] = (path, ast.parse(path.read_text(), str(path)))
    defined: dict[str, set[str]] = {}
    for module, (_, tree) in trees.items():
        defined.setdefault(package_of(module), set()).update(_private_defs(tree))
    found: dict[tuple[str, str], str] = {}
    for module, (path, tree) in trees.items():
        src = package_of(module)
        where = f"{path.relative_to(root.parent)}"
        if src not in RANKS:
            found[(module, "<rank>")] = (
                f"{where}:1: package '{src}' has no layer: place it in RANKS"
            )
        for line, target, names in _imports(root, tree, module, path.name == "__init__.py"):
            problem = _edge_problem(module, target, names)
            if problem:
                found.setdefault((module, target), f"{where}:{line}: imports {target}: {problem}")
            if package_of(target) != src:
                for n in names:
                    if n.startswith("_") and not n.startswith("__"):
                        found.setdefault(
                            (module, f"{target}.{n}"),
                            f"{where}:{line}: imports the private name {n} of {target}",
                        )
        own = defined.get(src, set())
        others = set().union(*(v for k, v in defined.items() if k != src))
        for line, attr in _private_uses(tree):
            if attr in others and attr not in own:
                found.setdefault(
                    (module, f"attr:{attr}"),
                    f"{where}:{line}: uses .{attr}, private to another package",
                )
    return found


def test_imports_follow_the_layers():
    found = layering_violations()
    new = {k: v for k, v in found.items() if k not in KNOWN}
    assert not new, "layering violations:\n" + "\n".join(sorted(new.values()))


def test_known_violations_still_exist():
    """KNOWN only shrinks: an entry whose violation is gone must leave the list."""
    gone = KNOWN - set(layering_violations())
    assert not gone, f"fixed, remove from KNOWN: {sorted(gone)}"


@pytest.mark.parametrize(
    "file, line, why",
    [
        (
            "mc/isa.py",
            "from tensorgen.codegen.emitter import Emitter",
            "mc never imports the compiler",
        ),
        (
            "sim/arrays.py",
            "from tensorgen.driver import compile_file",
            "back edge: sim (rank 4) imports driver",
        ),
        (
            "sim/machine.py",
            "from tensorgen.mc.binary import _HEADER",
            "imports the private name _HEADER of tensorgen.mc.binary",
        ),
        ("reference/torch_ref.py", "from tensorgen.mc import arith", "the reference imports only"),
    ],
)
def test_one_added_import_fails(tmp_path, file, line, why):
    """The checker itself: a copy of the tree with one function-level import added is refused."""
    copy = tmp_path / "tensorgen"
    shutil.copytree(ROOT, copy, ignore=shutil.ignore_patterns("__pycache__"))
    path = copy / file
    path.write_text(path.read_text() + f"\n\ndef _probe():\n    {line}\n")
    new = [v for k, v in layering_violations(copy).items() if k not in KNOWN]
    assert len(new) == 1 and why in new[0], new
