"""`batch.reduce_into`'s layouts are built once per geometry and used again: a second
reduction of the same geometry over other values, and one after the cache was cleared,
equal int64 arithmetic (written here) each time, on every path (plain, transposed, shared A,
shared B) and both arithmetics."""

from __future__ import annotations

import numpy as np
import pytest

from tensorgen.sim import batch, products


def _want(acc, a, b, a_zp, b_zp, accumulate, nb):
    # plain int64 dot products of one piece, wrapped to int32: (lead.., M, K) @ (lead.., K, N)
    k = b.shape[-2]
    x = a.astype(np.int64).reshape(*a.shape[: a.ndim - 1], k) - a_zp
    w = b.astype(np.int64) - b_zp
    prod = np.einsum("...mk,...kn->...mn", x.reshape(*(a.shape[:1] if nb else ()), -1, k), w)
    total = prod.reshape(acc.shape) + (acc.astype(np.int64) if accumulate else 0)
    return ((total + 2**31) % 2**32 - 2**31).astype(np.int32)


@pytest.mark.parametrize("path", ["plain", "transposed", "shared_a", "shared_b"])
@pytest.mark.parametrize("ints", [False, True])
def test_a_layout_used_again_computes_the_new_values(path, ints, monkeypatch) -> None:
    monkeypatch.setattr(products, "ENABLED", ints)
    monkeypatch.setattr(products, "MIN_INT_MACS", 0)
    monkeypatch.setattr(products, "ONLY_WHERE_FASTER", False)  # int_mm even where slower
    rng = np.random.default_rng(3)
    nb, m, k, n = (3 if path.startswith("shared") else 0), 6, 20, 5
    lead = (nb,) if nb else ()
    built = []
    monkeypatch.setattr(batch, "_LAYOUTS", {})
    for round_ in range(4):
        if round_ == 2:
            batch._LAYOUTS.clear()  # as when the byte limit is reached
        a_mem = rng.integers(0, 256, (*lead, k, m) if path == "transposed" else (*lead, m, k))
        a_mem = a_mem.astype(np.uint8)
        a = a_mem.swapaxes(-1, -2) if path == "transposed" else a_mem
        b = rng.integers(-128, 128, (*lead, k, n)).astype(np.int8)
        if path == "shared_a":
            a = np.broadcast_to(a[:1], a.shape)
        if path == "shared_b":
            b = np.broadcast_to(b[:1], b.shape)
        acc = rng.integers(-(2**31), 2**31, (*lead, m, n)).astype(np.int32)
        want = _want(acc, a, b, 7, -2, 1, nb)
        piece = batch.Piece(a, b, 7, -2, max(abs(v - 7) for v in (0, 255)) * 130)
        batch.reduce_into(acc, [piece], 1, batch=nb)
        np.testing.assert_array_equal(acc, want)
        (layout,) = batch._LAYOUTS.values()
        built.append(layout)
    # one geometry: built once and used again, built anew only after the clear
    assert built[0] is built[1] and built[2] is built[3] and built[1] is not built[2]
