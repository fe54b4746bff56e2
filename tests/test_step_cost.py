import time

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from helpers import measure, step_cost


def test_training_step_flops_linear():
    model = nn.Linear(8, 4, bias=False)
    x, y = torch.randn(16, 8), torch.randint(0, 4, (16,))
    flops = step_cost.training_step_flops(model, x, y, nn.CrossEntropyLoss())
    # forward 2*16*8*4; backward: grad of weight only (input needs no grad) 2*16*8*4
    assert flops == 2 * (2 * 16 * 8 * 4)
    assert model.weight.grad is None


def test_training_step_flops_two_layers_count_the_hidden_input_gradient():
    model = nn.Sequential(nn.Linear(8, 6), nn.ReLU(), nn.Linear(6, 4))
    x, y = torch.randn(16, 8), torch.randint(0, 4, (16,))
    flops = step_cost.training_step_flops(model, x, y, nn.CrossEntropyLoss())
    # first layer: forward + weight gradient (the images need no gradient); second layer: forward, weight
    # gradient and the gradient of its input (the hidden activations); biases and ReLU are not matmuls
    assert flops == 2 * (2 * 16 * 8 * 6) + 3 * (2 * 16 * 6 * 4)
    assert all(p.grad is None for p in model.parameters())


NAPS = {"forward": 0.03, "loss": 0.01, "backward": 0.05, "update": 0.02}


class _SleepThrough(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        time.sleep(NAPS["forward"])
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        time.sleep(NAPS["backward"])
        return grad


class _SleepyNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 3)

    def forward(self, x):
        return _SleepThrough.apply(self.fc(x))


class _SleepySGD(torch.optim.SGD):
    def step(self, closure=None):
        time.sleep(NAPS["update"])
        return super().step(closure)


def _sleepy_loss(out, targets):
    time.sleep(NAPS["loss"])
    return F.cross_entropy(out, targets)


def test_phase_times_attributes_known_sleeps_to_their_phase():
    """Each phase sleeps a known time, so a phase timed in the wrong slot (or not at all) fails:
    lower bounds are exact on any machine, and the 50 ms backward is the largest by 20 ms."""
    model = _SleepyNet()
    opt = _SleepySGD(model.parameters(), lr=0.1)
    x, y = torch.randn(2, 4), torch.tensor([0, 2])
    before = model.fc.weight.detach().clone()
    start = time.perf_counter()
    phases = step_cost.phase_times(model, x, y, _sleepy_loss, opt, steps=3, warmup=1)
    wall = time.perf_counter() - start
    assert list(phases) == ["forward", "loss", "backward", "update"]
    assert all(isinstance(s, measure.Stats) and s.n == 3 for s in phases.values())
    for name, nap in NAPS.items():
        assert phases[name].minimum >= nap, name
    assert max(phases, key=lambda k: phases[k].median) == "backward"
    per_step = sum(s.median for s in phases.values())
    assert sum(NAPS.values()) <= per_step <= wall / 3  # the four phases make up the step, and no more
    assert not torch.equal(before, model.fc.weight)  # the update phase did update
    with pytest.raises(ValueError):
        step_cost.phase_times(model, x, y, _sleepy_loss, opt, steps=0)


def test_matmul_peak_is_the_best_repeat_in_its_mode(monkeypatch):
    timed = []
    real_time_fn = step_cost.time_fn
    monkeypatch.setattr(step_cost, "time_fn", lambda *a, **kw: timed.append(real_time_fn(*a, **kw)) or timed[-1])
    peak = step_cost.matmul_peak("cpu", "fp32", n=128, repeats=3)
    assert peak and peak.mode == "fp32" and peak.repeats == 3 and len(timed[0].samples) == 3
    assert peak.flops == pytest.approx(2 * 128**3 / timed[0].stats.minimum)
    # the best (shortest) repeat decides, not the median
    monkeypatch.setattr(step_cost, "time_fn", lambda fn, **kw: measure.Result("mm", [0.4, 0.1, 0.2]))
    assert step_cost.matmul_peak("cpu", "fp32", n=100).flops == pytest.approx(2 * 100 ** 3 / 0.1)
    with pytest.raises(ValueError, match="unknown math mode"):
        step_cost.matmul_peak("cpu", "int4")
    assert step_cost.math_mode("cpu", torch.float32) == "fp32"
    assert not step_cost.MatmulPeak(0.0, "fp32")
