"""The book's FashionMNIST CNN as a tuner model file (chapter 13).

``build()`` returns (model, inputs, targets, loss_fn): one batch of 64 stand-in 28x28
images (random pixels: the tuner measures speed and a short-run loss, not accuracy).
Adam with lr 1e-3 is the tuner's default optimizer, as in the book.
"""

import torch
from torch import nn

from helpers import models

BATCH = 64


def build():
    model = models.book_cnn("fashionmnist")
    g = torch.Generator().manual_seed(0)
    images = torch.randn(BATCH, 1, 28, 28, generator=g)
    labels = torch.randint(0, 10, (BATCH,), generator=g)
    return model, images, labels, nn.CrossEntropyLoss()
