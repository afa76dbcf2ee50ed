"""The IR verifier: a well-formed program, whoever built it (the op.yaml loader, the PyTorch
frontend, a test), before any pass reads it.

`verify_program` checks names (unique, and names isl reads as names), tensors (shapes,
dtypes, roles, pad values), shared loops, every statement's indices and bounds, its
expression (known functions and operators, their arity, constants where constants belong),
and its writes and reads: every access names a tensor of its rank and only the statement's
own indices, every write lies inside its tensor (isl: the access relation's range against the
tensor's box; reads may leave it, they read the pad value), nothing writes an input, and
everything read is an input or written by some statement. A failure is an IRError naming the
statement and what is wrong, on one line.
"""

from __future__ import annotations

import math

import islpy as isl

from tensorgen.errors import IRError
from tensorgen.ir import poly
from tensorgen.ir.core import (
    BINOPS,
    CONST_ARGS,
    DTYPES,
    FUNCTIONS,
    ROLES,
    TENSOR_ARGS,
    TENSOR_READS,
    TWO_OPERANDS,
    Access,
    BinOp,
    Call,
    Const,
    Expr,
    Program,
    Read,
    Statement,
    Tensor,
    dtype_range,
)

OPS = ("=", "+=", "max=")


def verify_program(program: Program) -> Program:
    """Refuse (IRError, one line) a malformed `program`; returns it unchanged."""
    where = f"program {program.name}"
    _unique([t.name for t in program.tensors], f"{where}: tensor")
    _unique([s.name for s in program.statements], f"{where}: statement")
    _unique([n for n, _ in program.shared_loops], f"{where}: shared loop")
    for t in program.tensors:
        _check_tensor(where, t)
    for name, extent in program.shared_loops:
        _check_name(f"{where}: shared loop", name)
        if not (isinstance(extent, int) and extent >= 1):
            raise IRError(f"{where}: shared loop {name} has extent {extent!r}")
    if not program.statements:
        raise IRError(f"{where}: no statements")
    tensors = {t.name: t for t in program.tensors}
    for stmt in program.statements:
        _check_statement(program, tensors, stmt)
    _check_dataflow(program)
    return program


def _unique(names: list[str], what: str) -> None:
    seen = set()
    for n in names:
        if n in seen:
            raise IRError(f"{what} {n} is declared twice")
        seen.add(n)


def _check_name(what: str, name: str) -> None:
    if not (isinstance(name, str) and name.isascii() and name.isidentifier()):
        raise IRError(f"{what} {name!r} is not an identifier")
    if not poly.isl_name_ok(name):
        raise IRError(f"{what} {name!r} is a word isl reserves")


def _check_tensor(where: str, t: Tensor) -> None:
    _check_name(f"{where}: tensor", t.name)
    if t.dtype not in DTYPES:
        raise IRError(f"{where}: tensor {t.name} has dtype {t.dtype!r} (expected {list(DTYPES)})")
    if t.role not in ROLES:
        raise IRError(f"{where}: tensor {t.name} has role {t.role!r} (expected {list(ROLES)})")
    if not all(isinstance(n, int) and n >= 1 for n in t.shape):
        raise IRError(f"{where}: tensor {t.name} has shape {list(t.shape)} (extents >= 1)")
    lo, hi = dtype_range(t.dtype)  # (0, 0) for float32: its pad is 0.0
    if not (isinstance(t.pad, int | float) and lo <= t.pad <= hi):
        raise IRError(f"{where}: tensor {t.name}: pad value {t.pad!r} does not fit {t.dtype}")


def _check_statement(program: Program, tensors: dict[str, Tensor], stmt: Statement) -> None:
    at = f"statement {stmt.name}" + (f" ({stmt.location})" if stmt.location else "")
    _check_name("statement", stmt.name)
    _unique(list(stmt.indices), f"{at}: index")
    for i in stmt.indices:
        _check_name(f"{at}: index", i)
    if stmt.op not in OPS:
        raise IRError(f"{at}: operator {stmt.op!r} (expected one of {', '.join(OPS)})")
    if len(stmt.bounds) != len(stmt.indices) or any(lo > hi for lo, hi in stmt.bounds):
        raise IRError(f"{at}: bounds {list(stmt.bounds)} for indices {list(stmt.indices)}")
    shared = program.shared_names
    if stmt.indices[: len(shared)] != shared:
        raise IRError(f"{at}: indices {list(stmt.indices)} do not begin with the shared loops")
    for (name, extent), (lo, hi) in zip(program.shared_loops, stmt.bounds, strict=False):
        if lo < 0 or hi >= extent:
            raise IRError(f"{at}: shared loop {name} runs {lo}..{hi}, outside 0..{extent - 1}")
    for acc in [stmt.lhs, *stmt.reads]:
        _check_access(at, tensors, stmt, acc)
    _check_expr(at, stmt.rhs)
    if tensors[stmt.lhs.tensor].role == "input":
        raise IRError(f"{at}: writes {stmt.lhs.tensor}, an input")
    try:
        dom = poly.domain(stmt)
        written = poly.access_map(stmt, stmt.lhs).range()
    except isl.Error:
        raise IRError(f"{at}: isl cannot read its domain (where: {stmt.where!r})") from None
    if dom.is_empty():
        raise IRError(f"{at}: its domain is empty")
    outside = written.subtract(poly.tensor_box(tensors[stmt.lhs.tensor]))
    if not outside.is_empty():
        raise IRError(
            f"{at}: writes {stmt.lhs} outside {stmt.lhs.tensor}'s shape "
            f"{list(tensors[stmt.lhs.tensor].shape)} (at {outside.sample_point()})"
        )


def _check_access(at: str, tensors: dict[str, Tensor], stmt: Statement, acc: Access) -> None:
    t = tensors.get(acc.tensor)
    if t is None:
        raise IRError(f"{at}: {acc} names no tensor")
    if len(acc.index) != len(t.shape):
        raise IRError(f"{at}: {acc} has {len(acc.index)} subscripts, {t.name} rank {len(t.shape)}")
    for sub in acc.index:
        unknown = [n for n in sub.names if n not in stmt.indices]
        if unknown:
            raise IRError(f"{at}: {acc} uses {unknown[0]}, not an index of the statement")
        if any(not isinstance(c, int) or c == 0 for _, c in sub.terms):
            raise IRError(f"{at}: {acc} has a zero or non-integer coefficient")


def _check_expr(at: str, e: Expr) -> None:
    if isinstance(e, Read):
        return
    if isinstance(e, Const):
        if isinstance(e.value, bool) or not isinstance(e.value, int | float):
            raise IRError(f"{at}: constant {e.value!r} is not a number")
        if isinstance(e.value, float) and not math.isfinite(e.value):
            raise IRError(f"{at}: constant {e.value!r} is not finite")
        return
    if isinstance(e, BinOp):
        if e.op not in BINOPS:
            raise IRError(f"{at}: operator {e.op!r} (expected one of {sorted(BINOPS)})")
        _check_expr(at, e.lhs)
        _check_expr(at, e.rhs)
        return
    if not isinstance(e, Call):
        raise IRError(f"{at}: {e!r} is not an expression")
    if FUNCTIONS.get(e.fn) != len(e.args):
        raise IRError(f"{at}: {e.fn}() with {len(e.args)} argument(s) is not a known function")
    first = (
        1 if e.fn in CONST_ARGS else 2 if e.fn in TWO_OPERANDS else 1 + TENSOR_READS.get(e.fn, 0)
    )
    consts = e.args[first:]
    if (e.fn in CONST_ARGS or e.fn in TWO_OPERANDS or e.fn in TENSOR_ARGS) and not all(
        isinstance(a, Const) for a in consts
    ):
        raise IRError(f"{at}: {e.fn}() needs constants in place of {', '.join(map(str, consts))}")
    for a in e.args:
        _check_expr(at, a)


def _check_dataflow(program: Program) -> None:
    """Every tensor read holds something: an input, or written by some statement; every output
    is written."""
    written = {s.lhs.tensor for s in program.statements}
    for stmt in program.statements:
        for acc in stmt.reads:
            t = program.tensor(acc.tensor)
            if t.role not in ("input", "inout") and t.name not in written:
                raise IRError(f"statement {stmt.name}: reads {t.name}, which nothing writes")
    for t in program.tensors:
        if t.role == "output" and t.name not in written:
            raise IRError(f"program {program.name}: output {t.name} is never written")
