"""Fuzz cases over binaries: mutated .tgb files (bytes, header fields, tensor table, operand pool,
instruction words) run or disassembled, and `tensorgen run` with mutated `--in` arrays.

The bases are examples compiled by tensorgen itself (`encode`), with valid inputs; most mutations
recompute the CRC, so that they reach the decoder and the simulator instead of stopping at the
checksum, as a crafted file would.
"""

from __future__ import annotations

import io
import pickle
import random
import struct
import zlib
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import numpy as np

from tensorgen.mc.binary import HEADER as _HEADER
from tensorgen.mc.binary import TENSOR_RECORD as _TENSOR

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
BASES = (
    ("matmul_odd", "tiny"),
    ("prefix_sum", "tg1"),
    ("rnn_cell", "tiny"),
    ("conv_bias_relu_requant", "tiny"),
    ("jacobi1d", "tg1"),
)
WORD = 32
INTERESTING = (
    0,
    1,
    2,
    7,
    0x7F,
    0x80,
    0xFF,
    0x100,
    0x7FFF,
    0xFFFF,
    0x7FFFFFFF,
    0x80000000,
    0xFFFFFFFF,
    2**40,
    2**62,
    2**63 - 1,
    2**63,
    2**64 - 1,
)


@dataclass(frozen=True)
class Base:
    name: str
    tgb: bytes
    inputs: tuple[tuple[str, bytes], ...]  # tensor name -> .npy bytes
    arrays: tuple[tuple[str, np.ndarray], ...]


def npy_bytes(a, allow_pickle: bool = False) -> bytes:
    buf = io.BytesIO()
    np.save(buf, a, allow_pickle=allow_pickle)
    return buf.getvalue()


@cache
def bases() -> tuple[Base, ...]:
    from tensorgen.driver import compile_file, random_inputs
    from tensorgen.mc.binary import encode

    out = []
    for name, target in BASES:
        job = compile_file(EXAMPLES / f"{name}.yaml", target)
        arrays = random_inputs(job.program, 1)
        out.append(
            Base(
                name,
                encode(job.compiled.binary),
                tuple((k, npy_bytes(v)) for k, v in arrays.items()),
                tuple(arrays.items()),
            )
        )
    return tuple(out)


def _with_crc(data: bytes) -> bytes:
    """`data` with its checksum made valid again, as whoever crafts a file would make it."""
    from tensorgen.mc import binary

    if len(data) < _HEADER.size:
        return data
    head = bytearray(data[: _HEADER.size])
    checksum = getattr(binary, "checksum", None)  # format 2 covers the header too
    crc = checksum(data) if checksum is not None else zlib.crc32(data[_HEADER.size :])
    struct.pack_into("<I", head, _HEADER.size - 4, crc)
    return bytes(head) + data[_HEADER.size :]


def _layout(data: bytes) -> dict[str, int]:
    _, _, _, _, _, n_t, pool_len, n_words, const_len, _, _ = _HEADER.unpack_from(data)
    tensors = _HEADER.size
    pool = tensors + n_t * _TENSOR.size
    code = pool + pool_len
    return {
        "n_t": n_t,
        "tensors": tensors,
        "pool": pool,
        "pool_len": pool_len,
        "code": code,
        "n_words": n_words,
        "consts": code + n_words * WORD,
        "const_len": const_len,
    }


def _put(data: bytearray, at: int, fmt: str, value: int) -> None:
    size = struct.calcsize("<" + fmt)
    if at + size <= len(data):
        mask = (1 << (8 * size)) - 1
        data[at : at + size] = (value & mask).to_bytes(size, "little", signed=False)


# Header fields: offset, format (little-endian), whether an accept of the change is suspicious.
HEADER_FIELDS = {
    "target-name": (8, "16s", True),
    "target-hash": (24, "8s", True),
    "n-tensors": (32, "I", True),
    "pool-bytes": (36, "I", True),
    "code-words": (40, "I", True),
    "const-bytes": (44, "I", True),
    "dram-bytes": (48, "Q", False),
    "version": (4, "H", True),
    "magic": (0, "4s", True),
}
NAMES = (
    b"tg1",
    b"tiny",
    b"",
    b"../tg1",
    b"/etc/passwd",
    b"tensorgen/x.yaml",
    b"x" * 16,
    b"\xff\xfe",
    b"TG1",
)


def _header_field(rng, data: bytearray) -> tuple[str, bool]:
    field = rng.choice(list(HEADER_FIELDS))
    at, fmt, suspicious = HEADER_FIELDS[field]
    old = bytes(data[at : at + struct.calcsize("<" + fmt)])
    if fmt == "16s":
        data[at : at + 16] = rng.choice(NAMES).ljust(16, b"\0")[:16]
    elif fmt in ("8s", "4s"):
        n = int(fmt[0])
        data[at : at + n] = bytes(rng.randrange(256) for _ in range(n))
    else:
        _put(
            data,
            at,
            fmt,
            rng.choice(
                INTERESTING + (struct.unpack_from("<" + fmt, data, at)[0] + rng.choice((-1, 1)),)
            ),
        )
    return f"header-{field}", suspicious and bytes(
        data[at : at + len(old)]
    ) != old  # an unchanged field is valid


def _tensor_field(rng, data: bytearray, forbidden: list[str]) -> str:
    lay = _layout(bytes(data))
    if lay["n_t"] == 0:
        return "tensor-none"
    at = lay["tensors"] + rng.randrange(lay["n_t"]) * _TENSOR.size
    field = rng.choice(
        (
            "name",
            "dtype",
            "role",
            "rank",
            "pad",
            "shape",
            "dram-offset",
            "const-offset",
            "const-bytes",
        )
    )
    if field == "name":
        sentinel = f"/tmp/tgfz-{rng.randrange(16**8):08x}"
        forbidden.extend((sentinel, sentinel + ".npy"))
        name = rng.choice(
            (
                b"../esc",
                b"../../esc",
                sentinel.encode(),
                b"",
                b"a/b",
                b"..",
                b".",
                b"x" * 32,
                b"\xff",
                b"C",
                b"A",
                b"a b",
                b"\x1b[31m",
            )
        )
        if at + 32 <= len(data):
            data[at : at + 32] = name.ljust(32, b"\0")
    elif field in ("dtype", "role", "rank"):
        _put(
            data,
            at + 32 + ("dtype", "role", "rank").index(field),
            "B",
            rng.choice((0, 1, 2, 3, 4, 5, 6, 7, 0x7F, 0xFF)),
        )
    elif field == "pad":
        _put(data, at + 36, "i", rng.choice((0, 1, -1, 2**31 - 1, -(2**31), 64)))
    elif field == "shape":
        _put(
            data,
            at + 40 + 4 * rng.randrange(6),
            "I",
            rng.choice(INTERESTING[:13] + (3, 1000, 10**6)),
        )
    else:
        off = {"dram-offset": 64, "const-offset": 72, "const-bytes": 80}[field]
        _put(data, at + off, "Q", rng.choice(INTERESTING))
    return f"tensor-{field}"


def _pool_field(rng, data: bytearray) -> str:
    lay = _layout(bytes(data))
    if lay["pool_len"] <= 4:
        return "pool-empty"
    at = lay["pool"] + rng.randrange(lay["pool_len"])
    fmt = rng.choice(("B", "H", "I", "q"))
    _put(data, at, fmt, rng.choice(INTERESTING))
    return "pool-field"


def _code_field(rng, data: bytearray) -> str:
    lay = _layout(bytes(data))
    if lay["n_words"] == 0:
        return "code-empty"
    at = lay["code"] + rng.randrange(lay["n_words"]) * WORD
    what = rng.choice(("opcode", "tokens", "field", "field"))
    if what == "opcode":
        _put(data, at, "B", rng.randrange(256))
    elif what == "tokens":
        _put(data, at + rng.choice((1, 2)), "B", rng.randrange(256))
    else:
        _put(
            data,
            at + 4 + rng.randrange(WORD - 4),
            rng.choice(("B", "H", "I", "q")),
            rng.choice(INTERESTING),
        )
    return f"code-{what}"


def _code_shuffle(rng, data: bytes) -> bytes:
    lay = _layout(data)
    words = [
        data[lay["code"] + i * WORD : lay["code"] + (i + 1) * WORD] for i in range(lay["n_words"])
    ]
    if not words:
        return data
    i, j = rng.randrange(len(words)), rng.randrange(len(words))
    op = rng.randrange(3)
    if op == 0:
        words[i], words[j] = words[j], words[i]
    elif op == 1 and len(words) > 1:
        del words[i]
    else:
        words.insert(i, words[j])
    head = bytearray(data[: _HEADER.size])
    struct.pack_into("<I", head, 40, len(words))
    return bytes(head) + data[_HEADER.size : lay["code"]] + b"".join(words) + data[lay["consts"] :]


TGB_MUTATORS = (
    "flip",
    "flip-crc",
    "truncate",
    "extend",
    "header",
    "tensor",
    "pool",
    "code",
    "shuffle",
)
RETARGET = ("header-target-name", "header-target-hash")  # header edits only `run` must refuse


def mutate_tgb(
    rng: random.Random, data: bytes, kinds: frozenset[str] | None
) -> tuple[bytes, tuple[str, ...], tuple[bool, bool], list[str]]:
    """(mutated bytes, mutators, (an accept is suspicious, the header names another target), paths
    that must not appear). One or two mutations; one that leaves the layout unreadable (or a bare
    flip, whose broken checksum a later mutation would repair) is the last."""
    ops = [k for k in TGB_MUTATORS if kinds is None or k in kinds]
    applied, suspicious, forbidden = [], False, []
    retarget = False  # the header names another target (or hash): only `run` must refuse that
    for _ in range(rng.choice((1, 1, 2))):
        op = rng.choice(ops)
        if op in ("flip", "flip-crc"):
            data, susp = _flip_bits(rng, data, op == "flip-crc")
            suspicious |= susp
            applied.append(op)
            if op == "flip":  # a later mutation would recompute the checksum the flip broke
                break
        elif op in ("truncate", "extend"):
            data, suspicious = _resize(rng, data, op), True
            applied.append(op)
            break  # the layout is gone: nothing to mutate field by field
        elif op == "shuffle":
            data = _with_crc(_code_shuffle(rng, data))
            applied.append("code-shuffle")
        else:
            data, name, susp = _edit_field(rng, data, op, forbidden)
            if name in RETARGET:
                retarget |= susp
            else:
                suspicious |= susp
            applied.append(name)
            if op == "header":  # the layout the other mutators read may be gone
                break
    return data, tuple(applied), (suspicious, retarget), forbidden


def _flip_bits(rng: random.Random, data: bytes, keep_crc: bool) -> tuple[bytes, bool]:
    """One to three random bits flipped: anywhere (the checksum then fails), or past the header
    with the checksum recomputed (`keep_crc`), so that the reader's own checks meet them.
    Suspicious if accepted: a flip in the checksummed file outside the DRAM size field."""
    buf = bytearray(data)
    lo = _HEADER.size if keep_crc else 0
    suspicious = False
    for _ in range(rng.randrange(1, 4)):
        at = rng.randrange(lo, len(buf))
        if not keep_crc and 6 <= at < 8:  # the reserved field: nobody reads it
            continue
        buf[at] ^= 1 << rng.randrange(8)
        suspicious |= not keep_crc and not 48 <= at < 56  # any DRAM size may be valid
    return (_with_crc(bytes(buf)) if keep_crc else bytes(buf)), suspicious


def _resize(rng: random.Random, data: bytes, op: str) -> bytes:
    """The file cut short ("truncate") or with bytes after its end ("extend")."""
    if op == "truncate":
        return data[: rng.randrange(len(data))]
    return data + rng.choice(
        (b"\0", b"\0" * 32, bytes(rng.randrange(256) for _ in range(rng.randrange(1, 64))))
    )


def _edit_field(
    rng: random.Random, data: bytes, op: str, forbidden: list[str]
) -> tuple[bytes, str, bool]:
    """One field of the header, the tensor table, the operand pool or a code word set to an
    interesting value, the checksum recomputed: (bytes, mutator, suspicious if accepted)."""
    buf = bytearray(data)
    suspicious = False
    if op == "header":
        name, suspicious = _header_field(rng, buf)
    elif op == "tensor":
        name = _tensor_field(rng, buf, forbidden)
    elif op == "pool":
        name = _pool_field(rng, buf)
    else:
        name = _code_field(rng, buf)
    return _with_crc(bytes(buf)), name, suspicious


def _run_argv(base: Base, names=None) -> tuple[str, ...]:
    args = ["run", "{d}/in/x.tgb"]
    for name, _ in base.inputs:
        if names is None or name in names:
            args += ["--in", f"{name}={{d}}/in/{name}.npy"]
    return (*args, "--out", "{d}/out/res")


def tgb_case(rng: random.Random, kinds: frozenset[str] | None = None):
    from tensorgen.testing.fuzz import Case

    base = rng.choice(bases())
    data, applied, (suspicious, retarget), forbidden = mutate_tgb(rng, base.tgb, kinds)
    argv = ("disasm", "{d}/in/x.tgb") if rng.random() < 0.2 else _run_argv(base)
    suspicious |= retarget and argv[0] == "run"
    files = (("in/x.tgb", data), *((f"in/{n}.npy", b) for n, b in base.inputs), ("out", "dir"))
    return Case("tgb", applied, argv, files, ("out/res",), suspicious, tuple(forbidden))


# --- --in arrays ------------------------------------------------------------------------------

DTYPES = (
    "float32",
    "float64",
    "int16",
    "int64",
    "uint8",
    "int8",
    "int32",
    "bool",
    "complex64",
    "float16",
    ">i4",
    "<U2",
    "S2",
    "V4",
    "datetime64[s]",
    "uint32",
)


def _npy_header(shape: tuple[int, ...], dtype: str = "<i4") -> bytes:
    head = repr({"descr": dtype, "fortran_order": False, "shape": shape}).encode()
    head += b" " * (63 - (len(head) + 10) % 64) + b"\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(head)) + head


def mutate_array(rng: random.Random, a: np.ndarray, kinds) -> tuple[bytes | str, str, bool]:
    """(file content or a special kind, mutator, accept is suspicious)."""
    ops = [k for k in ARRAY_MUTATORS if kinds is None or k in kinds] or ["dtype"]
    op = rng.choice(ops)
    content, suspicious = ARRAY_MUTATORS[op](rng, a)
    return content, op, suspicious


def _other_dtype(rng: random.Random, a: np.ndarray) -> tuple[bytes, bool]:
    """The array cast to another dtype (zeros of it when the values do not convert)."""
    dt = rng.choice(DTYPES)
    try:
        b = a.astype(dt)
    except (TypeError, ValueError):
        b = np.zeros(a.shape, dt)
    return npy_bytes(b), b.dtype != a.dtype


def _other_shape(rng: random.Random, a: np.ndarray) -> tuple[bytes, bool]:
    """The values in another shape: transposed, with a leading 1, flat, empty, scalar, larger."""
    shapes = [
        a.T.shape,
        (1, *a.shape),
        (a.size,),
        (0, *a.shape[1:]),
        (),
        tuple(s + 1 for s in a.shape),
    ]
    shape = rng.choice(shapes)
    return npy_bytes(np.resize(a, shape)), shape != a.shape


def _truncated(rng: random.Random, a: np.ndarray) -> tuple[bytes, bool]:
    raw = npy_bytes(a)
    return raw[: rng.randrange(len(raw))], True


def _header_lie(rng: random.Random, a: np.ndarray) -> tuple[bytes, bool]:
    """A header whose shape the data cannot hold (huge, negative, or four times too long)."""
    shape = rng.choice(
        ((10**12,), (2**62,), (2**31, 2**31), (-1,), (*a.shape[:-1], a.shape[-1] * 4))
    )
    return _npy_header(shape, a.dtype.str) + a.tobytes(), True


def _npz(rng: random.Random, a: np.ndarray) -> tuple[bytes, bool]:
    buf = io.BytesIO()
    np.savez(buf, x=a)
    return buf.getvalue(), True


# mutator -> (rng, the array) -> (file content, or "fifo" / "dir"; an accept is suspicious),
# in the order the seeds draw from
ARRAY_MUTATORS = {
    "dtype": _other_dtype,
    "shape": _other_shape,
    "fortran": lambda rng, a: (npy_bytes(np.asfortranarray(a)), False),
    "object": lambda rng, a: (npy_bytes(a.astype(object), allow_pickle=True), True),
    "pickle": lambda rng, a: (pickle.dumps(a.tolist()), True),
    "truncate": _truncated,
    "empty": lambda rng, a: (b"", True),
    "header-lie": _header_lie,
    "npz": _npz,
    "random-bytes": lambda rng, a: (
        bytes(rng.randrange(256) for _ in range(rng.randrange(1, 200))),
        True,
    ),
    "fifo": lambda rng, a: ("fifo", True),
    "dir": lambda rng, a: ("dir", True),
    "strided": lambda rng, a: (npy_bytes(a[::-1]), False),
}


def npy_case(rng: random.Random, kinds: frozenset[str] | None = None):
    from tensorgen.testing.fuzz import Case

    base = rng.choice(bases())
    files = dict((f"in/{n}.npy", b) for n, b in base.inputs)
    arrays = dict(base.arrays)
    argv_kinds = ("missing-input", "unknown-name", "duplicate", "no-equals")
    ops = [k for k in ("array",) + argv_kinds if kinds is None or k in kinds or k == "array"]
    op = rng.choice(ops if kinds is None or any(k in kinds for k in argv_kinds) else ["array"])
    argv = list(_run_argv(base))
    suspicious = True
    if op == "array":
        name = rng.choice(list(arrays))
        content, op, suspicious = mutate_array(rng, arrays[name], kinds)
        files[f"in/{name}.npy"] = content
    elif op == "missing-input":
        drop = rng.choice(list(arrays))
        argv = list(_run_argv(base, set(arrays) - {drop}))
    elif op == "unknown-name":
        argv[2:2] = [
            "--in",
            f"{rng.choice(('Z', 'a', '', '../x', 'A.B'))}={{d}}/in/{next(iter(arrays))}.npy",
        ]
    elif op == "duplicate":
        argv[2:2] = argv[2:4]
        suspicious = False
    else:
        argv[2:2] = ["--in", rng.choice(("A", "", "{d}/in/A.npy"))]
    files_t = (("in/x.tgb", base.tgb), *files.items(), ("out", "dir"))
    return Case("npy", (op,), tuple(argv), files_t, ("out/res",), suspicious)


@cache
def cli_files() -> tuple[tuple[str, bytes | str], ...]:
    """The files a random command line may name (under {d}/in)."""
    base = bases()[0]
    return (
        ("in/op.yaml", (EXAMPLES / "matmul_odd.yaml").read_bytes()),
        ("in/sched.py", (EXAMPLES.parent / "schedules" / "matmul_odd.py").read_bytes()),
        ("in/x.tgb", base.tgb),
        ("in/a.npy", dict(base.inputs)["A"]),
        ("in/b.npy", dict(base.inputs)["B"]),
        ("in/empty", b""),
        ("in/bad.yaml", b"a: [\n"),
        ("in/notmodel.py", b"x = 1\n"),
        ("in/m.pt2", b"PK\x03\x04garbage"),
        ("in/dir", "dir"),
        ("out", "dir"),
    )
