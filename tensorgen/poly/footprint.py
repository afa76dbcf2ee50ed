"""Footprints of accesses over a tile, as boxes whose origin is affine in the tile origins.

A tile of statement S is `{ S[i] : o_i <= i < o_i + size_i }` with the tile
origins `o_i` as isl parameters; the footprint of an access is the image of the
tile, and its rectangular hull (`dim_min`/`dim_max`) gives the DMA box: an
offset affine in the origins and a constant size.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import islpy as isl

from tensorgen.errors import CodegenError
from tensorgen.ir.core import Access, Statement
from tensorgen.ir.poly import affine_text


@dataclass(frozen=True)
class FootprintBox:
    """offset[d] = const[d] + sum(coef * origin[name]); size[d] constant."""

    offset: tuple[tuple[int, tuple[tuple[str, int], ...]], ...]
    size: tuple[int, ...]

    @property
    def elements(self) -> int:
        n = 1
        for s in self.size:
            n *= s
        return n


def _origin(name: str) -> str:
    return f"o_{name}"


def _tile_map(stmt: Statement, access: Access, sizes: tuple[tuple[str, int], ...]) -> isl.Map:
    params = ", ".join(_origin(n) for n in stmt.indices)
    cons = [f"{_origin(n)} <= {n} < {_origin(n)} + {dict(sizes)[n]}" for n in stmt.indices]
    idx = ", ".join(affine_text(a) for a in access.index)
    return isl.Map(f"[{params}] -> {{ [{', '.join(stmt.indices)}] -> {access.tensor}[{idx}] : {' and '.join(cons)} }}")


@lru_cache(maxsize=4096)
def footprint(uses: tuple[tuple[Statement, Access, tuple[tuple[str, int], ...]], ...]) -> FootprintBox:
    """Rectangular hull of the union of `uses` (statement, access, tile sizes per index)."""
    union = None
    for stmt, access, sizes in uses:
        image = _tile_map(stmt, access, sizes).range()
        union = image if union is None else _align(union, image).union(_align(image, union))
    assert union is not None
    names = [union.get_dim_name(isl.dim_type.param, i) for i in range(union.dim(isl.dim_type.param))]
    offset, size = [], []
    for d in range(union.dim(isl.dim_type.set)):
        lo, hi = union.dim_min(d), union.dim_max(d)
        extent = hi.sub(lo)
        if lo.n_piece() != 1 or not extent.is_cst():
            raise CodegenError(f"the footprint of {uses[0][1].tensor} over a tile is not a box of fixed size")
        aff = lo.get_pieces()[0][1]
        coefs = []
        for i, n in enumerate(names):
            c = aff.get_coefficient_val(isl.dim_type.param, i).to_python()
            if c:
                coefs.append((n[2:], int(c)))
        offset.append((int(aff.get_constant_val().to_python()), tuple(sorted(coefs))))
        size.append(int(extent.get_pieces()[0][1].get_constant_val().to_python()) + 1)
    return FootprintBox(tuple(offset), tuple(size))


def _align(a: isl.Set, b: isl.Set) -> isl.Set:
    return a.align_params(b.get_space())


def is_dense_box(stmt: Statement, access: Access, sizes: tuple[tuple[str, int], ...]) -> bool:
    """Whether the access touches every element of its footprint's hull (no holes)."""
    image = _tile_map(stmt, access, sizes).range()
    return image.is_box() or image.simple_hull().subtract(image).is_empty()
