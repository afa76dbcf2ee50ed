"""Every example compiles with the default schedule and simulates bit-exactly on both targets."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tensorgen.driver import compile_file, random_inputs, run_and_compare
from tensorgen.sim.machine import simulate

EXAMPLES = sorted((Path(__file__).parents[2] / "examples").glob("*.yaml"))
# the big layers on the 4x4 tiny target run long in the simulator: exhaustive, not default
SLOW_ON_TINY = {"conv3x3_resnet18", "conv3x3_stride2", "conv1x1"}


def _params():
    for path in EXAMPLES:
        for target in ("tg1", "tiny"):
            marks = [pytest.mark.slow] if target == "tiny" and path.stem in SLOW_ON_TINY else []
            yield pytest.param(path, target, id=f"{path.stem}-{target}", marks=marks)


@pytest.mark.parametrize("path,target", list(_params()))
def test_example_bit_exact(path: Path, target: str) -> None:
    job = compile_file(path, target)
    cmp, result = run_and_compare(job, random_inputs(job.program, seed=1))
    assert cmp.exact, cmp.message
    assert result.stats.cycles > 0
    # the MAC array (or vector unit) did at least the program's useful MACs
    assert result.stats.macs + result.stats.vector_ops >= job.compiled.macs


def test_examples_exist() -> None:
    names = {p.stem for p in EXAMPLES}
    assert {
        "matmul_256",
        "conv3x3_resnet18",
        "conv3x3_stride2",
        "conv1x1",
        "conv_bias_relu_requant",
        "depthwise3x3",
        "matmul_odd",
        "rnn_cell",
    } <= names


@pytest.mark.parametrize("name", ["conv_bias_relu_requant", "depthwise3x3", "rnn_cell"])
def test_vectorised_loops_match_per_iteration_execution(name: str) -> None:
    """The simulator's whole-loop numpy path gives the same values and counters as stepping."""
    job = compile_file(Path(__file__).parents[2] / "examples" / f"{name}.yaml", "tiny")
    inputs = random_inputs(job.program, seed=3)
    fast = simulate(job.compiled.binary, inputs, job.target)
    slow = simulate(job.compiled.binary, inputs, job.target, vectorize_loops=False)
    for key in fast.outputs:
        np.testing.assert_array_equal(fast.outputs[key], slow.outputs[key])
    assert fast.stats.as_dict() == slow.stats.as_dict()


def test_code_size_does_not_grow_with_tensor_size(tmp_path: Path) -> None:
    """Hardware loops: a 4x bigger (tiled) matmul has about the same number of instruction words
    (the automatic schedule is chosen per size, so its staging may differ by an instruction or
    two; 64 times the work unrolled would be thousands)."""
    sizes = []
    for n in (256, 1024):
        f = tmp_path / f"mm{n}.yaml"
        f.write_text(f"""tensorgen: 1
tensors:
  A: {{shape: [{n}, {n}], dtype: int8, role: input}}
  B: {{shape: [{n}, {n}], dtype: int8, role: input}}
  C: {{shape: [{n}, {n}], dtype: int32, role: output}}
statements:
  - C[i, j] += A[i, k] * B[k, j]
""")
        sizes.append(len(compile_file(f, "tiny").compiled.binary.code))
    assert abs(sizes[0] - sizes[1]) <= 4 and max(sizes) < 64, sizes
