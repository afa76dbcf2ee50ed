"""A small CNN exercising the ops the model compiler must lower.

conv3x3 + BN + ReLU, a stride-2 conv, a residual add, max pooling, adaptive
average pooling to 1x1, flatten and a linear classifier. Plain torch only.
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


class SmallCNN(nn.Module):
    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(16)
        self.relu1 = nn.ReLU()
        self.conv2 = nn.Conv2d(16, 32, 3, stride=2, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(32)
        self.relu2 = nn.ReLU()
        self.conv3 = nn.Conv2d(32, 32, 3, padding=1, bias=False)
        self.bn3 = nn.BatchNorm2d(32)
        self.relu3 = nn.ReLU()
        self.pool = nn.MaxPool2d(2)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(32, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.relu1(self.bn1(self.conv1(x)))
        identity = self.relu2(self.bn2(self.conv2(x)))
        out = self.bn3(self.conv3(identity))
        out = out + identity
        out = self.relu3(out)
        out = self.pool(out)
        out = self.avgpool(out)
        out = torch.flatten(out, 1)
        return self.fc(out)


def build(size: int = 32, seed: int = 0) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """SmallCNN with seeded random weights, in eval mode, and a 1x3xSIZExSIZE input."""
    # fork_rng: seed the default initialisers without disturbing the caller's RNG.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = SmallCNN()
    randomize_batchnorm(model, torch.Generator().manual_seed(seed + 1))
    model.eval()
    example = torch.randn(1, 3, size, size, generator=torch.Generator().manual_seed(seed + 2))
    return model, (example,)
