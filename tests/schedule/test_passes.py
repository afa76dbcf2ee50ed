"""The kinds of passes of a loop after ragged splits (schedule.passes), which the cost model
times a double-buffered loop by: a ragged split outside the loop makes the passes in its last
iteration compute less, by smaller blocks of the band or fewer iterations inside."""

from __future__ import annotations

from tensorgen.schedule.passes import loop_passes, pass_kinds


def test_band_blocks_shrink_in_the_last_iteration_of_a_ragged_split() -> None:
    # h: 28 in blocks of 9 (9, 9, 9, 1), h_i in the band; k's passes in the last h_o block
    # compute blocks of 1 row instead of 9
    parts = {frozenset(): 9.0, frozenset({"h_o"}): 1.0}
    kinds = pass_kinds({"h": 28, "k": 4}, (("h", 9),), ("h_o", "k"), "k", parts)
    assert kinds == (((1.0,) * 4, 1), ((9.0,) * 4, 3))


def test_fewer_iterations_inside_in_the_last_iteration_of_a_ragged_split() -> None:
    # h_i an outer loop inside k: each iteration of k runs 9 of it, or 1 in the last h_o block
    kinds = pass_kinds({"h": 28, "k": 4}, (("h", 9),), ("h_o", "k", "h_i"), "k", {})
    assert kinds == (((1.0,) * 4, 1), ((9.0,) * 4, 3))
    # and the loop h_i itself: 3 passes of 9 iterations and one of 1, each iteration alike
    assert loop_passes({"h": 28, "k": 4}, (("h", 9),), ("h_o", "k", "h_i"))["h_i"] == (
        (1, 4),
        (9, 12),
    )


def test_even_splits_make_one_kind() -> None:
    kinds = pass_kinds({"h": 27, "k": 4}, (("h", 9),), ("h_o", "k"), "k", {frozenset(): 5.0})
    assert kinds == (((5.0,) * 4, 3),)
