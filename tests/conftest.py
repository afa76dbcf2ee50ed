"""Fixtures shared by the test suite: running the CLI, and a small compiled binary."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"


@pytest.fixture(autouse=True)
def _torch_threads_restored():
    """torch's intra-op thread count as it was before each test: a test that sets it and does
    not restore it would change later tests' PyTorch references (on a Xeon with AVX512-VNNI the
    x86 engine's 1x1 convs round near-ties differently at 1 thread than at 2: a 1-thread leak
    from one test failed test_numerics_onednn's near-tie tests after it)."""
    import torch

    before = torch.get_num_threads()
    yield
    if torch.get_num_threads() != before:
        torch.set_num_threads(before)


@dataclass(frozen=True)
class CliResult:
    code: int
    out: str
    err: str

    def one_error(self) -> str:
        """The single `error: ...` line that exit code 2 promises, without its prefix.

        Asserts the whole contract for bad input: exit code 2, exactly one line on
        stderr, starting with `error: `, and no traceback on either stream.
        """
        assert "Traceback" not in self.err + self.out, self.err
        assert self.code == 2, f"exit code {self.code}, stderr: {self.err!r}"
        lines = self.err.splitlines()
        assert len(lines) == 1, f"expected one line on stderr, got {lines!r}"
        assert lines[0].startswith("error: "), lines[0]
        return lines[0].removeprefix("error: ")


@pytest.fixture
def cli(capsys):
    """Run `tensorgen ARGS...` in-process; returns a CliResult."""
    from tensorgen.cli import main

    def run(*args: str | Path) -> CliResult:
        code = main([str(a) for a in args])
        captured = capsys.readouterr()
        return CliResult(code, captured.out, captured.err)

    return run


@pytest.fixture(scope="session")
def matmul_binary():
    """examples/matmul_odd.yaml compiled for `tiny`: (Binary, its .tgb bytes)."""
    from tensorgen.driver import compile_file
    from tensorgen.mc.binary import encode

    binary = compile_file(EXAMPLES / "matmul_odd.yaml", "tiny").compiled.binary
    return binary, encode(binary)


@pytest.fixture
def matmul_tgb(tmp_path, matmul_binary) -> Path:
    """A fresh copy of the matmul_odd .tgb file in this test's tmp_path."""
    path = tmp_path / "matmul.tgb"
    path.write_bytes(matmul_binary[1])
    return path
