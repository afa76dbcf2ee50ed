"""The layers the automatic scheduler takes, and the skeleton of their schedules.

A layer is one contraction (`ACC += A * B`, on the MAC array or the vector unit), optionally
preceded by the init of its accumulator (`ACC = B[k]`, `ACC = 0`) and followed by element-wise
statements over its output indices (`Y = requant(relu(ACC), s, zp)`, through temporaries if
need be). Its skeleton fuses every statement at the contraction's outer output loops (the
tile), so that each tile's init runs before the reduction loops begin and its epilogue after
they end, while the accumulator tile stays on chip. It is built from the schedule primitives
(reorder, fuse, split, distribute): the automatic scheduler checks the schedule it chooses
against the program's dependences, and a replay of its trace checks every step.
"""

from __future__ import annotations

from dataclasses import dataclass

from tensorgen.ir.core import Program, Statement
from tensorgen.ir.queries import out_indices
from tensorgen.schedule.api import Loop, Schedule


@dataclass(frozen=True)
class Layer:
    init: Statement | None
    contraction: Statement
    epilogue: tuple[Statement, ...]

    @property
    def statements(self) -> tuple[Statement, ...]:
        return tuple(s for s in (self.init, self.contraction, *self.epilogue) if s is not None)

    @property
    def others(self) -> tuple[Statement, ...]:
        """The statements fused with the contraction's tiles (init and epilogue)."""
        return tuple(s for s in self.statements if s is not self.contraction)

    @property
    def accumulator(self) -> str:
        return self.contraction.lhs.tensor

    def tensors(self) -> list[str]:
        """Every tensor of the layer: the accumulator, the contraction's operands, then the rest."""
        c = self.contraction
        names = [c.lhs.tensor] + [a.tensor for a in c.reads]
        for s in self.others:
            names += [s.lhs.tensor] + [a.tensor for a in s.reads]
        return list(dict.fromkeys(names))

    def accessing(self, tensor: str) -> list[Statement]:
        return [s for s in self.statements if any(a.tensor == tensor for a in [s.lhs] + s.reads)]


def recognise(program: Program) -> Layer | str:
    """The layer form of `program`, or why it is not one."""
    if program.shared_loops:
        return "the automatic scheduler does not take shared loops (recurrences)"
    stmts = program.statements
    updates = [s for s in stmts if s.op != "="]
    form = (
        "the automatic scheduler takes one reduction ('+=' of a product on the MAC array; '+=', 'max=' or "
        "'min=' on the vector unit), optionally after the init of its accumulator and before element-wise "
        "statements, or element-wise statements alone"
    )
    if not updates and stmts:
        updates = [
            stmts[0]
        ]  # element-wise alone: the first statement leads, the rest follow it point-wise
    if len(updates) != 1:
        return form
    c = updates[0]
    at = stmts.index(c)
    if at > 1:
        return form
    if len(stmts) == 1:
        return Layer(None, c, ())
    init = stmts[0] if at == 1 else None
    layer = Layer(init, c, stmts[at + 1 :])
    out = out_indices(program, c)
    if any(sub.bare() is None for sub in c.lhs.index):
        return f"{c.name} writes {c.lhs}: the fused layers the automatic scheduler takes write plain indices"
    if init is not None and (
        init.lhs != c.lhs or any(a.tensor in {s.lhs.tensor for s in stmts} for a in init.reads)
    ):
        return (
            f"{init.name} is not the init of {c.name}'s accumulator {c.lhs} from the layer's inputs"
        )
    writer = {}
    for s in layer.statements:
        writer.setdefault(s.lhs.tensor, s.lhs)
    bounds = dict(zip(c.indices, c.bounds, strict=False))
    for s in layer.others:
        if (
            s.where
            or set(s.indices) != set(out)
            or any(bounds[i] != b for i, b in zip(s.indices, s.bounds, strict=False))
        ):
            return f"{s.name} does not run over exactly the output indices of {c.name} ({', '.join(out)})"
        if any(sub.bare() is None for sub in s.lhs.index):
            return f"{s.name} writes {s.lhs}: the fused layers the automatic scheduler takes write plain indices"
        for acc in s.reads:
            if acc.tensor in writer and acc != writer[acc.tensor]:
                return f"{s.name} reads {acc}, not point-wise what {writer[acc.tensor]} holds"
        if s is not init and s.lhs.tensor in {a.tensor for a in c.reads}:
            return f"{s.name} overwrites {s.lhs.tensor}, an operand of {c.name}"
    return layer


@dataclass(frozen=True)
class Geometry:
    """The contraction's loops after its splits: the widest trip count of each, and for the inner
    loop of a split, its outer loop and the size of its last, partial block (0: none)."""

    trips: dict[str, int]
    outer: dict[str, str]
    partial: dict[str, int]
    base: dict[str, str]  # loop -> the index it comes from

    @staticmethod
    def of(stmt: Statement, blocks) -> Geometry:
        trips = {i: stmt.extent(i) for i in stmt.indices}
        outer, partial, base = {}, {}, {i: i for i in stmt.indices}
        for name, size in blocks:
            e = trips[name]
            if e <= size:
                continue
            o, i = f"{name}_o", f"{name}_i"
            trips[o], trips[i] = -(-e // size), size
            outer[i], partial[i] = o, e % size
            base[o] = base[i] = base[name]
        return Geometry(trips, outer, partial, base)

    def blocks(self, outside: list[str], inside: list[str]) -> list[tuple[int, int]]:
        """(count, elements) of the blocks of the `inside` loops over all iterations of the
        `outside` loops; the partial blocks of a split whose outer loop is outside apart."""
        kinds = [(1, 1)]
        count = 1
        paired = {self.outer.get(x) for x in inside}
        for o in outside:
            if o not in paired:
                count *= self.trips[o]
        for x in inside:
            o = self.outer.get(x)
            if o in outside:
                full = self.trips[o] - (1 if self.partial[x] else 0)
                options = [(full, self.trips[x])] + (
                    [(1, self.partial[x])] if self.partial[x] else []
                )
            else:
                options = [(1, self.trips[x])]
            kinds = [(n * m, e * f) for n, e in kinds for m, f in options]
        return [(count * n, e) for n, e in kinds]


@dataclass
class Skeleton:
    """A layer's schedule before staging: the contraction's loops by their names in the search
    (`k_o`, `c_i`, ...), the fused tile loops, and each other statement's own loops in the tile
    (outermost first), which the vector unit runs."""

    schedule: Schedule
    loops: dict[str, Loop]
    fused: tuple[str, ...]
    own: dict[str, list[Loop]]
    own_names: list[str]


def fused_prefix(layer: Layer, geometry: Geometry, order: tuple[str, ...], out) -> tuple[str, ...]:
    """The loops shared by all statements of a fused layer: the contraction's outer loops up to
    its first reduction loop."""
    if not layer.others:
        return ()
    fused = []
    for x in order:
        if geometry.base[x] not in out:
            break
        fused.append(x)
    return tuple(fused)


def build_skeleton(
    program: Program,
    target,
    layer: Layer,
    blocks,
    order: tuple[str, ...],
    band: list[str],
    checked: bool = True,
) -> Skeleton:
    """Splits, fusion and loop order of a layer: the fused tile loops, then in each tile the
    init's loops, the contraction's outer loops and band (`order` after the tile loops, then
    `band`), and the epilogue's loops."""
    s = Schedule(program, target, checked)
    c = layer.contraction
    geo = Geometry.of(c, blocks)
    fused = fused_prefix(layer, geo, order, out_indices(program, c))
    handles = {
        st.name: dict(zip(st.indices, s.loops(st.name), strict=False)) for st in layer.statements
    }
    fbase = list(dict.fromkeys(geo.base[x] for x in fused))
    shared, per, done = _fuse_tiles(s, layer, blocks, fused, fbase, handles)
    loops = {
        **shared,
        **per[c.name],
        **{i: h for i, h in handles[c.name].items() if i not in fbase},
    }
    for name, size in blocks:
        if name not in done and s.trips(loops[name]) > size:
            o, i = s.split(loops.pop(name), size)
            loops[f"{name}_o"], loops[f"{name}_i"] = o, i
    inner = list(order[len(fused) :]) + list(band)
    if len(inner) >= 2:
        s.reorder(*(loops[x] for x in inner))
    # each other statement's loops in a tile, in the order of the contraction's output
    names = []
    for sub in c.lhs.index:
        b = sub.bare()
        names += (
            [x for x in per[c.name] if geo.base[x] == b and x not in fused] if b in fbase else [b]
        )
    own: dict[str, list[Loop]] = {}
    for st in layer.others:
        mine = {**per[st.name], **{i: h for i, h in handles[st.name].items() if i not in fbase}}
        if len(names) >= 2 and names != sorted(mine, key=lambda x: s.position(mine[x])):
            s.reorder(*(mine[x] for x in names))
        own[st.name] = [mine[x] for x in names]
    return Skeleton(s, loops, fused, own, names if layer.others else [])


def _fuse_tiles(
    s: Schedule, layer: Layer, blocks, fused: tuple[str, ...], fbase: list[str], handles
):
    """Fuse the statements' loops over the indices of the tile loops `fused`, split those loops
    (once, for every statement), and give each statement its own copy of the loops that the
    splits leave inside a tile. Returns the tile loops, each statement's copies of the loops
    inside a tile, and the blocks split."""
    stmts = layer.statements
    shared: dict[str, Loop] = {}
    per: dict[str, dict[str, Loop]] = {st.name: {} for st in stmts}
    done: set[str] = set()
    if not fused:
        return shared, per, done
    for st in stmts:
        want = fbase + [i for i in st.indices if i not in fbase]
        if want != list(st.indices):
            s.reorder(*(handles[st.name][i] for i in want))
    for b in fbase:
        loop = handles[stmts[0].name][b]
        for st in stmts[1:]:
            loop = s.fuse(loop, handles[st.name][b])
        shared[b] = loop
    for name, size in blocks:
        if name in shared and f"{name}_o" in fused and s.trips(shared[name]) > size:
            o, i = s.split(shared.pop(name), size)
            shared[f"{name}_o"], shared[f"{name}_i"] = o, i
            done.add(name)
    rest = sorted((x for x in shared if x not in fused), key=lambda x: s.position(shared[x]))
    if list(fused) + rest != sorted(shared, key=lambda x: s.position(shared[x])):
        s.reorder(*(shared[x] for x in list(fused) + rest))
    for x in reversed(rest):  # innermost first
        loop = shared.pop(x)
        for j in range(1, len(stmts)):
            moved = s.distribute(loop, *(st.name for st in stmts[j:]))
            per[stmts[j - 1].name][x] = loop
            loop = moved
        per[stmts[-1].name][x] = loop
    return shared, per, done


def accumulator_levels(
    program: Program, layer: Layer, blocks, order, tensors: list[str], levels: list[list]
) -> list[list]:
    """The contraction's accumulator is not staged at or inside a ragged reduction loop (one
    whose last block is partial, like 7 columns of a kernel in blocks of 4). Staged there, its
    footprints are loaded, updated and stored again per reduction step in pieces the cost model
    does not follow yet: it underestimates them by up to 30 % and the search picked one (stem on
    tiny: 41,310 modelled cycles, 53,910 simulated, against 42,050 staging it at k_o). Even
    reduction chunks (BERT's FFN down-projection) are modelled exactly and stay in the space."""
    acc = layer.contraction.lhs.tensor
    if acc not in tensors:
        return levels
    geo = Geometry.of(layer.contraction, blocks)
    out = out_indices(program, layer.contraction)
    ragged = {geo.outer[i] for i, rest in geo.partial.items() if rest}
    allowed, seen_ragged = {None}, False
    for x in order:
        seen_ragged = seen_ragged or (geo.base[x] not in out and x in ragged)
        if not seen_ragged:
            allowed.add(x)
    i = tensors.index(acc)
    kept = [lv for lv in levels[i] if lv in allowed]
    return [*levels[:i], kept or levels[i], *levels[i + 1 :]]
