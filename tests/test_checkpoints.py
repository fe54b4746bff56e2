"""Tests of helpers.checkpoints: the round trip, loading with ``weights_only=True``, one clear
error for a damaged or foreign file, atomic saves (a failed save leaves the previous
checkpoint as it was), and the one format every training loop writes (portable model weights,
random state, progress). Resuming training from a checkpoint is tested in test_training.py."""

import pytest
import torch
from torch import nn

from helpers import checkpoints, models


def training_state():
    model = nn.Linear(3, 2)
    opt = torch.optim.Adam(model.parameters())
    model(torch.randn(4, 3)).sum().backward()
    opt.step()
    return {"model": model.state_dict(), "optimizer": opt.state_dict(), "rng": torch.get_rng_state(),
            "epoch": 2, "batch": 5, "step": 21, "epoch_times": [1.5, 1.25], "note": "adam"}


def test_round_trip_gives_back_every_tensor_and_value(tmp_path):
    state = training_state()
    path = checkpoints.save_checkpoint(tmp_path / "run.pt", state)
    assert path == tmp_path / "run.pt"
    back = checkpoints.load_checkpoint(str(path))  # a str path does as well
    assert set(back) == set(state)
    assert all(torch.equal(back["model"][k], v) for k, v in state["model"].items())
    assert torch.equal(back["rng"], state["rng"])
    assert back["optimizer"]["state"][0]["step"] == state["optimizer"]["state"][0]["step"] == 1
    assert torch.equal(back["optimizer"]["state"][0]["exp_avg"], state["optimizer"]["state"][0]["exp_avg"])
    assert (back["epoch"], back["batch"], back["step"], back["epoch_times"], back["note"]) == (2, 5, 21, [1.5, 1.25], "adam")
    model = nn.Linear(3, 2)
    model.load_state_dict(back["model"])  # what a resume does with it


def test_save_checkpoint_is_atomic(tmp_path):
    path = checkpoints.save_checkpoint(tmp_path / "a" / "c.pt", {"model": {"w": torch.ones(2)}})
    assert path.exists() and list(path.parent.iterdir()) == [path]
    assert torch.equal(checkpoints.load_checkpoint(path)["model"]["w"], torch.ones(2))


class Unpicklable:
    def __reduce__(self):
        raise RuntimeError("cannot pickle this")


def test_a_failed_save_leaves_the_previous_checkpoint_and_no_partial_file(tmp_path):
    path = checkpoints.save_checkpoint(tmp_path / "c.pt", {"model": {"w": torch.ones(2)}, "step": 1})
    before = path.read_bytes()
    # torch.save writes the tensors' bytes, then fails on the last item: a half-written file
    with pytest.raises(RuntimeError, match="cannot pickle this"):
        checkpoints.save_checkpoint(path, {"model": {"w": torch.zeros(1000)}, "step": 2, "bad": Unpicklable()})
    assert path.read_bytes() == before and list(tmp_path.iterdir()) == [path]
    assert checkpoints.load_checkpoint(path)["step"] == 1


class Pickled:
    value = 42


def test_loading_is_weights_only(tmp_path):
    """A checkpoint holding arbitrary Python objects is refused (weights_only=True never runs their code)."""
    path = tmp_path / "pickled.pt"
    torch.save({"model": {}, "extra": Pickled()}, path)
    with pytest.raises(checkpoints.CheckpointError, match=r"damaged or not a checkpoint \(UnpicklingError\)"):
        checkpoints.load_checkpoint(path)
    assert torch.load(path, weights_only=False)["extra"].value == 42  # the file itself is fine


def test_damaged_and_foreign_files_are_checkpoint_errors(tmp_path):
    bad = tmp_path / "bad.pt"
    bad.write_bytes(b"not a checkpoint at all")
    with pytest.raises(checkpoints.CheckpointError, match="damaged"):
        checkpoints.load_checkpoint(bad)
    other = tmp_path / "other.pt"
    torch.save({"weights": torch.zeros(1)}, other)
    with pytest.raises(checkpoints.CheckpointError, match="not a training checkpoint"):
        checkpoints.load_checkpoint(other)


def test_truncated_and_non_dict_checkpoints_name_the_file_and_what_to_do(tmp_path):
    path = checkpoints.save_checkpoint(tmp_path / "cut.pt", training_state())
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])  # a copy interrupted half-way
    with pytest.raises(checkpoints.CheckpointError, match=r"cut.pt is damaged .*Delete it to start training"):
        checkpoints.load_checkpoint(path)
    tensor = tmp_path / "tensor.pt"
    torch.save(torch.zeros(2), tensor)
    with pytest.raises(checkpoints.CheckpointError, match="tensor.pt is not a training checkpoint"):
        checkpoints.load_checkpoint(tensor)
    with pytest.raises(FileNotFoundError):  # a missing file is not a damaged one: the caller starts afresh
        checkpoints.load_checkpoint(tmp_path / "missing.pt")
    assert issubclass(checkpoints.CheckpointError, RuntimeError)


# ----- the course's one format ----------------------------------------------------------------

def test_training_state_is_portable_and_restores_model_optimizer_and_progress(tmp_path):
    model = models.book_cnn("fashionmnist")
    wrapped = torch.nn.Module()
    wrapped.module = model  # what DDP looks like to state_dict(): keys start with "module."
    assert next(iter(wrapped.state_dict())).startswith("module.")
    opt = torch.optim.Adam(model.parameters())
    model(torch.randn(2, 1, 28, 28)).sum().backward()
    opt.step()
    progress = {**checkpoints.fresh_progress(), "epoch": 1, "step": 8, "epoch_times": [1.0], "data_wait": [0.1],
                "epoch_losses": [2.0]}
    state = checkpoints.training_state(wrapped, opt, progress)
    assert state["format"] == checkpoints.FORMAT and state["scaler"] is None
    assert not any(k.startswith("module.") for k in state["model"])
    assert set(checkpoints.PROGRESS_KEYS) | {"format", "model", "optimizer", "scaler", "rng"} == set(state)
    path = checkpoints.save_checkpoint(tmp_path / "c.pt", state)
    fresh = models.book_cnn("fashionmnist")
    fresh.load_state_dict(checkpoints.load_checkpoint(path)["model"])  # no renaming
    opt2 = torch.optim.Adam(fresh.parameters())
    resumed = checkpoints.restore(path, fresh, opt2)
    assert resumed["resumed_from"] == [1, 0] and resumed["step"] == 8 and resumed["data_wait"] == [0.1]
    assert resumed["epoch_losses"] == [2.0] and resumed["epoch_times"] == [1.0]
    assert opt2.state_dict()["state"][0]["step"] == 1
    old = {k: v for k, v in state.items() if k != "data_wait"}  # an older course's checkpoint: refused, named
    torch.save(old, path)
    with pytest.raises(checkpoints.CheckpointError, match="course version"):
        checkpoints.restore(path, fresh, opt2)


def test_restore_refuses_a_checkpoint_of_another_model(tmp_path):
    small = nn.Linear(3, 2)
    path = checkpoints.save_checkpoint(tmp_path / "c.pt", checkpoints.training_state(
        small, torch.optim.SGD(small.parameters(), lr=0.1), checkpoints.fresh_progress()))
    other = nn.Linear(4, 2)
    with pytest.raises(checkpoints.CheckpointError, match="does not fit this model/optimizer"):
        checkpoints.restore(path, other, torch.optim.SGD(other.parameters(), lr=0.1))


def test_compiled_and_wrapped_models_save_their_plain_weights():
    model = nn.Linear(3, 2)
    outer = nn.Module()
    outer.module = nn.Module()
    outer.module._orig_mod = model  # DDP around torch.compile: module._orig_mod
    assert checkpoints.plain_module(outer) is model
    assert checkpoints.plain_module(model) is model


def test_the_scaler_state_goes_into_the_checkpoint_and_comes_back(tmp_path):
    model = nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=128.0)
    path = checkpoints.save_checkpoint(tmp_path / "s.pt", checkpoints.training_state(
        model, opt, checkpoints.fresh_progress(), scaler=scaler))
    again = torch.amp.GradScaler("cpu")
    assert again.get_scale() == 65536.0
    checkpoints.restore(path, model, opt, scaler=again)
    assert again.get_scale() == 128.0


def test_rng_state_round_trip_and_device_part():
    cpu = torch.device("cpu")
    state = checkpoints.rng_state(cpu)
    assert state["device_type"] == "cpu" and state["device"] is None
    first = torch.rand(4)
    checkpoints.set_rng_state(state, cpu)
    assert torch.equal(torch.rand(4), first)  # the same random stream again
    foreign = {**state, "device_type": "cuda", "device": torch.zeros(8, dtype=torch.uint8)}
    torch.rand(3)
    checkpoints.set_rng_state(foreign, torch.device("meta"))  # another device kind: its part is not applied
    assert torch.equal(torch.rand(4), first)
