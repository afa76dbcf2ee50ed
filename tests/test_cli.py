"""The `tensorgen` command line: happy paths, and bad input as exit 2 with one line.

Most tests call `tensorgen.cli.main` in-process (fast); a few run `python -m
tensorgen.cli` in a subprocess to show that no traceback reaches the terminal.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tensorgen.mc.binary import assemble, decode, disassemble

MATMUL = Path(__file__).resolve().parent.parent / "examples" / "matmul_odd.yaml"
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
        ("A", A_SHAPE, "input"), ("B", B_SHAPE, "input"), ("C", (100, 53), "output")]
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
    np.save(tmp_path / "big.npy", np.full(A_SHAPE, 300, np.int32))
    out = tmp_path / "DIR"
    message = cli(*run_args(matmul_tgb, tmp_path / "big.npy", operands[3], out)).one_error()
    assert message == "input 'A' has values outside int8"
    assert not out.exists()


def test_run_unknown_input(tmp_path, cli, matmul_tgb, operands):
    _, _, a_npy, b_npy = operands
    out = tmp_path / "DIR"
    message = cli(*run_args(matmul_tgb, a_npy, b_npy, out, "--in", f"Z={a_npy}")).one_error()
    assert message == "unknown input tensor(s): Z"
    assert not out.exists()


@pytest.mark.parametrize("content, reason", [
    pytest.param(None, "No such file or directory", id="missing"),
    pytest.param(b"", "No data left in file", id="empty"),
    pytest.param(b"A,B\n1,2\n", "", id="csv"),
    pytest.param("first 200 bytes", "", id="truncated"),
])
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
    return subprocess.run([sys.executable, "-m", "tensorgen.cli", *map(str, args)], cwd=cwd,
                          capture_output=True, text=True, timeout=120)


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
