"""The `tensorgen` command line: happy paths, and bad input as exit 2 with one line.

Most tests call `tensorgen.cli.main` in-process (fast); a few run `python -m
tensorgen.cli` in a subprocess to show that no traceback reaches the terminal.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tensorgen.mc.binary import assemble, decode, disassemble

ROOT = Path(__file__).resolve().parent.parent
MATMUL = ROOT / "examples" / "matmul_odd.yaml"
A_SHAPE, B_SHAPE = (100, 37), (37, 53)  # matmul_odd: C[100, 53] += A[100, 37] * B[37, 53]


@pytest.fixture
def operands(tmp_path):
    """Random int8 A and B for matmul_odd, saved as .npy: (A, B, path of A, path of B)."""
    rng = np.random.default_rng(7)
    a = rng.integers(-128, 127, A_SHAPE, endpoint=True).astype(np.int8)
    b = rng.integers(-128, 127, B_SHAPE, endpoint=True).astype(np.int8)
    np.save(tmp_path / "a.npy", a)
    np.save(tmp_path / "b.npy", b)
    return a, b, tmp_path / "a.npy", tmp_path / "b.npy"


def run_args(tgb, a, b, out, *extra):
    """`run` arguments for matmul_odd with A and B from the given files."""
    return ("run", tgb, "--in", f"A={a}", "--in", f"B={b}", *extra, "--out", out)


# --- happy paths -----------------------------------------------------------------------------


def test_emit_writes_binary_and_assembly(tmp_path, cli):
    tgb, asm = tmp_path / "X.tgb", tmp_path / "X.s"

    result = cli("emit", MATMUL, "-o", tgb, "--asm", asm, "--target", "tiny")

    assert (result.code, result.err) == (0, "")
    assert result.out.startswith(f"{tgb}: ") and result.out.rstrip().endswith("target tiny")
    binary = decode(tgb.read_bytes())
    assert binary.target_name == "tiny"
    assert [(t.name, t.shape, t.role) for t in binary.tensors] == [
        ("A", A_SHAPE, "input"),
        ("B", B_SHAPE, "input"),
        ("C", (100, 53), "output"),
    ]
    text = asm.read_text()
    assert text == disassemble(binary)
    assert assemble(text, binary.constants) == binary  # the .s is the .tgb, readable
    assert sorted(p.name for p in tmp_path.iterdir()) == ["X.s", "X.tgb"]  # no temporaries


def test_run_computes_the_matmul(tmp_path, cli, operands):
    a, b, a_npy, b_npy = operands
    tgb, out = tmp_path / "X.tgb", tmp_path / "DIR"
    assert cli("emit", MATMUL, "-o", tgb, "--target", "tiny").code == 0

    result = cli(*run_args(tgb, a_npy, b_npy, out))

    assert (result.code, result.err) == (0, "")
    assert f"{out / 'C.npy'}: int32 [100, 53]" in result.out
    assert sorted(p.name for p in out.iterdir()) == ["C.npy"]
    c = np.load(out / "C.npy")
    assert c.dtype == np.int32 and c.shape == (100, 53)
    np.testing.assert_array_equal(c, a.astype(np.int32) @ b.astype(np.int32))


def test_check_is_bit_exact_on_every_trial(cli):
    result = cli("check", MATMUL, "--target", "tiny", "--trials", "2")

    assert (result.code, result.err) == (0, "")
    assert result.out.count("BIT-EXACT") == 2
    assert "trial 1 (seed 0): BIT-EXACT" in result.out
    assert "trial 2 (seed 1): BIT-EXACT" in result.out
    assert "cycles " in result.out and "MAC utilization" in result.out


def test_check_compares_with_the_default_schedule_within_a_budget(tmp_path, cli):
    small = cli("check", MATMUL, "--target", "tiny")
    # over channels 1..37 conv3x3_stride2's default runs 1.2M vector steps: simulating it beside
    # the chosen schedule took 18 of check's 19 s
    text = (MATMUL.parent / "conv3x3_stride2.yaml").read_text()
    op = tmp_path / "conv.yaml"
    stmt = "Y[n, k, h, w] += X[n, c, 2*h + r - 1, 2*w + s - 1] * W[k, c, r, s]"
    op.write_text(text.replace(stmt, f'{{stmt: "{stmt}", where: "1 <= c < 38"}}'))
    assert "where" in op.read_text()
    large = cli("check", op)

    assert (small.code, small.err) == (0, "")
    assert re.search(r"default schedule: cycles \d+  \(\d+\.\d\dx the cycles", small.out)
    assert (large.code, large.err) == (0, "")
    assert re.search(
        r"default schedule: not simulated \(it executes up to [\d,]+ instructions, over the "
        r"comparison's 250,000; --schedule default runs it\)",
        large.out,
    )


def test_disasm_prints_the_assembly(cli, matmul_tgb, matmul_binary):
    result = cli("disasm", matmul_tgb)
    assert (result.code, result.err) == (0, "")
    assert result.out == disassemble(matmul_binary[0])


def test_isa_doc(cli):
    result = cli("isa-doc")
    assert result.code == 0 and "MATMUL" in result.out


# --- run: bad inputs -------------------------------------------------------------------------


def test_run_missing_input(tmp_path, cli, matmul_tgb, operands):
    out = tmp_path / "DIR"
    message = cli("run", matmul_tgb, "--in", f"A={operands[2]}", "--out", out).one_error()
    assert message == "missing input tensor 'B' (int8, shape [37, 53])"
    assert not out.exists()


@pytest.mark.parametrize("shape", [(37, 100), (100, 37, 1), (100,)])
def test_run_wrong_shape(tmp_path, cli, matmul_tgb, operands, shape):
    np.save(tmp_path / "bad.npy", np.zeros(shape, np.int8))
    out = tmp_path / "DIR"
    message = cli(*run_args(matmul_tgb, tmp_path / "bad.npy", operands[3], out)).one_error()
    assert message == f"input 'A' has shape {list(shape)}, expected [100, 37]"
    assert not out.exists()


def test_run_values_outside_the_dtype(tmp_path, cli, matmul_tgb, operands):
    """A file of another width is refused by its dtype; an array given in-process may be any
    integer type, and then its values are checked."""
    from tensorgen.errors import SimulatorError
    from tensorgen.mc.binary import decode
    from tensorgen.sim.machine import simulate
    from tensorgen.target import load_target

    np.save(tmp_path / "big.npy", np.full(A_SHAPE, 300, np.int32))
    out = tmp_path / "DIR"
    message = cli(*run_args(matmul_tgb, tmp_path / "big.npy", operands[3], out)).one_error()
    assert message.startswith("input 'A' has dtype int32; expected int8 ")
    assert not out.exists()
    binary = decode(Path(matmul_tgb).read_bytes())
    with pytest.raises(SimulatorError, match="^input 'A' has values outside int8$"):
        simulate(
            binary, {"A": np.full(A_SHAPE, 300, np.int32), "B": operands[1]}, load_target("tiny")
        )


def test_run_unknown_input(tmp_path, cli, matmul_tgb, operands):
    _, _, a_npy, b_npy = operands
    out = tmp_path / "DIR"
    message = cli(*run_args(matmul_tgb, a_npy, b_npy, out, "--in", f"Z={a_npy}")).one_error()
    assert message == "unknown input tensor(s): Z"
    assert not out.exists()


@pytest.mark.parametrize(
    "content, reason",
    [
        pytest.param(None, "No such file or directory", id="missing"),
        pytest.param(b"", "No data left in file", id="empty"),
        pytest.param(b"A,B\n1,2\n", "", id="csv"),
        pytest.param("first 200 bytes", "", id="truncated"),
    ],
)
def test_run_unloadable_npy(tmp_path, cli, matmul_tgb, operands, content, reason):
    bad, out = tmp_path / "bad.npy", tmp_path / "DIR"
    if content == "first 200 bytes":
        content = operands[2].read_bytes()[:200]
    if content is not None:
        bad.write_bytes(content)
    message = cli(*run_args(matmul_tgb, bad, operands[3], out)).one_error()
    assert message.startswith(f"--in A={bad}: cannot load {bad} (") and reason in message
    assert not out.exists()


def test_run_in_without_name(tmp_path, cli, matmul_tgb, operands):
    out = tmp_path / "DIR"
    message = cli("run", matmul_tgb, "--in", operands[2], "--out", out).one_error()
    assert message == f"--in {operands[2]}: expected NAME=FILE.npy"


def test_run_out_is_a_file(cli, matmul_tgb, operands):
    message = cli(*run_args(matmul_tgb, operands[2], operands[3], matmul_tgb)).one_error()
    assert message.startswith(f"--out {matmul_tgb}: cannot create the output directory (")


# --- emit and check: bad arguments -----------------------------------------------------------


def test_emit_into_a_missing_directory(tmp_path, cli):
    out = tmp_path / "no" / "such" / "dir" / "X.tgb"
    message = cli("emit", MATMUL, "-o", out, "--target", "tiny").one_error()
    assert message == f"{out}: cannot write (No such file or directory)"


def test_emit_asm_into_a_missing_directory_writes_no_binary(tmp_path, cli):
    asm = tmp_path / "nowhere" / "X.s"
    result = cli("emit", MATMUL, "-o", tmp_path / "X.tgb", "--asm", asm, "--target", "tiny")
    assert result.one_error() == f"{asm}: cannot write (No such file or directory)"
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("command", ["emit", "check"])
def test_unknown_target(tmp_path, cli, command):
    extra = ["-o", tmp_path / "X.tgb"] if command == "emit" else []
    message = cli(command, MATMUL, "--target", "nosuch", *extra).one_error()
    assert message.startswith("unknown target 'nosuch' (known: ") and "tiny" in message
    assert list(tmp_path.iterdir()) == []


# --- at the process level --------------------------------------------------------------------


def tensorgen(*args, cwd) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tensorgen.cli", *map(str, args)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
    )


def one_error_line(proc: subprocess.CompletedProcess) -> str:
    assert "Traceback" not in proc.stdout + proc.stderr, proc.stderr
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    return lines[0].removeprefix("error: ")


def test_process_bad_op_yaml(tmp_path):
    """The same one line, with the path as the user typed it, from a real process."""
    good = MATMUL.read_text().splitlines()
    line = next(n for n, text in enumerate(good, 1) if "A[i, k]" in text)
    col = good[line - 1].index("A[i, k]") + len("A[") + 1
    (tmp_path / "bad.yaml").write_text(MATMUL.read_text().replace("A[i, k]", "A[i*k, k]"))

    proc = tensorgen("emit", "bad.yaml", "-o", "out.tgb", cwd=tmp_path)

    expected = f"bad.yaml:{line}:{col}: non-affine subscript 'i * k': a product of two indices"
    assert one_error_line(proc) == expected
    assert proc.stdout == ""
    assert not (tmp_path / "out.tgb").exists()


def test_process_corrupt_binary(tmp_path, matmul_binary):
    data = bytearray(matmul_binary[1])
    data[-1] ^= 0xFF  # the last code word (matmul_odd has no constants)
    (tmp_path / "bad.tgb").write_bytes(bytes(data))
    for args in (["disasm", "bad.tgb"], ["run", "bad.tgb", "--out", "DIR"]):
        proc = tensorgen(*args, cwd=tmp_path)
        assert one_error_line(proc) == "bad.tgb: corrupt .tgb file (checksum mismatch)"
        assert proc.stdout == ""
    assert not (tmp_path / "DIR").exists()


def test_process_output_is_whole_when_it_ends_without_teardown(tmp_path, cli, matmul_tgb):
    """`run` ends the process by os._exit once its output is flushed: through a pipe, all of a
    long listing arrives, as main prints it in-process, the exit code is main's, and the
    output file is whole."""
    # this checkout's tensorgen, its stdout block-buffered (as a pipe makes it without
    # PYTHONUNBUFFERED): what is left in the buffer at the end is what os._exit would lose
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])

    def process(*args) -> subprocess.CompletedProcess:
        command = [sys.executable, "-m", "tensorgen.cli", *map(str, args)]
        return subprocess.run(
            command, cwd=tmp_path, capture_output=True, text=True, timeout=120, env=env
        )

    for args in (["disasm", matmul_tgb], ["isa-doc"]):
        want = cli(*args)
        proc = process(*args)
        assert proc.returncode == want.code == 0, proc.stderr
        assert proc.stdout == want.out and proc.stderr == ""
    assert len(want.out) > 8192  # more than one buffer of stdout's: its last part is flushed
    proc = process("emit", MATMUL, "--target", "tiny", "-o", "out.tgb")
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "out.tgb").read_bytes() == matmul_tgb.read_bytes()
    assert process("emit", "nosuch.yaml", "-o", "x.tgb").returncode == 2


# --- untrusted .tgb and .npy files: one line, nothing written --------------------------------


def crafted(tmp_path, binary, monkeypatch, **changes) -> Path:
    """A .tgb written with the encoder's name checks bypassed and a valid checksum."""
    import dataclasses
    import struct
    import zlib

    from tensorgen.mc import binary as binmod

    with monkeypatch.context() as m:
        m.setattr(binmod, "check_tensor_name", lambda name: None)
        m.setattr(binmod, "check_target_name", lambda name: None)
        data = bytearray(binmod.encode(dataclasses.replace(binary, **changes)))
    struct.pack_into("<I", data, 56, 0)
    struct.pack_into("<I", data, 56, zlib.crc32(data))
    path = tmp_path / "crafted.tgb"
    path.write_bytes(bytes(data))
    return path


def tree(path: Path) -> list[str]:
    return sorted(str(p.relative_to(path)) for p in path.rglob("*"))


@pytest.mark.parametrize("name", ["../escape", "../../escape", "/tmp/tensorgen_escape"])
def test_run_never_writes_outside_out(tmp_path, cli, matmul_binary, monkeypatch, operands, name):
    import dataclasses

    work = tmp_path / "work"
    work.mkdir()
    b = matmul_binary[0]
    tensors = tuple(dataclasses.replace(t, name=name) if t.name == "C" else t for t in b.tensors)
    tgb = crafted(work, b, monkeypatch, tensors=tensors)
    before = tree(tmp_path)
    message = cli(*run_args(tgb, operands[2], operands[3], work / "out")).one_error()
    assert message == (
        f"{tgb}: corrupt tensor table (tensor 2: tensor name {name!r} is not a dotted identifier "
        "of at most 32 bytes)"
    )
    assert tree(tmp_path) == before
    assert not Path("/tmp/tensorgen_escape.npy").exists()


@pytest.mark.parametrize("name", ["../escape", "/abs", "a/b", "C/../../x"])
def test_output_paths_are_confined_to_out(tmp_path, name):
    from tensorgen.cli.ops import output_path as _output_path
    from tensorgen.errors import TensorgenError

    with pytest.raises(TensorgenError, match=r"would be written outside the directory$"):
        _output_path(str(tmp_path / "out"), name)
    assert _output_path(str(tmp_path / "out"), "C") == tmp_path / "out" / "C.npy"


@pytest.mark.parametrize(
    "target, reason",
    [
        pytest.param(
            "../../../etc/x", r"target name '\.\./\.\./\.\./etc/x' is not a name", id="path"
        ),
        pytest.param(
            "tg9",
            r"binary was built for target 'tg9', which is not a built-in target",
            id="unknown",
        ),
    ],
)
def test_run_target_name_is_a_name(
    tmp_path, cli, matmul_binary, monkeypatch, operands, target, reason
):
    tgb = crafted(tmp_path, matmul_binary[0], monkeypatch, target_name=target)
    message = cli(*run_args(tgb, operands[2], operands[3], tmp_path / "out")).one_error()
    assert re.search(reason, message), message
    assert not (tmp_path / "out").exists()


def test_run_target_hash_mismatch(tmp_path, cli, matmul_binary, monkeypatch, operands):
    tgb = crafted(tmp_path, matmul_binary[0], monkeypatch, target_hash=bytes(8))
    message = cli(*run_args(tgb, operands[2], operands[3], tmp_path / "out")).one_error()
    assert re.fullmatch(
        rf"{re.escape(str(tgb))}: binary was built for target 'tiny' with other parameters "
        r"\(hash 0000000000000000\); this target 'tiny' has hash [0-9a-f]{16}",
        message,
    ), message
    message = cli(
        *run_args(tgb, operands[2], operands[3], tmp_path / "out", "--target", "tg1")
    ).one_error()
    assert "this target 'tg1' has hash" in message
    assert not (tmp_path / "out").exists()


def test_run_with_an_explicit_target_file(tmp_path, cli, matmul_tgb, operands):
    from tensorgen.target import ISA_DIR

    result = cli(
        *run_args(
            matmul_tgb,
            operands[2],
            operands[3],
            tmp_path / "out",
            "--target",
            ISA_DIR / "tiny.yaml",
        )
    )
    assert result.code == 0, result.err
    np.testing.assert_array_equal(
        np.load(tmp_path / "out" / "C.npy"),
        operands[0].astype(np.int32) @ operands[1].astype(np.int32),
    )


@pytest.mark.parametrize("shape", [(10**6, 10**6), (100, 37, 10**6)])
def test_run_npy_header_promising_huge_arrays(tmp_path, cli, matmul_tgb, operands, shape):
    """A header that promises 10^12 elements is refused from the header, not allocated."""
    import numpy.lib.format as fmt

    bad = tmp_path / "huge.npy"
    with open(bad, "wb") as f:
        fmt.write_array_header_1_0(f, {"descr": "|i1", "fortran_order": False, "shape": shape})
        f.write(b"\0" * 64)
    message = cli(*run_args(matmul_tgb, bad, operands[3], tmp_path / "out")).one_error()
    assert message == f"input 'A' has shape {list(shape)}, expected [100, 37]"
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "array, reason",
    [
        pytest.param(
            np.zeros((100, 37)),
            r"^input 'A' has dtype float64; expected int8 \(convert it with a.astype\(np.int8\)\)$",
            id="float64",
        ),
        pytest.param(
            np.zeros((100, 37), bool),
            r"^input 'A' has dtype bool; expected int8 ",
            id="bool",
        ),
        pytest.param(  # the fuzzer's suspicious accept: values in range, another width
            np.zeros((100, 37), np.int64),
            r"^input 'A' has dtype int64; expected int8 ",
            id="int64",
        ),
        pytest.param(
            np.zeros((100, 37), ">i1").astype(">i2"), r"^input 'A' has dtype >i2", id="big-endian"
        ),
        pytest.param(
            np.zeros((100, 37), "i1,i1"),
            r"^input 'A' has dtype .*; expected int8 ",
            id="structured",
        ),
        pytest.param(
            np.zeros((100, 37), object),
            r"^input 'A' has dtype object; expected int8 ",
            id="pickled-object",
        ),
    ],
)
def test_run_npy_of_the_wrong_dtype(tmp_path, cli, matmul_tgb, operands, array, reason):
    bad = tmp_path / "bad.npy"
    np.save(bad, array, allow_pickle=True)
    message = cli(*run_args(matmul_tgb, bad, operands[3], tmp_path / "out")).one_error()
    assert re.search(reason, message), message
    assert not (tmp_path / "out").exists()


def test_run_npy_with_missing_data(tmp_path, cli, matmul_tgb, operands):
    bad = tmp_path / "short.npy"
    bad.write_bytes(operands[2].read_bytes()[:-1])
    message = cli(*run_args(matmul_tgb, bad, operands[3], tmp_path / "out")).one_error()
    assert (
        message
        == f"--in A={bad}: cannot load {bad} (its data is 3,699 bytes, its header promises 3,700)"
    )


@pytest.mark.parametrize("kind", ["fifo", "device", "directory"])
def test_run_npy_that_is_not_a_file(tmp_path, cli, matmul_tgb, operands, kind):
    import os

    special = {"fifo": tmp_path / "fifo", "device": Path("/dev/zero"), "directory": tmp_path}[kind]
    if kind == "fifo":
        os.mkfifo(special)
    message = cli(*run_args(matmul_tgb, special, operands[3], tmp_path / "out")).one_error()
    assert message.startswith(f"--in A={special}: cannot load {special} (")
    assert "not a regular file" in message or "a directory" in message
    assert not (tmp_path / "out").exists()


def test_run_npy_for_a_tensor_that_is_not_an_input(tmp_path, cli, matmul_tgb, operands):
    message = cli(
        *run_args(
            matmul_tgb, operands[2], operands[3], tmp_path / "out", "--in", f"C={operands[2]}"
        )
    ).one_error()
    assert message == "unknown input tensor(s): C"
    message = cli(
        *run_args(
            matmul_tgb, operands[2], operands[3], tmp_path / "out", "--in", f"A={operands[2]}"
        )
    ).one_error()
    assert message == f"--in A={operands[2]}: a second array for A"


def test_run_tgb_that_is_not_a_file(tmp_path, cli):
    message = cli("run", "/dev/zero", "--out", tmp_path / "out").one_error()
    assert message == "/dev/zero: cannot read (not a regular file, expected a .tgb binary)"
    assert not (tmp_path / "out").exists()


def test_run_max_steps(tmp_path, cli, matmul_tgb, operands):
    message = cli(
        *run_args(matmul_tgb, operands[2], operands[3], tmp_path / "out", "--max-steps", "100")
    ).one_error()
    assert message == (
        f"{matmul_tgb}: the program executes 1,037 instructions, over the simulator's limit of 100 "
        "(SimLimits.max_steps; raise it with `tensorgen run --max-steps N`)"
    )
    assert not (tmp_path / "out").exists()
    ok = cli(
        *run_args(matmul_tgb, operands[2], operands[3], tmp_path / "out", "--max-steps", "1204")
    )
    assert ok.code == 0 and (tmp_path / "out" / "C.npy").exists()
    assert (
        cli(
            *run_args(matmul_tgb, operands[2], operands[3], tmp_path / "o2", "--max-steps", "0")
        ).one_error()
        == "--max-steps 0: at least one instruction"
    )


def test_run_failing_simulation_creates_no_out(tmp_path, cli, matmul_tgb, operands):
    out = tmp_path / "deep" / "er" / "out"
    message = cli(*run_args(matmul_tgb, operands[2], operands[2], out)).one_error()
    assert message == "input 'B' has shape [100, 37], expected [37, 53]"
    assert not (tmp_path / "deep").exists()


def test_run_failing_write_leaves_no_empty_out(tmp_path, cli, matmul_tgb, operands, monkeypatch):
    import errno

    from tensorgen import outputs

    def full(files):
        raise OSError(errno.ENOSPC, "No space left on device", str(files[0][0]))

    monkeypatch.setattr(outputs, "write_files_atomic", full)
    out = tmp_path / "new" / "out"
    message = cli(*run_args(matmul_tgb, operands[2], operands[3], out)).one_error()
    assert message == f"{out / 'C.npy'}: cannot write (No space left on device)"
    assert not (tmp_path / "new").exists()


@pytest.mark.parametrize("where", ["missing-directory", "is-a-directory"])
def test_emit_failing_output_removes_the_asm(tmp_path, cli, where):
    out = {"missing-directory": tmp_path / "nowhere" / "X.tgb", "is-a-directory": tmp_path / "d"}[
        where
    ]
    if where == "is-a-directory":
        out.mkdir()
    asm = tmp_path / "X.s"
    result = cli("emit", MATMUL, "-o", out, "--asm", asm, "--target", "tiny")
    assert re.fullmatch(rf"{re.escape(str(out))}: cannot write \(.*\)", result.one_error())
    assert not asm.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == (
        ["d"] if where == "is-a-directory" else []
    )
    assert where != "is-a-directory" or list(out.iterdir()) == []


def test_outputs_are_written_with_the_umask_mode(tmp_path, cli, matmul_tgb, operands):
    import os

    assert cli(*run_args(matmul_tgb, operands[2], operands[3], tmp_path / "out")).code == 0
    umask = os.umask(0o022)
    os.umask(umask)
    assert (tmp_path / "out" / "C.npy").stat().st_mode & 0o777 == 0o666 & ~umask


def test_check_of_256_cubed_element_by_element_fails_fast(tmp_path, cli):
    """The fuzzer's valid program that ran for minutes: refused before simulating, one line.
    (The removed kernel default ran it in 50,855,936 instructions; the primitive-built default
    in 5,586,945, still over the default limit.)"""
    op = tmp_path / "neg256.yaml"
    op.write_text(
        (MATMUL.parent / "matmul_256.yaml")
        .read_text()
        .replace("A[i, k] * B[k, j]", "A[i, k] * B[k, j] * -1")
    )
    message = cli("check", op, "--target", "tiny").one_error()
    assert message.startswith("the program executes ") and (
        " instructions, over the simulator's limit of 2,000,000 (SimLimits.max_steps" in message
    )
