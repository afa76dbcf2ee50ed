"""An Inception-style network (Szegedy et al., 2015) in plain torch.

Stem conv 3x3 + BN + ReLU; two Inception blocks separated by max pooling 2x2, each four
branches concatenated along channels: 1x1; 1x1 -> 3x3; 1x1 -> 3x3 -> 3x3 (a factorised 5x5);
max pooling 3x3/1 (padded) -> 1x1. Every conv is followed by BN + ReLU, the deepest branch
ends in ReLU6 -- so the branches reach the cat with different quantization parameters, which
tensorgen requantizes by PyTorch's rule. Then adaptive average pooling and a linear classifier.
"""

from __future__ import annotations

import torch
from torch import nn


def randomize_batchnorm(model: nn.Module, generator: torch.Generator) -> None:
    """Non-trivial BatchNorm statistics, so that BN folding is observable."""
    for module in model.modules():
        if isinstance(module, nn.BatchNorm2d):
            n = module.num_features
            with torch.no_grad():
                module.weight.copy_(0.5 + torch.rand(n, generator=generator))
                module.bias.copy_(0.2 * torch.randn(n, generator=generator))
                module.running_mean.copy_(0.2 * torch.randn(n, generator=generator))
                module.running_var.copy_(0.5 + torch.rand(n, generator=generator))


def cbr(c_in: int, c_out: int, k: int, act: type[nn.Module] = nn.ReLU) -> list[nn.Module]:
    return [nn.Conv2d(c_in, c_out, k, padding=k // 2, bias=False), nn.BatchNorm2d(c_out), act()]


class Inception(nn.Module):
    def __init__(self, c_in: int, c1: int, c3: tuple[int, int], c5: tuple[int, int], cp: int):
        super().__init__()
        self.b1 = nn.Sequential(*cbr(c_in, c1, 1))
        self.b3 = nn.Sequential(*cbr(c_in, c3[0], 1), *cbr(c3[0], c3[1], 3))
        self.b5 = nn.Sequential(
            *cbr(c_in, c5[0], 1), *cbr(c5[0], c5[1], 3), *cbr(c5[1], c5[1], 3, nn.ReLU6)
        )
        self.bp = nn.Sequential(nn.MaxPool2d(3, 1, 1), *cbr(c_in, cp, 1))
        self.channels = c1 + c3[1] + c5[1] + cp

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.b1(x), self.b3(x), self.b5(x), self.bp(x)], 1)


class InceptionNet(nn.Module):
    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        self.stem = nn.Sequential(*cbr(3, 16, 3))
        self.block1 = Inception(16, 8, (8, 12), (4, 6), 6)  # 32 channels
        self.pool = nn.MaxPool2d(2)
        self.block2 = Inception(self.block1.channels, 16, (12, 16), (6, 8), 8)  # 48 channels
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(self.block2.channels, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.block2(self.pool(self.block1(self.stem(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def build(size: int = 16, seed: int = 0) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """InceptionNet with seeded random weights, in eval mode, and a 1x3xSIZExSIZE input."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = InceptionNet()
    randomize_batchnorm(model, torch.Generator().manual_seed(seed + 1))
    model.eval()
    example = torch.randn(1, 3, size, size, generator=torch.Generator().manual_seed(seed + 2))
    return model, (example,)
