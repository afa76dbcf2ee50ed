"""Operands of microcode: affine addresses over hardware-loop counters, views, boxes.

An address or a coordinate is `const + sum(coef[l] * L_l)`, where `L_l` is the
counter of the l-th enclosing hardware loop (outermost first). Keeping operands
affine in the counters is what lets the simulator run whole loops with numpy.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

MAX_LOOP_DEPTH = 8
MAX_RANK = 6
MEMORIES = ("spad", "acc")
DTYPE_CODES = {"int8": 0, "uint8": 1, "int32": 2, "float32": 3}
DTYPE_NAMES = {v: k for k, v in DTYPE_CODES.items()}
ITEMSIZE = {"int8": 1, "uint8": 1, "int32": 4, "float32": 4}


@dataclass(frozen=True)
class LoopAffine:
    const: int = 0
    coefs: tuple[int, ...] = ()  # coefs[l] multiplies the counter of loop level l

    @staticmethod
    def make(const: int, coefs: dict[int, int] | tuple[int, ...] = ()) -> LoopAffine:
        if isinstance(coefs, dict):
            n = max(coefs, default=-1) + 1
            coefs = tuple(coefs.get(i, 0) for i in range(n))
        coefs = tuple(int(c) for c in coefs)
        while coefs and coefs[-1] == 0:
            coefs = coefs[:-1]
        return LoopAffine(int(const), coefs)

    def __add__(self, other: LoopAffine | int) -> LoopAffine:
        if isinstance(other, int):
            return LoopAffine(self.const + other, self.coefs)
        n = max(len(self.coefs), len(other.coefs))
        a = self.coefs + (0,) * (n - len(self.coefs))
        b = other.coefs + (0,) * (n - len(other.coefs))
        return LoopAffine.make(
            self.const + other.const, tuple(x + y for x, y in zip(a, b, strict=False))
        )

    def scale(self, k: int) -> LoopAffine:
        return LoopAffine.make(self.const * k, tuple(c * k for c in self.coefs))

    def eval(self, counters: tuple[int, ...]) -> int:
        return self.const + sum(c * counters[i] for i, c in enumerate(self.coefs) if c)

    def __str__(self) -> str:
        parts = [str(self.const)] if self.const or not any(self.coefs) else []
        for level, c in enumerate(self.coefs):
            if c:
                term = f"L{level}" if c == 1 else f"-L{level}" if c == -1 else f"{c}*L{level}"
                parts.append(term if not parts or term.startswith("-") else "+" + term)
        return "".join(parts) or "0"

    _TERM = re.compile(r"([+-]?)(\d*)\*?(L(\d+))?")

    @staticmethod
    def parse(text: str) -> LoopAffine:
        const, coefs = 0, {}
        pos = 0
        if not text:
            raise ValueError("empty affine expression")
        while pos < len(text):
            m = LoopAffine._TERM.match(text, pos)
            if not m or m.end() == pos:
                raise ValueError(f"bad affine expression '{text}'")
            sign = -1 if m.group(1) == "-" else 1
            if m.group(3):
                coefs[int(m.group(4))] = coefs.get(int(m.group(4)), 0) + sign * int(m.group(2) or 1)
            elif m.group(2):
                const += sign * int(m.group(2))
            else:
                raise ValueError(f"bad affine expression '{text}'")
            pos = m.end()
        return LoopAffine.make(const, coefs)


@dataclass(frozen=True)
class View:
    """A strided n-d window of an on-chip memory; strides and base are in elements and bytes."""

    mem: str
    dtype: str
    base: LoopAffine  # byte address
    shape: tuple[int, ...]
    strides: tuple[int, ...]  # in elements

    def __str__(self) -> str:
        shape = "x".join(map(str, self.shape))
        return f"{self.mem}:{self.dtype}@{self.base}[{shape}:{','.join(map(str, self.strides))}]"

    @property
    def size(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n

    @property
    def nbytes(self) -> int:
        return self.size * ITEMSIZE[self.dtype]

    _RE = re.compile(r"^(\w+):(\w+)@([^\[]+)\[([\dx]+):([-\d,]+)\]$")

    @staticmethod
    def parse(text: str) -> View:
        m = View._RE.match(text)
        if not m or m.group(1) not in MEMORIES or m.group(2) not in DTYPE_CODES:
            raise ValueError(f"bad view '{text}' (expected like spad:int8@0+16*L1[4x4:4,1])")
        shape = tuple(int(x) for x in m.group(4).split("x"))
        strides = tuple(int(x) for x in m.group(5).split(","))
        if len(shape) != len(strides):
            raise ValueError(f"bad view '{text}': shape and strides differ in rank")
        return View(m.group(1), m.group(2), LoopAffine.parse(m.group(3)), shape, strides)


@dataclass(frozen=True)
class Box:
    """A box of a DRAM tensor: origin coordinates (affine) and sizes, in elements."""

    tensor: int  # index into the binary's tensor table
    origin: tuple[LoopAffine, ...]
    shape: tuple[int, ...]

    def text(self, names: list[str]) -> str:
        shape = "x".join(map(str, self.shape))
        return f"{names[self.tensor]}({','.join(map(str, self.origin))})[{shape}]"

    @property
    def size(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n

    _RE = re.compile(r"^(\w+)\(([^)]*)\)\[([\dx]+)\]$")

    @staticmethod
    def parse(text: str, names: list[str]) -> Box:
        m = Box._RE.match(text)
        if not m or m.group(1) not in names:
            raise ValueError(
                f"bad box '{text}' (expected like X(0,L1,-1+L2)[1x4x3] over a declared tensor)"
            )
        origin = tuple(LoopAffine.parse(x) for x in m.group(2).split(","))
        shape = tuple(int(x) for x in m.group(3).split("x"))
        if len(origin) != len(shape):
            raise ValueError(f"bad box '{text}': origin and shape differ in rank")
        return Box(names.index(m.group(1)), origin, shape)


@dataclass(frozen=True)
class Bound:
    """Terms floor(affine / divisor) over loop iterators, combined by the instruction that uses
    them: the max for a lower loop bound, the min for an upper one, all >= 0 for a condition."""

    terms: tuple[tuple[LoopAffine, int], ...]

    def values(self, counters: tuple[int, ...]) -> list[int]:
        return [a.eval(counters) // d for a, d in self.terms]

    def __str__(self) -> str:
        return "B(" + ";".join(f"{a}/{d}" for a, d in self.terms) + ")"

    @staticmethod
    def parse(text: str) -> Bound:
        if not (text.startswith("B(") and text.endswith(")")) or len(text) < 4:
            raise ValueError(f"bad bound '{text}' (expected like B(L0+1/1;7/1))")
        terms = []
        for part in text[2:-1].split(";"):
            num, _, den = part.rpartition("/")
            if int(den) <= 0:
                raise ValueError(f"bad bound '{text}': divisors must be positive")
            terms.append((LoopAffine.parse(num), int(den)))
        return Bound(tuple(terms))
