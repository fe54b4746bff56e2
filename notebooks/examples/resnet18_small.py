"""torchvision's ResNet-18 (10 classes, random weights) on small images, as a tuner model file.

The image side comes from the environment variable ``TUNE_IMAGE_SIZE`` (default 64) so a
notebook can pick it per profile; the tuner's child processes inherit it. Batch 32.
"""

import os

import torch
from torch import nn

from helpers import models

BATCH = 32


def build():
    size = int(os.environ.get("TUNE_IMAGE_SIZE", "64"))
    model = models.torchvision_model("resnet18", num_classes=10)
    g = torch.Generator().manual_seed(0)
    images = torch.randn(BATCH, 3, size, size, generator=g)
    labels = torch.randint(0, 10, (BATCH,), generator=g)
    return model, images, labels, nn.CrossEntropyLoss()
