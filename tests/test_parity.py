import math

import pytest
import torch
from torch import nn

from helpers import parity


def scale_grad(index, factor):
    """A fault: the device run's gradient of model[index].weight comes out `factor` times too big."""
    return lambda model: model[index].weight.register_hook(lambda g: g * factor)


def noisy_grad(index, size):
    """A fault: seeded noise of `size` times the gradient's RMS added to model[index].weight's gradient."""
    gen = torch.Generator().manual_seed(7)

    def add(g):
        noise = torch.randn(g.shape, generator=gen).to(g.device, g.dtype)
        return g + size * g.pow(2).mean().sqrt() * noise

    return lambda model: model[index].weight.register_hook(add)


def test_honest_cpu_run_passes_with_zero_difference():
    res = parity.check("cpu", steps=3, batch=8)
    assert res.ok and res.max_rel_diff == 0.0
    assert res.cpu_losses == res.device_losses and len(res.cpu_losses) == 3
    assert set(res.grad_diffs) == set(res.update_diffs) == {k for k, _ in parity.probe_model().named_parameters()}
    assert res.tolerance == parity.TOLERANCES[None] == 1e-3 and res.dtype == "fp32"
    assert "agrees with the CPU" in res.summary() and res.settings["fault injected"] is False


def test_the_batch_is_learnable_so_the_loss_falls():
    res = parity.check("cpu", steps=5)
    assert res.cpu_losses[0] == pytest.approx(math.log(10), abs=0.3)
    assert res.cpu_losses[-1] < 0.7 * res.cpu_losses[0]  # about 2.3 -> 1.2: the backward pass and update do work
    assert all(b < a for a, b in zip(res.cpu_losses, res.cpu_losses[1:]))


@pytest.mark.parametrize("fault, where", [(scale_grad(0, 1.02), "0.weight"),     # first conv: 2% too big
                                          (scale_grad(9, 1.5), "9.weight"),      # the head: 50% too big
                                          (noisy_grad(4, 0.05), "4.weight")])    # second conv: 5% noise
def test_a_broken_backward_is_flagged(fault, where):
    res = parity.check("cpu", steps=3, batch=8, fault=fault)
    assert not res.ok and res.max_rel_diff > res.tolerance
    assert res.worst.startswith(where) and res.grad_diffs[where] > 10 * res.tolerance
    assert "DISAGREES" in res.summary() and where in res.summary()
    # only the faulty tensor's gradient is off (updates of the others follow from the same weights)
    others = {k: v for k, v in res.grad_diffs.items() if k != where}
    assert max(others.values()) < res.tolerance


def test_a_fault_the_loss_barely_shows_is_still_flagged():
    # the old probe compared losses at 5e-2: this fault moves them far less than that
    res = parity.check("cpu", steps=5, fault=scale_grad(0, 1.1))
    worst_loss = max(abs(a - b) / a for a, b in zip(res.cpu_losses, res.device_losses))
    assert worst_loss < 5e-2 and not res.ok


def test_low_precision_tolerances_pass_honest_runs_and_flag_big_faults():
    for dtype, torch_dtype in (("bf16", torch.bfloat16), ("fp16", torch.float16)):
        honest = parity.check("cpu", steps=3, batch=8, dtype=dtype)
        assert honest.dtype == dtype and honest.tolerance == parity.TOLERANCES[torch_dtype]
        assert 0 < honest.max_rel_diff < honest.tolerance, honest.summary()  # rounding shows, within the tolerance
        broken = parity.check("cpu", steps=3, batch=8, dtype=dtype, fault=scale_grad(0, 1.5))
        assert not broken.ok and broken.worst == "0.weight gradient"
    assert parity.TOLERANCES[None] < parity.TOLERANCES[torch.float16] < parity.TOLERANCES[torch.bfloat16]


def test_nan_on_the_device_is_flagged():
    res = parity.check("cpu", steps=2, batch=4, fault=scale_grad(0, float("nan")))
    assert not res.ok and math.isinf(res.max_rel_diff) and "NaN/inf" in res.summary()


def test_dropout_mismatch_is_flagged():
    # dropout draws different masks in the two runs: exactly the kind of divergence the probe must see
    def with_dropout():
        return nn.Sequential(nn.Flatten(), nn.Dropout(0.5), nn.Linear(3 * 8 * 8, 10))

    res = parity.check("cpu", model_fn=with_dropout, steps=2, batch=8, input_shape=(3, 8, 8))
    assert not res.ok and "DISAGREES" in res.summary()


def test_seed_decides_and_caller_random_state_is_kept():
    a = parity.check("cpu", steps=2, batch=4, seed=1)
    b = parity.check("cpu", steps=2, batch=4, seed=1)
    c = parity.check("cpu", steps=2, batch=4, seed=2)
    assert a.cpu_losses == b.cpu_losses != c.cpu_losses
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    parity.check("cpu", steps=1, batch=2)
    assert torch.equal(torch.rand(3), expected)


def test_relative_differences():
    ref = {"big": torch.tensor([3.0, 4.0]), "zero": torch.zeros(2)}
    out = parity.relative_differences(ref, {"big": torch.tensor([3.0, 4.5]), "zero": torch.tensor([0.0, 5e-4])})
    assert out["big"] == pytest.approx(0.1)
    assert out["zero"] == pytest.approx(0.1)  # measured against the floor, 1e-3 of the largest norm (5)
    assert parity.relative_differences(ref, {"big": torch.tensor([float("nan"), 4.0]), "zero": torch.zeros(2)})["big"] == math.inf
    with pytest.raises(ValueError, match="different tensors"):
        parity.relative_differences(ref, {"big": torch.zeros(2)})
    with pytest.raises(ValueError, match="shapes"):
        parity.relative_differences(ref, {"big": torch.zeros(3), "zero": torch.zeros(2)})
    res = parity.ParityResult("x", math.inf, [1.0], [float("nan")], False, 1e-3)
    assert "NaN/inf" in res.summary() and res.worst == ""


def test_bad_options():
    with pytest.raises(ValueError, match="steps >= 1"):
        parity.check("cpu", steps=0)
    with pytest.raises(ValueError, match="Unknown device"):
        parity.check("tpu")
    with pytest.raises(ValueError, match="fp32, bf16, fp16"):
        parity.check("cpu", dtype="int8")


def test_probe_model_and_batch_shapes():
    torch.manual_seed(0)
    model = parity.probe_model()
    assert model(torch.randn(2, 3, 16, 16)).shape == (2, 10)
    assert model(torch.randn(1, 3, 7, 9)).shape == (1, 10)  # any image size (global pooling before the head)
    gray = parity.probe_model(in_channels=1, num_classes=4)
    assert gray(torch.randn(2, 1, 8, 8)).shape == (2, 4)
    kinds = [type(m).__name__ for m in model]
    assert kinds.count("Conv2d") == 2 and kinds.count("BatchNorm2d") == 2 and kinds[-1] == "Linear"
    x, y = parity.learnable_batch(6, (1, 4, 4), 3, torch.Generator().manual_seed(0))
    assert x.shape == (6, 1, 4, 4) and y.shape == (6,) and int(y.max()) < 3


def test_check_takes_the_readers_model_and_plot_draws_every_tensor():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    mlp = lambda: nn.Sequential(nn.Flatten(), nn.Linear(1 * 8 * 8, 16), nn.ReLU(), nn.Linear(16, 10))
    own = parity.check("cpu", model_fn=mlp, steps=2, input_shape=(1, 8, 8))
    assert own.ok and own.max_rel_diff == 0 and set(own.grad_diffs) == {"1.weight", "1.bias", "3.weight", "3.bias"}
    broken = parity.check("cpu", model_fn=mlp, steps=2, input_shape=(1, 8, 8), fault=scale_grad(3, 1.5))
    assert not broken.ok and broken.worst.startswith("3.weight")
    fig = parity.plot({"honest": own, "broken": broken})
    assert len(fig.axes[0].patches) == 8
    plt.close(fig)
    with pytest.raises(ValueError):
        parity.plot({})
