"""One exception family for everything a user can get wrong.

Every error carries a one-line message a user can act on (``str(err)``) and,
where useful, a longer ``detail`` (the IR, the counterexample) underneath.
"""

from __future__ import annotations


class TensorgenError(Exception):
    """Base of all errors tensorgen reports to users (CLI exit code 2)."""

    def __init__(self, message: str, detail: str = "") -> None:
        super().__init__(message)
        self.detail = detail


class SpecError(TensorgenError):
    """A malformed or inconsistent op.yaml."""


class IRError(TensorgenError):
    """A malformed program (tensorgen.ir.verify), whichever front end built it."""


class TargetError(TensorgenError):
    """A malformed target description (tensorgen/target/isa/*.yaml)."""


class ScheduleError(TensorgenError):
    """An illegal or impossible schedule step."""


class CapacityError(ScheduleError):
    """A staged footprint does not fit the memory it is assigned to."""


class CodegenError(TensorgenError):
    """A program that the code generator cannot lower (yet)."""


class BinaryError(TensorgenError):
    """A truncated, corrupt or foreign .tgb file, or bad assembly text."""


class SimulatorError(TensorgenError):
    """A fault while running microcode: out-of-bounds access, hazard, token underflow."""
