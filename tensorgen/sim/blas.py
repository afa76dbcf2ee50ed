"""BLAS on one thread while the simulator runs (`machine.simulate`): its products are many and
small, and OpenBLAS's default two threads on a busy 2-core machine made it 1.7-3.4x slower."""

from __future__ import annotations

import contextlib
import functools

from threadpoolctl import ThreadpoolController


@functools.lru_cache(maxsize=1)
def _pools() -> tuple:
    """The process's BLAS thread pools, found once. A simulation runs on one BLAS thread: its
    products are small and many, and more threads on a busy machine only fight (1.7-3.4x
    slower measured at OpenBLAS's default two on two cores)."""
    return tuple(lib for lib in ThreadpoolController().lib_controllers if lib.user_api == "blas")


@contextlib.contextmanager
def one_blas_thread():
    """Every BLAS pool (`_pools`) at one thread meanwhile, set and restored only where it has
    another count: ThreadpoolController.limit does the same at ~14 us a run, ~1 % of a small
    layer's simulation (it builds the info of every library, twice)."""
    libs = _pools()
    before = [lib.num_threads for lib in libs]
    for lib, n in zip(libs, before, strict=True):
        if n != 1:
            lib.set_num_threads(1)
    try:
        yield
    finally:
        for lib, n in zip(libs, before, strict=True):
            if n != 1:
                lib.set_num_threads(n)
