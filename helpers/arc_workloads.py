"""The Intel Arc blog's workloads, rebuilt without downloads, so a reader can time them.

The blog (C. Mills, *Testing Intel's Arc A770 GPU for Deep Learning*, parts 1-4) timed
three trainings and one generation on an Arc A770 and a Titan RTX. Their datasets and
pretrained weights cannot be fetched here, but their *compute* can be rebuilt exactly:

* image classification: timm ``resnet18d`` (19 classes), batch 32, 288x288, AdamW
  (lr 1e-3, eps 1e-5), mixed precision; an epoch of the blog's HaGRID split is 4,324
  training steps (``HAGRID``);
* Stable Diffusion 2.1: the UNet (865,910,724 parameters) built from its published
  configuration (``SD21_UNET_CONFIG``) with random weights, one denoising step at 512x512
  with classifier-free guidance (batch 2, 77 text tokens of width 1024);
* style transfer: the fast-neural-style ``TransformerNet`` (reflection padding, as in
  the original; the blog swapped it for zero padding on Arc) trained against VGG16
  features, batch 4 at 256x256.

Each ``*_step`` function builds a fresh seeded model and returns a zero-argument callable
that performs one step; time it with ``helpers.measure.time_fn``, and compare variants in
``helpers.measure.interleaved`` rounds that call the ``*_step`` function anew every round.
Random weights change nothing about the time of a step; they do make the outputs
meaningless, which is why nothing here reports accuracy.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import nn

from .seeds import set_seed
from .step import train_step

# stabilityai/stable-diffusion-2-1, unet/config.json (the 768x768 "v" model; the 512 base
# model has the same architecture). Building it needs diffusers, no download.
SD21_UNET_CONFIG: dict[str, Any] = {
    "act_fn": "silu",
    "attention_head_dim": [5, 10, 20, 20],
    "block_out_channels": [320, 640, 1280, 1280],
    "center_input_sample": False,
    "cross_attention_dim": 1024,
    "down_block_types": ["CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "DownBlock2D"],
    "downsample_padding": 1,
    "dual_cross_attention": False,
    "flip_sin_to_cos": True,
    "freq_shift": 0,
    "in_channels": 4,
    "layers_per_block": 2,
    "mid_block_scale_factor": 1,
    "norm_eps": 1e-05,
    "norm_num_groups": 32,
    "num_class_embeds": None,
    "only_cross_attention": False,
    "out_channels": 4,
    "sample_size": 96,
    "up_block_types": ["UpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D"],
    "upcast_attention": True,
    "use_linear_projection": True,
}
SD21_UNET_PARAMETERS = 865_910_724

# A miniature of the same architecture for smoke runs (seconds instead of minutes).
TINY_UNET_OVERRIDES: dict[str, Any] = {"block_out_channels": [32, 64, 64, 64], "attention_head_dim": [2, 4, 4, 4],
                                       "cross_attention_dim": 64, "layers_per_block": 1, "norm_num_groups": 16}
# SD 2.1's blocks, layers and text width (1024) at 30% of its channel widths (83,397,412 parameters; heads of 32 channels instead of 64), so that a
# fresh instance per round builds in about a second and a step at 256x256 costs ~38 GFLOP
# instead of SD 2.1's ~1,600 GFLOP at 512x512 (torch.utils.flop_counter).
NARROW_UNET_OVERRIDES: dict[str, Any] = {"block_out_channels": [96, 192, 384, 384], "attention_head_dim": [3, 6, 12, 12]}
UNET_SIZES: dict[str, dict[str, Any]] = {"full": {}, "narrow": NARROW_UNET_OVERRIDES, "tiny": TINY_UNET_OVERRIDES}
NARROW_UNET_PARAMETERS = 83_397_412


@dataclass(frozen=True)
class BlogTraining:
    """The blog's image-classification run: what one epoch and the whole run contain."""

    train_steps_per_epoch: int = 4_324
    eval_steps_per_epoch: int = 481
    epochs: int = 3
    batch: int = 32
    size: int = 288
    classes: int = 19

    def estimated_total_s(self, step_s: float, eval_step_s: float = 0.0) -> float:
        """Seconds for the blog's whole run at ``step_s`` per training step (an estimate:
        data loading, evaluation unless given, and checkpointing are not included)."""
        if step_s <= 0 or eval_step_s < 0:
            raise ValueError("step times must be positive")
        return self.epochs * (self.train_steps_per_epoch * step_s + self.eval_steps_per_epoch * eval_step_s)


HAGRID = BlogTraining()


class BlogModelError(RuntimeError):
    """A blog model that cannot be built here (its library is missing)."""


def sd21_unet(size: str = "full", device: torch.device | str | None = None, seed: int = 0) -> nn.Module:
    """The Stable Diffusion 2.1 UNet from its configuration, random weights drawn from ``seed``.

    ``size``: ``"full"`` (SD 2.1 as published, 865,910,724 parameters), ``"narrow"`` (the same
    layout at 30% of the widths, for workshop-sized comparisons) or ``"tiny"`` (a miniature for
    smoke runs). ``device="meta"`` builds it without memory (to count parameters in a second).
    """
    if size not in UNET_SIZES:
        raise ValueError(f"size must be one of {', '.join(UNET_SIZES)}, not {size!r}")
    try:
        from diffusers import UNet2DConditionModel
    except ImportError as exc:  # pragma: no cover - diffusers is pinned
        raise BlogModelError("The SD 2.1 UNet needs diffusers: run `make setup` (it is one of the course's pins).") \
            from exc
    config = dict(SD21_UNET_CONFIG, **UNET_SIZES[size])
    if device is None:
        set_seed(seed)
        return UNet2DConditionModel.from_config(config)
    with torch.device(device):
        set_seed(seed)
        return UNet2DConditionModel.from_config(config)


def unet_step(unet: nn.Module, *, device: torch.device | str, image_size: int = 512, batch: int = 2,
              text_tokens: int = 77, autocast_dtype: torch.dtype | None = None, seed: int = 0) -> Callable[[], None]:
    """One denoising step of ``unet`` (inference, no gradients) at ``image_size`` pixels.

    The latent is ``image_size / 8`` on a side with 4 channels; ``batch`` 2 is one image
    with classifier-free guidance (conditioned + unconditioned), as the blog's pipeline ran.
    """
    if image_size % 8:
        raise ValueError("image_size must be a multiple of 8 (the VAE's downsampling factor)")
    device = torch.device(device)
    cfg = unet.config
    gen = torch.Generator().manual_seed(seed)
    latent = torch.randn(batch, cfg.in_channels, image_size // 8, image_size // 8, generator=gen).to(device)
    text = torch.randn(batch, text_tokens, cfg.cross_attention_dim, generator=gen).to(device)
    timestep = torch.tensor([500] * batch, device=device)
    unet.to(device).eval()

    @torch.no_grad()
    def step() -> None:
        with torch.autocast(device.type, dtype=autocast_dtype, enabled=autocast_dtype is not None):
            unet(latent, timestep, encoder_hidden_states=text)

    return step


def classification_step(*, device: torch.device | str, batch: int = HAGRID.batch, size: int = HAGRID.size,
                        num_classes: int = HAGRID.classes, autocast_dtype: torch.dtype | None = None,
                        channels_last: bool = False, model_name: str = "resnet18d",
                        seed: int = 0) -> Callable[[], float]:
    """One training step of the blog's classifier (timm ``resnet18d``, AdamW lr 1e-3 eps 1e-5).

    A fixed random batch lives on the device (the blog's loader kept the GPU fed, so data
    loading is not part of its step time). The callable returns the step's loss.
    """
    try:
        import timm
    except ImportError as exc:  # pragma: no cover - timm is pinned
        raise BlogModelError("The blog's classifier needs timm: run `make setup` (it is one of the course's pins).") \
            from exc
    device = torch.device(device)
    set_seed(seed)
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    model = timm.create_model(model_name, pretrained=False, num_classes=num_classes).to(device, memory_format=fmt)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, eps=1e-5)
    x = torch.randn(batch, 3, size, size).to(device, memory_format=fmt)
    y = torch.randint(num_classes, (batch,)).to(device)

    def step() -> float:
        return float(train_step(model, opt, nn.functional.cross_entropy, x, y, autocast_dtype=autocast_dtype,
                                device_type=device.type).detach())

    return step


class _ConvLayer(nn.Sequential):
    def __init__(self, cin: int, cout: int, kernel: int, stride: int, padding: str) -> None:
        pad = nn.ReflectionPad2d(kernel // 2) if padding == "reflect" else nn.ZeroPad2d(kernel // 2)
        super().__init__(pad, nn.Conv2d(cin, cout, kernel, stride))


class _Residual(nn.Module):
    def __init__(self, channels: int, padding: str) -> None:
        super().__init__()
        self.body = nn.Sequential(_ConvLayer(channels, channels, 3, 1, padding), nn.InstanceNorm2d(channels, affine=True),
                                  nn.ReLU(), _ConvLayer(channels, channels, 3, 1, padding),
                                  nn.InstanceNorm2d(channels, affine=True))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.body(x)


class _Upsample(nn.Module):
    def __init__(self, cin: int, cout: int, padding: str) -> None:
        super().__init__()
        self.conv = _ConvLayer(cin, cout, 3, 1, padding)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(nn.functional.interpolate(x, scale_factor=2, mode="nearest"))


def transformer_net(padding: str = "reflect") -> nn.Module:
    """The fast-neural-style image transformation network (3 downsampling convolutions,
    5 residual blocks, 2 upsampling convolutions, instance norm), 1,679,235 parameters.

    ``padding="zero"`` is the blog's Arc workaround (reflection padding had no bf16 kernel there).
    """
    if padding not in ("reflect", "zero"):
        raise ValueError("padding must be 'reflect' or 'zero'")
    norm = lambda c: nn.InstanceNorm2d(c, affine=True)  # noqa: E731
    return nn.Sequential(
        _ConvLayer(3, 32, 9, 1, padding), norm(32), nn.ReLU(),
        _ConvLayer(32, 64, 3, 2, padding), norm(64), nn.ReLU(),
        _ConvLayer(64, 128, 3, 2, padding), norm(128), nn.ReLU(),
        *[_Residual(128, padding) for _ in range(5)],
        _Upsample(128, 64, padding), norm(64), nn.ReLU(),
        _Upsample(64, 32, padding), norm(32), nn.ReLU(),
        _ConvLayer(32, 3, 9, 1, padding),
    )


def vgg16_features() -> nn.Sequential:
    """torchvision's VGG16 ``features[:23]`` (up to relu4_3), built without the 124-million-parameter
    classifier that fast neural style never uses (same layers, same indices)."""
    layers: list[nn.Module] = []
    cin = 3
    for v in (64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512):
        if v == "M":
            layers.append(nn.MaxPool2d(2, 2))
        else:
            layers += [nn.Conv2d(cin, int(v), 3, padding=1), nn.ReLU(inplace=True)]
            cin = int(v)
    return nn.Sequential(*layers)


def style_transfer_step(*, device: torch.device | str, batch: int = 4, size: int = 256,
                        autocast_dtype: torch.dtype | None = None, padding: str = "reflect",
                        seed: int = 0) -> Callable[[], float]:
    """One training step of fast neural style: transform, then content + style (Gram) losses on
    the frozen VGG16 features up to relu4_3 (random weights here), Adam lr 1e-3."""
    device = torch.device(device)
    set_seed(seed)
    net = transformer_net(padding).to(device).train()
    features = vgg16_features().to(device).eval()
    for p in features.parameters():
        p.requires_grad_(False)
    taps = (3, 8, 15, 22)  # relu1_2, relu2_2, relu3_3, relu4_3
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    x = torch.rand(batch, 3, size, size).to(device)
    style = torch.rand(1, 3, size, size).to(device)

    def feats(img: torch.Tensor) -> list[torch.Tensor]:
        out = []
        for i, layer in enumerate(features):
            img = layer(img)
            if i in taps:
                out.append(img)
        return out

    def gram(f: torch.Tensor) -> torch.Tensor:
        b, c, h, w = f.shape
        f = f.reshape(b, c, h * w).float()  # .reshape, not .view: the blog's lesson
        with torch.autocast(device.type, enabled=False):  # in fp32 by design: autocast would cast the matmul back
            return f @ f.transpose(1, 2) / (c * h * w)

    with torch.no_grad(), torch.autocast(device.type, dtype=autocast_dtype, enabled=autocast_dtype is not None):
        style_grams = [gram(f) for f in feats(style)]

    def perceptual_loss(y: torch.Tensor, content_image: torch.Tensor) -> torch.Tensor:
        fy, fx = feats(y), feats(content_image)
        content = nn.functional.mse_loss(fy[1].float(), fx[1].float())
        style_loss = sum(nn.functional.mse_loss(gram(a), g.expand(len(a), -1, -1)) for a, g in zip(fy, style_grams))
        return content + 1e5 * style_loss

    def step() -> float:  # the transformed image is judged against its own content
        return float(train_step(net, opt, perceptual_loss, x, x, autocast_dtype=autocast_dtype,
                                device_type=device.type).detach())

    return step


# Chapter 12's sizes per profile (``run_sizes.pick(**COMPARISON_SIZES)``). The comparisons of its section 5
# rebuild every variant every round, so they run below the blog's sizes at the workshop profile; the full
# profile uses the blog's. BLOG_SIZES: one instance per workload at the blog's own sizes (its section 5.3).
COMPARISON_SIZES: dict[str, dict[str, Any]] = {
    "smoke": dict(cls_batch=2, cls_size=32, unet="tiny", unet_image=32, style_batch=1, style_size=32, steps=1, warmup=0),
    "workshop": dict(cls_batch=8, cls_size=160, unet="narrow", unet_image=256, style_batch=2, style_size=128, steps=2,
                     warmup=1),
    "full": dict(cls_batch=32, cls_size=288, unet="full", unet_image=512, style_batch=4, style_size=256, steps=3,
                 warmup=1),
}
BLOG_SIZES: dict[str, dict[str, Any]] = {
    "smoke": COMPARISON_SIZES["smoke"],
    "workshop": dict(cls_batch=32, cls_size=288, unet="full", unet_image=512, style_batch=4, style_size=256, steps=2,
                     warmup=1),
    "full": dict(cls_batch=32, cls_size=288, unet="full", unet_image=512, style_batch=4, style_size=256, steps=5,
                 warmup=1),
}


def step_builders(sizes: dict[str, Any], device: torch.device | str
                  ) -> tuple[Callable[..., Callable], Callable[..., Callable], Callable[..., Callable]]:
    """The three step builders (classification, UNet, style transfer) at ``sizes`` (a dict of
    ``COMPARISON_SIZES``) on ``device``; each takes the options of its ``*_step`` function
    (``autocast_dtype=``, ``channels_last=``, ``padding=``) and builds a fresh seeded instance."""
    def cls(**options: Any) -> Callable:
        return classification_step(device=device, batch=sizes["cls_batch"], size=sizes["cls_size"], **options)

    def unet(**options: Any) -> Callable:
        return unet_step(sd21_unet(sizes["unet"]), device=device, image_size=sizes["unet_image"], **options)

    def style(**options: Any) -> Callable:
        return style_transfer_step(device=device, batch=sizes["style_batch"], size=sizes["style_size"], **options)

    return cls, unet, style


def variant(build: Callable[..., Callable], *, device: torch.device | str, steps: int, warmup: int,
            **options: Any) -> Callable[[], Any]:
    """A variant for ``measure.interleaved``: ``build(**options)`` afresh at every call (seeded), ``warmup``
    untimed steps, then the median of ``steps`` timed steps (``measure.time_fn``)."""
    from . import measure

    return lambda: measure.time_fn(build(**options), repeats=steps, warmup=warmup, device=device)


# (workload, published experiment, published setups with the Titan RTX, the reference, first)
PUBLISHED_SETUPS = (("resnet18d", "resnet18d_hagrid_train_step", ["titan_rtx_amp", "arc_a770_bf16_ipex_2_3_110"]),
                    ("SD 2.1 UNet", "stable_diffusion_2_1_512",
                     ["titan_rtx_eager", "arc_a770_fp16", "arc_a770_bf16_ipex_2_0_110"]),
                    ("style transfer", "style_transfer_training", ["titan_rtx", "arc_a770"]))


def published_comparison(runs: dict[str, Any], comparable: bool = True, rows: list | None = None
                         ) -> tuple[Any, list[tuple[str, float | None, str]]]:
    """Chapter 12's published-vs-yours table: every published setup and every measured run (``runs``: workload
    name -> ``measure.Result`` named "..., precision") against the published Titan RTX. ``vs Titan RTX`` is
    steps per second over the Titan's, or for style transfer (published as whole runs only) the Titan's run time
    over the run's; the resnet18d rows turn a rate into an estimate of the blog's whole run (``HAGRID``).
    Returns the table and the bars of :func:`plot_published` (label, ratio, colour)."""
    from . import published
    from .tables import Table

    pub = {(r.experiment, r.variant): r for r in (rows if rows is not None else published.load("arc_blog"))}
    table = Table(["workload", "setup", "it/s", "whole run (min)", "vs Titan RTX (x)", "source"],
                  note="published rows carry their source" + ("" if comparable else
                                                              "; this machine at SMOKE SIZES: not comparable"))
    bars: list[tuple[str, float | None, str]] = []
    for name, exp, setups in PUBLISHED_SETUPS:
        titan = pub[(exp, setups[0])]

        def run_min(rate: float | None) -> float | None:
            return HAGRID.estimated_total_s(1 / rate) / 60 if name == "resnet18d" and rate else None

        for r in (pub[(exp, s)] for s in setups):
            rate, ratio = (r.value, r.value / titan.value) if r.unit == "it/s" else (None, titan.value / r.value)
            table.add(name, f"{r.variant} (published)", rate, run_min(rate) if rate else r.value / 60, ratio, r.source)
            bars.append((f"{name}: {r.variant}", ratio, "tab:gray"))
        mine = runs.get(name)
        if mine is not None:
            rate = 1 / mine.stats.median
            ratio = rate / titan.value if titan.unit == "it/s" else None   # style transfer: no step count published
            table.add(name, f"this machine, {mine.name.split(', ')[-1]}", rate, run_min(rate), ratio,
                      "measured here (5.3)")
            if ratio:
                bars.append((f"{name}: this machine", ratio, "tab:blue"))
    return table, bars


def plot_published(bars: list[tuple[str, float | None, str]], comparable: bool = True) -> Any:
    """Horizontal bars of :func:`published_comparison`, on a log axis, the Titan RTX at 1."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 3.5))
    ys = range(len(bars))[::-1]
    ax.barh(ys, [b[1] for b in bars], color=[b[2] for b in bars])
    ax.set_yticks(ys, [b[0] for b in bars])
    ax.axvline(1.0, color="black", lw=1)
    ax.set(xscale="log", xlim=(None, 2), xlabel="speed relative to the published Titan RTX (log scale)",
           title="Published (grey) vs this machine (blue)" + ("" if comparable else ": SMOKE SIZES, not comparable"))
    return fig
