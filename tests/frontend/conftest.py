"""Fixtures shared by the frontend tests."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
import torch


@pytest.fixture
def engine() -> Iterator[Callable[[str], None]]:
    """Select torch's quantized engine for one test; the previous engine comes back after."""
    saved = torch.backends.quantized.engine

    def use(name: str) -> None:
        torch.backends.quantized.engine = name

    yield use
    torch.backends.quantized.engine = saved


@pytest.fixture
def wide_inputs() -> Callable[..., tuple[torch.Tensor, ...]]:
    """Random inputs for a compiled model: `spread` times randn, wider than the calibration
    data (randn) so that quantization saturates somewhere (`seed` None: the example itself).

    Under x86 on a CPU whose fbgemm saturates its int16 pair sums (no AVX512-VNNI:
    tensorgen.frontend.probe) PyTorch computes the exact dot product, and so matches tensorgen,
    only while the activations its convs and linear layers read stay <= 128 (docs/numerics.md:
    a pair of products then lies in -32768..32512).
    There the spread is narrowed until PyTorch's own activations meet that condition; where none
    does (the histogram observer clips outliers, so even the calibration data can read 129) the
    test is skipped with the figure: tensorgen computes exact products, PyTorch does not."""
    from tensorgen.frontend.probe import x86_behaviour

    def inputs(cm, seed: int | None, spread: float = 1.5) -> tuple[torch.Tensor, ...]:
        b = x86_behaviour("x86")
        saturating = cm.engine == "x86" and not (b.exact_products and b.exact_depthwise)
        shapes = [x.shape for x in cm.example_inputs]
        largest = 0
        for narrowed in (0.5, 0.35, 0.25) if saturating else (spread,):
            gen = torch.Generator().manual_seed(seed or 0)
            xs = tuple(torch.randn(s, generator=gen) * narrowed for s in shapes)
            if seed is None:
                xs = cm.example_inputs
            if not saturating:
                return xs
            largest = _largest_activation(cm, xs)
            if largest <= 128:
                return xs
        pytest.skip(
            f"{b.describe()}: PyTorch's convs read activations up to {largest} (> 128), where "
            "fbgemm's int16 pair sums saturate and tensorgen's exact products differ"
        )

    return inputs


def _largest_activation(cm, xs) -> int:
    """The largest uint8 code that PyTorch's own convs and linear layers of `cm` read on `xs`
    under x86 (only their uint8 x int8 products saturate)."""
    import torch.ao.nn.quantized as nnq

    from tensorgen.frontend.fx import record

    saved = torch.backends.quantized.engine
    torch.backends.quantized.engine = "x86"
    try:
        results = record(cm.qmodel, xs)
    finally:
        torch.backends.quantized.engine = saved
    modules = dict(cm.qmodel.named_modules())
    kinds = (nnq.Conv1d, nnq.Conv2d, nnq.Conv3d, nnq.Linear)
    read = [
        results[n.args[0]]
        for n in results
        if n.op == "call_module" and isinstance(modules[n.target], kinds)
    ]
    return max((int(r.int_repr().max()) for r in read if r.dtype == torch.quint8), default=0)
