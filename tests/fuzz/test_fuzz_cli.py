"""Random command lines (subcommands, flags, values, missing files, -o into missing directories):
exit 0 with valid output or exit 2 with one line, nothing written outside the output directory."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

SETTINGS = settings(
    max_examples=80,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


@SETTINGS
@given(seed=st.integers(0, 2**32 - 1))
def test_random_command_lines_keep_the_contract(fuzz_case, seed):
    outcome = fuzz_case("cli", seed)

    assert outcome.cls in ("ok", "refused")


# --- regressions the fuzzer found in the command line itself ------------------------------------

MATMUL = Path(__file__).resolve().parents[2] / "examples" / "matmul_odd.yaml"


def _argparse_error(capsys, *args) -> str:
    """argparse's refusal: exit 2, its usage block, then one `tensorgen CMD: error: ...` line."""
    from tensorgen.cli import main

    with pytest.raises(SystemExit) as exc:
        main([str(a) for a in args])
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert exc.value.code == 2 and "Traceback" not in err, err
    assert lines[0].startswith("usage: ") and ": error: " in lines[-1], lines
    assert not any(": error: " in ln for ln in lines[:-1]), lines
    return lines[-1].split(": error: ", 1)[1]


@pytest.mark.parametrize("value", ["-1", "-5", "4294967296", "99999999999999999999"])
def test_check_refuses_a_seed_outside_32_bits(capsys, value):
    # was: exit 3 (numpy: "expected non-negative integer") for a negative seed
    message = _argparse_error(capsys, "check", MATMUL, "--seed", value)

    assert message.startswith(f"argument --seed: {int(value)} is outside 0..4294967295")


def test_check_refuses_absurd_trials_before_compiling(capsys):
    # was: a hang (10^8 trials of simulation and PyTorch, no limit)
    message = _argparse_error(capsys, "check", MATMUL, "--trials", "100000000")

    assert message.startswith("argument --trials: 100000000 is outside 0..1000 (MAX_TRIALS")
    assert (
        _argparse_error(capsys, "check", MATMUL, "--trials", "x")
        == "argument --trials: expected an integer, got 'x'"
    )
