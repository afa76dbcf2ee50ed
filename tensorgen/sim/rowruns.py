"""A padded tile's rows gathered as one run (`batch`'s gathers of activations): n1 rows of n2
contiguous bytes q apart read as one run of (n1 - 1) * q + n2 bytes, the columns between the
rows computed along and dropped from the product afterwards. One copy of a long run costs far
less than n1 copies of short ones (layer1's 3x3 convs: one of 230 bytes for four of 56)."""

from __future__ import annotations

import numpy as np


def merged_transpose(a: np.ndarray, axes, merge) -> np.ndarray:
    return merged(a.transpose(axes), merge)


# gather a padded tile's rows as one run while it computes at most this many extra columns
MERGE_WASTE = 1.3


def rows_merge(arrays: list[tuple[np.ndarray, int]], nl: int) -> tuple[int, int, int, int] | None:
    """(n1, n2, q, run) when every A (lead axes, M axes, then the number of K axes given with
    it; the same M shape and strides) has two M axes last among them, n1 rows of n2
    contiguous bytes q bytes apart with q > n2 (a tile of a padded image): gathered as one run
    of (n1 - 1) * q + n2 bytes instead of n1 runs of n2, the q - n2 bytes between rows
    computed along and dropped (`unmerged`). The run lies within the view's own first and
    last bytes, so it reads nothing out of bounds."""
    ms = {(a.shape[nl : a.ndim - nk], a.strides[nl : a.ndim - nk]) for a, nk in arrays}
    if len(ms) != 1:
        return None
    ((shape, strides),) = ms
    if len(shape) < 2:
        return None
    (n1, n2), (s1, s2) = shape[-2:], strides[-2:]
    if s2 != arrays[0][0].itemsize or s1 <= n2 * s2 or s1 % s2 or n1 < 2 or n2 < 2:
        return None
    q, run = s1 // s2, (n1 - 1) * (s1 // s2) + n2
    return (n1, n2, q, run) if run <= MERGE_WASTE * n1 * n2 else None


def merged(a: np.ndarray, merge) -> np.ndarray:
    """A, (.., n1, n2) last, with those two axes as one run (`rows_merge`)."""
    n1, n2, q, run = merge
    shape, strides = a.shape[:-2] + (run,), a.strides[:-2] + (a.strides[-1],)
    return np.lib.stride_tricks.as_strided(a, shape, strides, writeable=False)


def unmerged(prod: np.ndarray, merge) -> np.ndarray:
    """The (.., M', N) product of merged operands as (.., n1, n2, N): the run's columns that
    are the tile's, dropping those between its rows."""
    n1, n2, q, run = merge
    prod = prod.reshape(*prod.shape[:-2], -1, run, prod.shape[-1])
    rs, cs = prod.strides[-2:]
    shape = prod.shape[:-2] + (n1, n2, prod.shape[-1])
    return np.lib.stride_tricks.as_strided(prod, shape, prod.strides[:-2] + (q * rs, rs, cs))
