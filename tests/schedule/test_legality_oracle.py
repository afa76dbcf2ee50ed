"""The isl legality checker against a brute-force oracle.

Hypothesis draws small affine programs (stencils, in-place updates, triangular domains,
recurrences over shared loops) and random primitive sequences. For every step, the oracle
enumerates every statement instance, computes the dependences by brute force (pairs of
instances touching one element, at least one writing, in original program order; integer
reductions relaxed) and the new schedule of every instance, and decides legality itself. The
checker's verdict (ScheduleError or not) must equal the oracle's, step by step.
"""

from __future__ import annotations

import itertools
from collections import Counter

import islpy as isl
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tensorgen.errors import ScheduleError
from tensorgen.ir import poly
from tensorgen.schedule.api import Schedule
from tensorgen.spec.loader import parse_program

VERDICTS: Counter = Counter()
N, T = 4, 3


@st.composite
def programs(draw):
    recurrent = draw(st.booleans())
    two_d = draw(st.booleans())
    idx = ["i", "j"] if two_d else ["i"]
    shape = [N] * len(idx)
    tshape = [T + 1] if recurrent else []
    tensors = ["A", "B", "C"][: draw(st.integers(2, 3))]
    lines = []
    for _ in range(draw(st.integers(1, 3))):
        out = draw(st.sampled_from(tensors))
        op = draw(st.sampled_from(["=", "=", "+="]))
        reads = []
        for _ in range(draw(st.integers(1, 2))):
            src = draw(st.sampled_from(tensors))
            subs = [f"{i} + {draw(st.integers(-1, 1))}" for i in idx]
            if draw(st.booleans()) and two_d:
                subs = subs[::-1]  # transposed read
            t_sub = [f"t + {draw(st.integers(0, 1))}"] if recurrent else []
            reads.append(f"{src}[{', '.join(t_sub + subs)}]")
        t_lhs = [f"t + {draw(st.integers(0, 1))}"] if recurrent else []
        lhs = f"{out}[{', '.join(t_lhs + idx)}]"
        stmt = f"{lhs} {op} {' + '.join(reads)}"
        where = "j <= i" if two_d and draw(st.booleans()) else ""
        lines.append(f'  - {{stmt: "{stmt}", where: "{where}"}}' if where else f"  - {stmt}")
    decl = "\n".join(
        f"  {t}: {{shape: {tshape + shape}, dtype: int32, role: inout}}" for t in tensors
    )
    loops = f"loops: {{t: {T}}}\n" if recurrent else ""
    return parse_program(
        f"tensorgen: 1\ntensors:\n{decl}\n{loops}statements:\n" + "\n".join(lines) + "\n"
    )


def _instances(program):
    """Every instance as (statement, index values), with its original schedule vector."""
    out = []
    shared = len(program.shared_loops)
    depth = max(len(s.indices) for s in program.statements)
    for pos, stmt in enumerate(program.statements):
        dom = poly.domain(stmt)
        for values in itertools.product(*(range(lo, hi + 1) for lo, hi in stmt.bounds)):
            fix = " and ".join(f"{i} = {v}" for i, v in zip(stmt.indices, values, strict=False))
            if (
                stmt.where
                and isl.Set(f"{{ {stmt.name}[{', '.join(stmt.indices)}] : {fix} }}")
                .intersect(dom)
                .is_empty()
            ):
                continue
            vec = values[:shared] + (pos,) + values[shared:] + (0,) * (depth - len(values))
            out.append((stmt, values, vec))
    return out


def _elements(program, stmt, values):
    env = dict(zip(stmt.indices, values, strict=False))

    def at(acc):
        idx = tuple(sum(c * env[n] for n, c in a.terms) + a.const for a in acc.index)
        shape = program.tensor(acc.tensor).shape
        return (
            (acc.tensor, idx) if all(0 <= x < n for x, n in zip(idx, shape, strict=False)) else None
        )

    writes = {at(stmt.lhs)} - {None}
    reads = {at(a) for a in stmt.reads} - {None}
    if stmt.op == "+=":
        reads |= writes
    return reads, writes


def _oracle_dependences(program):
    inst = _instances(program)
    touched = [(_elements(program, s, v)) for s, v, _ in inst]
    deps = []
    for a, b in itertools.permutations(range(len(inst)), 2):
        if not inst[a][2] < inst[b][2]:
            continue
        (ra, wa), (rb, wb) = touched[a], touched[b]
        common = (wa & (rb | wb)) | (ra & wb)
        if not common:
            continue
        sa, sb = inst[a][0], inst[b][0]
        if (
            sa is sb
            and sa.op == "+="
            and all(r.tensor != sa.lhs.tensor for r in sa.reads)
            and common <= wa
            and common <= wb
        ):
            continue  # integer reduction: any order gives the same bits
        deps.append((a, b))
    return inst, deps


def _new_vectors(schedule, inst):
    out = []
    for stmt, values, _ in inst:
        fix = " and ".join(f"{i} = {v}" for i, v in zip(stmt.indices, values, strict=False))
        m = schedule.statement_map(stmt.name).intersect_domain(
            isl.Set(f"{{ {stmt.name}[{', '.join(stmt.indices)}] : {fix} }}")
        )
        p = m.range().sample_point()
        out.append(
            tuple(
                int(p.get_coordinate_val(isl.dim_type.set, k).to_python())
                for k in range(m.dim(isl.dim_type.out))
            )
        )
    return out


def _oracle_legal(schedule, inst, deps, band=None) -> bool:
    vec = _new_vectors(schedule, inst)
    for a, b in deps:
        if band is None:
            if not vec[a] < vec[b]:
                return False
        else:
            lo, hi, among = band
            if inst[a][0].name not in among or inst[b][0].name not in among:
                continue
            if vec[a][:lo] == vec[b][:lo] and vec[a][lo:hi] != vec[b][lo:hi]:
                return False
    return True


def _loop_names(schedule):
    return schedule.loop_names()


@st.composite
def steps(draw):
    return [
        (
            draw(
                st.sampled_from(
                    ["split", "reorder", "skew", "fuse", "distribute", "vectorize", "tile"]
                )
            ),
            draw(st.integers(0, 10**6)),
        )
        for _ in range(draw(st.integers(1, 4)))
    ]


def _apply(schedule, kind, seed):
    """Perform one random primitive; returns (callable, band) or None if none applies."""
    names = _loop_names(schedule)
    pick = lambda xs: xs[seed % len(xs)] if xs else None  # noqa: E731
    loops = {n: schedule.loop(n) for n in names}
    info = {
        n: (loops[n], schedule.position(loops[n]), schedule.statements_of(loops[n])) for n in names
    }
    if kind == "split":
        n = pick(names)
        return (lambda: schedule.split(loops[n], 2 + seed % 2)), None
    if kind in ("reorder", "tile"):
        pairs = [
            (a, b)
            for a in names
            for b in names
            if info[a][1] < info[b][1] and info[a][2] == info[b][2]
        ]
        pair = pick(pairs)
        if pair is None:
            return None
        if kind == "tile":
            return (lambda: schedule.tile(loops[pair[0]], loops[pair[1]], 2, 2)), None
        return (lambda: schedule.reorder(loops[pair[1]], loops[pair[0]])), None
    if kind == "skew":
        pairs = [
            (a, b)
            for a in names
            for b in names
            if info[b][1] < info[a][1] and info[a][2] <= info[b][2]
        ]
        pair = pick(pairs)
        if pair is None:
            return None
        return (lambda: schedule.skew(loops[pair[0]], loops[pair[1]], (-1, 1, 2)[seed % 3])), None
    if kind == "fuse":
        pairs = [(a, b) for a in names for b in names if a != b and info[a][1] == info[b][1]]
        pair = pick(pairs)
        if pair is None:
            return None
        return (lambda: schedule.fuse(loops[pair[0]], loops[pair[1]])), None
    if kind == "distribute":
        cands = [n for n in names if len(info[n][2]) > 1]
        n = pick(cands)
        if n is None:
            return None
        stmts = sorted(info[n][2])
        return (lambda: schedule.distribute(loops[n], stmts[-1 - seed % (len(stmts) - 1)])), None
    # vectorize: innermost loops only
    inner = [n for n in names if all(schedule.loops(s)[-1].name == n for s in info[n][2])]
    n = pick(inner)
    if n is None:
        return None
    return (lambda: schedule.vectorize(loops[n])), (info[n][1], info[n][1] + 1, info[n][2])


@settings(
    max_examples=500,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(program=programs(), plan=steps())
def test_checker_agrees_with_brute_force(program, plan) -> None:
    inst, deps = _oracle_dependences(program)
    schedule = Schedule(program)
    for kind, seed in plan:
        applied = _apply(schedule, kind, seed)
        if applied is None:
            continue
        call, band = applied
        before = (schedule.state, list(schedule.trace))
        message = ""
        try:
            call()
            accepted = True
        except ScheduleError as err:
            accepted, message = False, str(err)
            assert message.split("(")[0] in (
                "split",
                "reorder",
                "skew",
                "fuse",
                "distribute",
                "vectorize",
                "tile",
            )
        if not accepted and "would run" not in message:
            continue  # structurally impossible (not siblings, ...): not a legality verdict
        if not accepted:
            # judge the step the checker refused: apply it without the check
            schedule._state, schedule.trace = before
            # the same state, unchecked: states are frozen records, so sharing one is safe
            trial = Schedule(schedule.program, schedule.target, checked=False)
            trial._state = schedule.state
            if band is None:
                _apply(trial, kind, seed)[0]()
                expected = _oracle_legal(trial, inst, deps)
            else:
                expected = _oracle_legal(trial, inst, deps, band)
        else:
            expected = (
                _oracle_legal(schedule, inst, deps, band)
                if band
                else _oracle_legal(schedule, inst, deps)
            )
        VERDICTS["legal" if accepted else "illegal"] += 1
        assert accepted == expected, (
            f"{kind}: checker {'accepted' if accepted else 'refused'}, oracle says "
            f"{'legal' if expected else 'illegal'}\n{schedule}"
        )
        if not accepted:
            break


def teardown_module(module) -> None:
    print(f"\noracle verdicts: {dict(VERDICTS)}")


@settings(
    max_examples=80,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(program=programs(), plan=steps(), seed=st.integers(0, 2**16))
def test_accepted_schedules_are_bit_exact(program, plan, seed) -> None:
    """Every schedule the checker accepts compiles and matches the PyTorch reference; a refused
    step raises ScheduleError and changes nothing."""
    from hypothesis import assume

    from tensorgen.codegen.scheduled import compile_scheduled
    from tensorgen.driver import Job, random_inputs, run_and_compare
    from tensorgen.errors import CodegenError
    from tensorgen.target import load_target

    tg1 = load_target("tg1")
    schedule = Schedule(program, tg1)
    for kind, s in plan:
        applied = _apply(schedule, kind, s)
        if applied is None:
            continue
        trace, umap = list(schedule.trace), schedule.union_map()
        try:
            applied[0]()
        except ScheduleError:
            assert schedule.trace == trace and schedule.union_map().is_equal(umap)
    try:
        compiled = compile_scheduled(program, tg1, schedule)
    except CodegenError:
        assume(False)  # e.g. a vectorized loop whose bounds vary: refused by the backend, not wrong
        return
    cmp, _ = run_and_compare(Job(program, tg1, compiled), random_inputs(program, seed))
    assert cmp.exact, f"{cmp.message}\n{schedule}"
