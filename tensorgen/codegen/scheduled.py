"""Lowering of a hand-written `Schedule` (any legal affine schedule) to microcode.

The loop structure is isl's AST of the schedule. Loops with constant bounds become LOOP,
others LOOPB (bounds as max/min of floor-affine terms of outer iterators), guards IF.
Statement instances run on the vector unit, one element at a time, or as whole vectors
over a `vectorize`d loop, or on the MAC array over a `tensorize`d band. Every tensor is
staged whole in the scratchpad (with its padding halo) at the start and stored at the end;
staging smaller footprints at a loop is not lowered by this backend yet.
"""

from __future__ import annotations

import islpy as isl

from tensorgen.codegen.compiled import Compiled, useful_macs
from tensorgen.codegen.emitter import Emitter
from tensorgen.codegen.lowering.bands import _BandPieces
from tensorgen.codegen.lowering.dma import _DmaGuards
from tensorgen.codegen.lowering.pipeline import _DoubleBuffering
from tensorgen.codegen.lowering.plan import _BufferPlan
from tensorgen.codegen.lowering.select import _InstructionSelection
from tensorgen.codegen.lowering.walk import _AstWalk
from tensorgen.codegen.vector import VectorExpr
from tensorgen.ir.core import Program, Statement
from tensorgen.mc.binary import Binary
from tensorgen.mc.operands import LoopAffine, View
from tensorgen.schedule.api import Schedule
from tensorgen.schedule.verify import verify_schedule
from tensorgen.target import Target


def compile_scheduled(program: Program, target: Target, schedule: Schedule) -> Compiled:
    # Every schedule is re-checked from its state alone before it is lowered, however it was
    # built (a file, the search, the primitive default): 10-20 ms on the examples.
    verify_schedule(schedule)
    low = _Lowering(program, target, schedule)
    low.emit()
    binary = Binary(target.name, target.hash, tuple(low.entries), tuple(low.em.finish()), low.dram)
    return Compiled(binary, useful_macs(program))


def vector_profile(program: Program, stmt: Statement) -> tuple[int, int]:
    """(vector instructions, int32 temporaries) that `stmt` lowers to over one block of its
    instances: what the instruction selection itself emits, so that a cost model cannot drift
    from it. Each instruction costs the vector unit's setup plus the block over its lanes."""

    class _Count:
        def __init__(self) -> None:
            self.code: list = []

        def emit(self, ins) -> None:
            self.code.append(ins)

    def view(dtype: str) -> View:
        return View("spad", dtype, LoopAffine.make(0), (1,), (1,))

    counter = _Count()
    expr = VectorExpr(
        counter,
        program,
        stmt,
        lambda acc: view(program.tensor(acc.tensor).dtype),
        lambda slot: view("int32"),
    )
    expr.statement()
    return len(counter.code), expr.next_slot


class _Lowering(
    _BufferPlan, _BandPieces, _AstWalk, _DmaGuards, _DoubleBuffering, _InstructionSelection
):
    """The lowering, its passes as mixins under tensorgen/codegen/lowering/."""

    def __init__(self, program: Program, target: Target, schedule: Schedule) -> None:
        self.program, self.target, self.schedule = program, target, schedule
        self.em = Emitter()
        self.by_name = {s.name: s for s in program.statements}
        self.piece_of: dict[str, str] = {}  # AST statement (a piece of a statement) -> statement
        self.piece_maps: dict[str, isl.Map] = {}  # AST statement -> its schedule
        self.compact: dict[
            str, tuple[int, int, int]
        ] = {}  # loaded one DMA per accessed row (row_compaction)
        self.bands = self._bands()
        self.first_writes: dict[
            str, tuple
        ] = {}  # statement -> its first writes and the rest, in uniform pieces
        self.overwriting: set[str] = (
            set()
        )  # AST statements whose `+=` overwrites (first writes, first touches)
        self._layout()
