"""The shortcut of hull_and_range for dimensions with constant bounds (constant_bounds) agrees
with isl's dim_min and dim_max, which stay the authority: on random sets over parameters that
mix such dimensions with tiled ones, with equalities, strides and unions."""

from __future__ import annotations

import islpy as isl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tensorgen.errors import CodegenError
from tensorgen.poly.footprint import constant_bounds, hull_and_range


@st.composite
def images(draw) -> isl.Set:
    """A set `[d0, d1] -> { T[i0, ...] : ... }`: each dimension constant-bounded (possibly twice,
    possibly fixed, possibly scaled), tiled by a parameter, or tied to another dimension."""
    n = draw(st.integers(1, 4))
    cons = ["0 <= d0 <= 3", "0 <= d1 <= 2"]
    for d in range(n):
        kind = draw(st.sampled_from(["const", "const", "fixed", "scaled", "tiled", "tied"]))
        lo, span = draw(st.integers(-3, 5)), draw(st.integers(0, 9))
        if kind == "const":
            cons.append(f"{lo} <= i{d} <= {lo + span}")
            if draw(st.booleans()):  # a redundant, looser bound
                cons.append(f"i{d} >= {lo - draw(st.integers(0, 3))}")
        elif kind == "fixed":
            cons.append(f"i{d} = {lo}")
        elif kind == "scaled":  # 2i >= lo and 3i <= hi: the bounds rounded inwards
            cons.append(f"2i{d} >= {lo} and 3i{d} <= {lo + 3 * span}")
        elif kind == "tiled":
            size = draw(st.integers(1, 4))
            cons.append(f"{size}d{d % 2} <= i{d} < {size}d{d % 2} + {size} and i{d} <= {lo + span}")
        elif d:
            cons.append(f"i{d - 1} <= i{d} <= i{d - 1} + {span}")
        else:
            cons.append(f"0 <= i{d} <= {span}")
    dims = ", ".join(f"i{d}" for d in range(n))
    text = f"[d0, d1] -> {{ T[{dims}] : {' and '.join(cons)} }}"
    image = isl.Set(text)
    if draw(st.booleans()):  # a second piece: the shortcut must leave every dimension to isl
        image = image.union(
            isl.Set(
                f"[d0, d1] -> {{ T[{dims}] : {' and '.join(cons[:2])} and "
                + " and ".join(f"i{d} = 7" for d in range(n))
                + " }"
            )
        )
    return image


@settings(max_examples=300, deadline=None)
@given(images())
def test_constant_bounds_are_isls(image: isl.Set) -> None:
    for d, (lo, hi) in constant_bounds(image).items():
        dmin, dmax = image.dim_min(d), image.dim_max(d)
        pieces = dmin.get_pieces()
        assert len(pieces) == 1 and pieces[0][1].is_cst()
        assert pieces[0][1].get_constant_val().to_python() == lo
        assert dmin.min_val().to_python() == dmin.max_val().to_python() == lo
        assert dmax.min_val().to_python() == dmax.max_val().to_python() == hi


def test_constant_bounds_read_constants_and_skip_the_rest() -> None:
    image = isl.Set(
        "[d0] -> { X[0, i1, i2, i3] : 0 <= d0 <= 3 and 16d0 <= i1 < 16d0 + 16 and "
        "-1 <= i2 <= 111 and 2i3 >= -3 and i3 <= 5 and i3 <= 9 }"
    )
    assert constant_bounds(image) == {0: (0, 0), 2: (-1, 111), 3: (-1, 5)}
    offset, size, spans = hull_and_range(image)
    assert offset == [(0, {}), (0, {"d0": 16}), (-1, {}), (-1, {})]
    assert size == [1, 16, 113, 7]
    assert spans == [(0, 0), (0, 63), (-1, 111), (-1, 5)]
    union = image.union(isl.Set("[d0] -> { X[1, 0, 0, 0] }"))
    assert constant_bounds(union) == {}


def _whole_image_hull(image: isl.Set):
    """hull_and_range as isl's dim_min and dim_max of each dimension of the whole image give it
    (before the bounds were asked of each dimension alone and remembered)."""
    names = [
        image.get_dim_name(isl.dim_type.param, i) for i in range(image.dim(isl.dim_type.param))
    ]
    offset, size, spans = [], [], []
    for d in range(image.dim(isl.dim_type.set)):
        lo, hi = image.dim_min(d), image.dim_max(d)
        size.append(int(hi.sub(lo).max_val().to_python()) + 1)
        spans.append((lo.min_val().to_python(), hi.max_val().to_python()))
        pieces = lo.get_pieces()
        aff = pieces[0][1]
        divided = any(
            not aff.get_coefficient_val(isl.dim_type.div, k).is_zero()
            for k in range(aff.dim(isl.dim_type.div))
        )
        if len(pieces) != 1 or divided or not aff.get_constant_val().is_int():
            offset.append(None)
            continue
        coefs = {
            n: int(aff.get_coefficient_val(isl.dim_type.param, i).to_python())
            for i, n in enumerate(names)
        }
        offset.append(
            (int(aff.get_constant_val().to_python()), {n: c for n, c in coefs.items() if c})
        )
    return offset, size, spans


@settings(max_examples=300, deadline=None)
@given(images())
def test_hull_and_range_is_isls_over_the_whole_image(image: isl.Set) -> None:
    if image.is_empty():
        with pytest.raises(CodegenError, match="has no bounded box"):
            hull_and_range(image)
        return
    want = _whole_image_hull(image)
    assert hull_and_range(image) == want
    assert hull_and_range(image) == want  # again: its dimensions' bounds remembered
    assert hull_and_range(image, False) == (want[0], want[1], [])
