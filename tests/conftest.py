"""Shared fixtures: a clean profile environment and tiny stand-in loaders."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    for var in ("COURSE_PROFILE", "COURSE_DATA", "COURSE_DATA_DIR"):
        monkeypatch.delenv(var, raising=False)
    torch.manual_seed(0)


@pytest.fixture
def tiny_loaders():
    from helpers import data

    train = data.load_dataset("fashionmnist", train=True, source="standin", standin_length=256)
    test = data.load_dataset("fashionmnist", train=False, source="standin", standin_length=128)
    return data.make_loader(train, 32, train=True, seed=3), data.make_loader(test, 64, train=False)
