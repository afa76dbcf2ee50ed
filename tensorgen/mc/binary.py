"""The .tgb container, its encoder/decoder, and the assembler/disassembler text.

Layout (little-endian):
  header   magic b"TGB\\x1a", version u16, reserved u16, target name 16s, target hash 8s,
           n_tensors u32, pool bytes u32, code words u32, constant bytes u32, DRAM bytes u64,
           CRC-32 of the whole file with this field zero u32 (version 2; version 1 left the
           header out of the checksum, so a corrupt target name or count went unnoticed)
  tensors  n_tensors entries (see `TENSOR_RECORD`), shapes padded to 6 dims
  pool     u32 count, then operand entries (views and boxes)
  code     32-byte instruction words (tensorgen.mc.isa)
  consts   raw bytes of constant tensors (weights)
"""

from __future__ import annotations

import math
import re
import struct
import zlib
from dataclasses import dataclass, field

import numpy as np

from tensorgen.errors import BinaryError
from tensorgen.inputs import one_line
from tensorgen.mc import isa
from tensorgen.mc.operands import (
    DTYPE_CODES,
    DTYPE_NAMES,
    MAX_RANK,
    MEMORIES,
    Bound,
    Box,
    LoopAffine,
    View,
)

MAGIC = b"TGB\x1a"
VERSION = 2
HEADER = struct.Struct("<4sHH16s8sIIIIQI")
_CRC_AT = HEADER.size - 4
NAME_BYTES = 32  # a tensor name in the tensor table
TARGET_NAME_BYTES = 16
# A tensor name becomes an output file name (`run --out DIR` writes DIR/NAME.npy), so it is
# dotted identifiers and nothing else: no "/", no "..", no leading dot, no NUL.
_TENSOR_NAME = re.compile(r"[^\W\d]\w*(\.[^\W\d]\w*)*")
# A target name selects one of the built-in target descriptions; it is never a path.
_TARGET_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_-]*")
TENSOR_RECORD = struct.Struct(f"<32sBBBxi{MAX_RANK}IQQQ")
ROLES = ("input", "output", "inout", "temp", "const")
_POOL_HEAD = struct.Struct("<BBBBH")


@dataclass(frozen=True)
class TensorEntry:
    name: str
    dtype: str
    shape: tuple[int, ...]
    role: str
    dram_offset: int
    pad: int = 0
    const_offset: int = 0  # into the constants section, for role "const"
    const_bytes: int = 0

    @property
    def nbytes(self) -> int:
        # Python integers: a crafted shape must not wrap around to a small size
        return math.prod(self.shape) * np.dtype(self.dtype).itemsize


@dataclass(frozen=True)
class Binary:
    target_name: str
    target_hash: bytes
    tensors: tuple[TensorEntry, ...]
    code: tuple[isa.Instruction, ...]
    dram_bytes: int
    constants: bytes = field(default=b"", repr=False)

    def tensor_index(self, name: str) -> int:
        return [t.name for t in self.tensors].index(name)


# --- binary encoding -----------------------------------------------------------------------


def check_tensor_name(name: str) -> None:
    """A tensor name is dotted identifiers of at most 32 UTF-8 bytes (it names an output file)."""
    if not _TENSOR_NAME.fullmatch(name) or len(name.encode()) > NAME_BYTES:
        raise BinaryError(
            f"tensor name {_quoted(name)} is not a dotted identifier of at most {NAME_BYTES} bytes"
        )


def check_target_name(name: str) -> None:
    """A target name is letters, digits, '_' and '-' (at most 16 bytes): a name, never a path."""
    if not _TARGET_NAME.fullmatch(name) or len(name.encode()) > TARGET_NAME_BYTES:
        raise BinaryError(
            f"target name {_quoted(name)} is not a name of at most {TARGET_NAME_BYTES} letters, "
            "digits, '_' or '-'"
        )


def _quoted(name: str) -> str:
    return repr(one_line(name, 60))


def _affine_bytes(a: LoopAffine, nlev: int) -> bytes:
    coefs = a.coefs + (0,) * (nlev - len(a.coefs))
    return struct.pack(f"<q{nlev}q", a.const, *coefs)


def _encode_operand(op: View | Box | Bound) -> bytes:
    if isinstance(op, Bound):
        nlev = max((len(a.coefs) for a, _ in op.terms), default=0)
        head = _POOL_HEAD.pack(2, len(op.terms), nlev, 0, 0)
        return head + b"".join(_affine_bytes(a, nlev) + struct.pack("<q", d) for a, d in op.terms)
    if isinstance(op, View):
        nlev = len(op.base.coefs)
        head = _POOL_HEAD.pack(
            0, len(op.shape), nlev, MEMORIES.index(op.mem), DTYPE_CODES[op.dtype]
        )
        return (
            head
            + _affine_bytes(op.base, nlev)
            + struct.pack(f"<{len(op.shape)}I{len(op.shape)}q", *op.shape, *op.strides)
        )
    nlev = max((len(a.coefs) for a in op.origin), default=0)
    head = _POOL_HEAD.pack(1, len(op.shape), nlev, 0, op.tensor)
    return (
        head
        + b"".join(_affine_bytes(a, nlev) for a in op.origin)
        + struct.pack(f"<{len(op.shape)}I", *op.shape)
    )


def _encode_word(i: int, ins: isa.Instruction, pool: dict) -> bytes:
    defn = ins.defn
    values = []
    for name, kind in defn.fields:
        v = ins.arg(name)
        if kind in isa.OPERAND_KINDS:
            if v is None:
                values.append(isa.NONE_OPERAND)
                continue
            v = pool.setdefault(v, len(pool))
            if v >= isa.NONE_OPERAND:
                raise BinaryError(
                    f"instruction {i} ({defn.mnemonic}): field {name}: more than "
                    f"{isa.NONE_OPERAND} distinct operands do not fit the operand pool"
                )
        elif kind in _RANGES and not (
            isinstance(v, (int, np.integer)) and _RANGES[kind][0] <= v <= _RANGES[kind][1]
        ):
            raise BinaryError(
                f"instruction {i} ({defn.mnemonic}): field {name}={one_value(v)} does not fit a {kind}"
            )
        elif kind == "f32" and not (
            isinstance(v, (int, float, np.integer, np.floating))
            and math.isfinite(v)
            and abs(v) <= float(np.finfo(np.float32).max)
        ):
            raise BinaryError(
                f"instruction {i} ({defn.mnemonic}): field {name}={one_value(v)} is not a finite f32"
            )
        values.append(v)
    word = isa.HEADER.pack(defn.opcode, isa.queue_mask(ins.wait), isa.queue_mask(ins.signal))
    return (word + defn.struct.pack(*values)).ljust(isa.WORD_BYTES, b"\0")


def one_value(v: object) -> str:
    return one_line(v, 40)


def _encode_pool(pool: dict) -> bytes:
    parts = [struct.pack("<I", len(pool))]
    for op in pool:
        try:
            parts.append(_encode_operand(op))
        except (struct.error, OverflowError, ValueError, KeyError, TypeError):
            raise BinaryError(
                f"operand {one_value(op)}: a shape, stride, offset or coefficient does not fit "
                "its field (shapes u32, strides, offsets and coefficients i64, rank <= 255)"
            ) from None
    return b"".join(parts)


def _encode_tensor(t: TensorEntry) -> bytes:
    check_tensor_name(t.name)
    if t.dtype not in DTYPE_CODES or t.role not in ROLES or len(t.shape) > MAX_RANK:
        raise BinaryError(
            f"tensor {t.name}: dtype {t.dtype}, role {t.role} or rank {len(t.shape)} is not encodable"
        )
    shape = tuple(t.shape) + (0,) * (MAX_RANK - len(t.shape))
    try:
        return TENSOR_RECORD.pack(
            t.name.encode(),
            DTYPE_CODES[t.dtype],
            ROLES.index(t.role),
            len(t.shape),
            t.pad,
            *shape,
            t.dram_offset,
            t.const_offset,
            t.const_bytes,
        )
    except (struct.error, OverflowError):
        raise BinaryError(
            f"tensor {t.name}: a shape (u32), pad (i32) or offset (u64) does not fit its field"
        ) from None


def encode(binary: Binary) -> bytes:
    """The .tgb bytes of `binary`; a value that does not fit its field is a one-line BinaryError
    naming the instruction or tensor and the field (never silently truncated)."""
    check_target_name(binary.target_name)
    if len(binary.target_hash) != 8:
        raise BinaryError(f"target hash of {len(binary.target_hash)} bytes (expected 8)")
    pool: dict[View | Box | Bound, int] = {}
    words = [_encode_word(i, ins, pool) for i, ins in enumerate(binary.code)]
    pool_bytes = _encode_pool(pool)
    tensors = b"".join(_encode_tensor(t) for t in binary.tensors)
    body = tensors + pool_bytes + b"".join(words) + binary.constants
    counts = (len(binary.tensors), len(pool_bytes), len(words), len(binary.constants))
    if max(counts) >= 2**32 or not 0 <= binary.dram_bytes < 2**64:
        raise BinaryError("binary too large for the .tgb format (a section over 4 GiB)")
    header = bytearray(
        HEADER.pack(
            MAGIC,
            VERSION,
            0,
            binary.target_name.encode(),
            binary.target_hash,
            *counts,
            binary.dram_bytes,
            0,
        )
    )
    struct.pack_into("<I", header, _CRC_AT, zlib.crc32(body, zlib.crc32(header)))
    return bytes(header) + body


def checksum(data: bytes) -> int:
    """The CRC-32 a .tgb stores: over the whole file with the checksum field read as zero."""
    crc = zlib.crc32(data[:_CRC_AT])
    crc = zlib.crc32(b"\0\0\0\0", crc)
    return zlib.crc32(data[HEADER.size :], crc)


class _Reader:
    def __init__(self, data: bytes, pos: int, end: int) -> None:
        self.data, self.pos, self.end = data, pos, end

    def take(self, fmt: str):
        s = struct.Struct("<" + fmt)
        if self.pos + s.size > self.end:
            raise BinaryError("truncated operand pool")
        out = s.unpack_from(self.data, self.pos)
        self.pos += s.size
        return out


def _decode_pool(data: bytes, start: int, end: int, n_tensors: int) -> list[View | Box]:
    r = _Reader(data, start, end)
    (count,) = r.take("I")
    pool: list[View | Box] = []
    for _ in range(count):
        kind, rank, nlev, mem, ref = r.take("BBBBH")
        if (rank > MAX_RANK and kind != 2) or nlev > 8:
            raise BinaryError("corrupt operand pool (rank or loop depth out of range)")

        def affine(nlev: int = nlev) -> LoopAffine:  # bound now: called in this iteration only
            vals = r.take(f"q{nlev}q")
            return LoopAffine.make(vals[0], vals[1:])

        if kind == 0:
            if mem >= len(MEMORIES) or ref not in DTYPE_NAMES:
                raise BinaryError("corrupt operand pool (unknown memory or dtype)")
            base = affine()
            vals = r.take(f"{rank}I{rank}q")
            pool.append(
                View(MEMORIES[mem], DTYPE_NAMES[ref], base, tuple(vals[:rank]), tuple(vals[rank:]))
            )
        elif kind == 2:
            terms = []
            for _ in range(rank):
                a = affine()
                terms.append((a, r.take("q")[0]))
            if any(d <= 0 for _, d in terms):
                raise BinaryError("corrupt operand pool (non-positive divisor)")
            pool.append(Bound(tuple(terms)))
        elif kind == 1:
            if ref >= n_tensors:
                raise BinaryError("corrupt operand pool (box of an unknown tensor)")
            origin = tuple(affine() for _ in range(rank))
            pool.append(Box(ref, origin, tuple(r.take(f"{rank}I"))))
        else:
            raise BinaryError(f"corrupt operand pool (unknown operand kind {kind})")
    if r.pos != end:
        raise BinaryError("corrupt operand pool (size mismatch)")
    return pool


def decode(data: bytes) -> Binary:
    """Parse a .tgb file, refusing with one line anything `encode` could not have written: a
    foreign or other-version file, a checksum mismatch, a count that does not match the file's
    length, and (behind a valid checksum) any field out of its range. What decodes is still
    untrusted: `tensorgen.mc.verify.verify_binary` checks it against the target it runs on."""
    if len(data) < HEADER.size:
        raise BinaryError("not a .tgb file (too short for a header)")
    magic, version, _, tname, thash, n_t, pool_len, n_words, const_len, dram, crc = (
        HEADER.unpack_from(data)
    )
    if magic != MAGIC:
        raise BinaryError("not a .tgb file (bad magic)")
    if version != VERSION:
        raise BinaryError(f"unsupported .tgb version {version} (this tool reads version {VERSION})")
    expected = (
        HEADER.size + n_t * TENSOR_RECORD.size + pool_len + n_words * isa.WORD_BYTES + const_len
    )
    if len(data) < expected:
        raise BinaryError(f"truncated .tgb file ({len(data)} bytes, header promises {expected})")
    if len(data) > expected:
        raise BinaryError(f"corrupt .tgb file ({len(data) - expected} trailing bytes)")
    if checksum(data) != crc:
        raise BinaryError("corrupt .tgb file (checksum mismatch)")
    target_name = _decode_name(tname, "target name")
    check_target_name(target_name)
    pos = HEADER.size
    tensors = [_decode_tensor(data, pos + k * TENSOR_RECORD.size, k) for k in range(n_t)]
    pos += n_t * TENSOR_RECORD.size
    pool = _decode_pool(data, pos, pos + pool_len, n_t)
    pos += pool_len
    code = [
        _decode_word(data[pos + i * isa.WORD_BYTES : pos + (i + 1) * isa.WORD_BYTES], i, pool)
        for i in range(n_words)
    ]
    pos += n_words * isa.WORD_BYTES
    return Binary(
        target_name, thash, tuple(tensors), tuple(code), dram, bytes(data[pos : pos + const_len])
    )


def _decode_name(raw: bytes, what: str) -> str:
    try:
        return raw.rstrip(b"\0").decode("utf-8")
    except UnicodeDecodeError:
        raise BinaryError(f"corrupt .tgb file ({what} is not UTF-8)") from None


def _decode_tensor(data: bytes, pos: int, k: int) -> TensorEntry:
    name, dt, role, rank, pad, *rest = TENSOR_RECORD.unpack_from(data, pos)
    shape, (off, coff, cbytes) = rest[:MAX_RANK], rest[MAX_RANK:]
    if dt not in DTYPE_NAMES or role >= len(ROLES) or rank > MAX_RANK:
        raise BinaryError("corrupt tensor table")
    text = _decode_name(name, f"the name of tensor {k}")
    try:
        check_tensor_name(text)
    except BinaryError as err:
        raise BinaryError(f"corrupt tensor table (tensor {k}: {err})") from None
    return TensorEntry(
        text, DTYPE_NAMES[dt], tuple(shape[:rank]), ROLES[role], off, pad, coff, cbytes
    )


_OPERAND_TYPES = {"view": View, "view?": View, "box": Box, "bound": Bound}


def _decode_word(word: bytes, i: int, pool: list) -> isa.Instruction:
    opcode, wait, signal = isa.HEADER.unpack_from(word)
    defn = isa.BY_OPCODE.get(opcode)
    if defn is None:
        raise BinaryError(f"instruction {i}: unknown opcode 0x{opcode:02x}")
    if (wait | signal) & ~0b111:
        raise BinaryError(
            f"instruction {i} ({defn.mnemonic}): token mask names a queue that does not exist"
        )
    values = defn.struct.unpack_from(word, isa.HEADER.size)
    args = []
    for (name, kind), v in zip(defn.fields, values, strict=False):
        if kind in isa.OPERAND_KINDS:
            if v == isa.NONE_OPERAND and kind == "view?":
                v = None
            elif v >= len(pool) or not isinstance(pool[v], _OPERAND_TYPES[kind]):
                raise BinaryError(f"instruction {i} ({defn.mnemonic}): bad operand reference {v}")
            else:
                v = pool[v]
        elif kind == "f32" and not math.isfinite(v):
            raise BinaryError(
                f"instruction {i} ({defn.mnemonic}): field {name} is not a finite number"
            )
        args.append((name, v))
    return isa.Instruction(
        defn.mnemonic, tuple(args), isa.mask_queues(wait), isa.mask_queues(signal)
    )


# --- text ------------------------------------------------------------------------------------


def _field_text(value, kind: str, names: list[str]) -> str:
    if kind == "box":
        return value.text(names)
    if kind in ("view", "view?", "bound"):
        return "-" if value is None else str(value)
    if kind == "f32":
        return repr(float(np.float32(value)))
    return str(value)


def format_instruction(ins: isa.Instruction, names: list[str]) -> str:
    parts = [ins.mnemonic]
    for name, kind in ins.defn.fields:
        parts.append(f"{name}={_field_text(ins.arg(name), kind, names)}")
    for label, qs in (("wait", ins.wait), ("signal", ins.signal)):
        if qs:
            parts.append(f"{label}={','.join(q for q in isa.QUEUES if q in qs)}")
    return " ".join(parts)


def disassemble(binary: Binary) -> str:
    names = [t.name for t in binary.tensors]
    lines = [
        "; tensorgen microcode",
        f".target {binary.target_name} {binary.target_hash.hex()}",
        f".dram {binary.dram_bytes}",
    ]
    for t in binary.tensors:
        shape = "x".join(map(str, t.shape))
        extra = f" const={t.const_offset}+{t.const_bytes}" if t.role == "const" else ""
        lines.append(
            f".tensor {t.name} {t.dtype} {shape} {t.role} dram={t.dram_offset} pad={t.pad}{extra}"
        )
    ends: list[int] = []
    for i, ins in enumerate(binary.code):
        while ends and ends[-1] <= i:
            ends.pop()
        lines.append("    " * (len(ends) + 1) + format_instruction(ins, names))
        if ins.mnemonic in ("LOOP", "LOOPB", "IF"):
            ends.append(i + 1 + ins.arg("body"))
    return "\n".join(lines) + "\n"


def _parse_field(text: str, kind: str, names: list[str]):
    if kind == "box":
        return Box.parse(text, names)
    if kind == "bound":
        return Bound.parse(text)
    if kind in ("view", "view?"):
        return None if text == "-" and kind == "view?" else View.parse(text)
    if kind == "f32":
        return float(np.float32(float(text)))
    return int(text)


# A comment starts at a ';' that begins the line or follows a space: inside an operand ';' separates
# the terms of a bound, B(L0+1/1;7/1).
_COMMENT = re.compile(r"(?:^|(?<=\s));")


def assemble(text: str, constants: bytes = b"") -> Binary:
    """Parse assembly text (as `disassemble` prints it) back into a Binary."""
    target, thash, dram, tensors, code = None, b"", 0, [], []
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = _COMMENT.split(raw, 1)[0].strip()
        if not line:
            continue
        try:
            words = line.split()
            if words[0] == ".target":
                target, thash = words[1], bytes.fromhex(words[2])
                if not _TARGET_NAME.fullmatch(target) or len(target.encode()) > TARGET_NAME_BYTES:
                    raise ValueError(
                        f"target name '{target}' is not a name of at most {TARGET_NAME_BYTES} letters, "
                        "digits, '_' or '-'"
                    )
            elif words[0] == ".dram":
                dram = int(words[1])
            elif words[0] == ".tensor":
                name, dtype, shape, role = words[1:5]
                if dtype not in DTYPE_CODES or role not in ROLES:
                    raise ValueError(f"unknown dtype '{dtype}' or role '{role}'")
                if not _TENSOR_NAME.fullmatch(name) or len(name.encode()) > NAME_BYTES:
                    raise ValueError(
                        f"tensor name '{name}' is not a dotted identifier of at most {NAME_BYTES} bytes"
                    )
                kv = dict(w.split("=", 1) for w in words[5:])
                coff, cbytes = (int(x) for x in kv.get("const", "0+0").split("+"))
                tensors.append(
                    TensorEntry(
                        name,
                        dtype,
                        tuple(int(s) for s in shape.split("x")),
                        role,
                        int(kv["dram"]),
                        int(kv.get("pad", 0)),
                        coff,
                        cbytes,
                    )
                )
            else:
                code.append(_parse_instruction(words, [t.name for t in tensors]))
        except (ValueError, KeyError, IndexError, TypeError) as err:
            raise BinaryError(f"line {lineno}: cannot assemble '{line}' ({err})") from None
    if target is None:
        raise BinaryError("line 1: missing '.target NAME HASH'")
    return Binary(target, thash, tuple(tensors), tuple(code), dram, constants)


def _parse_instruction(words: list[str], names: list[str]) -> isa.Instruction:
    defn = isa.BY_MNEMONIC.get(words[0])
    if defn is None:
        raise ValueError(f"unknown mnemonic {words[0]}")
    kv = dict(w.split("=", 1) for w in words[1:])
    kinds = dict(defn.fields)
    tokens = {}
    for label in ("wait", "signal"):
        tokens[label] = frozenset(q for q in kv.pop(label, "").split(",") if q)
        bad = tokens[label] - set(isa.QUEUES)
        if bad:
            raise ValueError(
                f"{label}= names unknown queue(s) {', '.join(sorted(bad))} (queues: LD, EX, ST)"
            )
    if set(kv) != set(kinds):
        raise ValueError(f"{defn.mnemonic} takes fields {', '.join(kinds)}")
    args = tuple((n, _parse_field(kv[n], k, names)) for n, k in defn.fields)
    for (n, k), (_, v) in zip(defn.fields, args, strict=False):
        if k in _RANGES and not _RANGES[k][0] <= v <= _RANGES[k][1]:
            raise ValueError(f"{defn.mnemonic} {n}={v} does not fit a {k}")
    return isa.Instruction(defn.mnemonic, args, tokens["wait"], tokens["signal"])


_RANGES = {
    "u8": (0, 2**8 - 1),
    "u16": (0, 2**16 - 1),
    "u32": (0, 2**32 - 1),
    "i32": (-(2**31), 2**31 - 1),
}
