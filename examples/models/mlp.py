"""A multilayer perceptron: flatten, Linear + ReLU layers, a final Linear.

The input is 1xSIZE (256 by default); an image-like input such as 1x1x16x16
works too, since forward() flattens everything after the batch dimension.
"""

from __future__ import annotations

import torch
from torch import nn


class MLP(nn.Module):
    def __init__(
        self, in_features: int, hidden: tuple[int, ...] = (128, 64), num_classes: int = 10
    ) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        width = in_features
        for h in hidden:
            layers += [nn.Linear(width, h), nn.ReLU()]
            width = h
        self.hidden = nn.Sequential(*layers)
        self.fc = nn.Linear(width, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.hidden(torch.flatten(x, 1)))


def build(size: int = 256, seed: int = 0) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """MLP over SIZE input features with seeded random weights, and a 1xSIZE input."""
    # fork_rng: seed the default initialisers without disturbing the caller's RNG.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = MLP(size)
    model.eval()
    example = torch.randn(1, size, generator=torch.Generator().manual_seed(seed + 2))
    return model, (example,)
