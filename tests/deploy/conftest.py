"""Fixture of the deploy tests: ``tiny_spec``, a light CNN served as ``deploy.build_model`` would serve it."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from helpers import deploy


def _tiny_cnn(in_channels: int = 3, num_classes: int = 10) -> nn.Module:
    return nn.Sequential(nn.Conv2d(in_channels, 16, 3, stride=2, padding=1), nn.ReLU(),
                         nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.ReLU(),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, num_classes))


@pytest.fixture()
def tiny_spec():
    """A seeded tiny CNN on 3x16x16 images, as ``deploy.build_model`` would serve it."""
    torch.manual_seed(0)
    return deploy.ModelSpec("tiny", _tiny_cnn().eval(), (3, 16, 16), "tiny test CNN")
