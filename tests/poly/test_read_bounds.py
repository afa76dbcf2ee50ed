"""The bounds of one dimension read off its constraints (footprint._read_bounds) or worked out
for a tile clipped to its tensor (_clipped_bounds) agree with isl's dim_min and dim_max, which
stay the authority: on random one-dimensional sets over parameters with tiles, halos,
equalities among the parameters, fixed dimensions, clips, scales and strides."""

from __future__ import annotations

import islpy as isl
from hypothesis import given, settings
from hypothesis import strategies as st

from tensorgen.poly import footprint
from tensorgen.poly.footprint import _UNKNOWN, _bounds, _read_bounds, _unit_constraints


@st.composite
def alone(draw) -> isl.Set:
    """`[d0, d1, d2] -> { [i0] : ... }` as a footprint's dimension, projected, looks."""
    cons = [draw(st.sampled_from(["d0 = 0", "d0 = 1", "0 <= d0 <= 3", "d0 >= 0", "1 <= d0 <= 1"]))]
    cons.append(
        draw(
            st.sampled_from(
                ["0 <= d1 <= 2", "d1 = d0", "d1 = 2d0 + 1", "d1 >= -1", "d0 <= d1 <= d0"]
            )
        )
    )
    a, b = draw(st.integers(-3, 3)), draw(st.integers(-4, 4))
    scale = draw(st.integers(1, 4))
    span = draw(st.integers(-1, 6))  # -1: empty
    on = draw(st.sampled_from(["d1", "d2", f"{scale}d1 + d2", f"{scale}d0"]))
    kind = draw(
        st.sampled_from(
            ["tile", "fixed", "param", "clip", "clip", "clip_hi", "clip_lo", "stride", "scaled"]
        )
    )
    if kind == "tile":
        cons.append(f"{on} + {b} <= i0 <= {on} + {b + span}")
    elif kind == "fixed":
        cons.append(f"i0 = {b}")
    elif kind == "param":
        cons.append(f"i0 = {on} + {b}")
    elif kind == "clip":  # a tile clipped to a tensor: two bounds each way
        cons.append(f"{on} + {b} <= i0 <= {on} + {b + span} and 0 <= i0 <= {5 + a}")
    elif kind in ("clip_hi", "clip_lo"):  # a halo's tile, clipped on one side
        clip = f"i0 <= {5 + a}" if kind == "clip_hi" else f"i0 >= {a}"
        cons.append(f"{on} + {b} <= i0 <= {on} + {b + span} and {clip}")
    elif kind == "stride":
        cons.append(f"{on} <= i0 <= {on} + {span} and (i0 - {b}) mod 2 = 0")
    else:
        cons.append(f"{on} <= 2i0 <= {on} + {span}")
    cons.append(
        draw(
            st.sampled_from(
                ["0 <= d2 <= 5", "d2 = d1", "d2 >= 0", "d1 <= d2 <= d1 + 1", "2 <= d2 <= 2"]
            )
        )
    )
    return isl.Set(f"[d0, d1, d2] -> {{ [i0] : {' and '.join(cons)} }}")


def _isl(s: isl.Set):
    """(size, offset, span) of isl's dim_min and dim_max, or None where they are unbounded."""
    try:
        lo, hi = s.dim_min(0), s.dim_max(0)
        extent = hi.sub(lo).max_val()
    except isl.Error:
        return None
    if not extent.is_int():
        return None
    pieces, offset = lo.get_pieces(), None
    if len(pieces) == 1:
        aff = pieces[0][1]
        divided = any(
            not aff.get_coefficient_val(isl.dim_type.div, k).is_zero()
            for k in range(aff.dim(isl.dim_type.div))
        )
        coefs = {
            s.get_dim_name(isl.dim_type.param, i): aff.get_coefficient_val(isl.dim_type.param, i)
            for i in range(s.dim(isl.dim_type.param))
        }
        if not divided and aff.get_constant_val().is_int():
            offset = (
                aff.get_constant_val().to_python(),
                {n: c.to_python() for n, c in coefs.items() if not c.is_zero()},
            )
    return extent.to_python() + 1, offset, _span(lambda: (lo.min_val(), hi.max_val()))


def _span(least_greatest):
    """The least and greatest value, or "unbounded" where one of them is infinite (to_python
    refuses it, for the old reading and the new alike)."""
    try:
        return tuple(v.to_python() if isinstance(v, isl.Val) else v for v in least_greatest())
    except ValueError:
        return "unbounded"


@settings(max_examples=400, deadline=None)
@given(alone())
def test_read_bounds_are_isls(s: isl.Set) -> None:
    unit = _unit_constraints(s)
    read = _UNKNOWN if unit is None else _read_bounds(s, *unit)
    if read is _UNKNOWN:
        return
    assert not s.is_empty()
    want = _isl(s)
    assert want is not None
    assert (read.size, read.offset, _span(read.span)) == want


def test_read_bounds_reads_tiles_and_leaves_clips_to_isl() -> None:
    tile = isl.Set("[d0, d1] -> { [i0] : d0 = 0 and 0 <= d1 <= 3 and -1 + 2d1 <= i0 <= 2 + 2d1 }")
    got = _read_bounds(tile, *_unit_constraints(tile))
    assert (got.size, got.offset, got.span()) == (4, (-1, {"d1": 2}), (-1, 8))
    fixed = isl.Set("[d0] -> { [i0] : 0 <= d0 <= 7 and i0 = d0 }")
    related = isl.Set("[d0, d1] -> { [i0] : 0 <= d0 <= 7 and d1 = d0 and i0 = d0 }")
    assert _read_bounds(related, *_unit_constraints(related)) is _UNKNOWN
    got = _read_bounds(fixed, *_unit_constraints(fixed))
    assert (got.size, got.offset) == (1, (0, {"d0": 1}))
    clip = isl.Set("[d0] -> { [i0] : i0 >= 16d0 and 0 <= i0 <= 127 and i0 <= 15 + 16d0 }")
    assert _read_bounds(clip, *_unit_constraints(clip)) is _UNKNOWN
    empty = isl.Set("[d0] -> { [i0] : d0 <= i0 <= d0 - 1 }")
    assert _unit_constraints(empty) is None  # isl knows it is empty: no basic set


def test_clipped_bounds_of_a_tile_clipped_to_its_tensor() -> None:
    clip = isl.Set("[d0] -> { [i0] : i0 >= 16d0 and 0 <= i0 <= 120 and i0 <= 15 + 16d0 }")
    got = footprint._clipped_bounds(clip, _unit_constraints(clip)[1])
    assert (got.size, got.offset, got.span()) == (16, (0, {"d0": 16}), (0, 120))
    halo = isl.Set("[d0] -> { [i0] : d0 >= 0 and -1 + 18d0 <= i0 <= 55 and i0 <= 17 + 18d0 }")
    got = footprint._clipped_bounds(halo, _unit_constraints(halo)[1])
    assert (got.size, got.offset, got.span()) == (19, (-1, {"d0": 18}), (-1, 55))


@settings(max_examples=400, deadline=None)
@given(alone())
def test_bounds_are_isls(s: isl.Set) -> None:
    footprint._BOUNDS.pop(str(s), None)  # worked out afresh, not remembered
    got = _bounds(s)
    want = _isl(s)
    assert (got is None) == (want is None)
    if got is not None:
        assert (got.size, got.offset, _span(got.span)) == want
