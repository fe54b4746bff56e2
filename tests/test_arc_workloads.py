"""helpers.arc_workloads: the Arc blog's workloads -- exact architectures (parameter counts) and steps that train --
and the numerics parity probe."""

import math

import pytest
import torch
from torch import nn

from helpers import arc_workloads, models


def test_sd21_unet_has_the_published_parameter_count():
    unet = arc_workloads.sd21_unet(device="meta")  # no memory, no download
    assert models.count_parameters(unet) == arc_workloads.SD21_UNET_PARAMETERS == 865_910_724


def test_narrow_unet_keeps_the_layout_of_sd21():
    full, narrow = arc_workloads.sd21_unet(device="meta"), arc_workloads.sd21_unet("narrow", device="meta")
    assert models.count_parameters(narrow) == 83_397_412
    for key in ("down_block_types", "up_block_types", "layers_per_block", "cross_attention_dim", "in_channels",
                "use_linear_projection", "upcast_attention"):
        assert narrow.config[key] == full.config[key], key
    widths = [n / f for n, f in zip(narrow.config.block_out_channels, full.config.block_out_channels)]
    assert widths == [0.3] * 4
    with pytest.raises(ValueError, match="full, narrow, tiny"):
        arc_workloads.sd21_unet("medium", device="meta")


def test_unet_weights_come_from_the_seed():
    a, b, c = arc_workloads.sd21_unet("tiny", seed=1), arc_workloads.sd21_unet("tiny", seed=1), arc_workloads.sd21_unet("tiny", seed=2)
    pa, pb, pc = (next(m.parameters()) for m in (a, b, c))
    assert torch.equal(pa, pb) and not torch.equal(pa, pc)


def test_tiny_unet_step_runs_and_keeps_the_latent_shape():
    unet = arc_workloads.sd21_unet("tiny")
    step = arc_workloads.unet_step(unet, device="cpu", image_size=32)
    step()
    out = unet(torch.zeros(1, 4, 4, 4), torch.tensor([1]), encoder_hidden_states=torch.zeros(1, 5, 64)).sample
    assert out.shape == (1, 4, 4, 4)


def test_unet_step_rejects_sizes_the_vae_cannot_make():
    with pytest.raises(ValueError, match="multiple of 8"):
        arc_workloads.unet_step(arc_workloads.sd21_unet("tiny"), device="cpu", image_size=30)


def test_transformer_net_is_the_fast_neural_style_network():
    net = arc_workloads.transformer_net()
    assert models.count_parameters(net) == 1_679_235
    x = torch.rand(1, 3, 32, 32)
    assert net(x).shape == x.shape
    assert any(isinstance(m, torch.nn.ReflectionPad2d) for m in net.modules())
    zero = arc_workloads.transformer_net("zero")
    assert not any(isinstance(m, torch.nn.ReflectionPad2d) for m in zero.modules())
    with pytest.raises(ValueError):
        arc_workloads.transformer_net("mirror")


def test_training_steps_lower_their_loss_on_a_fixed_batch():
    step = arc_workloads.classification_step(device="cpu", batch=4, size=32, num_classes=3)
    losses = [step() for _ in range(6)]
    assert losses[-1] < losses[0]
    style = arc_workloads.style_transfer_step(device="cpu", batch=1, size=32)
    style_losses = [style() for _ in range(3)]
    assert all(0 < v < float("inf") for v in style_losses)
    assert len(set(style_losses)) == 3  # the transformer's weights moved between steps


def test_sizes_per_profile_and_step_builders_and_variant():
    for table in (arc_workloads.COMPARISON_SIZES, arc_workloads.BLOG_SIZES):
        assert set(table) == {"smoke", "workshop", "full"}
    assert arc_workloads.BLOG_SIZES["workshop"]["cls_size"] == arc_workloads.COMPARISON_SIZES["full"]["cls_size"] == 288
    sizes = arc_workloads.COMPARISON_SIZES["smoke"]
    cls, unet, style = arc_workloads.step_builders(sizes, "cpu")
    timed = arc_workloads.variant(cls, device="cpu", steps=2, warmup=0)()
    assert len(timed.samples) == 2


def test_published_comparison_puts_every_setup_against_the_titan():
    from helpers import measure

    mine = measure.Result("resnet18d, fp32", [0.5, 0.5], [], {}, {})
    table, bars = arc_workloads.published_comparison({"resnet18d": mine}, comparable=False)
    text = str(table)
    assert "this machine, fp32" in text and "SMOKE SIZES" in text
    mine_row = [r for r in table.as_dicts() if r["setup"] == "this machine, fp32"][0]
    assert mine_row["whole run (min)"] == pytest.approx(3 * 4_324 * 0.5 / 60)  # the blog's 3 epochs of 4,324 steps
    titan = [b for b in bars if b[0] == "resnet18d: titan_rtx_amp"][0]
    assert titan[1] == pytest.approx(1.0)
    assert [b for b in bars if b[0] == "resnet18d: this machine"][0][1] == pytest.approx(2 / 21.94)
    assert not any("style transfer: this machine" in b[0] for b in bars)
    import matplotlib
    matplotlib.use("Agg")
    fig = arc_workloads.plot_published(bars, comparable=False)
    assert len(fig.axes[0].patches) == len(bars)


# ----- the numerics parity probe ----------------------------------------------------------------

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
    res = arc_workloads.parity_check("cpu", steps=3, batch=8)
    assert res.ok and res.max_rel_diff == 0.0
    assert res.cpu_losses == res.device_losses and len(res.cpu_losses) == 3
    assert set(res.grad_diffs) == set(res.update_diffs) == {k for k, _ in arc_workloads.probe_model().named_parameters()}
    assert res.tolerance == arc_workloads.PARITY_TOLERANCES[None] == 1e-3 and res.dtype == "fp32"
    assert "agrees with the CPU" in res.summary()


def test_the_batch_is_learnable_so_the_loss_falls():
    res = arc_workloads.parity_check("cpu", steps=5)
    assert res.cpu_losses[0] == pytest.approx(math.log(10), abs=0.3)
    assert res.cpu_losses[-1] < 0.7 * res.cpu_losses[0]  # about 2.3 -> 1.2: the backward pass and update do work
    assert all(b < a for a, b in zip(res.cpu_losses, res.cpu_losses[1:]))


@pytest.mark.parametrize("fault, where", [(scale_grad(0, 1.02), "0.weight"),     # first conv: 2% too big
                                          (scale_grad(9, 1.5), "9.weight"),      # the head: 50% too big
                                          (noisy_grad(4, 0.05), "4.weight")])    # second conv: 5% noise
def test_a_broken_backward_is_flagged(fault, where):
    res = arc_workloads.parity_check("cpu", steps=3, batch=8, fault=fault)
    assert not res.ok and res.max_rel_diff > res.tolerance
    assert res.worst.startswith(where) and res.grad_diffs[where] > 10 * res.tolerance
    assert "DISAGREES" in res.summary() and where in res.summary()
    # only the faulty tensor's gradient is off (updates of the others follow from the same weights)
    others = {k: v for k, v in res.grad_diffs.items() if k != where}
    assert max(others.values()) < res.tolerance


def test_a_fault_the_loss_barely_shows_is_still_flagged():
    # the old probe compared losses at 5e-2: this fault moves them far less than that
    res = arc_workloads.parity_check("cpu", steps=5, fault=scale_grad(0, 1.1))
    worst_loss = max(abs(a - b) / a for a, b in zip(res.cpu_losses, res.device_losses))
    assert worst_loss < 5e-2 and not res.ok


def test_low_precision_tolerances_pass_honest_runs_and_flag_big_faults():
    for dtype, torch_dtype in (("bf16", torch.bfloat16), ("fp16", torch.float16)):
        honest = arc_workloads.parity_check("cpu", steps=3, batch=8, dtype=dtype)
        assert honest.dtype == dtype and honest.tolerance == arc_workloads.PARITY_TOLERANCES[torch_dtype]
        assert 0 < honest.max_rel_diff < honest.tolerance, honest.summary()  # rounding shows, within the tolerance
        broken = arc_workloads.parity_check("cpu", steps=3, batch=8, dtype=dtype, fault=scale_grad(0, 1.5))
        assert not broken.ok and broken.worst == "0.weight gradient"
    assert arc_workloads.PARITY_TOLERANCES[None] < arc_workloads.PARITY_TOLERANCES[torch.float16] < arc_workloads.PARITY_TOLERANCES[torch.bfloat16]


def test_nan_on_the_device_is_flagged():
    res = arc_workloads.parity_check("cpu", steps=2, batch=4, fault=scale_grad(0, float("nan")))
    assert not res.ok and math.isinf(res.max_rel_diff) and "NaN/inf" in res.summary()


def test_dropout_mismatch_is_flagged():
    # dropout draws different masks in the two runs: exactly the kind of divergence the probe must see
    def with_dropout():
        return nn.Sequential(nn.Flatten(), nn.Dropout(0.5), nn.Linear(3 * 8 * 8, 10))

    res = arc_workloads.parity_check("cpu", model_fn=with_dropout, steps=2, batch=8, input_shape=(3, 8, 8))
    assert not res.ok and "DISAGREES" in res.summary()


def test_seed_decides_and_caller_random_state_is_kept():
    a = arc_workloads.parity_check("cpu", steps=2, batch=4, seed=1)
    b = arc_workloads.parity_check("cpu", steps=2, batch=4, seed=1)
    c = arc_workloads.parity_check("cpu", steps=2, batch=4, seed=2)
    assert a.cpu_losses == b.cpu_losses != c.cpu_losses
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    arc_workloads.parity_check("cpu", steps=1, batch=2)
    assert torch.equal(torch.rand(3), expected)


def test_relative_differences():
    ref = {"big": torch.tensor([3.0, 4.0]), "zero": torch.zeros(2)}
    out = arc_workloads.relative_differences(ref, {"big": torch.tensor([3.0, 4.5]), "zero": torch.tensor([0.0, 5e-4])})
    assert out["big"] == pytest.approx(0.1)
    assert out["zero"] == pytest.approx(0.1)  # measured against the floor, 1e-3 of the largest norm (5)
    assert arc_workloads.relative_differences(ref, {"big": torch.tensor([float("nan"), 4.0]), "zero": torch.zeros(2)})["big"] == math.inf
    with pytest.raises(ValueError, match="different tensors"):
        arc_workloads.relative_differences(ref, {"big": torch.zeros(2)})
    with pytest.raises(ValueError, match="shapes"):
        arc_workloads.relative_differences(ref, {"big": torch.zeros(3), "zero": torch.zeros(2)})
    res = arc_workloads.ParityResult("x", math.inf, [1.0], [float("nan")], False, 1e-3)
    assert "NaN/inf" in res.summary() and res.worst == ""


def test_bad_options():
    with pytest.raises(ValueError, match="steps >= 1"):
        arc_workloads.parity_check("cpu", steps=0)
    with pytest.raises(ValueError, match="Unknown device"):
        arc_workloads.parity_check("tpu")
    with pytest.raises(ValueError, match="fp32, bf16, fp16"):
        arc_workloads.parity_check("cpu", dtype="int8")


def test_probe_model_and_batch_shapes():
    torch.manual_seed(0)
    model = arc_workloads.probe_model()
    assert model(torch.randn(2, 3, 16, 16)).shape == (2, 10)
    assert model(torch.randn(1, 3, 7, 9)).shape == (1, 10)  # any image size (global pooling before the head)
    gray = arc_workloads.probe_model(in_channels=1, num_classes=4)
    assert gray(torch.randn(2, 1, 8, 8)).shape == (2, 4)
    kinds = [type(m).__name__ for m in model]
    assert kinds.count("Conv2d") == 2 and kinds.count("BatchNorm2d") == 2 and kinds[-1] == "Linear"
    x, y = arc_workloads.learnable_batch(6, (1, 4, 4), 3, torch.Generator().manual_seed(0))
    assert x.shape == (6, 1, 4, 4) and y.shape == (6,) and int(y.max()) < 3


def test_check_takes_the_readers_model_and_plot_draws_every_tensor():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    mlp = lambda: nn.Sequential(nn.Flatten(), nn.Linear(1 * 8 * 8, 16), nn.ReLU(), nn.Linear(16, 10))
    own = arc_workloads.parity_check("cpu", model_fn=mlp, steps=2, input_shape=(1, 8, 8))
    assert own.ok and own.max_rel_diff == 0 and set(own.grad_diffs) == {"1.weight", "1.bias", "3.weight", "3.bias"}
    broken = arc_workloads.parity_check("cpu", model_fn=mlp, steps=2, input_shape=(1, 8, 8), fault=scale_grad(3, 1.5))
    assert not broken.ok and broken.worst.startswith("3.weight")
    fig = arc_workloads.parity_plot({"honest": own, "broken": broken})
    assert len(fig.axes[0].patches) == 8
    plt.close(fig)
    with pytest.raises(ValueError):
        arc_workloads.parity_plot({})
