"""Timing of MATMULs with a second weight buffer (`mac_array.weight_buffers: 2`): the next
MATMUL's weights load while the current one streams, so its fill is hidden when the MATMUL before
it streamed at least fill_cycles rows, partly hidden when fewer, and not at all after another EX
instruction or when its weights' token arrives late."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import yaml

from tensorgen.mc import isa
from tensorgen.mc.binary import assemble
from tensorgen.sim.machine import simulate
from tensorgen.target import ISA_DIR, load_target, target_from_dict

TINY = load_target("tiny")  # 4x4 array, fill 4; DMA: 16 setup + bytes / 4


def _tiny(buffers: int):
    d = yaml.safe_load((ISA_DIR / "tiny.yaml").read_text())
    d["mac_array"]["weight_buffers"] = buffers
    return target_from_dict(d, "tiny.yaml")


def _program(target, body: str) -> str:
    return f""".target tiny {target.hash.hex()}
.dram 160
.tensor A int8 4x4 input dram=0 pad=0
.tensor B int8 4x4 input dram=16 pad=0
.tensor B2 int8 4x4 input dram=32 pad=0
.tensor C int32 4x4 output dram=64 pad=0
LOAD dst=spad:int8@0[4x4:4,1] src=A(0,0)[4x4]
LOAD dst=spad:int8@16[4x4:4,1] src=B(0,0)[4x4] signal=EX
{body}
STORE dst=C(0,0)[4x4] src=acc:int32@0[4x4:4,1] wait=EX
"""


MM = (
    "MATMUL acc=acc:int32@0[{m}x4:4,1] a=spad:int8@0[{m}x4:4,1] b=spad:int8@{b}[4x4:4,1] accumulate={acc} "
    "a_zp=0 b_zp=0"
)


def _mm(m: int = 4, b: int = 16, acc: int = 0, tokens: str = "") -> str:
    return MM.format(m=m, b=b, acc=acc) + (" " + tokens if tokens else "")


def _run(target, body: str):
    rng = np.random.default_rng(3)
    ins = {n: rng.integers(-128, 128, (4, 4)).astype(np.int8) for n in ("A", "B", "B2")}
    r = simulate(assemble(_program(target, body)), ins, target)
    t = {n: torch.from_numpy(v).int() for n, v in ins.items()}
    return r, t


def test_fill_hidden_behind_a_matmul_of_at_least_fill_rows() -> None:
    body = _mm(tokens="wait=LD") + "\n" + _mm(acc=1, tokens="signal=ST")
    for buffers, ex in ((1, 2 * (4 + 4)), (2, (4 + 4) + 4)):
        r, t = _run(_tiny(buffers), body)
        np.testing.assert_array_equal(r.outputs["C"], (2 * (t["A"] @ t["B"])).numpy())
        assert r.stats.busy["EX"] == ex
        assert r.stats.cycles == 2 * (16 + 4) + ex + (16 + 64 // 4)


def test_fill_partly_hidden_behind_fewer_rows_and_not_after_a_vector_instruction() -> None:
    # 2 rows stream while the next MATMUL's weights take 4 cycles: 2 of its fill show
    body = _mm(m=2, tokens="wait=LD") + "\n" + _mm(tokens="signal=ST")
    r, t = _run(_tiny(2), body)
    np.testing.assert_array_equal(r.outputs["C"], (t["A"] @ t["B"]).numpy())
    assert (
        r.stats.busy["EX"]
        == (2 + 4) + (4 + 2)
        == isa.matmul_cycles(_tiny(2), 2) + isa.matmul_cycles(_tiny(2), 4, previous_rows=2)
    )
    # a vector instruction between them: the second MATMUL pays its whole fill
    body = (
        _mm(tokens="wait=LD")
        + "\nVADD dst=acc:int32@0[4x4:4,1] a=acc:int32@0[4x4:4,1] b=- imm=1\n"
        + _mm(acc=1, tokens="signal=ST")
    )
    r, t = _run(_tiny(2), body)
    np.testing.assert_array_equal(r.outputs["C"], (2 * (t["A"] @ t["B"]) + 1).numpy())
    assert r.stats.busy["EX"] == (4 + 4) + (TINY.vector_setup_cycles + 16 // 4) + (4 + 4)


def test_weights_load_no_earlier_than_their_token() -> None:
    # the second MATMUL's weights (B2) arrive at cycle 60, after the first MATMUL streamed
    # (cycles 44-48): their fill starts at 60, nothing is hidden
    body = (
        "LOAD dst=spad:int8@32[4x4:4,1] src=B2(0,0)[4x4] signal=EX\n"
        + _mm(tokens="wait=LD")
        + "\n"
        + _mm(b=32, acc=1, tokens="wait=LD signal=ST")
    )
    r, t = _run(_tiny(2), body)
    np.testing.assert_array_equal(r.outputs["C"], (t["A"] @ t["B"] + t["A"] @ t["B2"]).numpy())
    assert r.stats.cycles == 3 * (16 + 4) + (4 + 4) + (16 + 64 // 4)


@pytest.mark.parametrize("buffers", [1, 2])
def test_a_vectorised_matmul_nest_times_like_its_iterations(buffers: int) -> None:
    # a reduction nest run as one numpy call costs what its iterations would, one by one
    body = "LOOP count=3 body=1\n" + _mm(acc=1) + "\nSYNC queue=1 signal=ST"
    body = _mm(tokens="wait=LD") + "\n" + body
    target = _tiny(buffers)
    fast, t = _run(target, body)
    slow = simulate(
        assemble(_program(target, body)),
        {n: v.numpy().astype(np.int8) for n, v in t.items()},
        target,
        vectorize_loops=False,
    )
    np.testing.assert_array_equal(fast.outputs["C"], (4 * (t["A"] @ t["B"])).numpy())
    np.testing.assert_array_equal(slow.outputs["C"], fast.outputs["C"])
    assert fast.stats.busy == slow.stats.busy and fast.stats.cycles == slow.stats.cycles
    assert fast.stats.busy["EX"] == isa.matmul_run_cycles(target, 4, 4)


def test_a_sync_between_matmuls_keeps_the_fill_hidden_unless_its_token_is_late() -> None:
    body = _mm(tokens="wait=LD") + "\nSYNC queue=1\n" + _mm(acc=1, tokens="signal=ST")
    r, t = _run(_tiny(2), body)
    np.testing.assert_array_equal(r.outputs["C"], (2 * (t["A"] @ t["B"])).numpy())
    assert r.stats.busy["EX"] == (4 + 4) + 4
    # the SYNC waits for B2's load (cycle 60): the next weights load after it, nothing hidden
    body = (
        "LOAD dst=spad:int8@32[4x4:4,1] src=B2(0,0)[4x4] signal=EX\n"
        + _mm(tokens="wait=LD")
        + "\nSYNC queue=1 wait=LD\n"
        + _mm(b=32, acc=1, tokens="signal=ST")
    )
    r, t = _run(_tiny(2), body)
    np.testing.assert_array_equal(r.outputs["C"], (t["A"] @ t["B"] + t["A"] @ t["B2"]).numpy())
    assert r.stats.cycles == 3 * (16 + 4) + (4 + 4) + (16 + 64 // 4)


def test_cost_model_follows_the_simulator_on_suite_layers_with_two_weight_buffers() -> None:
    import sys
    from pathlib import Path

    bench = Path(__file__).resolve().parents[2] / "benchmarks"
    if str(bench) not in sys.path:
        sys.path.insert(0, str(bench))
    from layers import LAYERS  # noqa: PLC0415 - benchmarks/ is a folder of scripts

    from tensorgen.driver import compare, compile_auto, random_inputs
    from tensorgen.reference.torch_ref import evaluate
    from tensorgen.spec.loader import parse_program

    cycles = {}
    for name in ("matmul_256", "resnet18_layer4_proj_1x1s2"):
        layer = next(x for x in LAYERS if x.name == name)
        for tname in ("tg1", "tg1db"):
            target = load_target(tname)
            program = parse_program(layer.op_yaml(), f"<{name}>", tname)
            auto = compile_auto(program, target)
            inputs = random_inputs(program, 1)
            r = simulate(auto.compiled.binary, inputs, target)
            assert compare(evaluate(program, inputs), r.outputs).exact
            assert abs(auto.plan.chosen.cycles / r.stats.cycles - 1) < 0.02, (name, tname)
            cycles[name, tname] = r.stats.cycles
        assert cycles[name, "tg1db"] < cycles[name, "tg1"]
