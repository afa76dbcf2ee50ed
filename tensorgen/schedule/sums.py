"""The buffers and transfers of every choice of a staging product at once, for the cost model
(tensorgen/schedule/cost.py: cost_product): per choice of `itertools.product(*levels)`, the
sums over its tensors that memory_of works out one choice at a time, as numpy
arrays over the whole product. Most choices of a product overflow a memory or are cut by the
search's bound before anything else is asked of them: those need only these sums."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np


class Memory(NamedTuple):
    """What the staged buffers of one choice take and move, summed over its tensors."""

    spad: int  # bytes of the scratchpad's buffers
    acc: int  # bytes of the accumulators' buffers
    spad_inner: int  # of them, at the innermost level (a second buffer each if pipelined)
    acc_inner: int
    serial: int  # _Staged.serial summed
    serial_inner: int  # of it, at the innermost level
    refills: int  # _Staged.refills summed
    refills_inner: int
    traffic: int  # DRAM bytes


def memory_of(staged, stages, inner) -> Memory | None:
    """The sums of Memory over the staged tensors; None if a tensor cannot be staged where
    `stages` say."""
    spad = acc = spad_inner = acc_inner = serial = serial_inner = refills = refills_inner = 0
    traffic = 0
    for st, (_, level) in zip(staged, stages, strict=True):
        if st is None:
            return None
        here = level == inner
        if st.in_acc:
            acc += st.footprint
            acc_inner += st.footprint if here else 0
        else:
            spad += st.footprint
            spad_inner += st.footprint if here else 0
        if here:
            serial_inner += st.serial
            refills_inner += st.refills
        serial += st.serial
        refills += st.refills
        traffic += st.traffic
    return Memory(
        spad, acc, spad_inner, acc_inner, serial, serial_inner, refills, refills_inner, traffic
    )


class ProductSums(NamedTuple):
    """Per choice (lists of Python ints, in the order of `itertools.product`): whether its
    buffers fit (every tensor can be staged where it says, within the rooms), and the fields
    of Memory."""

    fits: list[bool]
    spad: list[int]
    acc: list[int]
    spad_inner: list[int]
    acc_inner: list[int]
    serial: list[int]
    serial_inner: list[int]
    refills: list[int]
    refills_inner: list[int]
    traffic: list[int]

    def memory(self, k: int) -> tuple[int, ...]:
        """The fields of choice `k`'s Memory, in their order."""
        return tuple(f[k] for f in self[1:])


def product_sums(
    plain: list[dict], levels, rank: dict[str, int], spad_room: int, acc_room: int
) -> ProductSums | None:
    """The sums of every choice of `levels` (per tensor, its levels; `rank`: a level's position
    in the nest's order), given each tensor's _Staged at each of its levels (`plain`: None where
    it cannot be staged); the innermost level of a choice is its level of greatest rank (None:
    every tensor at the program level); a choice fits if its buffers take at most `spad_room`
    and `acc_room` bytes. None when a value is not an integer (then the sums
    are left to the caller, one choice at a time)."""
    lens = [len(lvs) for lvs in levels]
    grid = np.indices(lens).reshape(len(lens), -1)  # C order: itertools.product's
    ranks = [
        np.array([rank[lv] if lv else -1 for lv in lvs])[grid[i]] for i, lvs in enumerate(levels)
    ]
    inner = np.max(np.stack(ranks), axis=0)
    n = grid.shape[1]
    zero = np.zeros(n, dtype=np.int64)
    spad, acc, spad_in, acc_in = zero.copy(), zero.copy(), zero.copy(), zero.copy()
    serial, serial_in, refills, refills_in, traffic = (zero.copy() for _ in range(5))
    missing = np.zeros(n, dtype=bool)
    for i, lvs in enumerate(levels):
        staged = [plain[i][lv] for lv in lvs]
        values = [
            (0, False, 0, 0, 0)
            if st is None
            else (st.footprint, st.in_acc, st.serial, st.refills, st.traffic)
            for st in staged
        ]
        if any(type(v) is not int for vs in values for v in (vs[0], vs[2], vs[3], vs[4])):
            return None
        table = np.array([[v[0], v[1], v[2], v[3], v[4]] for v in values], dtype=np.int64)
        at = table[grid[i]]
        here = ranks[i] == inner
        missing |= np.array([st is None for st in staged])[grid[i]]
        foot, in_acc = at[:, 0], at[:, 1].astype(bool)
        acc += np.where(in_acc, foot, 0)
        spad += np.where(in_acc, 0, foot)
        acc_in += np.where(in_acc & here, foot, 0)
        spad_in += np.where(~in_acc & here, foot, 0)
        serial += at[:, 2]
        serial_in += np.where(here, at[:, 2], 0)
        refills += at[:, 3]
        refills_in += np.where(here, at[:, 3], 0)
        traffic += at[:, 4]
    return ProductSums(
        (~missing & (acc <= acc_room) & (spad <= spad_room)).tolist(),
        *(
            a.tolist()
            for a in (spad, acc, spad_in, acc_in, serial, serial_in, refills, refills_in, traffic)
        ),
    )
