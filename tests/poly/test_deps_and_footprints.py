"""isl-level stages: domains, original order, dependences, footprints, point-wise fusion."""

from __future__ import annotations

import islpy as isl

from tensorgen.ir import poly
from tensorgen.ir.queries import mac_mapping
from tensorgen.poly.deps import dependences, pointwise
from tensorgen.poly.footprint import footprint
from tensorgen.spec.loader import parse_program

RNN = """tensorgen: 1
tensors:
  X:   {shape: [4, 2, 3], dtype: int8, role: input}
  W:   {shape: [5, 3], dtype: int8, role: input}
  U:   {shape: [5, 5], dtype: int8, role: input}
  ACC: {shape: [2, 5], dtype: int32}
  H:   {shape: [5, 2, 5], dtype: int8, role: inout}
loops: {t: 4}
statements:
  - ACC[b, j] = 0
  - ACC[b, j] += X[t, b, i] * W[j, i]
  - ACC[b, j] += H[t, b, i] * U[j, i]
  - H[t + 1, b, j] = requant(ACC[b, j], 0.01, 0)
"""

CONV = """tensorgen: 1
tensors:
  X: {shape: [1, 8, 10, 10], dtype: int8, role: input}
  W: {shape: [4, 8, 3, 3], dtype: int8, role: input}
  Y: {shape: [1, 4, 8, 8], dtype: int32, role: output}
statements:
  - Y[n, k, h, w] += X[n, c, h + r, w + s] * W[k, c, r, s]
"""


def test_domain_and_schedule_follow_program_order() -> None:
    p = parse_program(RNN)
    s1 = p.statements[1]
    assert s1.indices == ("t", "b", "j", "i")
    assert poly.domain(s1).is_equal(
        isl.Set("{ S1[t, b, j, i] : 0 <= t < 4 and 0 <= b < 2 and 0 <= j < 5 and 0 <= i < 3 }")
    )
    sched = poly.schedule_map(p)
    # S3 at step t runs before S2 at step t + 1
    before = (
        isl.Map("{ S3[t, b, j] -> S2[t + 1, b2, j2, i] }")
        .intersect_domain(poly.domain(p.statements[3]))
        .intersect_range(poly.domain(p.statements[2]))
    )
    order = sched.apply_range(sched.reverse())  # identity sanity
    assert not order.is_empty()
    lt = isl.UnionMap.from_map(before).apply_domain(sched).apply_range(sched)
    assert lt.is_subset(
        isl.UnionSet("{ [x0, x1, x2, x3, x4] }").lex_lt_union_set(
            isl.UnionSet("{ [x0, x1, x2, x3, x4] }")
        )
    )


def test_rnn_flow_dependence_is_carried_by_time() -> None:
    p = parse_program(RNN)
    deps = dependences(p)
    flow = deps.flow.extract_map(isl.Map("{ S3[t, b, j] -> S2[t2, b2, j2, i] }").get_space())
    assert not flow.is_empty()
    # H[t+1, b, j] written by S3 at t is read by S2 at t + 1, element i = j
    assert flow.is_subset(isl.Map("{ S3[t, b, j] -> S2[t + 1, b, j2, j] }"))
    # and the init of ACC is read by the first contraction at the same step and point
    init = deps.flow.extract_map(isl.Map("{ S0[t, b, j] -> S1[t2, b2, j2, i] }").get_space())
    assert init.is_subset(isl.Map("{ S0[t, b, j] -> S1[t, b, j, 0] }"))


def test_rnn_statements_depend_point_wise_over_batch_and_units() -> None:
    """Within one step of the shared loop, init, contraction and epilogue link equal (b, j):
    they may run fused, tile by tile, over the output."""
    p = parse_program(RNN)
    deps = dependences(p).all
    names = [s.name for s in p.statements]
    for a, b in zip(names, names[1:], strict=False):
        assert pointwise(p, deps, a, b, ("t",), ("b", "j"))
    assert not pointwise(p, deps, names[1], names[1], ("t",), ("b", "j", "i"))


def test_conv_footprint_of_a_tile_has_the_halo() -> None:
    p = parse_program(CONV)
    s = p.statements[0]
    x = s.reads[0]
    sizes = (("n", 1), ("k", 4), ("h", 2), ("w", 4), ("c", 8), ("r", 3), ("s", 3))
    box = footprint(((s, x, sizes),))
    assert box.size == (1, 8, 4, 6)  # 2 rows + 2 halo, 4 columns + 2 halo
    # the box starts where the tile starts: offset = origin of h plus origin of r (and w, s)
    assert box.offset[2] == (0, (("h", 1), ("r", 1)))
    assert box.offset[3] == (0, (("s", 1), ("w", 1)))


def test_mac_mapping_of_conv_reduces_over_channels() -> None:
    p = parse_program(CONV)
    m = mac_mapping(p, p.statements[0])
    assert m.k == "c" and {m.m, m.n} == {"w", "k"}
    # the operand that does not carry the array's N index streams through it
    assert {m.a.tensor, m.b.tensor} == {"X", "W"}
    assert any(sub.coef(m.n) for sub in m.b.index) and not any(sub.coef(m.n) for sub in m.a.index)


def test_scan_depends_on_itself_across_its_output() -> None:
    """A scan's element i reads element i - 1 of the same statement: not point-wise."""
    p = parse_program("""tensorgen: 1
tensors:
  X: {shape: [8], dtype: int32, role: input}
  S: {shape: [8], dtype: int32, role: output}
statements:
  - S[i] = X[i]
  - {stmt: "S[i] = S[i - 1] + X[i]", where: "1 <= i < 8"}
""")
    deps = dependences(p).all
    assert not pointwise(p, deps, "S1", "S1", (), ("i",))
    assert pointwise(p, deps, "S0", "S1", (), ("i",)) is False  # S1 reads S0's S[i - 1]
