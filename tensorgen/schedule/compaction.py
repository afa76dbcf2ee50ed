"""Row compaction: a box that is only read and skips rows (a stride-2 convolution reads every
other row of its input) is loaded one DMA per accessed row into a buffer of only those rows. A
decision about the staged buffers that the automatic scheduler costs and the lowering carries
out: it lives here, below both, so that neither imports the other for it."""

from __future__ import annotations

import numpy as np

from tensorgen.target import Target

MAX_ROW_DMAS = 16  # the most DMAs a compacted box is loaded with (row_compaction)


def row_compaction(
    box, itemsize: int, target: Target, written: bool
) -> tuple[int, int, int] | None:
    """(dimension, step, rows) when a box that is only read is better loaded with one DMA per
    accessed row of its outermost strided dimension, into a buffer that holds only those rows (a
    stride-2 convolution reads every other row of its input): the rows skipped save more DRAM
    cycles than the extra DMA setups cost. None to load it whole."""
    if written or not box.steps:
        return None
    for d, (n, step) in enumerate(zip(box.size, box.steps, strict=False)):
        if step > 1 and n > 1:
            rows = (n - 1) // step + 1
            per_row = itemsize * int(np.prod(box.size)) // n
            saved = (n - rows) * per_row / target.dram_bytes_per_cycle
            if rows <= MAX_ROW_DMAS and saved > (rows - 1) * target.dma_setup_cycles:
                return d, step, rows
            return None
    return None


def compacted_size(size: tuple[int, ...], compaction) -> tuple[int, ...]:
    if compaction is None:
        return tuple(size)
    d, _, rows = compaction
    return tuple(size[:d]) + (rows,) + tuple(size[d + 1 :])
