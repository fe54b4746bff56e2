"""helpers.arc_workloads: the Arc blog's workloads -- exact architectures (parameter counts) and steps that train."""

import pytest
import torch

from helpers import arc_workloads, models


def test_sd21_unet_has_the_published_parameter_count():
    unet = arc_workloads.sd21_unet(device="meta")  # no memory, no download
    assert models.count_parameters(unet) == arc_workloads.SD21_UNET_PARAMETERS == 865_910_724


def test_narrow_unet_keeps_the_layout_of_sd21():
    full, narrow = arc_workloads.sd21_unet(device="meta"), arc_workloads.sd21_unet("narrow", device="meta")
    assert models.count_parameters(narrow) == arc_workloads.NARROW_UNET_PARAMETERS == 83_397_412
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
    step = arc_workloads.unet_step(unet, device="cpu", image_size=32, batch=2, text_tokens=5)
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


def test_estimated_total_counts_every_step_of_every_epoch():
    run = arc_workloads.BlogTraining(train_steps_per_epoch=10, eval_steps_per_epoch=2, epochs=3)
    assert run.estimated_total_s(0.5, 0.25) == pytest.approx(3 * (10 * 0.5 + 2 * 0.25))
    assert arc_workloads.HAGRID.estimated_total_s(1.0) == 3 * 4_324
    with pytest.raises(ValueError):
        run.estimated_total_s(0.0)


def test_vgg16_features_match_torchvision_up_to_relu4_3():
    from torchvision.models import vgg16

    ours, theirs = arc_workloads.vgg16_features(), vgg16(weights=None).features[:23]
    assert [type(m) for m in ours] == [type(m) for m in theirs]
    assert [tuple(p.shape) for p in ours.parameters()] == [tuple(p.shape) for p in theirs.parameters()]


def test_sizes_per_profile_and_step_builders_and_variant():
    for table in (arc_workloads.COMPARISON_SIZES, arc_workloads.BLOG_SIZES):
        assert set(table) == {"smoke", "workshop", "full"}
    assert arc_workloads.BLOG_SIZES["workshop"]["cls_size"] == arc_workloads.HAGRID.size
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
    titan = [b for b in bars if b[0] == "resnet18d: titan_rtx_amp"][0]
    assert titan[1] == pytest.approx(1.0)
    assert [b for b in bars if b[0] == "resnet18d: this machine"][0][1] == pytest.approx(2 / 21.94)
    assert not any("style transfer: this machine" in b[0] for b in bars)
    import matplotlib
    matplotlib.use("Agg")
    fig = arc_workloads.plot_published(bars, comparable=False)
    assert len(fig.axes[0].patches) == len(bars)
