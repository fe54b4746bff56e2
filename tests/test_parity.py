import math

import pytest
import torch
from torch import nn

from helpers import parity


def test_cpu_against_itself_is_identical():
    res = parity.check("cpu", steps=3, batch=4)
    assert res.ok and res.max_rel_loss_diff == 0.0
    assert len(res.cpu_losses) == len(res.device_losses) == 3
    assert res.cpu_losses == res.device_losses and all(math.isfinite(v) for v in res.cpu_losses)
    assert res.tolerance == parity.TOLERANCES[None] and res.dtype == "fp32"
    assert "agrees with the CPU" in res.summary()


def test_losses_move_and_seed_decides_them():
    a = parity.check("cpu", steps=4, batch=8, seed=1)
    b = parity.check("cpu", steps=4, batch=8, seed=1)
    c = parity.check("cpu", steps=4, batch=8, seed=2)
    assert a.cpu_losses == b.cpu_losses and a.cpu_losses != c.cpu_losses
    assert len(set(a.cpu_losses)) > 1  # the model really trains between steps


def test_a_mismatch_is_flagged():
    # dropout draws different masks in the two runs: exactly the kind of divergence the probe must see
    def with_dropout():
        return nn.Sequential(nn.Flatten(), nn.Dropout(0.5), nn.Linear(3 * 8 * 8, 10))

    res = parity.check("cpu", model_fn=with_dropout, steps=3, batch=8, input_shape=(3, 8, 8), tolerance=1e-6)
    assert not res.ok and res.max_rel_loss_diff > 1e-6 and "DISAGREES" in res.summary()


def test_caller_random_state_is_kept():
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    parity.check("cpu", steps=1, batch=2)
    assert torch.equal(torch.rand(3), expected)


def test_relative_differences_and_nan():
    assert parity.relative_differences([2.0, 1.0], [2.2, 1.0]) == pytest.approx([0.1, 0.0])
    assert parity.relative_differences([1.0], [float("nan")]) == [math.inf]
    with pytest.raises(ValueError, match="different lengths"):
        parity.relative_differences([1.0], [1.0, 2.0])
    res = parity.ParityResult("x", math.inf, [1.0], [float("nan")], False, 1e-2)
    assert "NaN/inf" in res.summary()


def test_low_precision_and_bad_options():
    res = parity.check("cpu", steps=2, batch=4, dtype="bf16")
    assert res.dtype == "bf16" and res.tolerance == parity.TOLERANCES[torch.bfloat16]
    assert res.max_rel_loss_diff < res.tolerance  # bf16 autocast on the CPU stays close to fp32
    with pytest.raises(ValueError, match="steps >= 1"):
        parity.check("cpu", steps=0)
    with pytest.raises(ValueError, match="Unknown device"):
        parity.check("tpu")
    with pytest.raises(ValueError, match="fp32, bf16, fp16"):
        parity.check("cpu", dtype="int8")


def test_probe_model_shapes_and_layers():
    torch.manual_seed(0)
    model = parity.probe_model()
    assert model(torch.randn(2, 3, 16, 16)).shape == (2, 10)
    assert model(torch.randn(1, 3, 7, 9)).shape == (1, 10)  # any image size (global pooling before the head)
    gray = parity.probe_model(in_channels=1, num_classes=4)
    assert gray(torch.randn(2, 1, 8, 8)).shape == (2, 4)
    kinds = [type(m).__name__ for m in model]
    assert kinds.count("Conv2d") == 2 and kinds.count("BatchNorm2d") == 2 and kinds[-1] == "Linear"
