"""Which exact arithmetic the simulator's products take (`tensorgen.sim.products.integer`):
torch._int_mm only where it is trusted and, unless a test asks otherwise, faster than
float32 BLAS; either way the same integers."""

from __future__ import annotations

import time

import numpy as np
import pytest

from tensorgen.sim import batch, products, rowruns


def test_a_slow_int_mm_is_not_taken(monkeypatch) -> None:
    """An int8 kernel slower than float32 BLAS (as oneDNN's without VNNI): the products stay
    on float32 -- unless ONLY_WHERE_FASTER is off, as the fast-path tests set it."""
    torch = pytest.importorskip("torch")
    real = torch._int_mm

    def slow(a, b):  # 50 ms: float32 BLAS at 128^3 is ~0.1 ms, a few ms on a loaded machine
        time.sleep(0.05)
        return real(a, b)

    monkeypatch.setattr(torch, "_int_mm", slow)
    products._int_mm_pays.cache_clear()
    try:
        assert not products._int_mm_pays()
        assert not products.integer(256, 256, 256)
        monkeypatch.setattr(products, "ONLY_WHERE_FASTER", False)
        assert products.integer(256, 256, 256) == (products._int_mm() is not None)
    finally:
        products._int_mm_pays.cache_clear()


def test_the_speed_probe_times_warm_calls_in_turns() -> None:
    """`_best` leaves out the slow first calls (oneDNN's first two of a shape) and times the
    arithmetics in turns: a call that is slow twice and then fast is timed fast, and each
    call's time is its own."""
    counts = [0, 0]

    def cold_then_fast() -> None:
        counts[0] += 1
        time.sleep(0.02 if counts[0] <= 2 else 0)

    def always_slow() -> None:
        counts[1] += 1
        time.sleep(0.005)

    fast, slow = products._best((cold_then_fast, always_slow), 4)
    assert fast < 0.004 <= slow
    assert counts == [products.PROBE_WARMUP + 4] * 2


@pytest.mark.parametrize("faster_only", [True, False])
def test_both_choices_give_the_same_integers(faster_only, monkeypatch) -> None:
    """A product large enough for torch._int_mm, uint8 with zero points, wrapping int32:
    int64 arithmetic, whichever arithmetic the choice picks."""
    monkeypatch.setattr(products, "ONLY_WHERE_FASTER", faster_only)
    monkeypatch.setattr(batch, "_LAYOUTS", {})
    rng = np.random.default_rng(5)
    a = rng.integers(0, 256, (64, 300)).astype(np.uint8)
    b = rng.integers(-128, 128, (300, 48)).astype(np.int8)
    acc = rng.integers(-(2**31), 2**31, (64, 48)).astype(np.int32)
    want = (a.astype(np.int64) - 3) @ (b.astype(np.int64) + 5) + acc
    batch.reduce_into(acc, [batch.Piece(a, b, 3, -5, 253 * 133)], 1)
    np.testing.assert_array_equal(acc, ((want + 2**31) % 2**32 - 2**31).astype(np.int32))


@pytest.mark.parametrize("gemm", ["numpy", "torch"])
@pytest.mark.parametrize(
    "shape",
    [
        ((7, 30), (30, 5)),
        ((3, 7, 30), (3, 30, 5)),
        ((7, 30), (3, 30, 5)),
        ((200, 200), (200, 9)),  # TORCH_MIN_ROWS: a single product on torch's GEMM too
    ],
)
def test_a_product_into_scratch_is_the_fresh_one(shape, gemm) -> None:
    """`exact_product` into a kept `Scratch` buffer: the fresh product's integers, for 2-D
    and stacked (broadcast) operands, a second product of other values into the same buffer
    too, and K beyond one float32-exact chunk (with sums beyond 2**24); stacks and
    large products on torch's GEMM (torch at one thread, as in `simulate`) or numpy's."""
    torch = pytest.importorskip("torch")
    threads = torch.get_num_threads()
    torch.set_num_threads(1 if gemm == "torch" else 2)
    rng = np.random.default_rng(2)
    scratch = products.Scratch()
    try:
        for term in (128 * 128, 1 << 22):  # the second: chunks of K of 3
            for _ in range(2):
                big = 128 if term < 1 << 22 else 2048  # products up to 2**22: sums beyond 2**24
                x = rng.integers(-big, big, shape[0]).astype(np.float32)
                w = rng.integers(-big, big, shape[1]).astype(np.float32)
                want = products.exact_product(x, w, term)
                got = products.exact_product(x, w, term, scratch)
                assert got.dtype == np.int32
                np.testing.assert_array_equal(got, want)
                exact = x.astype(np.int64) @ w.astype(np.int64)
                np.testing.assert_array_equal(got, ((exact + 2**31) % 2**32 - 2**31))
    finally:
        torch.set_num_threads(threads)


def _every_product_on(monkeypatch, int_mm: bool) -> None:
    """Every product on `torch._int_mm` (`int_mm`, even where slower or small) or on float32,
    with no gather layout kept from another test."""
    monkeypatch.setattr(products, "ENABLED", int_mm)
    monkeypatch.setattr(products, "MIN_INT_MACS", 0)
    monkeypatch.setattr(products, "ONLY_WHERE_FASTER", False)
    monkeypatch.setattr(batch, "_LAYOUTS", {})


def _spy_unmerged(monkeypatch) -> list:
    """The merges `rowruns.unmerged` is called with, appended as they come."""
    calls, real = [], rowruns.unmerged
    monkeypatch.setattr(rowruns, "unmerged", lambda p, m: calls.append(m) or real(p, m))
    return calls


@pytest.mark.parametrize("n_major", [False, True])
@pytest.mark.parametrize("arith", ["float32", "int_mm"])
def test_a_shared_k_major_tile_gathered_by_rows_is_exact(arith, n_major, monkeypatch) -> None:
    """A batch sharing one channel-major A (a 3x3 tile of 5x6 outputs in rows of 8, padded):
    its rows gathered as one run each (`rowruns.rows_merge`), the columns between them
    dropped from the product; weights stored K-major or output-channel-major (then gathered
    N-major with their K axes, and A's, in memory order: `products.k_order`) -- every
    output equals the int64 dot products, in float32 and in int8."""
    _every_product_on(monkeypatch, arith == "int_mm")
    rng = np.random.default_rng(7)
    c, h, w, rows, plane, n, count = 4, 5, 6, 8, 8 * 8, 3, 2  # channels, outputs, row bytes
    image = rng.integers(0, 256, c * plane, dtype=np.uint8)
    weights = rng.integers(-128, 128, (count, 3, 3, c, n), dtype=np.int8)
    if n_major:  # the same values stored (count, n, c, kh, kw)
        weights = np.ascontiguousarray(weights.transpose(0, 4, 3, 1, 2)).transpose(0, 3, 4, 2, 1)
    assert (products.k_order(weights) == (2, 0, 1)) if n_major else not products.k_order(weights)
    # A (count, h, w, kh, kw, c), the same for every reduction (stride 0), W contiguous
    a = np.lib.stride_tricks.as_strided(
        image, (count, h, w, 3, 3, c), (0, rows, 1, rows, 1, plane), writeable=False
    )
    unmerged = _spy_unmerged(monkeypatch)
    acc = np.zeros((count, h, w, n), np.int32)
    for _ in range(2):  # a second call on the layout built by the first
        batch.reduce_into(acc, [batch.Piece(a, weights, 9, 0, 247 * 128)], 0, count)
        want = np.einsum(
            "hwijc,bijcn->bhwn", a[0].astype(np.int64) - 9, weights.astype(np.int64)
        ).astype(np.int32)
        np.testing.assert_array_equal(acc, want)
        image[:] = rng.integers(0, 256, image.size, dtype=np.uint8)
    assert unmerged == [(h, w, rows, (h - 1) * rows + w)] * 2  # the rows were merged


@pytest.mark.parametrize("a_layout", ["channels_last", "channels_first"])
@pytest.mark.parametrize("kind", ["one", "stack", "shared_b"])
@pytest.mark.parametrize("arith", ["float32", "int_mm"])
def test_output_channel_major_weights_gathered_n_major_are_exact(
    arith, kind, a_layout, monkeypatch
):
    """Weights stored output-channel-major, (n, c, kh, kw), against a 3x3 conv's A (K axes
    (kh, kw, c)) stored either way, alone, as a stack of 2 (each its own A and B), or a
    stack sharing B (stride 0): gathered N-major with the K axes permuted to memory order
    (`products.k_order`), every output equals the int64 dot products, float32 and int8."""
    _every_product_on(monkeypatch, arith == "int_mm")
    rng = np.random.default_rng(11)
    c, h, w, n, count = 5, 4, 6, 7, 2
    lead = () if kind == "one" else (count,)
    image = rng.integers(
        0,
        256,
        (*lead, c, h + 2, w + 2) if a_layout == "channels_first" else (*lead, h + 2, w + 2, c),
        dtype=np.uint8,
    )
    im = image if a_layout == "channels_last" else np.moveaxis(image, -3, -1)  # (.., y, x, c)
    st = im.strides[-3:]
    a = np.lib.stride_tricks.as_strided(
        im, (*lead, h, w, 3, 3, c), im.strides[:-3] + (st[0], st[1], st[0], st[1], st[2])
    )
    stored = rng.integers(-128, 128, (count if kind == "stack" else 1, n, c, 3, 3), dtype=np.int8)
    b = stored.transpose(0, 3, 4, 2, 1)  # (.., kh, kw, c, n), n the widest stride
    if kind == "one":
        b = b[0]
    elif kind == "shared_b":
        b = np.broadcast_to(b, (count, *b.shape[1:]))
    assert products.k_order(b, len(lead)) == (2, 0, 1)
    acc = rng.integers(-1000, 1000, (*lead, h, w, n)).astype(np.int32)
    want = acc.astype(np.int64) + np.einsum(
        "...hwijc,...ijcn->...hwn", a.astype(np.int64) - 3, b.astype(np.int64)
    )
    batch.reduce_into(acc, [batch.Piece(a, b, 3, 0, 253 * 128)], 1, len(lead) and count)
    np.testing.assert_array_equal(acc, want.astype(np.int32))


@pytest.mark.parametrize("arith", ["float32", "int_mm"])
def test_a_shared_b_k_major_tile_gathered_by_rows_is_exact(arith, monkeypatch) -> None:
    """A stack of channel-major A sharing one B (a loop over 3x3 tiles of 5x6 outputs in
    rows of 8, padded, against the same weights): each tile's rows gathered as one run
    (`rowruns.rows_merge` in `batch._shared_b`), the columns between them dropped -- every
    output equals the int64 dot products, accumulated, in float32 and in int8."""
    _every_product_on(monkeypatch, arith == "int_mm")
    rng = np.random.default_rng(8)
    c, h, w, rows, plane, n, count = 4, 5, 6, 8, 8 * 8, 3, 2  # channels, outputs, row bytes
    image = rng.integers(0, 256, count * c * plane, dtype=np.uint8)
    weights = rng.integers(-128, 128, (3, 3, c, n), dtype=np.int8)
    b = np.broadcast_to(weights, (count, *weights.shape))
    # A (count, h, w, kh, kw, c): tile i at i * c * plane
    a = np.lib.stride_tricks.as_strided(
        image, (count, h, w, 3, 3, c), (c * plane, rows, 1, rows, 1, plane), writeable=False
    )
    unmerged = _spy_unmerged(monkeypatch)
    acc = rng.integers(-(2**31), 2**31, (count, h, w, n)).astype(np.int32)
    for _ in range(2):  # a second call on the layout built by the first
        want = acc.astype(np.int64) + np.einsum(
            "thwijc,ijcn->thwn", a.astype(np.int64) - 9, weights.astype(np.int64) + 2
        )
        batch.reduce_into(acc, [batch.Piece(a, b, 9, -2, 247 * 130)], 1, count)
        np.testing.assert_array_equal(acc, ((want + 2**31) % 2**32 - 2**31).astype(np.int32))
        image[:] = rng.integers(0, 256, image.size, dtype=np.uint8)
    assert unmerged == [(h, w, rows, (h - 1) * rows + w)] * 2  # the rows were merged


@pytest.mark.parametrize("zps", [(3, 3), (3, 200)])
@pytest.mark.parametrize("channel_major", [False, True])
@pytest.mark.parametrize("shared", ["none", "a", "b", "alone"])
def test_column_sums_from_the_row_of_ones_are_exact(zps, channel_major, shared, monkeypatch):
    """int8 products take B's column sums from the row of ones under A's gather buffer
    (`batch._gather_a`) where one zero point's correction spans all of K: two pieces of one
    uint8 zero point (then no column sum is computed apart), or of two (then each piece's
    is), alone, stacked, sharing A or B, row- or channel-major -- every output the int64 dot
    products, wrapped."""
    _every_product_on(monkeypatch, True)
    if products._int_mm() is None:
        pytest.skip("torch._int_mm is not exact here")
    apart = []
    real = products._sums
    monkeypatch.setattr(products, "_sums", lambda a, rows: apart.append(rows) or real(a, rows))
    rng = np.random.default_rng(12)
    count, m, ks, n = 3, (4, 5), (6, 7), 9
    lead = () if shared == "alone" else (count,)
    pieces, want = [], 0
    for k, zp in zip(ks, zps, strict=True):
        a_full = rng.integers(0, 256, (*lead, *m, k)).astype(np.uint8)
        if shared == "a":
            a_full = np.ascontiguousarray(np.broadcast_to(a_full[:1], a_full.shape))
        a = a_full
        if channel_major:  # K outermost in memory, M innermost
            nl = len(lead)
            order = (nl + 2, *range(nl), nl, nl + 1)
            a = np.ascontiguousarray(a_full.transpose(order)).transpose(np.argsort(order))
        if shared == "a":
            a = np.broadcast_to(a[:1], a.shape)
        b = rng.integers(-128, 128, (*lead, k, n)).astype(np.int8)
        if shared == "b":
            b = np.broadcast_to(b[:1], b.shape)
        pieces.append(batch.Piece(a, b, zp, -2, 256 * 130))
        ai = a_full.astype(np.int64).reshape(*lead, m[0] * m[1], k) - zp
        want = want + (ai @ (b.astype(np.int64) + 2)).reshape(*lead, *m, n)
    acc = rng.integers(-(2**31), 2**31, (*lead, *m, n)).astype(np.int32)
    want = want + acc
    batch.reduce_into(acc, pieces, 1, len(lead) and count)
    np.testing.assert_array_equal(acc, ((want + 2**31) % 2**32 - 2**31).astype(np.int32))
    assert (False in apart) == (zps[0] != zps[1])  # column sums apart only for two corrections
