"""A .tgb is untrusted: what `decode` and `verify_binary` refuse, and what `encode` will not write.

Crafted files are made the way an attacker would: encoded with the encoder's own checks
bypassed (or patched byte by byte) and the checksum fixed afterwards, so that each test
reaches the check it is about, not the checksum.
"""

from __future__ import annotations

import dataclasses
import random
import struct
import zlib

import numpy as np
import pytest

from tensorgen.errors import BinaryError, TensorgenError
from tensorgen.mc import binary as binmod
from tensorgen.mc import isa
from tensorgen.mc.binary import Binary, TensorEntry, decode, encode
from tensorgen.mc.operands import Bound, Box, LoopAffine, View
from tensorgen.mc.verify import SimLimits, binary_target, verify_binary
from tensorgen.sim.machine import simulate
from tensorgen.target import load_target

TINY = load_target("tiny")
CRC_AT = 56  # docs/isa.md: the CRC-32 is the header's last u32 (60-byte header)


def fix_crc(data: bytes) -> bytes:
    out = bytearray(data)
    struct.pack_into("<I", out, CRC_AT, 0)
    struct.pack_into("<I", out, CRC_AT, zlib.crc32(out))
    return bytes(out)


def encode_unchecked(binary: Binary, monkeypatch) -> bytes:
    """`encode` without its name checks (what a hostile tool could write); checksum valid."""
    with monkeypatch.context() as m:
        m.setattr(binmod, "check_tensor_name", lambda name: None)
        m.setattr(binmod, "check_target_name", lambda name: None)
        return fix_crc(encode(binary))


def renamed(binary: Binary, old: str, new: str) -> Binary:
    tensors = tuple(
        dataclasses.replace(t, name=new) if t.name == old else t for t in binary.tensors
    )
    return dataclasses.replace(binary, tensors=tensors)


def inputs(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "A": rng.integers(-128, 128, (100, 37)).astype(np.int8),
        "B": rng.integers(-128, 128, (37, 53)).astype(np.int8),
    }


# --- integrity: the header is checksummed too ------------------------------------------------


def test_every_flipped_header_byte_is_caught(matmul_binary):
    data = matmul_binary[1]
    for pos in range(8, 60):  # after magic and version: name, hash, counts, DRAM size, CRC
        out = bytearray(data)
        out[pos] ^= 0x01
        with pytest.raises(BinaryError, match=r"checksum mismatch|truncated|trailing bytes"):
            decode(bytes(out))


# --- names: a tensor name is a file name, a target name is never a path ----------------------


@pytest.mark.parametrize(
    "name",
    [
        "../escape",
        "../../../../tmp/x",
        "/tmp/absolute",
        "a/b",
        ".hidden",
        "C\0x",
        "a..b",
        "1st",
        "",
    ],
)
def test_tensor_names_are_dotted_identifiers(matmul_binary, monkeypatch, name):
    data = encode_unchecked(renamed(matmul_binary[0], "C", name), monkeypatch)
    with pytest.raises(
        BinaryError,
        match=r"^corrupt tensor table \(tensor 2: tensor name .* is not a dotted "
        r"identifier of at most 32 bytes\)$",
    ):
        decode(data)


def test_tensor_name_not_utf8(matmul_binary):
    data = bytearray(matmul_binary[1])
    data[60] = 0xFF  # the first tensor's name
    with pytest.raises(
        BinaryError, match=r"^corrupt \.tgb file \(the name of tensor 0 is not UTF-8\)$"
    ):
        decode(fix_crc(bytes(data)))


@pytest.mark.parametrize("name", ["conv1.weight", "L12.x", "x_1", "ä"])
def test_dotted_and_unicode_identifiers_round_trip(matmul_binary, name):
    b = renamed(matmul_binary[0], "C", name)
    assert decode(encode(b)) == b


@pytest.mark.parametrize("name", ["../tg1", "/etc/passwd", "tiny.yaml", "x/y", ""])
def test_target_name_is_never_a_path(matmul_binary, monkeypatch, name):
    data = encode_unchecked(dataclasses.replace(matmul_binary[0], target_name=name), monkeypatch)
    with pytest.raises(BinaryError, match=r"^target name .* is not a name of at most 16 letters"):
        decode(data)


def test_unknown_target_name_is_not_looked_up_as_a_file(matmul_binary):
    b = dataclasses.replace(matmul_binary[0], target_name="tg9")
    with pytest.raises(
        BinaryError,
        match=r"^binary was built for target 'tg9', which is not a built-in target "
        r"\(built in: .*tiny.*\); give its description with `tensorgen run "
        r"--target FILE\.yaml`$",
    ):
        binary_target(decode(encode(b)))


def test_target_hash_mismatch_names_both(matmul_binary):
    b = dataclasses.replace(matmul_binary[0], target_hash=b"\1" * 8)
    with pytest.raises(
        BinaryError,
        match=rf"^binary was built for target 'tiny' with other parameters \(hash "
        rf"0101010101010101\); this target 'tiny' has hash {TINY.hash.hex()}$",
    ):
        verify_binary(b, TINY)
    with pytest.raises(BinaryError, match=r"this target 'tg1' has hash"):
        verify_binary(matmul_binary[0], load_target("tg1"))


def test_duplicate_tensor_names(matmul_binary):
    with pytest.raises(BinaryError, match=r"^tensor A is declared twice$"):
        verify_binary(renamed(matmul_binary[0], "B", "A"), TINY)


# --- tensors: extents inside the DRAM image, constants inside the file -----------------------


def with_tensor(b: Binary, name: str, **changes) -> Binary:
    return dataclasses.replace(
        b,
        tensors=tuple(
            dataclasses.replace(t, **changes) if t.name == name else t for t in b.tensors
        ),
    )


@pytest.mark.parametrize(
    "changes, reason",
    [
        pytest.param(
            {"shape": (10**6, 10**6)},
            r"tensor C \(int32 \[1000000, 1000000\], 4,000,000,000,000 bytes at "
            r"DRAM offset [\d,]+\) lies outside the DRAM image",
            id="1e12-elements",
        ),
        pytest.param(
            {"shape": (2**32 - 1,) * 6}, r"lies outside the DRAM image", id="shape-product-2**192"
        ),
        pytest.param(
            {"dram_offset": 2**63 - 8}, r"lies outside the DRAM image", id="offset-near-2**63"
        ),
        pytest.param({"dram_offset": 2}, r"not aligned", id="misaligned"),
        pytest.param({"pad": 300, "dtype": "int8"}, r"pad value 300 is outside int8", id="pad"),
        pytest.param(
            {"role": "const", "const_bytes": 8}, r"constant bytes", id="const-outside-file"
        ),
    ],
)
def test_tensor_table_ranges(matmul_binary, changes, reason):
    b = decode(
        encode(with_tensor(matmul_binary[0], "C", **changes))
    )  # each field fits its encoding
    with pytest.raises(BinaryError, match=reason):
        verify_binary(b, TINY)


def test_dram_image_over_the_limit(matmul_binary):
    b = dataclasses.replace(matmul_binary[0], dram_bytes=2**62)
    with pytest.raises(
        BinaryError,
        match=r"^the DRAM image of [\d,]+ bytes is over the limit of 1,073,741,824 "
        r"\(SimLimits\.dram_bytes\)$",
    ):
        verify_binary(decode(encode(b)), TINY)
    verify_binary(matmul_binary[0], TINY, SimLimits(dram_bytes=matmul_binary[0].dram_bytes))


# --- the encoder: a value that does not fit is named, never a struct.error --------------------

SPAD = View("spad", "int32", LoopAffine.make(0), (4,), (1,))


def program(*code: isa.Instruction) -> Binary:
    t = TensorEntry("X", "int32", (4,), "input", 0)
    return Binary("tiny", TINY.hash, (t,), tuple(code), 16)


@pytest.mark.parametrize(
    "ins, reason",
    [
        pytest.param(
            isa.make("VADD", dst=SPAD, a=SPAD, imm=2**40),
            r"instruction 0 \(VADD\): field imm=1099511627776 "
            r"does not fit a i32",
            id="i32",
        ),
        pytest.param(
            isa.make("VADD", dst=SPAD, a=SPAD, imm=-(2**31) - 1),
            r"field imm=-2147483649 does not fit",
            id="i32-negative",
        ),
        pytest.param(
            isa.make("LOOP", count=2**32, body=0),
            r"instruction 0 \(LOOP\): field count=4294967296 does not "
            r"fit a u32",
            id="u32",
        ),
        pytest.param(
            isa.make("LOOP", count=1, body=-1), r"field body=-1 does not fit a u16", id="u16"
        ),
        pytest.param(
            isa.make("SYNC", queue=256),
            r"instruction 0 \(SYNC\): field queue=256 does not fit a u8",
            id="u8",
        ),
        pytest.param(
            isa.make("VREQUANT", dst=SPAD, a=SPAD, scale=1e39, zp=0, lo=0, hi=1),
            r"field scale=1e\+39 is not a finite f32",
            id="f32-overflow",
        ),
        pytest.param(
            isa.make("VREQUANT", dst=SPAD, a=SPAD, scale=float("nan"), zp=0, lo=0, hi=1),
            r"field scale=nan is not a finite f32",
            id="f32-nan",
        ),
        pytest.param(
            isa.make("VFILL", dst=View("spad", "int32", LoopAffine.make(0), (4,), (2**70,)), imm=0),
            r"^operand spad:int32@0\[4:1180591620717411303424\]: a shape, stride, offset or coefficient "
            r"does not fit",
            id="stride-2**70",
        ),
        pytest.param(
            isa.make("VFILL", dst=View("spad", "int32", LoopAffine.make(2**64), (4,), (1,)), imm=0),
            r"^operand .*: a shape, stride, offset or coefficient does not fit",
            id="offset-2**64",
        ),
        pytest.param(
            isa.make("VFILL", dst=View("spad", "int32", LoopAffine.make(0), (2**32,), (1,)), imm=0),
            r"does not fit",
            id="extent-2**32",
        ),
    ],
)
def test_encode_names_the_field_out_of_range(ins, reason):
    with pytest.raises(BinaryError, match=reason):
        encode(program(ins))


def test_encode_refuses_names_it_would_truncate(matmul_binary):
    with pytest.raises(BinaryError, match=r"tensor name 'x{33}' is not a dotted identifier"):
        encode(renamed(matmul_binary[0], "C", "x" * 33))
    with pytest.raises(BinaryError, match=r"target name 'a_target_name_longer' is not a name"):
        encode(dataclasses.replace(matmul_binary[0], target_name="a_target_name_longer"))


# --- operands, queues, tokens and structure: refused before they run -------------------------


@pytest.mark.parametrize(
    "code, reason",
    [
        pytest.param(
            [
                isa.make(
                    "VFILL", dst=View("spad", "int32", LoopAffine.make(0), (4,), (-(2**40),)), imm=0
                )
            ],
            r"instruction 0 \(VFILL\): dst has strides \[-1099511627776\] beyond its memory",
            id="stride",
        ),
        pytest.param(
            [
                isa.make(
                    "VFILL",
                    dst=View("spad", "int32", LoopAffine.make(0, (0, 0, 1)), (4,), (1,)),
                    imm=0,
                )
            ],
            r"instruction 0 \(VFILL\): dst's base uses loop counter L2 inside 0 loop\(s\)",
            id="counter",
        ),
        pytest.param(
            [
                isa.make(
                    "VFILL", dst=View("spad", "int32", LoopAffine.make(2**50), (4,), (1,)), imm=0
                )
            ],
            r"dst's base has a constant or coefficient beyond",
            id="offset",
        ),
        pytest.param(
            [
                isa.make(
                    "VFILL",
                    dst=View("spad", "int32", LoopAffine.make(0), (2**20, 2**20), (0, 0)),
                    imm=0,
                )
            ],
            r"dst has shape \[1048576, 1048576\]",
            id="broadcast-10**12",
        ),
        pytest.param(
            [isa.make("LOAD", dst=SPAD, src=Box(0, (LoopAffine.make(0),) * 2, (2, 2)))],
            r"instruction 0 \(LOAD\): box of X has rank 2, the tensor 1",
            id="box-rank",
        ),
        pytest.param(
            [isa.make("SYNC", queue=3)],
            r"instruction 0 \(SYNC\): queue 3 does not exist",
            id="queue",
        ),
        pytest.param(
            [isa.make("VFILL", dst=SPAD, imm=0).with_tokens(signal={"EX"})],
            r"instruction 0 \(VFILL\): a token from EX to itself",
            id="token-to-itself",
        ),
        pytest.param(
            [
                isa.make("LOOP", count=2, body=1).with_tokens(wait={"LD"}),
                isa.make("VFILL", dst=SPAD, imm=0),
            ],
            r"instruction 0 \(LOOP\): the sequencer takes no tokens",
            id="loop-tokens",
        ),
        pytest.param(
            [isa.make("LOOP", count=2, body=5), isa.make("VFILL", dst=SPAD, imm=0)],
            r"instruction 0 \(LOOP\): body of 5 instructions leaves its enclosing block",
            id="body",
        ),
        pytest.param(
            [isa.make("LOOP", count=1, body=9 - i) for i in range(9)]
            + [isa.make("VFILL", dst=SPAD, imm=0)],
            r"instruction 8 \(LOOP\): loops nest deeper than 8",
            id="depth",
        ),
        pytest.param(
            [isa.make("IF", cond=Bound(()), body=99 - i) for i in range(99)]
            + [isa.make("SYNC", queue=1)],
            r"instruction 64 \(IF\): .* blocks deeper than 64",
            id="if-depth",
        ),
        pytest.param(
            [
                isa.make("LOOPB", lower=Bound(()), upper=Bound(((LoopAffine.make(3), 1),)), body=1),
                isa.make("VFILL", dst=SPAD, imm=0),
            ],
            r"instruction 0 \(LOOPB\): lower has no terms",
            id="bound",
        ),
        pytest.param(
            [
                isa.make(
                    "MATMUL",
                    acc=View("acc", "int32", LoopAffine.make(0), (2, 2), (2, 1)),
                    a=View("spad", "int8", LoopAffine.make(0), (2, 3), (3, 1)),
                    b=View("spad", "int8", LoopAffine.make(8), (2, 2), (2, 1)),
                )
            ],
            r"instruction 0 \(MATMUL\): shapes acc \[2, 2\], a \[2, 3\], b \[2, 2\] do not make",
            id="matmul",
        ),
    ],
)
def test_verify_names_the_instruction(code, reason):
    b = program(*code)
    decoded = decode(encode(b))  # every one of them encodes: only the verifier can refuse it
    with pytest.raises(BinaryError, match=reason):
        verify_binary(decoded, TINY)
    with pytest.raises(BinaryError, match=reason):  # and the simulator never runs it unverified
        simulate(decoded, {"X": np.zeros(4, np.int32)}, TINY)


def test_the_static_count_is_the_simulated_count(matmul_binary):
    b = matmul_binary[0]
    assert verify_binary(b, TINY) == simulate(b, inputs(), TINY).stats.instructions


def test_any_corruption_behind_a_valid_checksum_never_crashes_the_simulator(matmul_binary):
    """Sampled bytes of the pool and the code, changed with the checksum fixed: decode, verify
    and simulation raise a TensorgenError (one line) or run; nothing else."""
    data = matmul_binary[1]
    rng = random.Random(3)
    for pos in rng.sample(range(60, len(data)), 150):
        corrupt = bytearray(data)
        corrupt[pos] = rng.choice([0x00, 0xFF, corrupt[pos] ^ 0x80, rng.randrange(256)])
        try:
            simulate(
                decode(fix_crc(bytes(corrupt))), inputs(), TINY, limits=SimLimits(max_steps=20_000)
            )
        except TensorgenError as err:
            assert "\n" not in str(err)
