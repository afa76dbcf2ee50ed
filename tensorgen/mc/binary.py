"""The .tgb container, its encoder/decoder, and the assembler/disassembler text.

Layout (little-endian):
  header   magic b"TGB\\x1a", version u16, reserved u16, target name 16s, target hash 8s,
           n_tensors u32, pool bytes u32, code words u32, constant bytes u32, DRAM bytes u64,
           CRC-32 of everything after the header u32
  tensors  n_tensors entries (see `_TENSOR`), shapes padded to 6 dims
  pool     u32 count, then operand entries (views and boxes)
  code     32-byte instruction words (tensorgen.mc.isa)
  consts   raw bytes of constant tensors (weights)
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass, field

import numpy as np

from tensorgen.errors import BinaryError
from tensorgen.mc import isa
from tensorgen.mc.operands import DTYPE_CODES, DTYPE_NAMES, MAX_RANK, MEMORIES, Bound, Box, LoopAffine, View

MAGIC = b"TGB\x1a"
VERSION = 1
_HEADER = struct.Struct("<4sHH16s8sIIIIQI")
_TENSOR = struct.Struct(f"<32sBBBxi{MAX_RANK}IQQQ")
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
        return int(np.prod(self.shape, dtype=np.int64)) * np.dtype(self.dtype).itemsize


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
        head = _POOL_HEAD.pack(0, len(op.shape), nlev, MEMORIES.index(op.mem), DTYPE_CODES[op.dtype])
        return head + _affine_bytes(op.base, nlev) + struct.pack(
            f"<{len(op.shape)}I{len(op.shape)}q", *op.shape, *op.strides)
    nlev = max((len(a.coefs) for a in op.origin), default=0)
    head = _POOL_HEAD.pack(1, len(op.shape), nlev, 0, op.tensor)
    return head + b"".join(_affine_bytes(a, nlev) for a in op.origin) + struct.pack(
        f"<{len(op.shape)}I", *op.shape)


def encode(binary: Binary) -> bytes:
    pool: dict[View | Box | Bound, int] = {}
    words = []
    for ins in binary.code:
        defn = ins.defn
        values = []
        for name, kind in defn.fields:
            v = ins.arg(name)
            if kind in isa.OPERAND_KINDS:
                v = isa.NONE_OPERAND if v is None else pool.setdefault(v, len(pool))
            values.append(v)
        word = isa.HEADER.pack(defn.opcode, isa.queue_mask(ins.wait), isa.queue_mask(ins.signal))
        word += defn.struct.pack(*values)
        words.append(word.ljust(isa.WORD_BYTES, b"\0"))
    pool_bytes = struct.pack("<I", len(pool)) + b"".join(_encode_operand(op) for op in pool)
    tensors = b""
    for t in binary.tensors:
        shape = tuple(t.shape) + (0,) * (MAX_RANK - len(t.shape))
        tensors += _TENSOR.pack(t.name.encode(), DTYPE_CODES[t.dtype], ROLES.index(t.role), len(t.shape),
                                t.pad, *shape, t.dram_offset, t.const_offset, t.const_bytes)
    body = tensors + pool_bytes + b"".join(words) + binary.constants
    header = _HEADER.pack(MAGIC, VERSION, 0, binary.target_name.encode(), binary.target_hash,
                          len(binary.tensors), len(pool_bytes), len(words), len(binary.constants),
                          binary.dram_bytes, zlib.crc32(body))
    return header + body


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

        def affine() -> LoopAffine:
            vals = r.take(f"q{nlev}q")
            return LoopAffine.make(vals[0], vals[1:])

        if kind == 0:
            if mem >= len(MEMORIES) or ref not in DTYPE_NAMES:
                raise BinaryError("corrupt operand pool (unknown memory or dtype)")
            base = affine()
            vals = r.take(f"{rank}I{rank}q")
            pool.append(View(MEMORIES[mem], DTYPE_NAMES[ref], base, tuple(vals[:rank]), tuple(vals[rank:])))
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
    if len(data) < _HEADER.size:
        raise BinaryError("not a .tgb file (too short for a header)")
    magic, version, _, tname, thash, n_t, pool_len, n_words, const_len, dram, crc = _HEADER.unpack_from(data)
    if magic != MAGIC:
        raise BinaryError("not a .tgb file (bad magic)")
    if version != VERSION:
        raise BinaryError(f"unsupported .tgb version {version} (this tool reads version {VERSION})")
    expected = _HEADER.size + n_t * _TENSOR.size + pool_len + n_words * isa.WORD_BYTES + const_len
    if len(data) < expected:
        raise BinaryError(f"truncated .tgb file ({len(data)} bytes, header promises {expected})")
    if len(data) > expected:
        raise BinaryError(f"corrupt .tgb file ({len(data) - expected} trailing bytes)")
    if zlib.crc32(data[_HEADER.size:]) != crc:
        raise BinaryError("corrupt .tgb file (checksum mismatch)")
    pos = _HEADER.size
    tensors = []
    for _ in range(n_t):
        name, dt, role, rank, pad, *rest = _TENSOR.unpack_from(data, pos)
        pos += _TENSOR.size
        shape, (off, coff, cbytes) = rest[:MAX_RANK], rest[MAX_RANK:]
        if dt not in DTYPE_NAMES or role >= len(ROLES) or rank > MAX_RANK:
            raise BinaryError("corrupt tensor table")
        tensors.append(TensorEntry(name.rstrip(b"\0").decode(errors="replace"), DTYPE_NAMES[dt],
                                   tuple(shape[:rank]), ROLES[role], off, pad, coff, cbytes))
    pool = _decode_pool(data, pos, pos + pool_len, n_t)
    pos += pool_len
    code = []
    for i in range(n_words):
        word = data[pos + i * isa.WORD_BYTES: pos + (i + 1) * isa.WORD_BYTES]
        opcode, wait, signal = isa.HEADER.unpack_from(word)
        defn = isa.BY_OPCODE.get(opcode)
        if defn is None:
            raise BinaryError(f"instruction {i}: unknown opcode 0x{opcode:02x}")
        values = defn.struct.unpack_from(word, isa.HEADER.size)
        args = []
        for (name, kind), v in zip(defn.fields, values):
            if kind in isa.OPERAND_KINDS:
                want = {"view": View, "view?": View, "box": Box, "bound": Bound}[kind]
                if v == isa.NONE_OPERAND and kind == "view?":
                    v = None
                elif v >= len(pool) or not isinstance(pool[v], want):
                    raise BinaryError(f"instruction {i} ({defn.mnemonic}): bad operand reference {v}")
                else:
                    v = pool[v]
            args.append((name, v))
        code.append(isa.Instruction(defn.mnemonic, tuple(args), isa.mask_queues(wait), isa.mask_queues(signal)))
    pos += n_words * isa.WORD_BYTES
    return Binary(tname.rstrip(b"\0").decode(errors="replace"), thash, tuple(tensors), tuple(code), dram,
                  bytes(data[pos:pos + const_len]))


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
    lines = ["; tensorgen microcode", f".target {binary.target_name} {binary.target_hash.hex()}",
             f".dram {binary.dram_bytes}"]
    for t in binary.tensors:
        shape = "x".join(map(str, t.shape))
        extra = f" const={t.const_offset}+{t.const_bytes}" if t.role == "const" else ""
        lines.append(f".tensor {t.name} {t.dtype} {shape} {t.role} dram={t.dram_offset} pad={t.pad}{extra}")
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


def assemble(text: str, constants: bytes = b"") -> Binary:
    """Parse assembly text (as `disassemble` prints it) back into a Binary."""
    target, thash, dram, tensors, code = None, b"", 0, [], []
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.split(";", 1)[0].strip()
        if not line:
            continue
        try:
            words = line.split()
            if words[0] == ".target":
                target, thash = words[1], bytes.fromhex(words[2])
            elif words[0] == ".dram":
                dram = int(words[1])
            elif words[0] == ".tensor":
                name, dtype, shape, role = words[1:5]
                if dtype not in DTYPE_CODES or role not in ROLES:
                    raise ValueError(f"unknown dtype '{dtype}' or role '{role}'")
                kv = dict(w.split("=", 1) for w in words[5:])
                coff, cbytes = (int(x) for x in kv.get("const", "0+0").split("+"))
                tensors.append(TensorEntry(name, dtype, tuple(int(s) for s in shape.split("x")), role,
                                           int(kv["dram"]), int(kv.get("pad", 0)), coff, cbytes))
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
            raise ValueError(f"{label}= names unknown queue(s) {', '.join(sorted(bad))} (queues: LD, EX, ST)")
    if set(kv) != set(kinds):
        raise ValueError(f"{defn.mnemonic} takes fields {', '.join(kinds)}")
    args = tuple((n, _parse_field(kv[n], k, names)) for n, k in defn.fields)
    for (n, k), (_, v) in zip(defn.fields, args):
        if k in _RANGES and not _RANGES[k][0] <= v <= _RANGES[k][1]:
            raise ValueError(f"{defn.mnemonic} {n}={v} does not fit a {k}")
    return isa.Instruction(defn.mnemonic, args, tokens["wait"], tokens["signal"])


_RANGES = {"u8": (0, 2**8 - 1), "u16": (0, 2**16 - 1), "u32": (0, 2**32 - 1), "i32": (-(2**31), 2**31 - 1)}
