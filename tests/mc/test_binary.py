"""The .tgb container: round trips, and refusal of truncated, corrupt, foreign or newer files.

A .tgb that is not exactly what `encode` wrote must be refused with one line that
names the file, by `decode` and by every command that reads one, and never half-run.
Files are taken apart with the layout docs/isa.md documents, not with binary.py's own
structs, so that a change of layout has to change the documentation too.
"""

from __future__ import annotations

import contextlib
import dataclasses
import random
import re
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest

from tensorgen.driver import compile_file
from tensorgen.errors import BinaryError
from tensorgen.mc import isa
from tensorgen.mc.binary import Binary, TensorEntry, assemble, decode, disassemble, encode

EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "examples").glob("*.yaml"))

# docs/isa.md: magic, version u16, reserved u16, target name 16s, target hash 8s, then u32
# tensor count, pool bytes, code words, constant bytes; u64 DRAM bytes; u32 CRC-32 of the whole
# file with this field read as zero (version 2: the header is covered too).
HEADER = struct.Struct("<4sHH16s8sIIIIQI")
HEADER_FIELDS = "magic version reserved target hash tensors pool code_words const_bytes dram crc"
VERSION_AT = 4  # byte offset of the version field
TENSOR_ENTRY = 88  # bytes; the dtype code follows a 32-byte name
PNG_HEADER = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR"


def header(data: bytes) -> dict:
    return dict(zip(HEADER_FIELDS.split(), HEADER.unpack_from(data), strict=False))


def code_section(data: bytes) -> slice:
    h = header(data)
    end = len(data) - h["const_bytes"]
    return slice(end - h["code_words"] * isa.WORD_BYTES, end)


def with_crc(data: bytearray) -> bytes:
    """`data` with its checksum recomputed: corruption that the CRC alone cannot catch."""
    data = bytearray(data)
    struct.pack_into("<I", data, HEADER.size - 4, 0)
    struct.pack_into("<I", data, HEADER.size - 4, zlib.crc32(data))
    return bytes(data)


def flip(data: bytes, pos: int) -> bytes:
    out = bytearray(data)
    out[pos] ^= 0xFF
    return bytes(out)


def with_version(data: bytes, version: int) -> bytes:
    """`data` claiming another format version, with a checksum that matches (as a file that
    really is of that version would have), so that the version check is what refuses it."""
    out = bytearray(data)
    struct.pack_into("<H", out, VERSION_AT, version)
    return with_crc(out)


def test_header_is_as_documented(matmul_binary):
    binary, data = matmul_binary
    h = header(data)
    assert HEADER.size == 60
    assert (h["magic"], h["version"], h["tensors"]) == (b"TGB\x1a", 2, len(binary.tensors))
    assert h["code_words"] == len(binary.code)
    assert h["target"].rstrip(b"\0") == b"tiny"
    assert code_section(data).start == HEADER.size + TENSOR_ENTRY * h["tensors"] + h["pool"]


# --- round trips ---------------------------------------------------------------------------


@pytest.fixture(scope="module", params=EXAMPLES, ids=lambda p: p.stem)
def example_binary(request) -> Binary:
    return compile_file(request.param, "tiny").compiled.binary


def test_examples_are_found():
    assert len(EXAMPLES) >= 8


def test_decode_inverts_encode(example_binary):
    assert decode(encode(example_binary)) == example_binary


def test_assemble_inverts_disassemble(example_binary):
    b = example_binary
    text = disassemble(b)
    assert encode(assemble(text, b.constants)) == encode(b)
    assert assemble(text, b.constants) == b
    assert disassemble(decode(encode(b))) == text


def test_round_trip_keeps_constants_and_const_tensors(matmul_binary):
    """No example has weights baked in, so add a constant tensor by hand."""
    b, _ = matmul_binary
    weights = bytes(range(256)) * 2 + b"\x7f\x80"
    const = TensorEntry("K", "int8", (2, 257), "const", b.dram_bytes, 0, 0, len(weights))
    b = dataclasses.replace(
        b, tensors=b.tensors + (const,), constants=weights, dram_bytes=b.dram_bytes + const.nbytes
    )
    assert decode(encode(b)) == b
    assert encode(assemble(disassemble(b), b.constants)) == encode(b)
    assert ".tensor K int8 2x257 const" in disassemble(b)


# --- decode refuses bad files ----------------------------------------------------------------

TOO_SHORT = r"not a \.tgb file \(too short for a header\)"


@pytest.mark.parametrize(
    "cut",
    [
        "empty",
        "inside-header",
        "header-only",
        "inside-tensor-table",
        "inside-code",
        "last-byte-missing",
    ],
)
def test_truncated(matmul_binary, cut):
    whole = matmul_binary[1]
    end = {
        "empty": 0,
        "inside-header": HEADER.size - 1,
        "header-only": HEADER.size,
        "inside-tensor-table": HEADER.size + 10,
        "inside-code": code_section(whole).start + 5,
        "last-byte-missing": len(whole) - 1,
    }[cut]
    promise = rf"truncated \.tgb file \({end} bytes, header promises {len(whole)}\)"
    with pytest.raises(BinaryError, match=rf"^({TOO_SHORT}|{promise})$"):
        decode(whole[:end])


def test_flipped_byte_in_code_is_a_checksum_mismatch(matmul_binary):
    data = matmul_binary[1]
    code = code_section(data)
    for pos in (code.start, (code.start + code.stop) // 2, code.stop - 1):
        with pytest.raises(BinaryError, match=r"^corrupt \.tgb file \(checksum mismatch\)$"):
            decode(flip(data, pos))


def test_every_flipped_byte_after_the_header_is_caught(matmul_binary):
    data = matmul_binary[1]
    for pos in range(HEADER.size, len(data)):
        with pytest.raises(BinaryError, match="checksum mismatch"):
            decode(flip(data, pos))


def test_trailing_bytes(matmul_binary):
    with pytest.raises(BinaryError, match=r"^corrupt \.tgb file \(3 trailing bytes\)$"):
        decode(matmul_binary[1] + b"\0\0\0")


@pytest.mark.parametrize(
    "foreign",
    [
        pytest.param(PNG_HEADER + bytes(200), id="png"),
        pytest.param(random.Random(0).randbytes(2000), id="random-bytes"),
        pytest.param(b"tensorgen: 1\nname: op\ntensors: {}\nstatements: []\n" * 3, id="op-yaml"),
        pytest.param(b"\x7fELF\x02\x01\x01" + bytes(100), id="elf"),
    ],
)
def test_foreign_file(foreign):
    with pytest.raises(BinaryError, match=r"^not a \.tgb file \(bad magic\)$"):
        decode(foreign)


@pytest.mark.parametrize("version", [0, 1, 3, 0xFFFF])
def test_other_version(matmul_binary, version):
    expected = rf"^unsupported \.tgb version {version} \(this tool reads version 2\)$"
    with pytest.raises(BinaryError, match=expected):
        decode(with_version(matmul_binary[1], version))


def test_unknown_opcode_behind_a_valid_checksum(matmul_binary):
    data = bytearray(matmul_binary[1])
    used = {d.opcode for d in isa.INSTRUCTIONS}
    # the opcode is the first byte of an instruction word
    data[code_section(data).start] = next(op for op in range(255, 0, -1) if op not in used)
    with pytest.raises(BinaryError, match=r"^instruction 0: unknown opcode 0x[0-9a-f]{2}$"):
        decode(with_crc(data))


def test_corrupt_tensor_table_behind_a_valid_checksum(matmul_binary):
    data = bytearray(matmul_binary[1])
    data[HEADER.size + 32] = 0xEE  # the first tensor's dtype code
    with pytest.raises(BinaryError, match=r"^corrupt tensor table$"):
        decode(with_crc(data))


def test_any_corruption_behind_a_valid_checksum_is_refused_or_decodes(matmul_binary):
    """The checksum is not a parser: every field must still be checked.

    Each byte after the header is changed in turn and the checksum made to match: decode
    (and disassembly of what it returns) must raise BinaryError or succeed, never crash.
    """
    data = matmul_binary[1]
    rng = random.Random(1)
    for pos in range(HEADER.size, len(data)):
        corrupt = bytearray(data)
        corrupt[pos] = rng.choice([0x00, 0xFF, corrupt[pos] ^ 0x80, rng.randrange(256)])
        with contextlib.suppress(BinaryError):
            disassemble(decode(with_crc(corrupt)))


# --- the commands that read a .tgb refuse it with one line naming the file -------------------

REASONS = {
    "truncated": r"truncated \.tgb file",
    "corrupt": r"corrupt \.tgb file \(checksum mismatch\)",
    "png": r"not a \.tgb file \(bad magic\)",
    "random": r"not a \.tgb file \(bad magic\)",
    "empty": TOO_SHORT,
    "version": r"unsupported \.tgb version 1 \(this tool reads version 2\)",
}


def bad_file(data: bytes, kind: str) -> bytes:
    return {
        "truncated": lambda: data[: len(data) // 2],
        "corrupt": lambda: flip(data, code_section(data).start + 3),
        "png": lambda: PNG_HEADER + bytes(100),
        "random": lambda: random.Random(2).randbytes(500),
        "empty": lambda: b"",
        "version": lambda: with_version(data, 1),
    }[kind]()


@pytest.mark.parametrize("kind", sorted(REASONS))
def test_run_refuses_and_writes_nothing(tmp_path, cli, matmul_binary, kind):
    bad = tmp_path / f"{kind}.tgb"
    bad.write_bytes(bad_file(matmul_binary[1], kind))
    np.save(tmp_path / "a.npy", np.zeros((100, 37), np.int8))
    np.save(tmp_path / "b.npy", np.zeros((37, 53), np.int8))

    result = cli(
        "run",
        bad,
        "--in",
        f"A={tmp_path / 'a.npy'}",
        "--in",
        f"B={tmp_path / 'b.npy'}",
        "--out",
        tmp_path / "out",
    )

    message = result.one_error()
    assert re.fullmatch(rf"{re.escape(str(bad))}: {REASONS[kind]}.*", message), message
    assert result.out == ""
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("kind", sorted(REASONS))
def test_disasm_refuses(tmp_path, cli, matmul_binary, kind):
    bad = tmp_path / f"{kind}.tgb"
    bad.write_bytes(bad_file(matmul_binary[1], kind))
    result = cli("disasm", bad)
    assert re.fullmatch(rf"{re.escape(str(bad))}: {REASONS[kind]}.*", result.one_error())
    assert result.out == ""


@pytest.mark.parametrize("command", ["run", "disasm"])
def test_missing_binary(tmp_path, cli, command):
    path = tmp_path / "nope.tgb"
    extra = ["--out", tmp_path / "out"] if command == "run" else []
    message = cli(command, path, *extra).one_error()
    assert message == f"{path}: cannot read (No such file or directory)"
    assert not (tmp_path / "out").exists()


# --- the assembler names the line at fault ---------------------------------------------------


def mutate_first(text: str, pattern: str, replace) -> tuple[str, int]:
    """Apply `replace` to the first match of `pattern`; return (new text, its 1-based line).

    Operands are found by pattern, not spelled out, so that a better schedule for the
    example does not break these tests.
    """
    m = re.search(pattern, text, re.MULTILINE)
    assert m, f"no {pattern} in the disassembly"
    return text[: m.start()] + replace(m) + text[m.end() :], text[: m.start()].count("\n") + 1


INSTRUCTION = r"^    (\w+)( .*)?$"  # the first instruction line (instructions are indented)
VIEW = r"=(spad|acc):(int8|uint8|int32)@"
BOX = r"=([A-Za-z_]\w*)\(([^()]*),([^(),]*)\)\["
FIELD = r"^(    \w+ .*?)\b(\w+)=(\d+)\b"  # the first integer field of an instruction


@pytest.mark.parametrize(
    "pattern, replace, reason",
    [
        pytest.param(
            INSTRUCTION,
            lambda m: f"    FROB{m[2] or ''}",
            r"unknown mnemonic FROB",
            id="unknown-mnemonic",
        ),
        pytest.param(
            INSTRUCTION,
            lambda m: f"    {m[1]}{m[2] or ''} bogus=1",
            r"takes fields",
            id="extra-field",
        ),
        pytest.param(INSTRUCTION, lambda m: f"    {m[1]}", r"takes fields", id="no-fields"),
        pytest.param(
            INSTRUCTION, lambda m: f"    {m[1]}{m[2] or ''} wait", r"", id="word-without-="
        ),
        pytest.param(
            FIELD, lambda m: f"{m[1]}{m[2]}=twelve", r"invalid literal", id="integer-field-word"
        ),
        pytest.param(
            VIEW, lambda m: f"=sram:{m[2]}@", r"bad view 'sram:", id="view-unknown-memory"
        ),
        pytest.param(
            VIEW, lambda m: f"={m[1]}:float@", r"bad view '\w+:float@", id="view-unknown-dtype"
        ),
        pytest.param(
            BOX, lambda m: f"=Nope({m[2]},{m[3]})[", r"bad box 'Nope\(", id="box-unknown-tensor"
        ),
        pytest.param(
            BOX,
            lambda m: f"={m[1]}({m[2]})[",
            r"origin and shape differ in rank",
            id="box-wrong-rank",
        ),
    ],
)
def test_bad_instruction_names_the_line(matmul_binary, pattern, replace, reason):
    text, lineno = mutate_first(disassemble(matmul_binary[0]), pattern, replace)
    bad_line = re.escape(text.splitlines()[lineno - 1].strip())
    expected = rf"^line {lineno}: cannot assemble '{bad_line}' \(.*{reason}.*\)$"
    with pytest.raises(BinaryError, match=expected):
        assemble(text)


@pytest.mark.parametrize(
    "directive, reason",
    [
        (".tensor A int8 100x37 input pad=0", r"'dram'"),
        (".tensor A int8 100xx37 input dram=0", r"invalid literal"),
        (".dram lots", r"invalid literal"),
        (".target tiny not-hex", r"non-hexadecimal"),
    ],
)
def test_bad_directive_names_the_line(directive, reason):
    text = "; a comment\n.target tiny 00\n\n" + directive + "\n"
    expected = rf"^line 4: cannot assemble '{re.escape(directive)}' \(.*{reason}.*\)$"
    with pytest.raises(BinaryError, match=expected):
        assemble(text)


def test_assembly_without_target():
    with pytest.raises(BinaryError, match=r"^line 1: missing '\.target NAME HASH'$"):
        assemble("; nothing but a comment\n.dram 16\n")


# The assembler range-checks fields, queues, dtypes and roles, so a bad value is refused on its
# line instead of crashing the encoder.
@pytest.mark.parametrize(
    "pattern, replace",
    [
        pytest.param(r"\bcount=\d+", lambda m: "count=99999999999", id="u32-field-too-big"),
        pytest.param(r"\bcount=\d+", lambda m: "count=-1", id="u32-field-negative"),
        pytest.param(r"\b(wait|signal)=\w+", lambda m: f"{m[1]}=XX", id="unknown-queue"),
        pytest.param(r"\.tensor (\w+) int8", lambda m: f".tensor {m[1]} float", id="unknown-dtype"),
        pytest.param(r" input dram=", lambda m: " banana dram=", id="unknown-role"),
    ],
)
def test_out_of_range_assembly_names_the_line(matmul_binary, pattern, replace):
    text, lineno = mutate_first(disassemble(matmul_binary[0]), pattern, replace)
    try:
        encode(assemble(text))
    except BinaryError as err:
        assert str(err).startswith(f"line {lineno}: ")
        return
    raise AssertionError("accepted")


@pytest.mark.parametrize(
    "directive, reason",
    [
        (".target ../tiny 00", r"target name '\.\./tiny' is not a name"),
        (".tensor ../A int8 4 input dram=0", r"tensor name '\.\./A' is not a dotted identifier"),
    ],
)
def test_assembler_refuses_names_that_are_paths(directive, reason):
    text = ".target tiny 00\n" + directive + "\n"
    with pytest.raises(
        BinaryError, match=rf"^line 2: cannot assemble '{re.escape(directive)}' \(.*{reason}.*\)$"
    ):
        assemble(text)
