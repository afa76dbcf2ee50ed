"""Checks of a decoded binary against the target it runs on, before anything runs.

A .tgb comes from anywhere: `decode` only proves that it is well formed. `verify_binary`
proves that running it cannot go wrong in any way but a one-line error: every tensor lies
inside the DRAM image and every constant inside the constants section, every operand's
numbers are small enough that no address computation overflows and no numpy array is made
from an impossible shape or stride, the loop structure is properly nested, every field fits
its encoding, every on-chip operand stays inside its memory at every value of its loop
counters (where those form a box known before it runs: not under an IF or a LOOPB whose
bounds follow outer counters), the tokens name real queues and balance (no instruction waits
for a token not signalled before it, none is left unawaited at the end), and the program's
dynamic instruction count is within `SimLimits`. The simulator still bounds-checks every
access at run time (an affine address under a guard or a skewed bound can leave its memory at
some iteration); this is what can be known from the code alone.
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

    # dynamic instructions (each iteration of a loop body counts), or their upper bound where
    # LOOPB trips or IF bodies depend on counters, checked before anything runs: 25x a whole
    # ResNet-18 at 224 (79,118 on tg1), 2.6x conv_bias_relu_requant's default schedule (776,839)
    max_steps: int = 2_000_000
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
    for pc, ranges in enumerate(_exact_ranges(binary.code)):
        if ranges is not None:
            _check_spans(pc, binary.code[pc], ranges, onchip)
    _check_tokens(binary.code)
    steps, exact = _count(binary.code, 0, len(binary.code), (), 0)
    if steps > limits.max_steps:  # refused before the work starts, even when only a bound:
        # running until the limit is reached cost minutes (unbatched steps, ~17 us each)
        raise BinaryError(step_limit_message(steps, limits, exact))
    return steps


# What a compile checks: the binary's structure, not a simulator's budget (`tensorgen run` sets
# that when it loads the binary).
COMPILE_LIMITS = SimLimits(max_steps=2**62, max_iterations=2**62, dram_bytes=2**62)


def verify_compiled(binary: Binary, target) -> Binary:
    """`verify_binary` as the last pass of a compile: returns `binary` unchanged."""
    verify_binary(binary, target, COMPILE_LIMITS)
    return binary


def step_limit_message(steps: int | None, limits: SimLimits, exact: bool = True) -> str:
    """`steps`: the program's count (`exact`) or an upper bound of it (data-dependent LOOPB
    trips, IF bodies), known before it runs; None: it passed the limit while running."""
    how = "(SimLimits.max_steps; raise it with `tensorgen run --max-steps N`)"
    if steps is None:
        return f"the program executes more than {limits.max_steps:,} instructions, the simulator's limit {how}"
    if not exact:
        return (
            f"the program may execute up to {steps:,} instructions (a bound: its loops or IFs "
            f"depend on counters), over the simulator's limit of {limits.max_steps:,} {how}"
        )
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
    for name, kind in ins.defn.fields:
        _check_field(pc, ins, name, kind, ins.arg(name), len(binary.tensors))
    if ins.mnemonic in SEQUENCER:
        if ins.wait or ins.signal:
            raise _bad(pc, ins, "the sequencer takes no tokens")
    elif ins.mnemonic == "SYNC" and ins.arg("queue") >= len(isa.QUEUES):
        raise _bad(pc, ins, f"queue {ins.arg('queue')} does not exist (0=LD, 1=EX, 2=ST)")
    else:
        q = ins.queue
        if q in ins.wait or q in ins.signal:
            raise _bad(pc, ins, f"a token from {q} to itself")
    for name, _ in ins.defn.fields:
        v = ins.arg(name)
        if isinstance(v, View):
            _check_view(pc, ins, name, v, depth, onchip)
        elif isinstance(v, Box):
            _check_box(pc, ins, binary, v, depth, onchip)
        elif isinstance(v, Bound):
            _check_bound(pc, ins, name, v, depth)
    if ins.mnemonic == "VLUT":
        _check_lut(pc, ins)
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


def _check_lut(pc: int, ins: isa.Instruction) -> None:
    table, a = ins.arg("table"), ins.arg("a")
    if (
        table.mem != "spad"
        or table.dtype not in ("int8", "uint8")
        or table.shape != (256,)
        or table.strides != (1,)
    ):
        raise _bad(
            pc,
            ins,
            f"table is {table.mem}:{table.dtype} {list(table.shape)} stride {list(table.strides)}; "
            "expected 256 consecutive int8/uint8 entries in spad",
        )
    if a.dtype not in ("int8", "uint8"):
        raise _bad(pc, ins, f"a is {a.dtype}; a lookup indexes by int8/uint8 elements")


INT_RANGES = {"u8": (0, 2**8 - 1), "u16": (0, 2**16 - 1), "u32": (0, 2**32 - 1)}
INT_RANGES["i32"] = (-(2**31), 2**31 - 1)
F32_MAX = float(np.finfo(np.float32).max)


def _check_field(pc: int, ins: isa.Instruction, name: str, kind: str, v, tensors: int) -> None:
    """The field's value fits its encoding (a binary built in memory was never encoded)."""
    if kind in INT_RANGES:
        lo, hi = INT_RANGES[kind]
        if not isinstance(v, int) or not lo <= v <= hi:
            raise _bad(pc, ins, f"field {name}={v!r} does not fit a {kind}")
    elif kind == "f32" and not (isinstance(v, int | float) and abs(v) <= F32_MAX):
        raise _bad(pc, ins, f"field {name}={v!r} is not a finite f32")
    elif kind == "box" and not (isinstance(v, Box) and 0 <= v.tensor < tensors):
        raise _bad(pc, ins, f"field {name} names no tensor of the table")
    elif kind in ("view", "bound") and not isinstance(v, View if kind == "view" else Bound):
        raise _bad(pc, ins, f"field {name} is not a {kind}")


def _exact_ranges(code: tuple[isa.Instruction, ...]) -> list[tuple[tuple[int, int], ...] | None]:
    """The loop counters' values every instruction runs at, where they form a box known before
    the program runs: under LOOPs, and LOOPBs with constant bounds, that run at least once.
    None under an IF or a LOOPB whose bounds follow outer counters (skewed, triangular): there
    intervals would over-approximate the iterations, and the simulator checks each access."""
    out: list[tuple[tuple[int, int], ...] | None] = [()] * len(code)
    stack: list[tuple[int, tuple[tuple[int, int], ...] | None]] = [(len(code), ())]
    for pc, ins in enumerate(code):
        while stack[-1][0] <= pc:
            stack.pop()
        ranges = out[pc] = stack[-1][1]
        if ins.mnemonic not in SEQUENCER:
            continue
        inner = None
        if ins.mnemonic == "LOOP" and ranges is not None and ins.arg("count") > 0:
            inner = ranges + ((0, ins.arg("count") - 1),)
        elif ins.mnemonic == "LOOPB" and ranges is not None:
            terms = ins.arg("lower").terms + ins.arg("upper").terms
            if not any(a.coefs for a, _ in terms):
                lo = max(a.const // d for a, d in ins.arg("lower").terms)
                hi = min(a.const // d for a, d in ins.arg("upper").terms)
                inner = ranges + ((lo, hi),) if lo <= hi else None
        stack.append((pc + 1 + ins.arg("body"), inner))
    return out


def _check_spans(
    pc: int, ins: isa.Instruction, ranges: tuple[tuple[int, int], ...], onchip: dict[str, int]
) -> None:
    """Every byte an on-chip operand touches, at every counter value, lies inside its memory."""
    for name, _ in ins.defn.fields:
        v = ins.arg(name)
        if not isinstance(v, View):
            continue
        isz = ITEMSIZE[v.dtype]
        base_lo, base_hi = _term_range(v.base, 1, ranges)
        extents = [(n - 1) * s * isz for n, s in zip(v.shape, v.strides, strict=True)]
        lo = base_lo + sum(min(0, e) for e in extents)
        hi = base_hi + sum(max(0, e) for e in extents) + isz
        if lo < 0 or hi > onchip[v.mem]:
            raise _bad(
                pc,
                ins,
                f"{name} ({v}) reaches bytes {lo:,}..{hi - 1:,} of {v.mem}, which has "
                f"{onchip[v.mem]:,}",
            )


@dataclass(frozen=True)
class _Flow:
    """What a block does to one token FIFO: `net` tokens added, the lowest count it reaches
    relative to its start (`low` <= 0) and the instruction that first reaches it."""

    net: int = 0
    low: int = 0
    at: int = -1

    def then(self, other: _Flow) -> _Flow:
        if self.net + other.low < self.low:
            return _Flow(self.net + other.net, self.net + other.low, other.at)
        return _Flow(self.net + other.net, self.low, self.at)


def _token_flows(code, start: int, end: int, ranges) -> dict[tuple[str, str], _Flow]:
    flows: dict[tuple[str, str], _Flow] = {}

    def add(fifo, flow: _Flow) -> None:
        flows[fifo] = flows.get(fifo, _Flow()).then(flow)

    pc = start
    while pc < end:
        ins = code[pc]
        if ins.mnemonic not in SEQUENCER:
            for src in sorted(ins.wait):
                add((src, ins.queue), _Flow(-1, -1, pc))
            for dst in sorted(ins.signal):
                add((ins.queue, dst), _Flow(1, 0, pc))
            pc += 1
            continue
        body_end = pc + 1 + ins.arg("body")
        inner = _token_flows(code, pc + 1, body_end, ranges)
        for fifo, f in inner.items():
            if ins.mnemonic == "LOOP":
                n = ins.arg("count")
                if n:
                    add(fifo, _Flow(n * f.net, f.low + min(0, (n - 1) * f.net), f.at))
            elif f.net:  # an IF, or a LOOPB whose count is not known before it runs
                raise _bad(
                    pc,
                    ins,
                    f"its body's tokens from {fifo[0]} to {fifo[1]} do not balance ({f.net:+d} "
                    "per run): their count would depend on how often it runs",
                )
            else:
                add(fifo, _Flow(0, f.low, f.at))
        pc = body_end
    return flows


def _check_tokens(code: tuple[isa.Instruction, ...]) -> None:
    """Tokens are FIFOs between queues, filled by signals and drained by waits in program order:
    none may be awaited before it is signalled, and none is left when the program ends."""
    for (src, dst), f in sorted(_token_flows(code, 0, len(code), ()).items()):
        if f.low < 0:
            raise _bad(
                f.at,
                code[f.at],
                f"waits for a token from {src} that no instruction before it signalled",
            )
        if f.net:
            raise BinaryError(
                f"{f.net} token(s) from {src} to {dst} are signalled and never awaited"
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
