"""A reduced ShuffleNetV2 (Ma et al., 2018) in plain torch.

Stem conv 3x3/2 + BN + ReLU and max pooling 3x3/2; units of two kinds:

- stride 1: `chunk(2, dim=1)`; the right half goes through 1x1 + BN + ReLU, depthwise 3x3 +
  BN, 1x1 + BN + ReLU; `cat` with the untouched left half;
- stride 2: both branches see the whole input (left: depthwise 3x3/2 + BN, 1x1 + BN + ReLU;
  right as above with a stride-2 depthwise); `cat`.

Each unit ends in the channel shuffle `view(n, 2, c // 2, h, w).transpose(1, 2).contiguous()
.view(n, c, h, w)`. Then a 1x1 conv + BN + ReLU, adaptive average pooling and a linear
classifier. Stage widths are scaled down (`STAGES`) so the default 32x32 input runs quickly.
"""

from __future__ import annotations

import torch
from torch import nn

# (output channels, units) per stage; the first unit of each stage has stride 2
STAGES = ((32, 2), (64, 2))


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


def conv1x1(c_in: int, c_out: int, relu: bool = True) -> list[nn.Module]:
    return [nn.Conv2d(c_in, c_out, 1, bias=False), nn.BatchNorm2d(c_out)] + (
        [nn.ReLU()] if relu else []
    )


def depthwise(c: int, stride: int) -> list[nn.Module]:
    return [nn.Conv2d(c, c, 3, stride, 1, groups=c, bias=False), nn.BatchNorm2d(c)]


def shuffle(x: torch.Tensor, groups: int = 2) -> torch.Tensor:
    n, c, h, w = x.shape
    return x.view(n, groups, c // groups, h, w).transpose(1, 2).contiguous().view(n, c, h, w)


class Unit(nn.Module):
    def __init__(self, c_in: int, c_out: int, stride: int) -> None:
        super().__init__()
        self.stride = stride
        half = c_out // 2
        right_in = c_in if stride == 2 else half
        self.right = nn.Sequential(
            *conv1x1(right_in, half), *depthwise(half, stride), *conv1x1(half, half)
        )
        self.left = (
            nn.Sequential(*depthwise(c_in, 2), *conv1x1(c_in, half)) if stride == 2 else None
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.left is None:
            left, right = x.chunk(2, dim=1)
            out = torch.cat([left, self.right(right)], 1)
        else:
            out = torch.cat([self.left(x), self.right(x)], 1)
        return shuffle(out)


class ShuffleNetV2(nn.Module):
    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, 16, 3, 2, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU()
        )
        self.pool = nn.MaxPool2d(3, 2, 1)
        units, c_in = [], 16
        for c_out, repeats in STAGES:
            for i in range(repeats):
                units.append(Unit(c_in, c_out, 2 if i == 0 else 1))
                c_in = c_out
        self.units = nn.Sequential(*units)
        self.head = nn.Sequential(*conv1x1(c_in, 64))
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(64, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.head(self.units(self.pool(self.stem(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def build(size: int = 32, seed: int = 0) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """ShuffleNetV2 with seeded random weights, in eval mode, and a 1x3xSIZExSIZE input."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = ShuffleNetV2()
    randomize_batchnorm(model, torch.Generator().manual_seed(seed + 1))
    model.eval()
    example = torch.randn(1, 3, size, size, generator=torch.Generator().manual_seed(seed + 2))
    return model, (example,)
