"""The default schedules, built from the schedule primitives: always legal (a step the
dependences forbid is skipped). `primitive_default` schedules statement by statement,
`fused_default` fuses the statements over blocks of output rows; the driver measures a few
of each (blocks, staging) on the simulator and keeps the fastest.
"""

from __future__ import annotations

import contextlib

from tensorgen.errors import ScheduleError
from tensorgen.ir.core import Program, Statement
from tensorgen.ir.queries import mac_mapping, out_indices
from tensorgen.schedule.api import Loop, Schedule
from tensorgen.target import Target

# per vector reduction blocked by `_block_reductions`: the loop its accumulator is staged at and
# the one its operands are
VecAt = dict[str, tuple[Loop | None, Loop | None]]


def primitive_default(
    program: Program,
    target: Target,
    tensorize: bool = True,
    stage: bool = False,
    m_block: int | None = None,
    v_block: int | None = None,
) -> Schedule:
    """The simple default schedule built from the schedule primitives, statement by statement:
    a contraction of 8-bit operands runs on the MAC array in blocks of its shape (N and K split
    by the array's columns and rows, M streamed whole), any other statement as vectors over a
    loop that carries no dependence (its innermost, else the innermost one that can be moved
    inside). A step the program's dependences forbid is skipped, so the result is always legal;
    tensors are staged whole, as the lowering does when the schedule names no stage.
    `tensorize=False`: every statement on the vector unit (a triangular or short contraction
    can run faster as vectors over its output than as small MATMULs). `stage`: each tensor
    staged at the innermost loop that encloses every statement accessing it (outside the vector
    and MAC-array bands), for a target whose memories do not hold the tensors whole.
    `m_block`: the streamed M split into blocks of that many rows; `v_block`: the vectorized
    loop split into blocks of that many lanes, and a vector reduction's loops too."""
    s = Schedule(program, target)
    acc_at: dict[str, Loop | None] = {}  # per tensorized statement, its accumulator's loop
    red = {st.name: _reduction_loops(s, program, st) for st in program.statements}
    vec_at: VecAt = {}
    for stmt in program.statements:
        if tensorize and _tensorize(s, program, target, stmt, m_block, acc_at):
            continue
        _vectorize(s, program, stmt, v_block, red[stmt.name], vec_at)
    if stage:
        _stage_innermost(s, program, acc_at, red, vec_at)
    return s


def _reduction_loops(s: Schedule, program: Program, stmt: Statement) -> set[int]:
    """Ids of the loops of `stmt` over indices its output does not have (its reductions)."""
    out = set(out_indices(program, stmt)) | set(program.shared_names)
    return {h.id for i, h in zip(stmt.indices, s.loops(stmt.name), strict=True) if i not in out}


def _stage_innermost(
    s: Schedule,
    program: Program,
    acc_at: dict[str, Loop | None],
    red: dict[str, set[int]],
    vec_at: VecAt,
) -> None:
    """Each tensor staged at the innermost loop outside the bands that encloses all statements
    accessing it; for a reduction on the vector unit, outside its reduction loops too (its
    accumulator then stays on chip while it reduces)."""
    tensorized = {name for ms, n, ks in s.tensorized for name in (*ms, n, *ks)}
    banded = set(s.vectorized) | tensorized
    on_array = {  # what the MAC array accumulates lives in the accumulators
        st.lhs.tensor
        for st in program.statements
        if any(h.name in tensorized for h in s.loops(st.name))
    }
    acc_loops = {  # loops of the statements on the MAC array
        h.name
        for st in program.statements
        if st.lhs.tensor in on_array and any(h.name in tensorized for h in s.loops(st.name))
        for h in s.loops(st.name)
    }
    for t in program.tensors:
        users = [
            st for st in program.statements if t.name in {a.tensor for a in [st.lhs, *st.reads]}
        ]
        if not users:
            continue
        common = _outside(s, users[0], t.name, banded, acc_at, (red, vec_at))
        for st in users[1:]:
            ids = {h.id for h in _outside(s, st, t.name, banded, acc_at, (red, vec_at))}
            common = [h for h in common if h.id in ids]
        if common:
            at = [common[-1]]
        else:  # no loop encloses every user: a stage at each user's innermost loop
            at = [
                acc_at[st.name] if st.name in acc_at and st.lhs.tensor == t.name else own[-1]
                for st in users
                if (own := _unbanded(s, st, banded))
            ]
            if None in at:  # an accumulator of the whole output
                continue
        for loop in dict.fromkeys(at):
            memory = "acc" if t.name in on_array and loop.name in acc_loops else "spad"
            try:
                s.stage(t.name, loop, memory)
            except ScheduleError:
                break  # over capacity there too: staged whole by the lowering


def _outside(s: Schedule, stmt: Statement, tensor: str, banded, acc_at, blocks) -> list[Loop]:
    """The loops of `stmt` a stage of `tensor` may sit at: outside its bands and, on the vector
    unit, outside its reductions (or their blocks, for an operand of blocked reductions)."""
    red, vec_at = blocks
    loops = _unbanded(s, stmt, banded)
    if stmt.name in acc_at:
        return loops
    if stmt.name in vec_at:
        acc, op = vec_at[stmt.name]
        limit = acc if tensor == stmt.lhs.tensor else op
        ids = [h.id for h in loops]
        return loops[: ids.index(limit.id) + 1] if limit is not None and limit.id in ids else []
    first = next((n for n, h in enumerate(loops) if h.id in red[stmt.name]), len(loops))
    return loops[:first]


def _unbanded(s: Schedule, stmt: Statement, banded: set[str]) -> list[Loop]:
    return [h for h in s.loops(stmt.name) if h.name not in banded]


def _own_loops(s: Schedule, program: Program, stmt: Statement) -> dict[str, Loop]:
    """The statement's own loops (not the shared ones) by index name, outermost first."""
    loops = dict(zip(stmt.indices, s.loops(stmt.name), strict=True))
    return {i: h for i, h in loops.items() if i not in program.shared_names}


def _tensorize(
    s: Schedule,
    program: Program,
    target: Target,
    stmt: Statement,
    m_block: int | None,
    acc_at: dict[str, Loop | None],
    own: dict[str, Loop] | None = None,
    tile: Loop | None = None,
) -> bool:
    """Put `stmt` on the MAC array; `own`: its loops inside the tile loops by index name (default:
    all but the shared loops), `tile`: the innermost tile loop, where its accumulator lives
    when no block loop of its own is outside the reduction."""
    mac = mac_mapping(program, stmt)
    if mac is None or mac.m is None or mac.n is None:
        return False
    own = own if own is not None else _own_loops(s, program, stmt)
    outer = [h for i, h in own.items() if i not in (mac.m, mac.n, mac.k)]
    blocked = []
    inner = {}
    try:
        for name, cap in ((mac.m, m_block), (mac.n, target.cols), (mac.k, target.rows)):
            if cap is not None and s.trips(own[name]) > cap:
                o, inner[name] = s.split(own[name], cap)
                blocked.append(o)
            else:
                inner[name] = own[name]
        order = [*outer, *blocked, inner[mac.m], inner[mac.n], inner[mac.k]]
        if [h.name for h in order] != [h.name for h in s.loops(stmt.name)[-len(order) :]]:
            s.reorder(*order)
        s.tensorize(inner[mac.m], inner[mac.n], inner[mac.k])
    except ScheduleError:
        return False
    k_at = len(outer) + len(blocked) - (1 if inner[mac.k] != own[mac.k] else 0)
    acc_at[stmt.name] = order[k_at - 1] if k_at > 0 else tile
    return True


def _vectorize_blocked(
    s: Schedule, loop: Loop, v_block: int | None, stmt=None, red=(), vec_at=None
) -> None:
    """Vectorize `loop`, in blocks of `v_block` iterations (its inner loop) when it is longer;
    with blocks, the reductions `red` of `stmt` are blocked too (`_block_reductions`)."""
    if v_block is not None and s.trips(loop) > v_block:
        loop = s.split(loop, v_block)[1]
    if v_block is not None and red:
        # an order the dependences forbid leaves the reductions where they are
        with contextlib.suppress(ScheduleError):
            vec_at[stmt.name] = _block_reductions(s, stmt, loop, red, v_block)
    s.vectorize(loop)


def _block_reductions(
    s: Schedule, stmt: Statement, vec: Loop, red: set[int], block: int
) -> tuple[Loop | None, Loop | None]:
    """Split the reduction loops of a vector statement into blocks of `block` and order its
    loops (outer output loops, reduction blocks, reductions in a block, the vector loop), so
    that its accumulator is staged outside the reductions (a block of the output) and its
    operands at a block of the reductions: both fit small memories."""
    own = [h for h in s.loops(stmt.name) if h.name not in set(s.program.shared_names)]
    outer = [h for h in own if h.id not in red and h != vec]
    blocks, inner = [], []
    for h in (h for h in own if h.id in red):
        if s.trips(h) > block:
            o, i = s.split(h, block)
            blocks.append(o)
            inner.append(i)
        else:
            inner.append(h)
    want = [*outer, *blocks, *inner, vec]
    if [h.name for h in want] != [h.name for h in s.loops(stmt.name)[-len(want) :]]:
        s.reorder(*want)
    acc = outer[-1] if outer else None
    return acc, (blocks[-1] if blocks else acc)


def _vectorize(
    s: Schedule,
    program: Program,
    stmt: Statement,
    v_block: int | None,
    red: set[int] = frozenset(),
    vec_at: VecAt | None = None,
) -> None:
    """Vectorize a loop of `stmt` over its output (not one of the reductions `red`): the
    innermost, else the innermost that can be moved inside."""
    shared = sum(1 for i in stmt.indices if i in program.shared_names)
    own = s.loops(stmt.name)[shared:]  # after any splits a failed tensorize left
    if not own:
        return
    if own[-1].id not in red:
        try:
            _vectorize_blocked(s, own[-1], v_block, stmt, red, vec_at)
            return
        except ScheduleError:
            pass
    for pick in reversed([h for h in own[:-1] if h.id not in red]):
        try:
            s.reorder(*[h for h in own if h != pick], pick)
        except ScheduleError:
            continue
        try:
            _vectorize_blocked(s, pick, v_block, stmt, red, vec_at)
            return
        except ScheduleError:
            s.reorder(*own)  # back to the original order: the move bought nothing


def fused_default(program: Program, target: Target, m_block: int) -> Schedule:
    """The statements fused over the first index of their outputs in blocks of `m_block`; in a
    block, each run of consecutive statements over outputs of the same shape (a layer: init,
    contraction, epilogue) fused again over the second output index, in blocks of the MAC
    array's columns if one of them runs on it. Contractions on the MAC array, the rest as
    vectors; each tensor staged at the innermost tile loop (or reduction block, for an operand)
    that encloses every statement accessing it: an intermediate between two layers stays on
    chip for a block of rows. Raises ScheduleError where the program does not take that form."""
    s = Schedule(program, target)
    stmts = program.statements
    outs = {st.name: out_indices(program, st) for st in stmts}
    if any(len(outs[st.name]) < 2 for st in stmts):
        raise ScheduleError("fused default: every statement writes a matrix or more")
    handles = {st.name: _own_loops(s, program, st) for st in stmts}
    for st in stmts:
        want = [*outs[st.name], *(i for i in handles[st.name] if i not in outs[st.name])]
        if want != list(handles[st.name]):
            s.reorder(*(handles[st.name][i] for i in want))
    groups = _layers(program, stmts, outs)
    cols = []
    for g in groups:  # within a layer first: a chain of fusions orders its statements right
        for depth in (0, 1):
            loop = handles[g[0].name][outs[g[0].name][depth]]
            for st in g[1:]:
                loop = s.fuse(loop, handles[st.name][outs[st.name][depth]])
        cols.append(loop)
    row = handles[stmts[0].name][outs[stmts[0].name][0]]
    for g in groups[1:]:
        row = s.fuse(row, handles[g[0].name][outs[g[0].name][0]])
    if s.trips(row) <= m_block:
        raise ScheduleError("fused default: the rows fit one block")
    tile, row = s.split(row, m_block)
    tiles: dict[str, list[Loop]] = {st.name: [tile] for st in stmts}
    acc_at: dict[str, Loop | None] = {}
    rows = _distribute(s, row, [[st.name for st in g] for g in groups])
    for g, grow, col in zip(groups, rows, cols, strict=True):
        on_array = any(mac_mapping(program, st) for st in g)
        if on_array and s.trips(col) > target.cols:
            col_o, col = s.split(col, target.cols)
            s.reorder(col_o, grow)
            for st in g:
                tiles[st.name].append(col_o)
        inner = [[st.name] for st in g]
        for loop in (col, grow):  # innermost first: each statement its own copy
            _distribute(s, loop, inner)
        for st in g:
            own = dict(
                zip(handles[st.name], s.loops(st.name)[-len(handles[st.name]) :], strict=True)
            )
            if not _tensorize(s, program, target, st, None, acc_at, own, tiles[st.name][-1]):
                _vectorize(s, program, st, None)
    _stage_tiles(s, program, tiles, acc_at)
    return s


def _layers(program: Program, stmts, outs) -> list[list[Statement]]:
    """Runs of consecutive statements whose outputs have the same extents."""
    groups: list[list[Statement]] = []
    for st in stmts:
        shape = [st.extent(i) for i in outs[st.name]]
        if groups and shape == [groups[-1][0].extent(i) for i in outs[groups[-1][0].name]]:
            groups[-1].append(st)
        else:
            groups.append([st])
    return groups


def _distribute(s: Schedule, loop: Loop, parts: list[list[str]]) -> list[Loop]:
    """`loop` distributed into one copy per part (statement names, in order)."""
    copies = [loop]
    for j in range(1, len(parts)):
        copies.append(s.distribute(copies[-1], *(n for p in parts[j:] for n in p)))
    return copies


def _stage_tiles(s: Schedule, program: Program, tiles, acc_at: dict[str, Loop | None]) -> None:
    tensorized = {name for ms, n, ks in s.tensorized for name in (*ms, n, *ks)}
    on_array = {st.lhs.tensor for st in program.statements if st.name in acc_at}
    for t in program.tensors:
        users = [
            st for st in program.statements if t.name in {a.tensor for a in [st.lhs, *st.reads]}
        ]
        if not users:
            continue
        places = list(tiles[users[0].name])
        if len(users) == 1 and users[0].name in acc_at and t.name != users[0].lhs.tensor:
            k_blocks = [h for h in s.loops(users[0].name) if h.name not in tensorized]
            places += k_blocks[len(places) :]  # an operand: at its reduction block
        at = next(
            (h for h in reversed(places) if all(u.name in s.statements_of(h) for u in users)),
            None,
        )
        if at is not None:
            s.stage(t.name, at, "acc" if t.name in on_array else "spad")
