import os
import signal
import time

import pytest
import torch
from torch import nn

from helpers import checkpoints, data, models, seeds, training


def small_model():
    return nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.MaxPool2d(4), nn.Flatten(), nn.Linear(4 * 49, 10))


def fresh(seed=0):
    seeds.set_seed(seed)
    model = small_model()
    return model, torch.optim.Adam(model.parameters(), lr=1e-2)


def test_train_learns_and_times_epochs(tiny_loaders):
    train_loader, test_loader = tiny_loaders
    model, opt = fresh()
    before = training.evaluate(model, test_loader)
    res = training.train(model, train_loader, opt, nn.CrossEntropyLoss(), epochs=3, progress=False)
    after = training.evaluate(model, test_loader)
    assert len(res.epoch_times) == 3 and res.steps == 3 * 8 and res.total_time == sum(res.epoch_times)
    assert len(res.data_wait) == 3 and all(0 < w < t for w, t in zip(res.data_wait, res.epoch_times))
    assert res.epoch_losses[-1] < res.epoch_losses[0]
    assert after["accuracy"] > before["accuracy"] and after["accuracy"] > 30
    assert model.training  # evaluate restores the mode


def test_evaluate_counts_exactly():
    class Fixed(nn.Module):
        def forward(self, x):
            out = torch.zeros(len(x), 10)
            out[:, 3] = 1
            return out

    xs = torch.zeros(4, 1, 2, 2)
    ys = torch.tensor([3, 3, 1, 3])
    res = training.evaluate(Fixed(), [(xs, ys)])
    assert res["accuracy"] == 75.0
    with pytest.raises(ValueError):
        training.evaluate(Fixed(), [])


class StopTraining(Exception):
    """A simulated crash."""


class Interrupted:
    """``loader`` that crashes (StopTraining) when asked for a batch after its first ``after`` in the run."""

    def __init__(self, loader, after):
        self.loader, self.sampler, self.batch_size, self.left = loader, loader.sampler, loader.batch_size, after

    def __len__(self):
        return len(self.loader)

    def __iter__(self):
        for batch in self.loader:
            if self.left == 0:
                raise StopTraining("a simulated crash")
            self.left -= 1
            yield batch


def test_interrupted_run_resumes_to_identical_weights(tiny_loaders, tmp_path):
    train_loader, _ = tiny_loaders
    loss = nn.CrossEntropyLoss()
    model_a, opt_a = fresh()
    training.train(model_a, train_loader, opt_a, loss, epochs=2, progress=False)

    ckpt = tmp_path / "run.pt"
    model_b, opt_b = fresh()
    with pytest.raises(StopTraining):  # stops mid-epoch 1, after the step-10 checkpoint
        training.train(model_b, Interrupted(train_loader, after=12), opt_b, loss, epochs=2, progress=False,
                       checkpoint=ckpt, checkpoint_every=5)
    model_c, opt_c = fresh(seed=123)  # a different start: everything must come from the checkpoint
    res = training.train(model_c, train_loader, opt_c, loss, epochs=2, progress=False,
                         checkpoint=ckpt, checkpoint_every=5)
    assert res.resumed_from == (1, 2)
    for a, c in zip(model_a.state_dict().values(), model_c.state_dict().values()):
        assert torch.equal(a, c)


def test_ctrl_c_finishes_the_step_saves_and_resumes_exactly(tiny_loaders, tmp_path, monkeypatch):
    train_loader, _ = tiny_loaders
    loss = nn.CrossEntropyLoss()
    ref, ref_opt = fresh()
    training.train(ref, train_loader, ref_opt, loss, epochs=1, progress=False)

    model, opt = fresh()
    calls = {"n": 0}
    real_step = opt.step

    def step_with_ctrl_c(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 3:  # Ctrl-C arrives in the middle of the third optimizer step
            os.kill(os.getpid(), signal.SIGINT)
        return real_step(*args, **kwargs)

    monkeypatch.setattr(opt, "step", step_with_ctrl_c)
    ckpt = tmp_path / "ctrl_c.pt"
    with pytest.raises(KeyboardInterrupt, match="checkpoint saved"):
        training.train(model, train_loader, opt, loss, epochs=1, progress=False, checkpoint=ckpt)
    state = checkpoints.load_checkpoint(ckpt)
    assert (state["epoch"], state["batch"]) == (0, 3)  # the step in flight was completed and counted
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    resumed, resumed_opt = fresh(seed=9)
    training.train(resumed, train_loader, resumed_opt, loss, epochs=1, progress=False, checkpoint=ckpt)
    for a, b in zip(ref.state_dict().values(), resumed.state_dict().values()):
        assert torch.equal(a, b)


def test_mismatched_checkpoint_is_refused(tiny_loaders, tmp_path):
    # (damaged and foreign checkpoint files: test_checkpoints.py)
    ckpt = tmp_path / "cnn.pt"
    model = models.book_cnn()
    checkpoints.save_checkpoint(ckpt, {"model": model.state_dict(), "optimizer": {}, "rng": torch.get_rng_state(),
                                    "epoch": 0, "batch": 0, "step": 0})
    small, opt = fresh()
    with pytest.raises(checkpoints.CheckpointError, match="does not fit"):
        training.train(small, tiny_loaders[0], opt, nn.CrossEntropyLoss(), epochs=1, progress=False, checkpoint=ckpt)


def test_autocast_and_max_steps(tiny_loaders):
    model, opt = fresh()
    res = training.train(model, tiny_loaders[0], opt, nn.CrossEntropyLoss(), epochs=1, progress=False,
                         autocast_dtype=torch.bfloat16, max_steps_per_epoch=3)
    assert res.steps == 3
    with pytest.raises(ValueError):
        training.train(model, tiny_loaders[0], opt, nn.CrossEntropyLoss(), epochs=0)


def test_data_wait_measures_a_slow_loader():
    class Slow(torch.utils.data.Dataset):
        def __len__(self):
            return 4

        def __getitem__(self, i):
            time.sleep(0.02)
            return torch.zeros(1, 28, 28), 0

    model, opt = fresh()
    loader = data.make_loader(Slow(), 2, train=True)
    res = training.train(model, loader, opt, nn.CrossEntropyLoss(), epochs=1, progress=False)
    assert res.data_wait[0] >= 0.08 and res.data_wait[0] <= res.epoch_times[0]


def test_set_loader_epoch_tells_the_sampler_and_says_whether_it_can_skip():
    from torch.utils.data import DistributedSampler, TensorDataset

    loader = data.make_loader(TensorDataset(torch.arange(10)), 4, train=True, seed=1)
    assert training.set_loader_epoch(loader, 3, start=4) is True
    sampler = loader.sampler
    assert (sampler.epoch, sampler.start) == (3, 4) and list(sampler) == sampler.order()[4:]
    dist = torch.utils.data.DataLoader(TensorDataset(torch.arange(10)), batch_size=4,
                                       sampler=DistributedSampler(range(10), num_replicas=1, rank=0))
    assert training.set_loader_epoch(dist, 2, start=4) is False  # its set_epoch takes no start: resume at the epoch
    assert dist.sampler.epoch == 2
    assert training.set_loader_epoch([(torch.zeros(1), torch.zeros(1))], 1, start=0) is False  # no sampler at all
