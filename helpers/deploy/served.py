"""What ``helpers.deploy`` serves: the model (the book's CNNs, torchvision, timm or the Arc blog's
setting), its input size, trained weights from a course checkpoint, and a fixed input batch.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from .. import models
from .engines import DeployError, import_engine


BLOG_MODEL = "blog"
BOOK_MODELS = {"book_cnn": "fashionmnist", "book_cnn_fashionmnist": "fashionmnist", "book_cnn_cifar10": "cifar10"}


@dataclass
class ModelSpec:
    """A model ready for export, with the input shape (C, H, W) it expects and how it was made."""

    name: str
    model: nn.Module
    input_shape: tuple[int, int, int]
    label: str


def parse_size(text: str | int) -> tuple[int, int]:
    """``"64"`` -> (64, 64); ``"224x384"`` -> (224, 384), height first."""
    m = re.fullmatch(r"\s*(\d+)\s*(?:[xX]\s*(\d+))?\s*", str(text))
    if not m or int(m.group(1)) < 1 or (m.group(2) and int(m.group(2)) < 1):
        raise DeployError(f"--size must be N or HxW with positive integers (e.g. 224 or 224x384); got {text!r}.")
    h = int(m.group(1))
    return h, int(m.group(2) or h)


def build_model(name: str, *, size: tuple[int, int] | None = None, checkpoint: str | Path | None = None,
                num_classes: int = 10, seed: int = 0) -> ModelSpec:
    """The book's CNN, a torchvision model, ``timm:NAME``, or ``blog`` (the Arc blog's setting), in eval mode."""
    torch.manual_seed(seed)
    key = name.lower()
    if key in BOOK_MODELS:
        model = models.book_cnn(BOOK_MODELS[key], num_classes=num_classes)
        shape = (1, 28, 28) if BOOK_MODELS[key] == "fashionmnist" else (3, 32, 32)
        if size is not None and size != shape[1:]:
            raise DeployError(f"{name} takes {shape[1]}x{shape[2]} images only (its Linear layer fixes the size); "
                              f"drop --size or pass --size {shape[1]}x{shape[2]}.")
        label = f"the book's {BOOK_MODELS[key]} CNN"
    elif key == BLOG_MODEL:
        model = models.torchvision_model("resnet18", num_classes=num_classes)
        shape = (3, *(size or (224, 384)))
        label = ("STAND-IN for the blog's YOLOX-tiny (not a pinned dependency): torchvision resnet18, about 3.1 GMAC "
                 "per 384x224 image; YOLOX-tiny's published 6.45 GFLOPs (3.2 GMAC) are at 416x416, about 1.6 GMAC at "
                 "384x224, so the stand-in does about twice the work")
    elif key.startswith("timm:"):
        timm = import_engine("timm")
        model = timm.create_model(name[5:], pretrained=False, num_classes=num_classes)
        shape, label = (3, *(size or (224, 224))), f"timm {name[5:]}"
    else:
        try:
            model = models.torchvision_model(name, num_classes=num_classes)
        except ValueError as exc:
            raise DeployError(f"{exc} Also: {', '.join(BOOK_MODELS)}, {BLOG_MODEL}, timm:NAME.") from None
        shape, label = (3, *(size or (224, 224))), f"torchvision {name}"
    if checkpoint is not None:
        load_weights(model, checkpoint)
        label += f", trained weights from {Path(checkpoint).name}"
    else:
        label += ", random weights"
    return ModelSpec(name, model.eval(), shape, label)


def load_weights(model: nn.Module, path: str | Path) -> None:
    """Load a helpers.checkpoints checkpoint (a dict whose "model" is the state_dict) into ``model``."""
    from ..checkpoints import load_checkpoint

    state = load_checkpoint(path)
    try:
        model.load_state_dict(state["model"])
    except RuntimeError as exc:
        first = str(exc).splitlines()[1:2] or [str(exc)[:200]]
        raise DeployError(f"Checkpoint {Path(path).name} does not fit this model ({first[0].strip()}); "
                          "pass the --model the checkpoint was trained with.") from None


def fixed_batch(input_shape: tuple[int, int, int], batch: int, seed: int = 0) -> np.ndarray:
    """A seeded random float32 batch (N, C, H, W): the same input for every engine."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn((batch, *input_shape), generator=g).numpy()
