"""ResNet-18 (He et al., 2015), written from scratch in plain torch.

BasicBlock x [2, 2, 2, 2]; 7x7/2 stem conv + BN + ReLU; 3x3/2 max pool with
padding 1; 1x1/2 projection shortcuts with BN where the shape changes;
adaptive average pooling and a 1000-way classifier. The input is 1x3xSIZExSIZE
(64 by default, 224 for the benchmark).
"""

from __future__ import annotations

import torch
from torch import nn


def randomize_batchnorm(model: nn.Module, generator: torch.Generator) -> None:
    """Give every BatchNorm2d non-trivial affine params and running stats.

    Fresh BatchNorm is the identity (mean 0, var 1, weight 1, bias 0), which
    would hide folding mistakes; random stats make BN folding observable.
    """
    for module in model.modules():
        if isinstance(module, nn.BatchNorm2d):
            n = module.num_features
            with torch.no_grad():
                module.weight.copy_(0.5 + torch.rand(n, generator=generator))
                module.bias.copy_(0.2 * torch.randn(n, generator=generator))
                module.running_mean.copy_(0.2 * torch.randn(n, generator=generator))
                module.running_var.copy_(0.5 + torch.rand(n, generator=generator))


class BasicBlock(nn.Module):
    def __init__(self, in_channels: int, channels: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, channels, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.relu1 = nn.ReLU()
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)
        self.relu2 = nn.ReLU()
        self.downsample: nn.Module | None = None
        if stride != 1 or in_channels != channels:
            self.downsample = nn.Sequential(
                nn.Conv2d(in_channels, channels, 1, stride=stride, bias=False),
                nn.BatchNorm2d(channels),
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu1(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        out = out + identity
        return self.relu2(out)


class ResNet18(nn.Module):
    def __init__(self, num_classes: int = 1000) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU()
        self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)
        self.layer1 = self._stage(64, 64, stride=1)
        self.layer2 = self._stage(64, 128, stride=2)
        self.layer3 = self._stage(128, 256, stride=2)
        self.layer4 = self._stage(256, 512, stride=2)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(512, num_classes)

    @staticmethod
    def _stage(in_channels: int, channels: int, stride: int) -> nn.Sequential:
        return nn.Sequential(
            BasicBlock(in_channels, channels, stride), BasicBlock(channels, channels, 1)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        x = torch.flatten(self.avgpool(x), 1)
        return self.fc(x)


def build(size: int = 64, seed: int = 0) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """ResNet-18 with seeded random weights, in eval mode, and a 1x3xSIZExSIZE input."""
    # fork_rng: seed the default initialisers without disturbing the caller's RNG.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = ResNet18()
    randomize_batchnorm(model, torch.Generator().manual_seed(seed + 1))
    model.eval()
    example = torch.randn(1, 3, size, size, generator=torch.Generator().manual_seed(seed + 2))
    return model, (example,)
