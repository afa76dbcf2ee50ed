"""Checks of a decoded binary against the target it runs on, before anything runs.

A .tgb comes from anywhere: `decode` only proves that it is well formed. `verify_binary`
proves that running it cannot go wrong in any way but a one-line error: every tensor lies
inside the DRAM image and every constant inside the constants section, every operand's
numbers are small enough that no address computation overflows and no numpy array is made
from an impossible shape or stride, the loop structure is properly nested, the tokens name
real queues, and the program's dynamic instruction count is within `SimLimits`. The
simulator still bounds-checks every access at run time (an affine address can leave its
memory at some iteration); this is what can be known from the code alone.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from tensorgen.errors import BinaryError
from tensorgen.mc import isa
from tensorgen.mc.binary import Binary, check_target_name, check_tensor_name
from tensorgen.mc.operands import ITEMSIZE, MAX_LOOP_DEPTH, Bound, Box, LoopAffine, View

# Address arithmetic stays far inside int64 (numpy's offsets and strides) with these bounds:
# a coefficient times a loop count (u32) plus a constant is below 2**41 + 2**40.
MAX_COEF = 1 << 40
MAX_STRIDE = 1 << 32
SEQUENCER = ("LOOP", "LOOPB", "IF")
MAX_BLOCK_DEPTH = 64  # LOOPs and IFs nested: the simulator recurses once per level


@dataclass(frozen=True)
class SimLimits:
    """Upper bounds on what a binary may ask of the simulator, checked before it runs."""

    max_steps: int = 50_000_000  # dynamic instructions (each iteration of a loop body counts)
    # iterations of hardware loops run one by one: far cheaper than instructions, but a loop
    # around an IF that is never taken executes none and must still end
    max_iterations: int = 200_000_000
    dram_bytes: int = 1 << 30  # the DRAM image the simulator allocates


def binary_target(binary: Binary):
    """The built-in target the header names. The name is checked to be a name first: it selects
    one of the package's target descriptions and is never used as a path."""
    from tensorgen.target import ISA_DIR, load_target

    check_target_name(binary.target_name)
    if not (ISA_DIR / f"{binary.target_name}.yaml").is_file():
        known = ", ".join(sorted(p.stem for p in ISA_DIR.glob("*.yaml")))
        raise BinaryError(
            f"binary was built for target '{binary.target_name}', which is not a built-in target "
            f"(built in: {known}); give its description with `tensorgen run --target FILE.yaml`"
        )
    return load_target(binary.target_name)


def verify_binary(binary: Binary, target, limits: SimLimits | None = None) -> int:
    """Refuse (BinaryError, one line) a binary that `target` cannot run safely; returns an upper
    bound of its dynamic instruction count (exact when it has no LOOPB or IF)."""
    limits = limits or SimLimits()
    check_target_name(binary.target_name)
    if binary.target_hash != target.hash or binary.target_name != target.name:
        raise BinaryError(
            f"binary was built for target '{binary.target_name}' with other parameters "
            f"(hash {binary.target_hash.hex()}); this target '{target.name}' has hash "
            f"{target.hash.hex()}"
        )
    _check_tensors(binary, limits)
    onchip = {"spad": target.spad.bytes, "acc": target.acc.bytes}
    for pc, (ins, depth) in enumerate(zip(binary.code, _depths(binary.code), strict=False)):
        _check_instruction(binary, pc, ins, depth, onchip)
    steps, exact = _count(binary.code, 0, len(binary.code), (), 0)
    if exact and steps > limits.max_steps:
        raise BinaryError(step_limit_message(steps, limits))
    return steps


def step_limit_message(steps: int | None, limits: SimLimits) -> str:
    """`steps`: the program's count, known before it runs; None: it passed the limit while running."""
    how = "(SimLimits.max_steps; raise it with `tensorgen run --max-steps N`)"
    if steps is None:
        return f"the program executes more than {limits.max_steps:,} instructions, the simulator's limit {how}"
    return f"the program executes {steps:,} instructions, over the simulator's limit of {limits.max_steps:,} {how}"


def _check_tensors(binary: Binary, limits: SimLimits) -> None:
    if binary.dram_bytes > limits.dram_bytes:
        raise BinaryError(
            f"the DRAM image of {binary.dram_bytes:,} bytes is over the limit of "
            f"{limits.dram_bytes:,} (SimLimits.dram_bytes)"
        )
    seen: set[str] = set()
    for t in binary.tensors:
        check_tensor_name(t.name)
        if t.name in seen:
            raise BinaryError(f"tensor {t.name} is declared twice")
        seen.add(t.name)
        if t.dram_offset + t.nbytes > binary.dram_bytes:
            raise BinaryError(
                f"tensor {t.name} ({t.dtype} {list(t.shape)}, {t.nbytes:,} bytes at DRAM offset "
                f"{t.dram_offset:,}) lies outside the DRAM image of {binary.dram_bytes:,} bytes"
            )
        if t.dram_offset % np.dtype(t.dtype).itemsize:
            raise BinaryError(
                f"tensor {t.name}: DRAM offset {t.dram_offset} is not aligned to its dtype {t.dtype}"
            )
        kind = np.dtype(t.dtype).kind
        if kind in "iu" and not np.iinfo(t.dtype).min <= t.pad <= np.iinfo(t.dtype).max:
            raise BinaryError(f"tensor {t.name}: pad value {t.pad} is outside {t.dtype}")
        if t.role == "const" and (
            t.const_bytes != t.nbytes
            or t.const_offset + t.const_bytes > len(binary.constants)
            or t.const_offset % np.dtype(t.dtype).itemsize
        ):
            raise BinaryError(
                f"tensor {t.name}: its {t.const_bytes:,} constant bytes at offset {t.const_offset:,} "
                f"are not its {t.nbytes:,} bytes inside the {len(binary.constants):,}-byte constants"
            )


def _bad(pc: int, ins: isa.Instruction, what: str) -> BinaryError:
    return BinaryError(f"instruction {pc} ({ins.mnemonic}): {what}")


def _check_affine(pc: int, ins: isa.Instruction, a: LoopAffine, depth: int, what: str) -> None:
    if len(a.coefs) > depth:
        raise _bad(pc, ins, f"{what} uses loop counter L{len(a.coefs) - 1} inside {depth} loop(s)")
    if any(abs(c) > MAX_COEF for c in (a.const, *a.coefs)):
        raise _bad(pc, ins, f"{what} has a constant or coefficient beyond +-2**40")


def _check_view(
    pc: int, ins: isa.Instruction, name: str, v: View, depth: int, onchip: dict[str, int]
) -> None:
    _check_affine(pc, ins, v.base, depth, f"{name}'s base")
    mem = onchip[v.mem]
    if math.prod(v.shape) > max(onchip.values()) or any(n < 1 for n in v.shape):
        raise _bad(
            pc,
            ins,
            f"{name} has shape {list(v.shape)} (every extent >= 1, at most "
            f"{max(onchip.values()):,} elements)",
        )
    if any(abs(s) * ITEMSIZE[v.dtype] > min(mem, MAX_STRIDE) for s in v.strides):
        raise _bad(
            pc,
            ins,
            f"{name} has strides {list(v.strides)} beyond its memory ({v.mem}, {mem:,} bytes)",
        )


def _check_box(
    pc: int, ins: isa.Instruction, binary: Binary, b: Box, depth: int, onchip: dict[str, int]
) -> None:
    t = binary.tensors[b.tensor]
    if len(b.shape) != len(t.shape):
        raise _bad(pc, ins, f"box of {t.name} has rank {len(b.shape)}, the tensor {len(t.shape)}")
    if math.prod(b.shape) > max(onchip.values()) or any(n < 1 for n in b.shape):
        raise _bad(
            pc,
            ins,
            f"box of {t.name} has shape {list(b.shape)} (every extent >= 1, at most "
            f"{max(onchip.values()):,} elements)",
        )
    for a in b.origin:
        _check_affine(pc, ins, a, depth, f"box of {t.name}'s origin")


def _check_bound(pc: int, ins: isa.Instruction, name: str, b: Bound, depth: int) -> None:
    if not b.terms and ins.mnemonic == "LOOPB":
        raise _bad(pc, ins, f"{name} has no terms")
    for a, d in b.terms:
        _check_affine(pc, ins, a, depth, name)
        if not 0 < d <= MAX_COEF:
            raise _bad(pc, ins, f"{name} has divisor {d}")


def _check_instruction(
    binary: Binary, pc: int, ins: isa.Instruction, depth: int, onchip: dict[str, int]
) -> None:
    if ins.mnemonic in SEQUENCER:
        if ins.wait or ins.signal:
            raise _bad(pc, ins, "the sequencer takes no tokens")
    elif ins.mnemonic == "SYNC" and ins.arg("queue") >= len(isa.QUEUES):
        raise _bad(pc, ins, f"queue {ins.arg('queue')} does not exist (0=LD, 1=EX, 2=ST)")
    else:
        q = ins.queue
        if q in ins.wait or q in ins.signal:
            raise _bad(pc, ins, f"a token from {q} to itself")
    for name, kind in ins.defn.fields:
        v = ins.arg(name)
        if isinstance(v, View):
            _check_view(pc, ins, name, v, depth, onchip)
        elif isinstance(v, Box):
            _check_box(pc, ins, binary, v, depth, onchip)
        elif isinstance(v, Bound):
            _check_bound(pc, ins, name, v, depth)
    if ins.mnemonic == "MATMUL":
        a, b, acc = ins.arg("a"), ins.arg("b"), ins.arg("acc")
        if (
            len(a.shape) < 2
            or len(b.shape) != 2
            or acc.shape != a.shape[:-1] + b.shape[1:]
            or a.shape[-1] != b.shape[0]
        ):
            raise _bad(
                pc,
                ins,
                f"shapes acc {list(acc.shape)}, a {list(a.shape)}, b {list(b.shape)} do not "
                "make a matrix product",
            )


def _depths(code: tuple[isa.Instruction, ...]) -> list[int]:
    """The loop depth of every instruction (the counters its operands may use); refuses a body
    that leaves its enclosing one, loops nested deeper than the sequencer's counters, and
    blocks (with IFs) nested deeper than `MAX_BLOCK_DEPTH`."""
    depths = [0] * len(code)
    ends: list[tuple[int, bool]] = [(len(code), False)]  # (end, whether the block adds a counter)
    loops = 0
    for pc, ins in enumerate(code):
        while ends[-1][0] <= pc:
            loops -= ends.pop()[1]
        depths[pc] = loops
        if ins.mnemonic in SEQUENCER:
            end = pc + 1 + ins.arg("body")
            if end > ends[-1][0]:
                raise _bad(
                    pc, ins, f"body of {ins.arg('body')} instructions leaves its enclosing block"
                )
            is_loop = ins.mnemonic != "IF"
            if loops + is_loop > MAX_LOOP_DEPTH or len(ends) > MAX_BLOCK_DEPTH:
                raise _bad(
                    pc,
                    ins,
                    f"loops nest deeper than {MAX_LOOP_DEPTH} or blocks deeper than {MAX_BLOCK_DEPTH}",
                )
            ends.append((end, is_loop))
            loops += is_loop
    return depths


def _term_range(a: LoopAffine, d: int, ranges: tuple[tuple[int, int], ...]) -> tuple[int, int]:
    lo = hi = a.const
    for c, (rlo, rhi) in zip(a.coefs, ranges, strict=False):
        lo += min(c * rlo, c * rhi)
        hi += max(c * rlo, c * rhi)
    return lo // d, hi // d


def _count(
    code, start: int, end: int, ranges: tuple[tuple[int, int], ...], level: int
) -> tuple[int, bool]:
    """(upper bound of the dynamic instructions of code[start:end], whether it is exact), with
    `ranges` the intervals of the enclosing loop counters (interval arithmetic for LOOPB)."""
    total, exact, pc = 0, True, start
    while pc < end:
        ins = code[pc]
        if ins.mnemonic not in SEQUENCER:
            total, pc = total + 1, pc + 1
            continue
        body_end = pc + 1 + ins.arg("body")
        inner_ranges = ranges
        if ins.mnemonic == "LOOP":
            n = ins.arg("count")
            inner_ranges = ranges + ((0, max(n - 1, 0)),)
        elif ins.mnemonic == "LOOPB":
            lows = [_term_range(a, d, ranges) for a, d in ins.arg("lower").terms]
            highs = [_term_range(a, d, ranges) for a, d in ins.arg("upper").terms]
            lo, hi = max(r[0] for r in lows), min(r[1] for r in highs)
            n = max(0, hi - lo + 1)
            inner_ranges = ranges + ((lo, max(lo, hi)),)
            exact = exact and all(
                not a.coefs for a, _ in ins.arg("lower").terms + ins.arg("upper").terms
            )
        else:
            n, exact = 1, False
        inner, inner_exact = (
            _count(code, pc + 1, body_end, inner_ranges, level + 1) if n else (0, True)
        )
        total, exact, pc = total + n * inner, exact and inner_exact, body_end
    return total, exact
