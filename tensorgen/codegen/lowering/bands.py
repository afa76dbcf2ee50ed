"""Band pieces: the vectorized and tensorized bands by schedule position, and the
split of each statement into uniform pieces (first writes that overwrite, the rest)."""

from __future__ import annotations

import islpy as isl

from tensorgen.codegen.lowering.walk import _cst, _statements_under
from tensorgen.ir.core import Statement


class _BandPieces:
    """Methods of the scheduled lowering (tensorgen.codegen.scheduled._Lowering), one pass."""

    def _bands(self) -> list[tuple[str, tuple[int, ...], frozenset[str]]]:
        """(kind, schedule positions, statements) of every vectorized or tensorized band."""
        out = []
        for name in self.schedule.vectorized:
            pos, stmts = self.schedule.position(name), self.schedule.statements_of(name)
            out.append(("vector", (pos,), stmts))
        self.n_position: dict[
            tuple[int, ...], int
        ] = {}  # an array band's positions -> its N loop's
        for ms, n, ks in self.schedule.tensorized:
            positions = tuple(self.schedule.position(x) for x in (*ms, n, *ks))
            self.n_position[positions] = positions[len(ms)]
            out.append(("array", positions, self.schedule.statements_of(ms[0] if ms else n)))
        return out

    def _declared_n(self, stmt: Statement, band) -> int | None:
        """The band slot of the loop that tensorize named N for `stmt` (None: isl emitted no loop)."""
        for kind, positions, stmts in self.bands:
            if kind == "array" and stmt.name in stmts:
                entry = band.get(f"c{self.n_position[positions]}")
                return entry[0] if entry else None
        return None

    def _banded(self, ast_name: str, band) -> bool:
        """Whether AST statement `ast_name` (a piece of a statement) runs as `band`."""
        return not ast_name.endswith("__rest") and self.piece_of.get(ast_name, ast_name) in band[2]

    def _band_at(self, pos: int, node) -> tuple[str, tuple[int, ...], frozenset[str]] | None:
        """The band one of whose loops is the AST loop `node` (at schedule position `pos`)."""
        under = _statements_under(node)
        for band in self.bands:
            if pos in band[1] and under and all(self._banded(n, band) for n in under):
                return band
        return None

    def _separated(self) -> isl.UnionMap:
        """The schedule with each banded statement split into pieces in which every band loop
        has constant bounds (full tiles, then each kind of partial tile: one vector or MATMUL
        each); instances that fit no such piece form `S__rest` and run element by element.
        The MATMULs that hold the first update of every element they update (of a buffer that
        would be zeroed for them in the iterations that first touch it) form pieces `S__w<i>`
        that overwrite their accumulators, and the buffer is not zeroed."""
        out = isl.UnionMap("{ }")
        for stmt in self.program.statements:
            m = self.schedule.statement_map(stmt.name)
            positions = sorted({p for _, ps, stmts in self.bands if stmt.name in stmts for p in ps})
            if not positions and stmt.name not in self.first_writes:
                out = out.union(isl.UnionMap.from_map(m))
                self.piece_maps[stmt.name] = m
                continue
            if (
                stmt.name in self.first_writes
            ):  # the first writes of a fresh `+=`: pieces `S__first`
                parts = [
                    ("__first", self.first_writes[stmt.name][0]),
                    ("", self.first_writes[stmt.name][1]),
                ]
            else:  # the MATMULs that first touch a reloaded accumulator: pieces `S__w`
                parts, points = [], m.range()
                first = self._overwriting(stmt)
                if first is not None:
                    pieces, rest = _uniform_pieces(first, positions)
                    if rest is None or rest.is_empty():
                        parts.append(("__w", (pieces, None)))
                        self.no_fill.add(stmt.lhs.tensor)
                        points = points.subtract(first)
                parts.append(("", _uniform_pieces(points, positions)))
            for tag, (pieces, rest) in parts:
                named = [
                    (f"{stmt.name}{tag}" if i == 0 else f"{stmt.name}{tag}__p{i}", piece)
                    for i, piece in enumerate(p for p in pieces if not p.is_empty())
                ]
                if rest is not None and not rest.is_empty():
                    named.append((f"{stmt.name}{tag}__rest", rest))
                for name, where in named:
                    piece_map = m.intersect_range(where).set_tuple_name(isl.dim_type.in_, name)
                    out = out.union(isl.UnionMap.from_map(piece_map))
                    self.piece_of[name] = stmt.name
                    self.piece_maps[name] = piece_map
                    if tag:
                        self.overwriting.add(name)
        return out

    def _overwriting(self, stmt: Statement) -> isl.Set | None:
        """The schedule points of `stmt`'s MATMULs that may overwrite their accumulators, if its
        buffer is zeroed only in the iterations that first touch it, and they write all of it."""
        first = self.first.get(stmt.lhs.tensor)
        arrays = [ps for kind, ps, stmts in self.bands if kind == "array" and stmt.name in stmts]
        if first is None or not first.covered or len(arrays) != 1:
            return None
        points = self.schedule.overwriting_blocks(stmt.name, min(arrays[0]))
        return None if points is None or points.is_empty() else points


def _uniform_pieces(points: isl.Set, positions: list[int]) -> tuple[list[isl.Set], isl.Set | None]:
    """Split `points` (schedule points of one statement) into pieces where each band dimension
    takes every value of a constant range for every value of the outer dimensions."""
    pieces, rest = [points], None
    n = points.dim(isl.dim_type.set)
    for p in positions:
        done = []
        for piece in pieces:
            todo = piece
            for _ in range(8):  # full tiles, then each kind of partial tile
                if todo.is_empty():
                    break
                upto = todo.project_out(isl.dim_type.set, p + 1, n - p - 1)
                good = _whole_range(todo, upto, p, upto.dim_min(p), upto.dim_max(p))
                if good is not None and good.is_empty():
                    # no prefix takes the whole range of every other: the range of the first
                    # prefix (a split of a loop that starts at 1 has a first tile of 1..15, a
                    # last one of 0..5, and full tiles between)
                    one = upto.intersect(_prefix_of(upto.lexmin(), p))
                    good = _whole_range(todo, upto, p, one.dim_min(p), one.dim_max(p), True)
                if good is None or good.is_empty():
                    break
                done.append(good)
                todo = todo.subtract(good)
            if not todo.is_empty():
                rest = todo if rest is None else rest.union(todo)
        pieces = done
    return pieces, rest


def _whole_range(
    todo: isl.Set, upto: isl.Set, p: int, lo: isl.PwAff, hi: isl.PwAff, clip: bool = False
) -> isl.Set | None:
    """The points of `todo` whose prefix (the dimensions before `p`) takes every value of
    lo..hi at `p` (None: the bounds are not constants); `clip`: only those values of it."""
    if not (lo.is_cst() and hi.is_cst()):
        return None
    box = isl.Set(
        f"{{ [{', '.join(f'd{i}' for i in range(p + 1))}] : {_cst(lo)} <= d{p} <= {_cst(hi)} }}"
    )
    prefixes = upto.project_out(isl.dim_type.set, p, 1)
    cube = prefixes.add_dims(isl.dim_type.set, 1).intersect(box)
    bad = cube.subtract(upto).project_out(isl.dim_type.set, p, 1)
    n = todo.dim(isl.dim_type.set)
    good = todo.intersect(prefixes.subtract(bad).add_dims(isl.dim_type.set, n - p))
    if clip:
        good = good.intersect(box.add_dims(isl.dim_type.set, n - p - 1))
    return good


def _prefix_of(point: isl.Set, p: int) -> isl.Set:
    """The set of points whose dimensions before `p` are those of `point` (a single point)."""
    n = point.dim(isl.dim_type.set)
    fixed = point.project_out(isl.dim_type.set, p, n - p)
    return fixed.add_dims(isl.dim_type.set, n - p)
