"""MobileNetV3-Small (Howard et al., 2019) in plain torch, as torchvision builds it.

Stem conv 3x3/2 + BN + Hardswish; eleven inverted residual blocks (1x1 expand + BN +
activation, depthwise k x k + BN + activation, an optional squeeze-excite block, 1x1
projection + BN, and a residual add when the block keeps stride 1 and its channel count),
the activation ReLU in the first three blocks and Hardswish after; a final 1x1 conv + BN +
Hardswish, global average pooling and the classifier Linear + Hardswish + Dropout + Linear.

Squeeze-excite (torchvision's `SqueezeExcitation`): global average pooling, 1x1 conv + ReLU,
1x1 conv, Hardsigmoid, and the block's input multiplied by the result, broadcast over the
spatial dimensions ([N, C, H, W] * [N, C, 1, 1]). The pooling is `nn.AdaptiveAvgPool2d(1)` as
in torchvision, or with `mean=1` `x.mean((2, 3), keepdim=True)`, which tensorgen compiles
under qnnpack only (PyTorch's x86 engine takes a float mean there).

The block list and channel counts are the paper's (Table 2) at width 1.0; `classes` sets the
classifier's outputs, `size` the input and `blocks` how many of the blocks are kept, so that
tests can run it small.
"""

from __future__ import annotations

import torch
from torch import nn

# (kernel, expanded channels, output channels, squeeze-excite, activation, stride): Table 2
BLOCKS = (
    (3, 16, 16, True, "RE", 2),
    (3, 72, 24, False, "RE", 2),
    (3, 88, 24, False, "RE", 1),
    (5, 96, 40, True, "HS", 2),
    (5, 240, 40, True, "HS", 1),
    (5, 240, 40, True, "HS", 1),
    (5, 120, 48, True, "HS", 1),
    (5, 144, 48, True, "HS", 1),
    (5, 288, 96, True, "HS", 2),
    (5, 576, 96, True, "HS", 1),
    (5, 576, 96, True, "HS", 1),
)
LAST = 576
HIDDEN = 1024


def make_divisible(v: float, divisor: int = 8) -> int:
    """torchvision's channel rounding: to a multiple of 8, never below 90 % of `v`."""
    new = max(divisor, int(v + divisor / 2) // divisor * divisor)
    return new + divisor if new < 0.9 * v else new


def randomize_batchnorm(model: nn.Module, generator: torch.Generator) -> None:
    """Non-trivial BatchNorm statistics, so that folding them into the convs is observable."""
    for module in model.modules():
        if isinstance(module, nn.BatchNorm2d):
            n = module.num_features
            with torch.no_grad():
                module.weight.copy_(0.5 + torch.rand(n, generator=generator))
                module.bias.copy_(0.2 * torch.randn(n, generator=generator))
                module.running_mean.copy_(0.2 * torch.randn(n, generator=generator))
                module.running_var.copy_(0.5 + torch.rand(n, generator=generator))


def conv_bn(
    cin: int, cout: int, kernel: int, stride: int = 1, groups: int = 1, act: str | None = None
) -> nn.Sequential:
    layers: list[nn.Module] = [
        nn.Conv2d(cin, cout, kernel, stride, kernel // 2, groups=groups, bias=False),
        nn.BatchNorm2d(cout),
    ]
    if act is not None:
        layers.append(nn.Hardswish() if act == "HS" else nn.ReLU())
    return nn.Sequential(*layers)


class SqueezeExcitation(nn.Module):
    def __init__(self, channels: int, squeeze: int, mean: bool) -> None:
        super().__init__()
        self.mean = mean
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc1 = nn.Conv2d(channels, squeeze, 1)
        self.relu = nn.ReLU()
        self.fc2 = nn.Conv2d(squeeze, channels, 1)
        self.scale = nn.Hardsigmoid()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = x.mean((2, 3), keepdim=True) if self.mean else self.avgpool(x)
        s = self.scale(self.fc2(self.relu(self.fc1(s))))
        return s * x


class InvertedResidual(nn.Module):
    def __init__(self, cin: int, kernel: int, expanded: int, cout: int, se: bool, act: str,
                 stride: int, mean: bool) -> None:  # fmt: skip
        super().__init__()
        self.use_residual = stride == 1 and cin == cout
        layers: list[nn.Module] = []
        if expanded != cin:
            layers.append(conv_bn(cin, expanded, 1, act=act))
        layers.append(conv_bn(expanded, expanded, kernel, stride, groups=expanded, act=act))
        if se:
            layers.append(SqueezeExcitation(expanded, make_divisible(expanded // 4), mean))
        layers.append(conv_bn(expanded, cout, 1))
        self.block = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.block(x)
        return y + x if self.use_residual else y


class MobileNetV3Small(nn.Module):
    def __init__(self, classes: int = 1000, mean: bool = False, blocks: int = 11) -> None:
        super().__init__()
        layers: list[nn.Module] = [conv_bn(3, 16, 3, stride=2, act="HS")]
        channels = 16
        for kernel, expanded, cout, se, act, stride in BLOCKS[:blocks]:
            layers.append(InvertedResidual(channels, kernel, expanded, cout, se, act, stride, mean))
            channels = cout
        layers.append(conv_bn(channels, LAST, 1, act="HS"))
        self.features = nn.Sequential(*layers)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Sequential(
            nn.Linear(LAST, HIDDEN), nn.Hardswish(), nn.Dropout(0.2), nn.Linear(HIDDEN, classes)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.avgpool(self.features(x))
        return self.classifier(torch.flatten(x, 1))


def build(
    size: int = 64, seed: int = 0, classes: int = 1000, mean: int = 0, blocks: int = 11
) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """MobileNetV3-Small with seeded random weights, in eval mode, and a 1x3xSIZExSIZE input;
    `blocks` < 11 keeps the first blocks only (a small model for tests)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = MobileNetV3Small(classes, bool(mean), blocks)
    randomize_batchnorm(model, torch.Generator().manual_seed(seed + 1))
    model.eval()
    example = torch.randn(1, 3, size, size, generator=torch.Generator().manual_seed(seed + 2))
    return model, (example,)
