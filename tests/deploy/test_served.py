"""helpers.deploy.served: sizes, the served models and their labels, weights from a course checkpoint."""

from __future__ import annotations


import pytest
import torch

from helpers import models
from helpers.checkpoints import save_checkpoint
from helpers.deploy import engines, served


def test_parse_size():
    assert served.parse_size("64") == (64, 64)
    assert served.parse_size("224x384") == (224, 384)
    assert served.parse_size(32) == (32, 32)
    for bad in ("0", "64x", "axb", "-3", "64x0"):
        with pytest.raises(engines.DeployError, match="HxW"):
            served.parse_size(bad)


def test_build_model_shapes_labels_and_checkpoints(tmp_path):
    book = served.build_model("book_cnn")
    assert book.input_shape == (1, 28, 28) and "random weights" in book.label and not book.model.training
    with pytest.raises(engines.DeployError, match="28x28 images only"):
        served.build_model("book_cnn", size=(32, 32))
    blog = served.build_model("blog")
    assert blog.input_shape == (3, 224, 384) and "STAND-IN" in blog.label
    assert served.build_model("resnet18", size=(64, 48)).input_shape == (3, 64, 48)
    with pytest.raises(engines.DeployError, match="Unknown model"):
        served.build_model("yolo9000")

    trained = models.book_cnn("fashionmnist")
    torch.nn.init.constant_(trained.fc2.bias, 0.5)
    save_checkpoint(tmp_path / "ck.pt", {"model": trained.state_dict()})
    loaded = served.build_model("book_cnn", checkpoint=tmp_path / "ck.pt")
    assert "trained weights from ck.pt" in loaded.label
    assert torch.equal(loaded.model.fc2.bias, trained.fc2.bias)
    with pytest.raises(engines.DeployError, match="does not fit this model"):
        served.build_model("book_cnn_cifar10", checkpoint=tmp_path / "ck.pt")


def test_load_weights_fills_the_model_or_names_the_mismatch(tmp_path):
    trained = models.small_cnn(3, 10)
    torch.nn.init.constant_(trained[0].weight, 0.25)
    save_checkpoint(tmp_path / "w.pt", {"model": trained.state_dict()})
    fresh = models.small_cnn(3, 10)
    served.load_weights(fresh, tmp_path / "w.pt")
    assert all(torch.equal(a, b) for a, b in zip(fresh.state_dict().values(), trained.state_dict().values()))
    with pytest.raises(engines.DeployError, match="Checkpoint w.pt does not fit this model"):
        served.load_weights(models.small_cnn(3, 5), tmp_path / "w.pt")
