"""The book's two CNNs, exactly (stable layer names for pruning masks), and a torchvision model factory."""

from __future__ import annotations

import torch
from torch import nn

from .data import spec

TORCHVISION_MODELS: tuple[str, ...] = ("alexnet", "densenet121", "efficientnet_b0", "efficientnet_b7", "mobilenet_v2",
                                       "resnet18", "resnet50", "vgg16")
_ALIASES = {"mobilenet": "mobilenet_v2", "efficientnet": "efficientnet_b0"}


class BookCNN(nn.Module):
    """Two conv blocks (32 then 64 channels, 3x3, ReLU, max-pool 2), two linear layers, no activation between them."""

    def __init__(self, in_channels: int = 1, image_size: int = 28, num_classes: int = 10, bias: bool = True):
        super().__init__()
        if image_size % 4:
            raise ValueError("image_size must be divisible by 4 (two 2x2 max-pools)")
        self.layer1 = nn.Sequential(
            nn.Conv2d(in_channels, 32, kernel_size=3, padding=1, bias=bias), nn.ReLU(), nn.MaxPool2d(2))
        self.layer2 = nn.Sequential(
            nn.Conv2d(32, 64, kernel_size=3, padding=1, bias=bias), nn.ReLU(), nn.MaxPool2d(2))
        flat = 64 * (image_size // 4) ** 2
        self.fc1 = nn.Linear(flat, 512, bias=bias)
        self.fc2 = nn.Linear(512, num_classes, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.layer2(self.layer1(x))
        return self.fc2(self.fc1(torch.flatten(x, 1)))


def book_cnn(dataset: str = "fashionmnist", *, bias: bool = True, num_classes: int = 10) -> BookCNN:
    """The book's CNN for ``fashionmnist`` (1x28x28) or ``cifar10`` (3x32x32)."""
    shape = spec(dataset)
    return BookCNN(shape.channels, shape.size, num_classes, bias=bias)


def count_parameters(model: nn.Module, trainable_only: bool = True) -> int:
    """Number of (trainable) parameters."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad or not trainable_only)


def torchvision_model(name: str, num_classes: int = 10) -> nn.Module:
    """A torchvision classification model by name (random weights: no download) with ``num_classes`` outputs."""
    from torchvision import models as tvm

    key = _ALIASES.get(name.lower(), name.lower())
    if key not in TORCHVISION_MODELS:
        raise ValueError(f"Unknown model {name!r}. Choose one of {', '.join(TORCHVISION_MODELS)} "
                         f"(aliases: {', '.join(_ALIASES)}).")
    return getattr(tvm, key)(weights=None, num_classes=num_classes)
