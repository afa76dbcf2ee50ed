"""A small segmentation network in plain torch: a strided encoder, a decoder that upsamples
(nearest, x2) and concatenates the encoder's skips of each scale, and a per-pixel classifier.

Encoder: conv 3x3 + BN + ReLU at full resolution, then two stride-2 stages (conv 3x3/2 + BN +
ReLU, conv 3x3 + BN + ReLU6). Decoder, twice: nn.Upsample(scale_factor=2) of the deeper
features, torch.cat with the skip of that scale (each input has its own quantization
parameters: tensorgen requantizes them by PyTorch's rule), conv 3x3 + BN + ReLU. Classifier:
a 1x1 conv to NUM_CLASSES logits per pixel, at the input's resolution.

`decoder` picks the upsampling: "nearest" (nn.Upsample, the default), "bilinear"
(F.interpolate x2, align_corners=False: PyTorch's quantized bilinear kernel) or "transposed"
(a learned nn.ConvTranspose2d 3x3, stride 2, padding 1, output padding 1, per stage).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

DECODERS = ("nearest", "bilinear", "transposed")

NUM_CLASSES = 5


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


def conv_bn(c_in: int, c_out: int, stride: int = 1, act: type[nn.Module] = nn.ReLU) -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False), nn.BatchNorm2d(c_out), act()
    )


class SegNet(nn.Module):
    def __init__(self, num_classes: int = NUM_CLASSES, decoder: str = "nearest") -> None:
        super().__init__()
        if decoder not in DECODERS:
            raise ValueError(f"decoder '{decoder}' (one of {', '.join(DECODERS)})")
        self.decoder = decoder
        self.enc1 = conv_bn(3, 16)
        self.enc2 = nn.Sequential(conv_bn(16, 24, 2), conv_bn(24, 24, act=nn.ReLU6))
        self.enc3 = nn.Sequential(conv_bn(24, 32, 2), conv_bn(32, 32, act=nn.ReLU6))
        self.up = nn.Upsample(scale_factor=2, mode="nearest")
        if decoder == "transposed":
            self.up3 = nn.ConvTranspose2d(32, 32, 3, stride=2, padding=1, output_padding=1)
            self.up2 = nn.ConvTranspose2d(24, 24, 3, stride=2, padding=1, output_padding=1)
        self.dec2 = conv_bn(32 + 24, 24)
        self.dec1 = conv_bn(24 + 16, 16)
        self.classifier = nn.Conv2d(16, num_classes, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s1 = self.enc1(x)  # full resolution
        s2 = self.enc2(s1)  # 1/2
        s3 = self.enc3(s2)  # 1/4
        d2 = self.dec2(torch.cat([self._up(s3, "up3"), s2], 1))
        d1 = self.dec1(torch.cat([self._up(d2, "up2"), s1], 1))
        return self.classifier(d1)

    def _up(self, x: torch.Tensor, learned: str) -> torch.Tensor:
        if self.decoder == "bilinear":
            return F.interpolate(x, scale_factor=2, mode="bilinear", align_corners=False)
        if self.decoder == "transposed":
            return getattr(self, learned)(x)
        return self.up(x)


def build(
    size: int = 32, seed: int = 0, decoder: str = "nearest"
) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """SegNet with seeded random weights, in eval mode, and a 1x3xSIZExSIZE input (SIZE a
    multiple of 4); `decoder` one of DECODERS."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = SegNet(decoder=decoder)
    randomize_batchnorm(model, torch.Generator().manual_seed(seed + 1))
    model.eval()
    example = torch.randn(1, 3, size, size, generator=torch.Generator().manual_seed(seed + 2))
    return model, (example,)


def build_bilinear(size: int = 32, seed: int = 0) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """SegNet whose decoder upsamples bilinearly (`segnet.py:build_bilinear` on the CLI)."""
    return build(size, seed, decoder="bilinear")


def build_transposed(size: int = 32, seed: int = 0) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """SegNet whose decoder upsamples with transposed convolutions."""
    return build(size, seed, decoder="transposed")
