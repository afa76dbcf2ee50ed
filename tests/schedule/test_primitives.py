"""Each schedule primitive: accepted steps are bit-exact through the simulator, illegal steps
are refused with their counterexample, and refusals leave the schedule as it was."""

from __future__ import annotations

from pathlib import Path

import pytest

from tensorgen.codegen.scheduled import compile_scheduled
from tensorgen.driver import Job, random_inputs, run_and_compare
from tensorgen.errors import CapacityError, ScheduleError
from tensorgen.mc.binary import encode
from tensorgen.schedule import steps
from tensorgen.schedule.api import Schedule
from tensorgen.schedule.files import render, replay
from tensorgen.schedule.steps import LoopRef, Step
from tensorgen.spec.loader import load_program, parse_program
from tensorgen.target import load_target

ROOT = Path(__file__).parents[2]
TG1 = load_target("tg1")

JACOBI = """tensorgen: 1
tensors:
  A: {shape: [7, 12], dtype: int32, role: inout}
loops: {t: 6}
statements:
  - A[t + 1, i] = (A[t, i - 1] + 2 * A[t, i] + A[t, i + 1]) >> 2
"""
MATMUL = """tensorgen: 1
tensors:
  A: {shape: [10, 7], dtype: int8, role: input}
  B: {shape: [7, 9], dtype: int8, role: input}
  C: {shape: [10, 9], dtype: int32, role: output}
statements:
  - C[i, j] += A[i, k] * B[k, j]
"""
SHIFTED = """tensorgen: 1
tensors:
  A: {shape: [8], dtype: int32, role: input}
  B: {shape: [8], dtype: int32}
  C: {shape: [8], dtype: int32, role: output}
statements:
  - B[i] = A[i] * 3
  - C[i] = B[i + 1] - B[i]
"""
SCAN = (ROOT / "examples" / "prefix_sum.yaml").read_text()


def _exact(schedule: Schedule, seed: int = 0) -> None:
    job = Job(schedule.program, TG1, compile_scheduled(schedule.program, TG1, schedule))
    cmp, _ = run_and_compare(job, random_inputs(schedule.program, seed))
    assert cmp.exact, cmp.message


def _refused(schedule: Schedule, call, match: str) -> None:
    before = list(schedule.trace), schedule.union_map()
    with pytest.raises(ScheduleError, match=match):
        call()
    assert schedule.trace == before[0] and schedule.union_map().is_equal(before[1])


def test_split() -> None:
    s = Schedule(parse_program(MATMUL))
    io, ii = s.split(s.loop("i"), 3)
    assert [lp.name for lp in s.loops("S0")] == ["i_o", "i_i", "j", "k"]
    _exact(s)
    _refused(s, lambda: s.split(ii, 0), r"^split\(i_i, 0\): factor must be a positive integer$")


def test_reorder() -> None:
    s = Schedule(parse_program(MATMUL))
    s.reorder(s.loop("k"), s.loop("j"), s.loop("i"))
    _exact(s)
    j = Schedule(parse_program(JACOBI))
    _refused(
        j,
        lambda: j.reorder(j.loop("i"), j.loop("t")),
        r"^reorder\(i, t\): S0\[t=\d+, i=\d+\] would run before S0\[t=\d+, i=\d+\], "
        r"but S0 reads A\[\d+, \d+\] that S0 writes$",
    )


def test_skew_then_tile_is_legal_where_tile_alone_is_not() -> None:
    s = Schedule(parse_program(JACOBI))
    _refused(
        s,
        lambda: s.tile(s.loop("t"), s.loop("i"), 2, 4),
        r"^tile\(t, i, 2, 4\): S0\[t=\d+, i=\d+\] would run before S0\[t=\d+, i=\d+\], but S0 reads A",
    )
    s.skew(s.loop("i"), s.loop("t"), 1)
    s.tile(s.loop("t"), s.loop("i"), 2, 4)
    _exact(s)
    _refused(
        s,
        lambda: s.skew(s.loop("t_o"), s.loop("i_i")),
        r"^skew\(t_o, i_i, 1\): i_i must be a loop enclosing t_o$",
    )


def test_fuse_and_distribute() -> None:
    s = Schedule(parse_program(SCAN))
    fused = s.fuse(s.loop("S0.i"), s.loop("S1.i"))
    _exact(s)
    _refused(
        s,
        lambda: s.distribute(fused, "S0"),
        r"^distribute\(S0.i, S0\): S1\[i=\d+\] would run before S0\[i=\d+\], but S1 reads S\[\d+\] that S0 writes$",
    )
    s.distribute(fused, "S1")
    _exact(s)
    bad = Schedule(parse_program(SHIFTED))
    _refused(
        bad,
        lambda: bad.fuse(bad.loop("S0.i"), bad.loop("S1.i")),
        r"^fuse\(S0.i, S1.i\): S1\[i=\d\] would run before S0\[i=\d\], but S1 reads B\[\d\] that S0 writes$",
    )


def test_unroll_was_removed_with_one_line() -> None:
    s = Schedule(parse_program(MATMUL))
    _refused(s, lambda: s.unroll(s.loop("k")), r"^unroll was removed: [^\n]*delete the call$")
    _refused(s, lambda: s.unroll(s.loop("k"), 2), r"^unroll was removed: ")


def test_a_schedule_file_calling_unroll_gets_one_line_naming_it() -> None:
    text = "def schedule(s):\n    s.split(s.loop('k'), 2)\n    s.unroll(s.loop('k_i'))\n"
    with pytest.raises(ScheduleError, match=r"^f\.py:3: unroll was removed: [^\n]*$"):
        replay(text, parse_program(MATMUL), TG1, "f.py")


def test_vectorize() -> None:
    s = Schedule(parse_program(SCAN))
    _refused(
        s,
        lambda: s.vectorize(s.loop("S1.i")),
        r"^vectorize\(S1.i\): S1\[i=\d+\] and S1\[i=\d+\] would run at once, but S1 reads S\[\d+\] that S1 writes$",
    )
    s.vectorize(s.loop("S0.i"))
    _exact(s)


def test_vectorize_several_loops_as_one_vector() -> None:
    s = Schedule(parse_program(MATMUL), TG1)
    _refused(
        s,
        lambda: s.vectorize(s.loop("i"), s.loop("k")),
        r"^vectorize\(i, k\): give distinct loops of the same statements, each directly inside the one before$",
    )
    s.reorder(s.loop("k"), s.loop("i"), s.loop("j"))
    s.vectorize(s.loop("i"), s.loop("j"))
    assert str(s.trace[-1]) == "s.vectorize(s.loop('i'), s.loop('j'))"
    assert s.trace[-1] == Step("vectorize", (LoopRef("i"), LoopRef("j")))
    code = compile_scheduled(s.program, TG1, s).binary.code
    # one VMAC of 10 x 9 lanes per k
    assert [ins.arg("dst").shape for ins in code if ins.mnemonic == "VMAC"] == [(10, 9)]
    _exact(s)


def test_a_peeled_staging_iteration_in_several_pieces_is_staged_once() -> None:
    # j = 53 = 3 * 16 + 5: isl peels the last iteration of j_o and emits it as two nests
    # (full and partial blocks of k); C's buffer must span both, zeroed and stored once
    s = Schedule(load_program(ROOT / "examples" / "matmul_odd.yaml"), TG1)
    s.split(s.loop("j"), 16)
    s.split(s.loop("k"), 16)
    s.reorder(s.loop("j_o"), s.loop("k_o"), s.loop("i"), s.loop("j_i"), s.loop("k_i"))
    s.stage("C", s.loop("j_o"), "acc")
    s.tensorize(s.loop("i"), s.loop("j_i"), s.loop("k_i"))
    code = compile_scheduled(s.program, TG1, s).binary.code
    assert (
        sum(ins.mnemonic == "STORE" for ins in code) == 2
    )  # in the loop, and the peeled iteration
    _exact(s)


def test_tensorize() -> None:
    s = Schedule(parse_program(MATMUL))
    _refused(
        s,
        lambda: s.tensorize(s.loop("i"), s.loop("j"), s.loop("j")),
        r"^tensorize\(i, j, j\): give distinct loops that are adjacent in the nest$",
    )
    s.split(s.loop("j"), 3)
    _refused(
        s,
        lambda: s.tensorize(s.loop("i"), s.loop("j_o"), s.loop("j_i")),
        r"^tensorize\(i, j_o, j_i\): S0 has loops inside the band; the band must be innermost$",
    )
    s2 = Schedule(parse_program(MATMUL))
    s2.tensorize(s2.loop("i"), s2.loop("j"), s2.loop("k"))
    job = compile_scheduled(s2.program, TG1, s2)
    assert any(i.mnemonic == "MATMUL" for i in job.binary.code)
    _exact(s2)


def test_stage_and_double_buffer_check_capacity() -> None:
    tiny = load_target("tiny")
    big = Schedule(load_program(ROOT / "examples" / "matmul_256.yaml"), tiny)
    with pytest.raises(
        CapacityError,
        match=r"^stage\(A, the program, spad\): spad holds 65536 B but has 2048 B "
        r"\(63488 B over\): A at the program \(65536 B\)$",
    ):
        big.stage("A", None, "spad")
    i = big.loop("i")
    big.stage("A", i, "spad")  # one row of A per i: 256 B
    big.double_buffer("A")
    assert big.footprint_bytes(big.stages[-1]) == 512
    big.stage("C", i, "acc")  # one int32 row of C: exactly the 1 KiB accumulator
    with pytest.raises(
        CapacityError,
        match=r"^double_buffer\(C\): acc holds 2048 B but has 1024 B \(1024 B over\): "
        r"C at i \(2048 B, double-buffered\)$",
    ):
        big.double_buffer("C")
    assert not big.stages[-1].double_buffered
    with pytest.raises(ScheduleError, match=r"^double_buffer\(B\): stage B first$"):
        big.double_buffer("B")


def test_trace_replays_to_the_same_microcode() -> None:
    program = load_program(ROOT / "examples" / "rnn_cell.yaml")
    original = replay((ROOT / "schedules" / "rnn_cell.py").read_text(), program, TG1)
    again = replay(render(original), program, TG1)  # the trace printed as a schedule file
    from_json = steps.replay(program, steps.loads(steps.dumps(original.trace)), TG1)
    assert again.trace == original.trace == from_json.trace
    a = encode(compile_scheduled(program, TG1, original).binary)
    assert a == encode(compile_scheduled(program, TG1, again).binary)
    assert a == encode(compile_scheduled(program, TG1, from_json).binary)


@pytest.mark.parametrize(
    "text, message",
    [
        (
            "def schedule(s):\n    s.split(s.loop('nope'), 2)\n",
            r"^f.py:2: loop\('nope'\): no such loop \(loops: ",
        ),
        (
            "def schedule(s):\n    s.explode()\n",
            r"^f.py:2: AttributeError: 'Schedule' object has no attribute 'explode'$",
        ),
        (
            "def schedule(s):\n    undefined_name('x')\n",
            r"^f.py:2: NameError: name 'undefined_name' is not defined$",
        ),
        ("x = 1\n", r"^f.py:1: a schedule file must define 'def schedule\(s\):'$"),
        ("def schedule(s)\n", r"^f.py:1: syntax error"),
        (
            "def schedule(s):\n    s.reorder(s.loop('i'), s.loop('t'))\n",
            r"^f.py:2: reorder\(i, t\): S0\[t=",
        ),
    ],
)
def test_bad_schedule_files_get_one_line(text: str, message: str) -> None:
    with pytest.raises(ScheduleError, match=message) as err:
        replay(text, parse_program(JACOBI), TG1, "f.py")
    assert "\n" not in str(err.value)


def test_schedule_file_errors_through_the_cli(tmp_path: Path, capsys) -> None:
    from tensorgen.cli import main

    bad = tmp_path / "bad.py"
    bad.write_text("def schedule(s):\n    s.vectorize(s.loop('S9.q'))\n")
    out = tmp_path / "o.tgb"
    code = main(
        ["emit", str(ROOT / "examples" / "prefix_sum.yaml"), "-o", str(out), "--schedule", str(bad)]
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert (
        code == 2
        and len(err) == 1
        and err[0].startswith(f"error: {bad}:2: loop('S9.q'): no such loop")
    )
    assert not out.exists()


SLOW_SCHEDULES = {"conv3x3_resnet18", "conv3x3_stride2", "matmul_256"}


@pytest.mark.parametrize(
    "name",
    [
        pytest.param(p.stem, marks=[pytest.mark.slow] if p.stem in SLOW_SCHEDULES else [])
        for p in sorted((ROOT / "examples").glob("*.yaml"))
    ],
)
def test_example_schedules_are_exact_and_no_slower_than_default(name: str) -> None:
    """Each hand-written schedule is bit-exact and at least as fast as the default (several of
    them are what the primitive-built default now finds by itself)."""
    from tensorgen.driver import compile_default
    from tensorgen.sim.machine import simulate

    program = load_program(ROOT / "examples" / f"{name}.yaml")
    s = replay((ROOT / "schedules" / f"{name}.py").read_text(), program, TG1)
    job = Job(program, TG1, compile_scheduled(program, TG1, s))
    inputs = random_inputs(program, 4)
    cmp, result = run_and_compare(job, inputs)
    assert cmp.exact, cmp.message
    default = simulate(compile_default(program, TG1).binary, inputs, TG1).stats.cycles
    assert result.stats.cycles <= default


def test_stage_at_a_loop_is_exact() -> None:
    s = Schedule(parse_program(MATMUL), TG1)
    jo, ji = s.split(s.loop("j"), 4)
    s.stage("B", jo, "spad")
    s.stage("C", jo, "acc")
    _exact(s)
    program = s.program
    code = compile_scheduled(program, TG1, s).binary.code
    loads = [i for i in code if i.mnemonic == "LOAD" and i.arg("src").tensor == 1]
    assert loads and loads[0].arg("src").shape == (7, 4)  # B's footprint per j block


def test_rnn_time_must_stay_sequential() -> None:
    s = Schedule(load_program(ROOT / "examples" / "rnn_cell.yaml"), TG1)
    _refused(
        s,
        lambda: s.distribute(s.loop("t"), "S3"),
        r"^distribute\(t, S3\): S2\[t=\d+, b=\d+, j=\d+, i=\d+\] would run before S3\[t=\d+, b=\d+, j=\d+\], "
        r"but S2 reads H\[\d+, \d+, \d+\] that S3 writes$",
    )


def test_double_buffering_overlaps_loads_with_compute() -> None:
    """Two buffers for B at the k blocks: the loads of the next block run while the array
    computes (the simulator's hazard check would refuse an unsafe overlap), and it is faster."""
    program = load_program(ROOT / "examples" / "matmul_256.yaml")
    text = (ROOT / "schedules" / "matmul_256.py").read_text()
    single = replay(text, program, TG1)
    double = replay(text + "\n    s.double_buffer('B')\n", program, TG1)
    inputs = random_inputs(program, 5)
    runs = []
    for s in (single, double):
        cmp, result = run_and_compare(Job(program, TG1, compile_scheduled(program, TG1, s)), inputs)
        assert cmp.exact, cmp.message
        runs.append(result.stats)
    assert runs[1].cycles < runs[0].cycles
    assert runs[1].busy == runs[0].busy  # the same work, overlapped


def test_a_tensor_staged_at_a_loop_stays_staged_when_the_loop_is_split_or_fused() -> None:
    s = Schedule(parse_program(MATMUL), TG1)
    k = s.loop("k")
    s.stage("B", k, "spad")
    one_row = s.footprint_bytes(s.stages[-1])
    ko, ki = s.split(k, 4)
    # one iteration of k is one iteration of k_i: the same footprint, staged there
    assert s.stages[-1].loop == "k_i" and s.footprint_bytes(s.stages[-1]) == one_row == 1
    s.stage("A", None, "spad")  # checks the capacity of every stage: the split one too
    with pytest.raises(
        ScheduleError,
        match=r"^loop\('k'\): no such loop \(loops: i, j, k_i, k_o\); "
        r"k was split into k_o and k_i$",
    ):
        s.loop("k")
    _refused(
        s,
        lambda: s.vectorize(k),
        r"^vectorize\(k\): k was split into k_o and k_i; use the loops split returned$",
    )
    _exact(s)
    again = steps.replay(s.program, s.trace, TG1)
    assert again.stages == s.stages
    fused = Schedule(parse_program(SHIFTED.replace("B[i + 1] - B[i]", "B[i] - 1")), TG1)
    fused.stage("C", fused.loop("S1.i"), "spad")
    fused.fuse(fused.loop("S0.i"), fused.loop("S1.i"))
    assert [(st.tensor, st.loop) for st in fused.stages] == [("C", "S0.i")]
    _exact(fused)
