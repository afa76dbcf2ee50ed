"""The instruction set, each instruction defined once.

An `InstructionDef` holds everything about one instruction: mnemonic, opcode,
queue, fields (and so its binary encoding), numpy semantics and cost. The
assembler, disassembler, simulator, documentation and the code generator's
instruction selection all read these definitions, so none can drift from
another. `docs/isa.md` is generated from this module (`tensorgen isa-doc`).

Every instruction word is 32 bytes: opcode (u8), wait mask (u8), signal mask
(u8), a reserved byte, then the fields little-endian in the order listed.
Views and boxes are u16 indices into the binary's operand pool.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from tensorgen.mc import requant
from tensorgen.mc.operands import Box, View  # noqa: F401  (Bound operands are read by the sequencer)
from tensorgen.mc.semantics import (  # noqa: F401  (MachineState is the simulator's contract)
    MachineState,
    _binary,
    _load,
    _matmul,
    _matmul_loop,
    _rshr,
    _shl,
    _shr,
    _store,
    _vclamp,
    _vfill,
    _vlut,
    _vmac,
    _vmac_loop,
)
from tensorgen.mc.timing import (  # noqa: F401  (the cost of each instruction, re-exported)
    Channel,
    Cost,
    dma_channel_cycles,
    dma_cycles,
    matmul_cycles,
    matmul_fill,
    matmul_run_cycles,
    matmul_stream_start,
    vector_cycles,
)
from tensorgen.mc.timing import dma_cost as _dma_cost
from tensorgen.mc.timing import free_cost as _free
from tensorgen.mc.timing import matmul_cost as _matmul_cost
from tensorgen.mc.timing import vector_cost as _vector_cost
from tensorgen.mc.timing import vmac_cost as _vmac_cost

WORD_BYTES = 32
HEADER = struct.Struct("<BBBx")
QUEUES = ("LD", "EX", "ST")
QUEUE_BITS = {"LD": 1, "EX": 2, "ST": 4}
NONE_OPERAND = 0xFFFF
FIELD_FORMATS = {
    "u8": "B",
    "u16": "H",
    "u32": "I",
    "i32": "i",
    "f32": "f",
    "view": "H",
    "box": "H",
    "view?": "H",
    "bound": "H",
}
OPERAND_KINDS = ("view", "box", "view?", "bound")


@dataclass(frozen=True)
class InstructionDef:
    mnemonic: str
    opcode: int
    queue: str | None  # None: sequencer (LOOP); "field": SYNC names its queue
    fields: tuple[tuple[str, str], ...]
    doc: str
    execute: Callable | None = None  # (state, args) -> None
    cost: Callable | None = None  # (target, args) -> Cost
    # semantics of a loop nest around this one instruction when its destination does not
    # move with the loops (a reduction): lets the simulator run the nest as one numpy call
    execute_reduction_loop: Callable | None = None

    @property
    def struct(self) -> struct.Struct:
        return struct.Struct("<" + "".join(FIELD_FORMATS[t] for _, t in self.fields))


# --- the instruction table ---------------------------------------------------------------

_BIN = (("dst", "view"), ("a", "view"), ("b", "view?"), ("imm", "i32"))

INSTRUCTIONS: tuple[InstructionDef, ...] = (
    InstructionDef(
        "LOOP",
        0x01,
        None,
        (("count", "u32"), ("body", "u16")),
        "Zero-overhead hardware loop: run the next `body` instruction words `count` times. "
        "Its counter L<depth> (0-based) is visible to every operand inside; nesting depth <= 8.",
    ),
    InstructionDef(
        "LOOPB",
        0x03,
        None,
        (("lower", "bound"), ("upper", "bound"), ("body", "u16")),
        "Hardware loop with bounds computed by the sequencer: its iterator L<depth> runs from "
        "max(floor(a/d) of `lower`) to min(floor(a/d) of `upper`), affine terms of the outer "
        "iterators (triangular, skewed and tiled nests); no iteration if empty.",
    ),
    InstructionDef(
        "IF",
        0x04,
        None,
        (("cond", "bound"), ("body", "u16")),
        "Run the next `body` instruction words only if every floor(a/d) of `cond` is >= 0.",
    ),
    InstructionDef(
        "SYNC",
        0x02,
        "field",
        (("queue", "u8"),),
        "No-op on queue `queue` (0=LD, 1=EX, 2=ST) that exists to wait for or signal tokens.",
        None,
        _free,
    ),
    InstructionDef(
        "LOAD",
        0x10,
        "LD",
        (("dst", "view"), ("src", "box")),
        "DMA a box of a DRAM tensor into an on-chip view; elements outside the tensor read as "
        "its pad value (the DMA fills halos, no compute does).",
        _load,
        _dma_cost,
    ),
    InstructionDef(
        "STORE",
        0x11,
        "ST",
        (("dst", "box"), ("src", "view")),
        "DMA an on-chip view into a box of a DRAM tensor; elements of the box outside the tensor "
        "(halos) are dropped.",
        _store,
        _dma_cost,
    ),
    InstructionDef(
        "MATMUL",
        0x20,
        "EX",
        (
            ("acc", "view"),
            ("a", "view"),
            ("b", "view"),
            ("accumulate", "u8"),
            ("a_zp", "i32"),
            ("b_zp", "i32"),
        ),
        "acc[M..,N] (+)= (a[M..,K] - a_zp) @ (b[K,N] - b_zp) on the weight-stationary MAC array "
        "(M.. = one or more streamed dimensions, M their product rows): "
        "int8/uint8 operands, zero points subtracted at the array inputs (9-bit multipliers), "
        "int32 accumulator with two's-complement wrap; K <= rows, N <= cols, M streams. "
        "Cycles: M + fill, the fill hidden by the MATMUL before it with two weight buffers.",
        _matmul,
        _matmul_cost,
        _matmul_loop,
    ),
    InstructionDef(
        "VADD",
        0x30,
        "EX",
        _BIN,
        "dst = a + (b or imm), int32 wrap; then stored with dst's dtype (wrap).",
        _binary(np.add),
        _vector_cost,
    ),
    InstructionDef(
        "VSUB",
        0x31,
        "EX",
        _BIN,
        "dst = a - (b or imm), int32 wrap.",
        _binary(np.subtract),
        _vector_cost,
    ),
    InstructionDef(
        "VMUL",
        0x32,
        "EX",
        _BIN,
        "dst = a * (b or imm), int32 wrap.",
        _binary(np.multiply),
        _vector_cost,
    ),
    InstructionDef(
        "VMAX", 0x33, "EX", _BIN, "dst = max(a, b or imm).", _binary(np.maximum), _vector_cost
    ),
    InstructionDef(
        "VMIN", 0x34, "EX", _BIN, "dst = min(a, b or imm).", _binary(np.minimum), _vector_cost
    ),
    InstructionDef(
        "VSHL",
        0x35,
        "EX",
        _BIN,
        "dst = a << (b or imm), shift clamped to [0, 31], int32 wrap.",
        _binary(_shl),
        _vector_cost,
    ),
    InstructionDef(
        "VSHR",
        0x36,
        "EX",
        _BIN,
        "dst = a >> (b or imm), arithmetic, shift clamped to [0, 31].",
        _binary(_shr),
        _vector_cost,
    ),
    InstructionDef(
        "VMAC",
        0x37,
        "EX",
        (("dst", "view"), ("a", "view"), ("b", "view")),
        "dst = dst + a * b, int32 wrap (depthwise and other contractions off the MAC array).",
        _vmac,
        _vmac_cost,
        _vmac_loop,
    ),
    InstructionDef(
        "VFILL", 0x38, "EX", (("dst", "view"), ("imm", "i32")), "dst = imm.", _vfill, _vector_cost
    ),
    InstructionDef(
        "VCLAMP",
        0x39,
        "EX",
        (("dst", "view"), ("a", "view"), ("lo", "i32"), ("hi", "i32")),
        "dst = min(max(a, lo), hi).",
        _vclamp,
        _vector_cost,
    ),
    InstructionDef(
        "VREQUANT",
        0x3A,
        "EX",
        (
            ("dst", "view"),
            ("a", "view"),
            ("scale", "f32"),
            ("zp", "i32"),
            ("lo", "i32"),
            ("hi", "i32"),
        ),
        "dst = clamp(rint(f32(a) * scale) + zp, lo, hi): float32 multiply, round half to even "
        "(PyTorch's qnnpack requantization, NUMERICS.md).",
        requant.vrequant,
        _vector_cost,
    ),
    InstructionDef(
        "VREQUANTF",
        0x3E,
        "EX",
        (
            ("dst", "view"),
            ("a", "view"),
            ("bias", "view"),
            ("mult", "view"),
            ("zp", "i32"),
            ("lo", "i32"),
            ("hi", "i32"),
        ),
        "dst = clamp(rint(f32(f32(a) + bias) * mult) + zp, lo, hi) with float32 views `bias` and "
        "`mult` (per output channel, broadcast): fbgemm's per-channel requantization with a "
        "float bias (NUMERICS.md), each float32 operation rounded once.",
        requant.vrequantf,
        _vector_cost,
    ),
    InstructionDef(
        "VREQUANTO",
        0x42,
        "EX",
        (
            ("dst", "view"),
            ("a", "view"),
            ("wei", "view"),
            ("bias", "view"),
            ("s_src", "f32"),
            ("d", "f32"),
            ("zp", "i32"),
            ("lo", "i32"),
            ("hi", "i32"),
        ),
        "dst = clamp(rint(f32(f32(t * d) + zp)), lo, hi) with t = f32(f32(f32(f32(a) * s_src) "
        "* wei) + bias) and float32 views `wei` and `bias` (per output channel, broadcast): "
        "oneDNN's conv requantization under PyTorch's x86 engine (NUMERICS.md), each float32 "
        "operation rounded once (ties to even), the float clamped before it converts.",
        requant.vrequanto,
        _vector_cost,
    ),
    InstructionDef(
        "VADDQF",
        0x3F,
        "EX",
        (
            ("dst", "view"),
            ("a", "view"),
            ("b", "view"),
            ("s_a", "f32"),
            ("off_a", "f32"),
            ("s_b", "f32"),
            ("off_b", "f32"),
            ("inv", "f32"),
            ("zp", "u8"),
        ),
        "dst = clamp(rint(f32(c * inv)) + zp, 0, 255) with c = f32(fma(s_a, a, off_a) + "
        "fma(s_b, b, off_b)): the quantized add of PyTorch's x86/fbgemm engine "
        "(vectorised path; off = f32(s * -zero point)).",
        requant.vaddqf,
        _vector_cost,
    ),
    InstructionDef(
        "VADDQS",
        0x43,
        "EX",
        (
            ("dst", "view"),
            ("a", "view"),
            ("b", "view"),
            ("s_a", "f32"),
            ("zp_a", "u8"),
            ("s_b", "f32"),
            ("zp_b", "u8"),
            ("inv", "f32"),
            ("zp", "u8"),
        ),
        "dst = clamp(rint(f32(f32(c * inv) + zp)), 0, 255) with c = f32(f32(s_a * f32(a - zp_a)) "
        "+ f32(s_b * f32(b - zp_b))): the quantized add of PyTorch's x86/fbgemm engine on its "
        "scalar path (the tail of each vectorised run, or every element when the inputs' layouts "
        "differ): unfused products, the zero point added in float before rounding.",
        requant.vaddqs,
        _vector_cost,
    ),
    InstructionDef(
        "VREQUANTZ",
        0x40,
        "EX",
        (
            ("dst", "view"),
            ("a", "view"),
            ("scale", "f32"),
            ("zp", "i32"),
            ("lo", "i32"),
            ("hi", "i32"),
        ),
        "dst = clamp(rint(fma(f32(a), scale, zp)), lo, hi): requantization with the zero point "
        "added inside one fused multiply-add (fbgemm's average pooling on channels-last data).",
        requant.vrequantz,
        _vector_cost,
    ),
    InstructionDef(
        "VSHRR",
        0x3B,
        "EX",
        _BIN,
        "dst = a >> (b or imm) rounding half away from zero (asr plus one when the remainder "
        "exceeds half; negative values round down on ties), shift clamped to [0, 31]: the "
        "rounding of qnnpack's fixed-point quantized add.",
        _binary(_rshr),
        _vector_cost,
    ),
    InstructionDef(
        "VQUANT",
        0x3C,
        "EX",
        (
            ("dst", "view"),
            ("a", "view"),
            ("inv_scale", "f32"),
            ("zp", "i32"),
            ("lo", "i32"),
            ("hi", "i32"),
        ),
        "dst = clamp(rint(fma(a, inv_scale, zp)), lo, hi): float32 `a`, one fused multiply-add "
        "rounded once, round half to even (PyTorch's quantize_per_tensor, NUMERICS.md).",
        requant.vquant,
        _vector_cost,
    ),
    InstructionDef(
        "VDEQUANT",
        0x3D,
        "EX",
        (("dst", "view"), ("a", "view"), ("scale", "f32"), ("zp", "i32")),
        "dst = float32 dequantization of the integers `a` with `scale` and `zp`, rounded as "
        "PyTorch's Tensor.dequantize() does (see tensorgen/mc/arith.py).",
        requant.vdequant,
        _vector_cost,
    ),
    InstructionDef(
        "VLUT",
        0x41,
        "EX",
        (("dst", "view"), ("a", "view"), ("table", "view")),
        "dst = table[a & 0xFF]: each int8/uint8 element of `a` indexes, by its byte, a table of "
        "256 int8/uint8 entries held in the scratchpad (`table`: shape [256], stride 1, loaded "
        "by DMA like a weight): PyTorch's quantized element-wise functions of one input "
        "(hardswish, sigmoid, ...), each table built from PyTorch's own operator.",
        _vlut,
        _vector_cost,
    ),
)

BY_MNEMONIC = {d.mnemonic: d for d in INSTRUCTIONS}
BY_OPCODE = {d.opcode: d for d in INSTRUCTIONS}
assert all(HEADER.size + d.struct.size <= WORD_BYTES for d in INSTRUCTIONS)


@dataclass(frozen=True)
class Instruction:
    """One instruction: its definition, field values (views/boxes as objects) and tokens."""

    mnemonic: str
    args: tuple[tuple[str, object], ...]
    wait: frozenset[str] = frozenset()
    signal: frozenset[str] = frozenset()

    @property
    def defn(self) -> InstructionDef:
        return BY_MNEMONIC[self.mnemonic]

    @property
    def queue(self) -> str | None:
        q = self.defn.queue
        return QUEUES[self.arg("queue")] if q == "field" else q

    def arg(self, name: str):
        for k, v in self.args:
            if k == name:
                return v
        raise KeyError(name)

    def with_tokens(self, wait=None, signal=None) -> Instruction:
        return Instruction(
            self.mnemonic,
            self.args,
            frozenset(wait) if wait is not None else self.wait,
            frozenset(signal) if signal is not None else self.signal,
        )


def make(mnemonic: str, **args) -> Instruction:
    """Build an instruction, checking its fields against the definition."""
    defn = BY_MNEMONIC[mnemonic]
    names = [n for n, _ in defn.fields]
    for n, t in defn.fields:
        if n not in args:
            if t in ("view?",):
                args[n] = None
            elif t in ("i32", "u8") and n in ("imm", "accumulate", "a_zp", "b_zp"):
                args[n] = 0
            else:
                raise TypeError(f"{mnemonic}: missing field {n}")
    extra = set(args) - set(names)
    if extra:
        raise TypeError(f"{mnemonic}: unknown field(s) {sorted(extra)}")
    return Instruction(mnemonic, tuple((n, args[n]) for n in names))


def queue_mask(queues) -> int:
    return sum(QUEUE_BITS[q] for q in queues)


def mask_queues(mask: int) -> frozenset[str]:
    return frozenset(q for q, b in QUEUE_BITS.items() if mask & b)
