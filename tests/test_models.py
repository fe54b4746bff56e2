import pytest
import torch
from torch import nn

from helpers import models


@pytest.mark.parametrize("kwargs,expected", [
    ({}, 1_630_090),
    ({"bias": False}, 1_629_472),
    ({"dataset": "cifar10"}, 2_122_186),
])
def test_book_parameter_counts(kwargs, expected):
    assert models.count_parameters(models.book_cnn(**kwargs)) == expected


def test_book_cnn_forward_shapes():
    assert models.book_cnn()(torch.zeros(2, 1, 28, 28)).shape == (2, 10)
    assert models.book_cnn("cifar10", num_classes=4)(torch.zeros(2, 3, 32, 32)).shape == (2, 4)
    with pytest.raises(ValueError):
        models.book_cnn("imagenet")
    with pytest.raises(ValueError):
        models.BookCNN(image_size=30)


def test_count_trainable_only():
    m = nn.Linear(3, 2)
    m.bias.requires_grad_(False)
    assert models.count_parameters(m) == 6 and models.count_parameters(m, trainable_only=False) == 8


def test_torchvision_factory():
    assert models.count_parameters(models.torchvision_model("densenet121", num_classes=1000)) == 7_978_856
    net = models.torchvision_model("mobilenet", num_classes=7)
    assert net(torch.zeros(1, 3, 64, 64)).shape == (1, 7)
    with pytest.raises(ValueError, match="resnet18"):
        models.torchvision_model("lenet")

