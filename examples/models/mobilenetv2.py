"""A reduced MobileNetV2 (Sandler et al., 2018) in plain torch.

Stem conv 3x3/2 + BN + ReLU6; inverted residual blocks (1x1 expand + BN +
ReLU6, depthwise 3x3 stride 1 or 2 + BN + ReLU6, 1x1 linear projection + BN,
and a residual add when the block keeps stride 1 and its channel count); a
final 1x1 conv + BN + ReLU6, adaptive average pooling and a linear classifier.

The block list is shortened and the widths scaled (`WIDTH`) so the default
64x64 input runs quickly, while still having stride-1 and stride-2 depthwise
convolutions, an expansion-1 block (no expand conv) and residual blocks.
"""

from __future__ import annotations

import torch
from torch import nn

WIDTH = 0.5

# (expansion t, output channels c at width 1.0, repeats n, first stride s), as in
# the paper's Table 2, with fewer stages and repeats.
BLOCKS = (
    (1, 16, 1, 1),
    (6, 24, 2, 2),
    (6, 32, 3, 2),
    (6, 64, 2, 2),
)


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


def scaled(channels: int) -> int:
    """Channels at WIDTH, rounded to a multiple of 8 as MobileNetV2 does."""
    return max(8, int(channels * WIDTH + 4) // 8 * 8)


def conv_bn_relu6(
    in_channels: int, out_channels: int, kernel: int, stride: int = 1, groups: int = 1
) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(
            in_channels,
            out_channels,
            kernel,
            stride=stride,
            padding=kernel // 2,
            groups=groups,
            bias=False,
        ),
        nn.BatchNorm2d(out_channels),
        nn.ReLU6(),
    )


class InvertedResidual(nn.Module):
    def __init__(self, in_channels: int, out_channels: int, stride: int, expansion: int) -> None:
        super().__init__()
        hidden = in_channels * expansion
        self.use_residual = stride == 1 and in_channels == out_channels
        layers: list[nn.Module] = []
        if expansion != 1:
            layers.append(conv_bn_relu6(in_channels, hidden, 1))
        layers += [
            conv_bn_relu6(hidden, hidden, 3, stride=stride, groups=hidden),
            nn.Conv2d(hidden, out_channels, 1, bias=False),
            nn.BatchNorm2d(out_channels),
        ]
        self.conv = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # use_residual is fixed at construction, so FX traces a static graph.
        if self.use_residual:
            return self.conv(x) + x
        return self.conv(x)


class MobileNetV2(nn.Module):
    def __init__(self, num_classes: int = 1000) -> None:
        super().__init__()
        channels = scaled(32)
        layers: list[nn.Module] = [conv_bn_relu6(3, channels, 3, stride=2)]
        for expansion, c, repeats, first_stride in BLOCKS:
            out_channels = scaled(c)
            for i in range(repeats):
                stride = first_stride if i == 0 else 1
                layers.append(InvertedResidual(channels, out_channels, stride, expansion))
                channels = out_channels
        last = scaled(256)
        layers.append(conv_bn_relu6(channels, last, 1))
        self.features = nn.Sequential(*layers)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Linear(last, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.avgpool(self.features(x))
        return self.classifier(torch.flatten(x, 1))


def build(size: int = 64, seed: int = 0) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """MobileNetV2 with seeded random weights, in eval mode, and a 1x3xSIZExSIZE input."""
    # fork_rng: seed the default initialisers without disturbing the caller's RNG.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = MobileNetV2()
    randomize_batchnorm(model, torch.Generator().manual_seed(seed + 1))
    model.eval()
    example = torch.randn(1, 3, size, size, generator=torch.Generator().manual_seed(seed + 2))
    return model, (example,)
