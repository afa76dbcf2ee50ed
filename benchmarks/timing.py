"""Fair wall times of the simulator against PyTorch (benchmarks/suite.py, benchmarks/models.py).

Both are timed in the same process, interleaved (simulator, PyTorch, simulator, ...) so that
a change in the machine's load hits both alike, and the minimum of the runs is reported (the
least disturbed one). This is done twice: with PyTorch (and numpy's BLAS outside the
simulator) at one thread, and at PyTorch's default thread count; both ratios are reported.
The simulator pins its own BLAS calls to one thread whatever the setting
(tensorgen.sim.machine.simulate), so its two times differ only by noise. At one thread the
minimum process CPU times are reported too (`sim_over_torch_cpu`): on a machine other work
keeps busy, wall times stretch by whatever the scheduler takes, CPU times much less.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

import torch
from threadpoolctl import threadpool_limits


def _wall(fn: Callable[[], object], cpu: list[float] | None = None) -> float:
    """Wall seconds of one call; its process CPU seconds appended to `cpu` too."""
    c0, t0 = time.process_time(), time.perf_counter()
    fn()
    wall = time.perf_counter() - t0
    if cpu is not None:
        cpu.append(time.process_time() - c0)
    return wall


def interleaved(
    sim: Callable[[], object],
    ref: Callable[[], object],
    threads: int,
    repeats: int,
    sim_repeats: int | None = None,
    cpu: dict[str, list[float]] | None = None,
) -> tuple[float, float]:
    """(min simulator s, min PyTorch s) over `repeats` alternating calls at `threads` threads;
    only the first `sim_repeats` rounds run the (slow) simulator too. With `cpu`, the calls'
    process CPU seconds go to its "sim" and "torch" lists."""
    sim_repeats = repeats if sim_repeats is None else min(sim_repeats, repeats)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with threadpool_limits(limits=threads):
            sims, refs = [], []
            for i in range(repeats):
                if i < sim_repeats:
                    sims.append(_wall(sim, cpu and cpu["sim"]))
                refs.append(_wall(ref, cpu and cpu["torch"]))
    finally:
        torch.set_num_threads(before)
    return min(sims), min(refs)


def compare(
    sim: Callable[[], object],
    ref: Callable[[], object],
    repeats: int,
    sim_repeats: int | None = None,
) -> dict:
    """The simulator against PyTorch at one thread and at the default thread count: times
    (seconds, minimum of the interleaved runs) and ratios, keyed as the reports store them."""
    default = torch.get_num_threads()
    cpu: dict[str, list[float]] = {"sim": [], "torch": []}
    s1, t1 = interleaved(sim, ref, 1, repeats, sim_repeats, cpu)
    sd, td = interleaved(sim, ref, default, repeats, sim_repeats)
    return {
        "sim_s": s1,
        "torch_s": t1,
        "sim_over_torch": s1 / t1,
        "default_threads": default,
        "sim_default_s": sd,
        "torch_default_s": td,
        "sim_over_torch_default": sd / td,
        # at one thread, CPU seconds (minimum): less skewed than wall time on a loaded machine
        "sim_cpu_s": min(cpu["sim"]),
        "torch_cpu_s": min(cpu["torch"]),
        "sim_over_torch_cpu": min(cpu["sim"]) / min(cpu["torch"]),
        "load_average_1min": os.getloadavg()[0],  # other work on the machine skews wall times
    }
