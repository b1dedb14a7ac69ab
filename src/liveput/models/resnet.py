"""ResNet-50 as a sequence of layers: the stem, each of the 16 bottleneck blocks, and the head.

The network is torchvision's ``resnet50`` (v1.5: the stride on the 3x3 convolution, the same
module names and initialization, so its state dicts load either way). It is defined here rather
than imported because torchvision's wheels on PyPI are built against the CUDA build of torch and
cannot even be imported beside the CPU build this project installs; :func:`resnet_layers` cuts
a torchvision ``ResNet`` the same way where torchvision is importable.

``width`` scales every channel count (64 is ResNet-50; tests use 8); BatchNorm keeps running
statistics per replica (they are buffers, not parameters: no gradient is all-reduced for them).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from liveput.errors import LiveputError
from liveput.models.lazy import (
    InitLayer,
    building_empty,
    constructing,
    initialize_layers,
    seeded,
)

RESNET50_BLOCKS = (3, 4, 6, 3)
"""Bottleneck blocks per stage of ResNet-50."""
EXPANSION = 4
"""Output channels of a bottleneck over its inner width."""


def _torchvision_init(module: nn.Module) -> None:
    """torchvision's ResNet initialization of one module: Kaiming normal (fan-out) for a
    convolution, one and zero for a BatchNorm's weight and bias."""
    if isinstance(module, nn.Conv2d):
        nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")
    elif isinstance(module, nn.BatchNorm2d):
        nn.init.ones_(module.weight)
        nn.init.zeros_(module.bias)


class Bottleneck(nn.Module):
    """1x1 reduce, 3x3 (strided), 1x1 expand, with a projected shortcut where shapes change."""

    def __init__(self, in_channels: int, width: int, stride: int = 1) -> None:
        super().__init__()
        out_channels = width * EXPANSION
        self.conv1 = nn.Conv2d(in_channels, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, out_channels, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(out_channels)
        self.relu = nn.ReLU(inplace=True)
        self.downsample: nn.Module | None = None
        if stride != 1 or in_channels != out_channels:
            self.downsample = nn.Sequential(
                nn.Conv2d(in_channels, out_channels, 1, stride=stride, bias=False),
                nn.BatchNorm2d(out_channels),
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        return self.relu(self.bn3(self.conv3(out)) + identity)


class ResNet(nn.Module):
    """torchvision's ResNet with bottleneck blocks (module names as torchvision's)."""

    def __init__(
        self, blocks: tuple[int, ...] = RESNET50_BLOCKS, num_classes: int = 1000, width: int = 64
    ) -> None:
        super().__init__()
        if width < 1 or num_classes < 1 or not blocks or min(blocks) < 1:
            raise LiveputError("resnet: width, num_classes and every stage's blocks must be >= 1")
        self.conv1 = nn.Conv2d(3, width, 7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)
        channels = width
        for stage, count in enumerate(blocks):
            inner = width * 2**stage
            stage_blocks = []
            for index in range(count):
                stride = 2 if stage > 0 and index == 0 else 1
                stage_blocks.append(Bottleneck(channels, inner, stride))
                channels = inner * EXPANSION
            setattr(self, f"layer{stage + 1}", nn.Sequential(*stage_blocks))
        self.num_stages = len(blocks)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(channels, num_classes)
        for module in self.modules():
            _torchvision_init(module)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(images))))
        for stage in range(1, self.num_stages + 1):
            x = getattr(self, f"layer{stage}")(x)
        return self.fc(torch.flatten(self.avgpool(x), 1))


class Stem(nn.Module):
    """7x7 convolution, BatchNorm, ReLU, max-pool."""

    def __init__(
        self, conv1: nn.Module, bn1: nn.Module, relu: nn.Module, maxpool: nn.Module
    ) -> None:
        super().__init__()
        self.conv1, self.bn1, self.relu, self.maxpool = conv1, bn1, relu, maxpool

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.maxpool(self.relu(self.bn1(self.conv1(images))))


class ClassifierHead(nn.Module):
    """Global average pool and the fully connected classifier."""

    def __init__(self, avgpool: nn.Module, fc: nn.Module) -> None:
        super().__init__()
        self.avgpool, self.fc = avgpool, fc

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.flatten(self.avgpool(features), 1))


def resnet_layers(model: nn.Module) -> list[nn.Module]:
    """Cut a ResNet (this module's or torchvision's) into stem, blocks and head; the layers
    share the model's modules."""
    needed = ("conv1", "bn1", "relu", "maxpool", "layer1", "avgpool", "fc")
    missing = [name for name in needed if not hasattr(model, name)]
    if missing:
        raise LiveputError(
            f"resnet_layers: {type(model).__name__} is not a ResNet (no {', '.join(missing)})"
        )
    blocks: list[nn.Module] = []
    stage = 1
    while hasattr(model, f"layer{stage}"):
        blocks.extend(getattr(model, f"layer{stage}").children())
        stage += 1
    net: Any = model  # torchvision's ResNet: its submodules are attributes by name
    return [
        Stem(net.conv1, net.bn1, net.relu, net.maxpool),
        *blocks,
        ClassifierHead(net.avgpool, net.fc),
    ]


def build_resnet50(num_classes: int = 1000, width: int = 64, seed: int = 0) -> list[nn.Module]:
    """ResNet-50's layers (18: stem, 16 bottlenecks, head), each initialized by
    :func:`resnet_init` (without weights while a job is built empty: ``liveput.models.lazy``)."""
    with constructing():
        model = ResNet(RESNET50_BLOCKS, num_classes, width)
    layers = resnet_layers(model.train())
    if not building_empty():
        initialize_layers(layers, resnet_init(seed))
    return layers


def resnet_init(seed: int = 0) -> InitLayer:
    """ResNet's ``init_layer``: torchvision's initialization (Kaiming normal, fan-out, for the
    convolutions; BatchNorm at one and zero; PyTorch's default for the classifier), each layer
    under its own seed."""

    def init(layer: nn.Module) -> None:
        for module in layer.modules():
            _torchvision_init(module)
            if isinstance(module, nn.BatchNorm2d):
                module.reset_running_stats()
            elif isinstance(module, nn.Linear):
                module.reset_parameters()

    return seeded(seed, init)


class SyntheticImages(torch.utils.data.Dataset):
    """Seeded synthetic images and labels (nothing is downloaded): sample ``i`` has label
    ``i``'s hash mod ``num_classes`` and is Gaussian noise plus that class's own low-frequency
    pattern (an 8x8 pattern upsampled), so a model can learn it and the loss falls."""

    PATTERN = 8
    """Side of the per-class pattern before upsampling."""

    def __init__(
        self,
        num_samples: int = 50_000,
        image_size: int = 224,
        num_classes: int = 1000,
        seed: int = 0,
    ) -> None:
        if num_samples < 1 or num_classes < 1 or image_size < self.PATTERN:
            raise LiveputError(
                f"synthetic images: need >= 1 sample and class and an image side >= {self.PATTERN}"
            )
        self.num_samples = num_samples
        self.image_size = image_size
        self.num_classes = num_classes
        self.seed = seed
        generator = torch.Generator().manual_seed(seed)
        self.patterns = torch.randn(num_classes, 3, self.PATTERN, self.PATTERN, generator=generator)

    def __len__(self) -> int:
        return self.num_samples

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        label = (index * 2_654_435_761 + self.seed) % self.num_classes
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + index)
        noise = torch.randn(3, self.image_size, self.image_size, generator=generator)
        repeat = math.ceil(self.image_size / self.PATTERN)
        pattern = self.patterns[label].repeat_interleave(repeat, 1).repeat_interleave(repeat, 2)
        image = noise + pattern[:, : self.image_size, : self.image_size]
        return image, torch.tensor(label)
