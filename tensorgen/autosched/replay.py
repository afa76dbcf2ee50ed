"""Layers of the same structure scheduled once: a key, and the schedule replayed onto a new layer.

ResNet-18 repeats its blocks: two layers whose statements, shapes and tensors are the same and
whose constants (requantization scales, zero points, clamp bounds) differ get the same schedule
from the search, since the search reads no constant's value -- only what the instruction
selection makes of the statements, their vector profile, which is part of the key. The key is
the program with every constant in a statement's right-hand side abstracted (its type kept),
a tensor's padding value dropped too (only the lowering's tensor entries read it, from the
program compiled), its name dropped, and the target's identity. A hit replays the cached
schedule's trace onto the new program through the primitives (the memory primitives check the
capacities) and checks its legality against the new program's dependences; the lowering then
checks what it emits. A replay that fails is a miss: only slower, never wrong.
"""

from __future__ import annotations

from tensorgen.codegen.scheduled import vector_profile
from tensorgen.errors import TensorgenError
from tensorgen.ir.core import BinOp, Call, Const, Expr, Program, Read
from tensorgen.schedule.api import Schedule
from tensorgen.schedule.steps import Step, apply
from tensorgen.target import Target

__all__ = ["replay_schedule", "structure_key"]


def _abstract(expr: Expr):
    """`expr` with each constant replaced by its type's name."""
    if isinstance(expr, Const):
        return ("const", type(expr.value).__name__)
    if isinstance(expr, Read):
        return expr
    if isinstance(expr, Call):
        return ("call", expr.fn, tuple(_abstract(a) for a in expr.args))
    if isinstance(expr, BinOp):
        return ("binop", expr.op, _abstract(expr.lhs), _abstract(expr.rhs))
    return ("other", str(expr))


def _profile(program: Program, stmt) -> tuple[int, int] | str:
    try:
        return vector_profile(program, stmt)
    except TensorgenError as err:  # a statement the vector unit does not take: its reason
        return type(err).__name__


def structure_key(program: Program, target: Target) -> tuple:
    """What the schedule search of `program` depends on: equal keys, equal schedules."""
    statements = tuple(
        (s.name, s.lhs, s.op, _abstract(s.rhs), s.indices, s.bounds, s.where, _profile(program, s))
        for s in program.statements
    )
    return (
        target.name,
        target.hash,
        tuple((t.name, t.shape, t.dtype, t.role) for t in program.tensors),
        program.shared_loops,
        program.schedule,
        statements,
    )


def replay_schedule(program: Program, target: Target, trace: tuple[Step, ...]) -> Schedule:
    """The schedule `trace` builds on `program`, checked against its dependences once at the
    end, as the search checks the schedules it builds (Space.schedule), and against the
    capacities by each memory primitive."""
    s = Schedule(program, target, checked=False)
    for step in trace:
        apply(s, step)
    s.check()
    return s
