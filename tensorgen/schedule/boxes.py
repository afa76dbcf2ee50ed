"""What a staged buffer holds: the box of a tensor that one iteration of a loop touches.

`staged_box` gives its origin (affine in the schedule dimensions up to the loop) and size,
and whether a buffer of it needs a load, a zero fill or neither; the lowering (codegen) and the
capacity check (memory.py) read it. The queries below it decide when the first update of an
accumulator may overwrite instead of add, so that its buffer need not be zeroed.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import islpy as isl

from tensorgen.ir import poly
from tensorgen.ir.core import Program
from tensorgen.poly.footprint import hull_and_range, union_aligned
from tensorgen.schedule.state import State, find, prefix, resolve


@dataclass(frozen=True)
class FirstTouch:
    """The iterations of a staging loop whose box no earlier iteration's box meets, for a tensor


    that starts as zeros but whose boxes meet (a `+=` accumulator staged inside a loop over
        chunks of its reduction): in those the buffer starts as zeros instead of being loaded.
        `first` and `rest` (the iterations that load) are disjunctions of conjunctions of
        constraints (constant, {"d<k>": coefficient}) >= 0 over the schedule dimensions up to the
        loop, each exact within the iterations that exist."""

    first: tuple[tuple[tuple[int, dict[str, int]], ...], ...]
    rest: tuple[tuple[tuple[int, dict[str, int]], ...], ...]
    count: int  # how many iterations are first
    covered: bool  # in every iteration, every element of the box inside the tensor is written


@dataclass(frozen=True)
class StagedBox:
    offset: tuple  # per dimension: (constant, {"d<k>": coefficient}) over schedule dimensions
    size: tuple[int, ...]
    fresh: bool  # the buffer starts as zeros: no load needed
    covered: bool = False  # fresh, and every element of the box inside the tensor is written in its
    # iteration (so that the buffer need not be zeroed) by a program that reads no initial value of it
    first: FirstTouch | None = None  # not fresh, starts as zeros: the iterations that need no load
    disjoint_in_loop: bool = (
        False  # not fresh, written: no two iterations of the loop with the same
    )
    # outer iterations meet, so a double buffer may load the next box while the last one is stored
    steps: tuple[
        int, ...
    ] = ()  # per dimension, the stride of the elements accessed (2: every other row)
    halo: bool = False  # some access falls outside the tensor: its padding halo, read as the pad


def staged_box(
    program: Program, state: State, tensor: str, loop: str | None, overlaps: bool = True
) -> StagedBox | None:
    """The box a buffer of `tensor` staged at `loop` (None: the program) holds in one iteration.

    Its origin is affine in the schedule dimensions d0..dp up to the loop (one piece, or
    CodegenError-worthy None offsets), its size the largest over the iterations; `fresh` says
    that no iteration's box meets another's and the tensor starts as zeros (an output or a
    temporary), so a buffer needs no load: zeros are its correct initial contents. Boxes that
    meet are analysed further (`first`, `disjoint_in_loop`) unless `overlaps` is False.
    """
    pos, stmts = -1, frozenset(state.maps)
    if loop:
        _, pos, stmts = resolve(state, find(state, loop), "stage", False)
    # the box is a function of the program, the schedule up to `pos` of the statements that
    # access the tensor and the arguments: keyed by their text, so that the search's probes (a
    # level outside the loops two orders differ in), the schedule it builds and each capacity
    # check (which measures every staged buffer again) compute it once
    uptos = [
        (st, prefix(state, st.name, pos))
        for st in program.statements
        if st.name in stmts and any(a.tensor == tensor for a in [st.lhs] + st.reads)
    ]
    key = (id(program), tensor, pos, overlaps, tuple((st.name, str(m)) for st, m in uptos))
    hit = _BOXES.get(key)
    if hit is not None and hit[0] is program:  # the entry holds the program: its id is not reused
        return hit[1]
    image, written = _images(tensor, pos, uptos)
    t = program.tensor(tensor)
    # the analysis below is a function of the images, the tensor and (for a stored output only)
    # whether its initial zeros are read: different schedules (the bias at any level of any
    # order) and different layers of one shape give the same images, worked out once
    facts = (t.name, t.shape, t.role, zeros_read(program, tensor) if t.role == "output" else None)
    text = (facts, pos, overlaps, str(image), str(written))
    box = _BOXES_BY_IMAGE.get(text, _MISSING)
    if box is _MISSING:
        box = _staged_box(program, tensor, pos, image, written, overlaps)
        _remember(_BOXES_BY_IMAGE, text, box)
    _remember(_BOXES, key, (program, box))
    return box


BOX_CACHE = 4096  # staged boxes remembered (the oldest forgotten first)
_BOXES: dict[tuple, tuple[Program, StagedBox | None]] = {}
_BOXES_BY_IMAGE: dict[tuple, StagedBox | None] = {}  # keyed by the images' text, any program
_MISSING = object()


def _remember(cache: dict, key, value) -> None:
    if len(cache) >= BOX_CACHE:
        del cache[next(iter(cache))]
    cache[key] = value


def _images(tensor: str, pos: int, uptos) -> tuple[isl.Set | None, isl.Set | None]:
    """The elements of `tensor` that the statements accessing it touch in one iteration of
    the schedule dimensions d0..dp (as parameters), given their schedules `uptos` (statement,
    its schedule up to `pos`): all of them, and those written (None: none)."""
    image = written = None
    for st, upto in uptos:
        for acc in [st.lhs] + st.reads:
            if acc.tensor != tensor:
                continue
            # the staged box includes the padding halo: the DMA fills it, so it takes space
            rel = upto.reverse().apply_range(poly.access_map(st, acc))
            part = rel.move_dims(isl.dim_type.param, 0, isl.dim_type.in_, 0, pos + 1).range()
            image = union_aligned(image, part)
            if acc is st.lhs:
                written = union_aligned(written, part)
    return image, written


def _staged_box(
    program: Program, tensor: str, pos: int, image, written, overlaps: bool
) -> StagedBox | None:
    """staged_box of `tensor` given the `image` of its accesses in one iteration and the part
    of it `written` (_images)."""
    t = program.tensor(tensor)
    if image is None or image.is_empty():
        return None
    offset, size, spans = hull_and_range(image)
    fresh = (
        None not in offset
        and t.role in ("output", "none")
        and _boxes_disjoint(tensor, pos, offset, size, image)
    )
    # (only asked where it decides something: a stored buffer whose initial zeros nothing reads)
    covered = (
        fresh
        and written is not None
        and t.role != "none"
        and not zeros_read(program, tensor)
        and _box_covered(t, pos, offset, size, image, written)
    )
    first, disjoint = None, False
    if overlaps and not fresh and written is not None and None not in offset and pos >= 0:
        first, disjoint = _overlaps(t, pos, offset, size, image, written)
    steps = tuple(
        max(1, int(image.get_stride(d).to_python())) if n > 1 else 1 for d, n in enumerate(size)
    )
    halo = _outside(t, spans)
    return StagedBox(tuple(offset), tuple(size), fresh, covered, first, disjoint, steps, halo)


def _outside(t, spans: list[tuple[int, int]]) -> bool:
    """Whether some element of an image whose least and greatest values per dimension are
    `spans` (hull_and_range) lies outside the tensor `t`: a padding halo, which a buffer that
    is never loaded must hold as the pad."""
    return any(lo < 0 or hi >= n for (lo, hi), n in zip(spans, t.shape, strict=True))


def initial_value_read(program: Program, tensor: str) -> bool:
    """Whether some instance reads an element of `tensor` before any statement writes it
    (a `+=` of a tensor that starts as zeros): only then must a fresh buffer be zeroed."""
    return not _initial_readers(program, tensor).is_empty()


def zeros_read(program: Program, tensor: str) -> bool:
    """Whether a fresh buffer of `tensor` must be zeroed: some instance reads an initial value
    of it, and the first `+=` to each element cannot simply overwrite it instead (see
    `overwrites_first`)."""
    return initial_value_read(program, tensor) and not overwrites_first(program, tensor)


def overwrites_first(program: Program, tensor: str) -> bool:
    """Whether the lowering may run the first update of each element of a fresh `tensor` as
    an overwrite (`Y = rhs` for `Y += rhs`: VMUL for VMAC, a MATMUL that does not accumulate),
    so that its buffer need not be zeroed: one `+=` statement writes it and nothing else
    reads it."""
    accessing = [
        s
        for s in program.statements
        if s.lhs.tensor == tensor or any(a.tensor == tensor for a in s.reads)
    ]
    if len(accessing) != 1:
        return False
    (stmt,) = accessing
    return (
        stmt.lhs.tensor == tensor
        and stmt.op == "+="
        and not any(a.tensor == tensor for a in stmt.reads)
    )


def first_writes(
    program: Program, state: State, statement: str, depth: int | None = None
) -> isl.Set:
    """The schedule points of `statement` that write an element of its left-hand side in the
    earliest value of the schedule dimensions d0..d<depth-1> (all of them by default) that
    writes it: with a band below `depth`, every instance of the band's first block."""
    stmt = next(s for s in program.statements if s.name == statement)
    sched = state.maps[statement]
    n = sched.dim(isl.dim_type.out)
    upto = sched.project_out(isl.dim_type.out, depth, n - depth) if depth is not None else sched
    writes = poly.access_map(stmt, stmt.lhs)  # instance -> element
    first = writes.reverse().apply_range(upto).lexmin()  # element -> its first prefix
    instances = writes.range_product(upto).intersect_range(first.wrap()).domain()
    return instances.apply(sched)


def _box_covered(t, pos: int, offset, size, image: isl.Set, written: isl.Set) -> bool:
    """Whether, in every iteration, the writes cover the box (within the tensor's bounds)."""
    dims = [f"d{k}" for k in range(pos + 1)]
    cons = []
    for d, ((const, coefs), n) in enumerate(zip(offset, size, strict=False)):
        lo = " + ".join([str(const)] + [f"{c}*{k}" for k, c in coefs.items()])
        cons.append(f"{lo} <= e{d} < {lo} + {n} and 0 <= e{d} < {t.shape[d]}")
    elems = ", ".join(f"e{d}" for d in range(len(size)))
    box = isl.Set(f"[{', '.join(dims)}] -> {{ {t.name}[{elems}] : {' and '.join(cons)} }}")
    box = box.align_params(image.get_space()).intersect_params(image.params())
    return box.is_subset(written.align_params(box.get_space()))


def _boxes_disjoint(tensor: str, pos: int, offset, size, image: isl.Set) -> bool:
    if pos < 0:
        return True
    box, iterations = _box_map(tensor, pos, offset, size, image)
    return box.intersect_domain(iterations).reverse().is_single_valued()


def _overlaps(
    t, pos: int, offset, size, image: isl.Set, written: isl.Set
) -> tuple[FirstTouch | None, bool]:
    """For boxes that meet across iterations: the iterations whose box no earlier one meets
    (for a tensor that starts as zeros), and whether the boxes of one pass of the loop (its
    outer iterations fixed) are disjoint."""
    box, iterations = _box_map(t.name, pos, offset, size, image)
    box = box.intersect_domain(iterations)
    meets = box.apply_range(
        box.reverse()
    )  # iteration -> the iterations whose boxes share an element
    dims = [f"d{k}" for k in range(pos + 1)]
    other = [f"{d}'" for d in dims]
    same = " and ".join(
        [f"{a} = {b}" for a, b in zip(dims[:-1], other[:-1], strict=False)]
        + [f"{dims[-1]} != {other[-1]}"]
    )
    in_pass = isl.Map(f"{{ [{', '.join(dims)}] -> [{', '.join(other)}] : {same} }}")
    disjoint = meets.intersect(in_pass).is_empty()
    if t.role not in ("output", "none"):
        return None, disjoint
    first = iterations.subtract(meets.intersect(isl.Map.lex_gt(iterations.get_space())).domain())
    if first.is_empty():
        return None, disjoint
    pieces = (
        _constraint_pieces(first, iterations),
        _constraint_pieces(iterations.subtract(first), iterations),
    )
    if None in pieces:
        return None, disjoint
    covered = _box_covered(t, pos, offset, size, image, written)
    return FirstTouch(pieces[0], pieces[1], int(first.count_val().to_python()), covered), disjoint


def overwriting_blocks(
    program: Program, state: State, statement: str, depth: int
) -> isl.Set | None:
    """For a `+=` statement that alone accesses its tensor, which starts as zeros: the
    schedule points of its blocks (instances that share the schedule dimensions before
    `depth`: one MATMUL of a band that starts there) that update only elements whose first
    update they hold, provided every instance that reads an initial value lies in such a
    block. Such a block may overwrite its elements instead of adding to them, and a buffer
    need not be zeroed for it. None when some initial value is read elsewhere."""
    stmt = next(st for st in program.statements if st.name == statement)
    tensor = program.tensor(stmt.lhs.tensor)
    if (
        stmt.op != "+="
        or tensor.role not in ("output", "none")
        or depth < 1
        or any(
            a.tensor == tensor.name
            for st in program.statements
            for a in [st.lhs] + st.reads
            if st is not stmt
        )
        or any(a.tensor == tensor.name for a in stmt.reads)
    ):
        return None
    initial = (
        _initial_readers(program, tensor.name)
        .intersect(isl.UnionSet.from_set(poly.domain(stmt)))
        .extract_set(poly.domain(stmt).get_space())
    )
    if initial.is_empty():
        return None
    block = prefix(state, statement, depth - 1)  # { S[i] -> [d0..d<depth-1>] }
    lhs = poly.access_map(stmt, stmt.lhs).intersect_domain(poly.domain(stmt))
    updates = block.reverse().apply_range(lhs)  # block -> the elements it updates
    firsts = (
        block.intersect_domain(initial).reverse().apply_range(lhs)
    )  # ... whose first update it holds
    overwriting = updates.domain().subtract(updates.subtract(firsts).domain())
    instances = block.intersect_range(overwriting).domain()
    if not initial.is_subset(instances):
        return None
    return state.maps[statement].intersect_domain(instances).range()


def _box_map(tensor: str, pos: int, offset, size, image: isl.Set) -> tuple[isl.Map, isl.Set]:
    """{ [d0..dp] -> tensor[box] } of a staged box, and the iterations (prefix values d0..dp, the
    parameters of `image`) as a set over [d0..dp]."""
    dims = [f"d{k}" for k in range(pos + 1)]
    elems = [f"e{d}" for d in range(len(size))]
    cons = []
    for d, ((const, coefs), n) in enumerate(zip(offset, size, strict=False)):
        lo = " + ".join([str(const)] + [f"{c}*{k}" for k, c in coefs.items()])
        cons.append(f"{lo} <= e{d} < {lo} + {n}")
    box = isl.Map(
        f"{{ [{', '.join(dims)}] -> {tensor}[{', '.join(elems)}] : {' and '.join(cons)} }}"
    )
    ordered = image.params().align_params(isl.Set(f"[{', '.join(dims)}] -> {{ : }}").get_space())
    iterations = isl.Set.from_params(ordered).move_dims(
        isl.dim_type.set, 0, isl.dim_type.param, 0, len(dims)
    )
    return box, iterations


def _constraint_pieces(points: isl.Set, context: isl.Set):
    """`points` as disjoint conjunctions of constraints (constant, {"d<k>": coefficient}) >= 0,
    simplified within `context`; None if a piece needs an existential variable."""
    pieces = []
    for part in points.make_disjoint().get_basic_sets():
        for bset in isl.Set.from_basic_set(part).gist(context).get_basic_sets():
            if bset.dim(isl.dim_type.div):
                return None
            cons = []
            for c in bset.get_constraints():
                const = int(c.get_constant_val().to_python())
                coefs = {
                    f"d{k}": int(c.get_coefficient_val(isl.dim_type.set, k).to_python())
                    for k in range(bset.dim(isl.dim_type.set))
                }
                coefs = {k: v for k, v in coefs.items() if v}
                cons.append((const, coefs))
                if c.is_equality():
                    cons.append((-const, {k: -v for k, v in coefs.items()}))
            pieces.append(tuple(cons))
    return tuple(pieces)


@lru_cache(maxsize=256)
def _initial_readers(program: Program, tensor: str) -> isl.UnionSet:
    """The instances that read an element of `tensor` before any statement writes it."""
    if _written_first(program, tensor):
        return isl.UnionSet("{ }")
    return _initial_readers_by_flow(program, tensor)


def _written_first(program: Program, tensor: str) -> bool:
    """Whether no instance reads an initial value of `tensor` for a plain reason, without
    isl's dataflow analysis (3 ms a program and tensor, 0.28 s of ResNet-18's compile, where
    this answers every one): the first statement that accesses it is an `=` that does not read
    it, every statement runs after the one before (no shared loops), and it writes every
    element of the tensor that any statement reads. Then each read has that write before it.
    False declines: _initial_readers_by_flow decides."""
    if program.shared_loops:
        return False
    box = poly.tensor_box(program.tensor(tensor))
    first, written, read = None, None, None
    for stmt in program.statements:
        accs = stmt.reads + ([stmt.lhs] if stmt.op != "=" else [])
        mine = [acc for acc in accs if acc.tensor == tensor]
        if first is None:
            if mine:
                return False  # read before (or as) it is first written
            if stmt.lhs.tensor != tensor:
                continue
            first = stmt
            written = poly.access_map(stmt, stmt.lhs).range().intersect(box)
            continue
        for acc in mine:
            part = poly.access_map(stmt, acc).range().intersect(box)
            read = part if read is None else read.union(part)
    return first is not None and (read is None or read.is_subset(written))


def _initial_readers_by_flow(program: Program, tensor: str) -> isl.UnionSet:
    """_initial_readers by isl's dataflow analysis (the instances of the reads of `tensor`
    that no write precedes)."""
    reads = isl.UnionMap("{ }")
    for stmt in program.statements:
        # `+=` and `max=` read the element they update
        accs = stmt.reads + ([stmt.lhs] if stmt.op != "=" else [])
        for acc in accs:
            if acc.tensor == tensor:
                m = poly.access_map(stmt, acc).intersect_range(
                    poly.tensor_box(program.tensor(tensor))
                )
                reads = reads.union(isl.UnionMap.from_map(m))
    if reads.is_empty():
        return isl.UnionSet("{ }")
    flow = (
        isl.UnionAccessInfo.from_sink(reads)
        .set_must_source(poly.accesses(program, "write"))
        .set_schedule_map(poly.schedule_map(program))
        .compute_flow()
    )
    return flow.get_may_no_source().domain()
