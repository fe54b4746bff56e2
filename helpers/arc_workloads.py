"""Chapter 12: the Intel Arc blog's workloads rebuilt without downloads, and the numerics parity probe.

Each ``*_step`` builds a fresh seeded model (random weights: the time of a step, never accuracy) and returns one
step to time. ``parity_check`` asks whether a device trains the same numbers as the CPU (docs/hardware.md).
"""

from __future__ import annotations

import contextlib
import copy
import math
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Callable

import torch
from torch import nn

from . import devices
from .seeds import set_seed
from .step import train_step

# stabilityai/stable-diffusion-2-1, unet/config.json (the 512 base model has the same architecture)
SD21_UNET_CONFIG: dict[str, Any] = {
    "act_fn": "silu", "attention_head_dim": [5, 10, 20, 20], "block_out_channels": [320, 640, 1280, 1280],
    "center_input_sample": False, "cross_attention_dim": 1024,
    "down_block_types": ["CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "DownBlock2D"],
    "downsample_padding": 1, "dual_cross_attention": False, "flip_sin_to_cos": True, "freq_shift": 0,
    "in_channels": 4, "layers_per_block": 2, "mid_block_scale_factor": 1, "norm_eps": 1e-05, "norm_num_groups": 32,
    "num_class_embeds": None, "only_cross_attention": False, "out_channels": 4, "sample_size": 96,
    "up_block_types": ["UpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D"],
    "upcast_attention": True, "use_linear_projection": True,
}
SD21_UNET_PARAMETERS = 865_910_724

# A miniature of the same architecture for smoke runs (seconds instead of minutes).
TINY_UNET_OVERRIDES: dict[str, Any] = {"block_out_channels": [32, 64, 64, 64], "attention_head_dim": [2, 4, 4, 4],
                                       "cross_attention_dim": 64, "layers_per_block": 1, "norm_num_groups": 16}
# SD 2.1 at 30% of its channel widths (83,397,412 parameters): builds in about a second, ~38 GFLOP a step at 256x256
NARROW_UNET_OVERRIDES: dict[str, Any] = {"block_out_channels": [96, 192, 384, 384], "attention_head_dim": [3, 6, 12, 12]}
UNET_SIZES: dict[str, dict[str, Any]] = {"full": {}, "narrow": NARROW_UNET_OVERRIDES, "tiny": TINY_UNET_OVERRIDES}
# The blog's image-classification run (HaGRID): 3 epochs of 4,324 training steps, batch 32 at 288x288, 19 classes
HAGRID_TRAIN_STEPS = 3 * 4_324


def sd21_unet(size: str = "full", device: torch.device | str | None = None, seed: int = 0) -> nn.Module:
    """The Stable Diffusion 2.1 UNet from its configuration, random weights from ``seed``; ``size``: "full" (as
    published), "narrow" (30% of the widths) or "tiny" (smoke runs); ``device="meta"``: without memory."""
    if size not in UNET_SIZES:
        raise ValueError(f"size must be one of {', '.join(UNET_SIZES)}, not {size!r}")
    from diffusers import UNet2DConditionModel
    with contextlib.nullcontext() if device is None else torch.device(device):
        set_seed(seed)
        return UNet2DConditionModel.from_config(dict(SD21_UNET_CONFIG, **UNET_SIZES[size]))


def unet_step(unet: nn.Module, *, device: torch.device | str, image_size: int = 512,
              autocast_dtype: torch.dtype | None = None) -> Callable[[], None]:
    """One denoising step of ``unet`` (no gradients) at ``image_size`` pixels, batch 2 (one image with
    classifier-free guidance, as the blog's pipeline ran) and 77 text tokens."""
    if image_size % 8:
        raise ValueError("image_size must be a multiple of 8 (the VAE's downsampling factor)")
    device = torch.device(device)
    cfg = unet.config
    gen = torch.Generator().manual_seed(0)
    latent = torch.randn(2, cfg.in_channels, image_size // 8, image_size // 8, generator=gen).to(device)
    text = torch.randn(2, 77, cfg.cross_attention_dim, generator=gen).to(device)
    timestep = torch.tensor([500, 500], device=device)
    unet.to(device).eval()

    @torch.no_grad()
    def step() -> None:
        with torch.autocast(device.type, dtype=autocast_dtype, enabled=autocast_dtype is not None):
            unet(latent, timestep, encoder_hidden_states=text)

    return step


def classification_step(*, device: torch.device | str, batch: int = 32, size: int = 288, num_classes: int = 19,
                        autocast_dtype: torch.dtype | None = None, channels_last: bool = False,
                        seed: int = 0) -> Callable[[], float]:
    """One training step of the blog's classifier (timm ``resnet18d``, AdamW) on a fixed batch: it returns the loss."""
    import timm
    device = torch.device(device)
    set_seed(seed)
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    model = timm.create_model("resnet18d", pretrained=False, num_classes=num_classes).to(device, memory_format=fmt)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, eps=1e-5)
    x = torch.randn(batch, 3, size, size).to(device, memory_format=fmt)
    y = torch.randint(num_classes, (batch,)).to(device)

    def step() -> float:
        return float(train_step(model, opt, nn.functional.cross_entropy, x, y, autocast_dtype=autocast_dtype,
                                device_type=device.type).detach())

    return step


def _conv(cin: int, cout: int, kernel: int, stride: int, padding: str) -> nn.Sequential:
    pad = nn.ReflectionPad2d(kernel // 2) if padding == "reflect" else nn.ZeroPad2d(kernel // 2)
    return nn.Sequential(pad, nn.Conv2d(cin, cout, kernel, stride))


class _Residual(nn.Module):
    def __init__(self, channels: int, padding: str) -> None:
        super().__init__()
        self.body = nn.Sequential(_conv(channels, channels, 3, 1, padding), nn.InstanceNorm2d(channels, affine=True),
                                  nn.ReLU(), _conv(channels, channels, 3, 1, padding),
                                  nn.InstanceNorm2d(channels, affine=True))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.body(x)


def transformer_net(padding: str = "reflect") -> nn.Module:
    """The fast-neural-style transformation network (1,679,235 parameters); ``padding="zero"`` is the blog's Arc
    workaround (reflection padding had no bf16 kernel there)."""
    if padding not in ("reflect", "zero"):
        raise ValueError("padding must be 'reflect' or 'zero'")
    norm = lambda c: nn.InstanceNorm2d(c, affine=True)  # noqa: E731
    return nn.Sequential(
        _conv(3, 32, 9, 1, padding), norm(32), nn.ReLU(),
        _conv(32, 64, 3, 2, padding), norm(64), nn.ReLU(),
        _conv(64, 128, 3, 2, padding), norm(128), nn.ReLU(),
        *[_Residual(128, padding) for _ in range(5)],
        nn.Upsample(scale_factor=2), _conv(128, 64, 3, 1, padding), norm(64), nn.ReLU(),
        nn.Upsample(scale_factor=2), _conv(64, 32, 3, 1, padding), norm(32), nn.ReLU(),
        _conv(32, 3, 9, 1, padding),
    )


def style_transfer_step(*, device: torch.device | str, batch: int = 4, size: int = 256,
                        autocast_dtype: torch.dtype | None = None, padding: str = "reflect",
                        seed: int = 0) -> Callable[[], float]:
    """One training step of fast neural style: content + style (Gram) losses on frozen VGG16 features, Adam."""
    from torchvision.models.vgg import cfgs, make_layers

    device = torch.device(device)
    set_seed(seed)
    net = transformer_net(padding).to(device).train()
    features = make_layers(cfgs["D"])[:23].to(device).eval()  # torchvision's VGG16 up to relu4_3, no classifier
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


# Chapter 12's sizes per profile (``run_sizes.pick(**COMPARISON_SIZES)``); BLOG_SIZES: the blog's own (its 5.3)
_BLOG = dict(cls_batch=32, cls_size=288, unet="full", unet_image=512, style_batch=4, style_size=256, warmup=1)
COMPARISON_SIZES: dict[str, dict[str, Any]] = {
    "smoke": dict(cls_batch=2, cls_size=32, unet="tiny", unet_image=32, style_batch=1, style_size=32, steps=1, warmup=0),
    "workshop": dict(cls_batch=8, cls_size=160, unet="narrow", unet_image=256, style_batch=2, style_size=128, steps=2,
                     warmup=1),
    "full": dict(_BLOG, steps=3),
}
BLOG_SIZES: dict[str, dict[str, Any]] = {"smoke": COMPARISON_SIZES["smoke"], "workshop": dict(_BLOG, steps=2),
                                         "full": dict(_BLOG, steps=5)}


def step_builders(sizes: dict[str, Any], device: torch.device | str
                  ) -> tuple[Callable[..., Callable], Callable[..., Callable], Callable[..., Callable]]:
    """The classification, UNet and style-transfer step builders at ``sizes``: each call builds a fresh seeded step."""
    return (partial(classification_step, device=device, batch=sizes["cls_batch"], size=sizes["cls_size"]),
            lambda **options: unet_step(sd21_unet(sizes["unet"]), device=device, image_size=sizes["unet_image"],
                                        **options),
            partial(style_transfer_step, device=device, batch=sizes["style_batch"], size=sizes["style_size"]))


def variant(build: Callable[..., Callable], *, device: torch.device | str, steps: int, warmup: int,
            **options: Any) -> Callable[[], Any]:
    """A variant for ``measure.interleaved``: ``build(**options)`` afresh per call, the median of ``steps`` timed steps."""
    from . import measure

    return lambda: measure.time_fn(build(**options), repeats=steps, warmup=warmup, device=device)


# (workload, published experiment, published setups with the Titan RTX, the reference, first)
PUBLISHED_SETUPS = (("resnet18d", "resnet18d_hagrid_train_step", ["titan_rtx_amp", "arc_a770_bf16_ipex_2_3_110"]),
                    ("SD 2.1 UNet", "stable_diffusion_2_1_512",
                     ["titan_rtx_eager", "arc_a770_fp16", "arc_a770_bf16_ipex_2_0_110"]),
                    ("style transfer", "style_transfer_training", ["titan_rtx", "arc_a770"]))


def published_comparison(runs: dict[str, Any], comparable: bool = True
                         ) -> tuple[Any, list[tuple[str, float | None, str]]]:
    """Chapter 12's published-vs-yours table against the published Titan RTX (``runs``: workload -> Result named
    "..., precision"; style transfer compares whole-run times), and the bars of ``plot_published``."""
    from . import published
    from .tables import Table

    pub = {(r.experiment, r.variant): r for r in published.load("arc_blog")}
    table = Table(["workload", "setup", "it/s", "whole run (min)", "vs Titan RTX (x)", "source"],
                  note="published rows carry their source" + ("" if comparable else
                                                              "; this machine at SMOKE SIZES: not comparable"))
    bars: list[tuple[str, float | None, str]] = []
    for name, exp, setups in PUBLISHED_SETUPS:
        titan = pub[(exp, setups[0])]

        def run_min(rate: float | None) -> float | None:
            return HAGRID_TRAIN_STEPS / rate / 60 if name == "resnet18d" and rate else None

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


# ----- the numerics parity probe (docs/hardware.md says how the tolerances were measured) -----------------------

PARITY_TOLERANCES: dict[torch.dtype | None, float] = {None: 1e-3, torch.bfloat16: 1.5e-1, torch.float16: 5e-2}
_FLOOR = 1e-3  # a tensor's denominator is at least this fraction of the largest tensor's norm

_DTYPE_NAMES = {None: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}


@dataclass
class ParityResult:
    """What the two runs computed (losses from the CPU's weights) and, per tensor, the largest relative difference
    of gradients and updates over the steps; ``max_rel_diff`` is the largest of all (inf for NaN or inf)."""

    device: str
    max_rel_diff: float
    cpu_losses: list[float]
    device_losses: list[float]
    ok: bool
    tolerance: float
    dtype: str = "fp32"
    grad_diffs: dict[str, float] = field(default_factory=dict)
    update_diffs: dict[str, float] = field(default_factory=dict)

    @property
    def worst(self) -> str:
        """Which tensor differs most, and in what ('' when nothing was compared)."""
        diffs = {**{f"{k} gradient": v for k, v in self.grad_diffs.items()},
                 **{f"{k} update": v for k, v in self.update_diffs.items()}}
        return max(diffs, key=lambda k: diffs[k] if math.isfinite(diffs[k]) else math.inf, default="")

    def summary(self) -> str:
        """One line: device, verdict, the largest difference against the tolerance, where, the losses."""
        verdict = "agrees with the CPU" if self.ok else "DISAGREES with the CPU"
        diff = "NaN/inf" if not math.isfinite(self.max_rel_diff) else f"{self.max_rel_diff:.1e}"
        where = f" ({self.worst})" if self.worst else ""
        losses = ""
        if self.cpu_losses and self.device_losses:
            losses = (f"; loss over {len(self.cpu_losses)} steps (each from the CPU's weights): CPU "
                      f"{self.cpu_losses[0]:.2f} -> {self.cpu_losses[-1]:.2f}, device {self.device_losses[0]:.2f} -> "
                      f"{self.device_losses[-1]:.2f}")
        return (f"{self.device} ({self.dtype}) {verdict}: largest relative difference of gradients and updates "
                f"{diff}{where}, tolerance {self.tolerance:.2g}{losses}")


def probe_model(in_channels: int = 3, num_classes: int = 10) -> nn.Module:
    """The probe model: the kernels a vision training step leans on (convolution, batch norm, pooling, linear)."""
    return nn.Sequential(
        nn.Conv2d(in_channels, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1, bias=False), nn.BatchNorm2d(32), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, num_classes),
    )


def learnable_batch(batch: int, input_shape: tuple[int, ...], num_classes: int,
                    generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """One batch a model learns in a few steps: each class's random pattern and colour, plus unit noise."""
    labels = torch.randint(num_classes, (batch,), generator=generator)
    patterns = torch.randn(num_classes, *input_shape, generator=generator)
    colours = 2.0 * torch.randn(num_classes, input_shape[0], *([1] * (len(input_shape) - 1)), generator=generator)
    return (patterns + colours)[labels] + torch.randn(batch, *input_shape, generator=generator), labels


def relative_differences(reference: dict[str, torch.Tensor], other: dict[str, torch.Tensor]) -> dict[str, float]:
    """Per tensor ``||other - reference|| / max(||reference||, floor * largest ||reference||)``; inf if not finite."""
    if reference.keys() != other.keys():
        raise ValueError(f"different tensors: {sorted(reference)} and {sorted(other)}")
    norms = {k: float(v.double().norm()) for k, v in reference.items()}
    smallest = _FLOOR * max(norms.values(), default=0.0)
    out = {}
    for k, ref in reference.items():
        o = other[k].double()
        if o.shape != ref.shape:
            raise ValueError(f"{k}: shapes {tuple(ref.shape)} and {tuple(o.shape)}")
        finite = bool(torch.isfinite(o).all())
        out[k] = float((o - ref.double()).norm()) / max(norms[k], smallest, 1e-30) if finite else math.inf
    return out


def _weights(model: nn.Module, grads: bool = False) -> dict[str, torch.Tensor]:
    pick = (lambda p: torch.zeros(p.shape) if p.grad is None else p.grad) if grads else (lambda p: p)
    return {k: pick(p).detach().float().cpu().clone() for k, p in model.named_parameters()}


def _parity_step(model: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor,
                 device: torch.device, dtype: torch.dtype | None) -> tuple[float, dict[str, torch.Tensor]]:
    loss_fn = nn.CrossEntropyLoss()
    grads: dict[str, torch.Tensor] = {}

    def mark(phase: str) -> None:
        if phase == "backward":
            grads.update(_weights(model, grads=True))

    loss = train_step(model, opt, lambda out, target: loss_fn(out.float(), target), x, y, autocast_dtype=dtype,
                      device_type=device.type, mark=mark)
    return float(loss.detach().cpu()), grads


def _compare(reference: nn.Module, inputs: torch.Tensor, labels: torch.Tensor, device: torch.device, steps: int,
             dtype: torch.dtype | None, fault: Callable[[nn.Module], object] | None
             ) -> tuple[list[float], list[float], dict[str, float], dict[str, float]]:
    """``reference`` trains on the CPU; before each step its twin takes its weights and optimizer state and makes the
    same step on ``device``: both losses, per tensor the largest difference of gradients and of updates."""
    cpu = torch.device("cpu")
    reference = reference.train()
    twin = copy.deepcopy(reference).to(device).train()
    if fault is not None:
        fault(twin)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9)
    twin_opt = torch.optim.SGD(twin.parameters(), lr=0.1, momentum=0.9)
    x, y = inputs.to(device), labels.to(device)
    cpu_losses, dev_losses = [], []
    grad_diffs: dict[str, float] = {}
    update_diffs: dict[str, float] = {}
    for _ in range(steps):
        twin.load_state_dict(reference.state_dict())
        twin_opt.load_state_dict(copy.deepcopy(ref_opt.state_dict()))   # a copy: the CPU's buffers stay its own
        before = _weights(reference)
        loss, ref_grads = _parity_step(reference, ref_opt, inputs, labels, cpu, None)
        cpu_losses.append(loss)
        loss, twin_grads = _parity_step(twin, twin_opt, x, y, device, dtype)
        dev_losses.append(loss)
        ref_update = {k: w - before[k] for k, w in _weights(reference).items()}
        twin_update = {k: w - before[k] for k, w in _weights(twin).items()}
        for into, new in ((grad_diffs, relative_differences(ref_grads, twin_grads)),
                          (update_diffs, relative_differences(ref_update, twin_update))):
            for k, v in new.items():
                into[k] = max(into.get(k, 0.0), v)
    return cpu_losses, dev_losses, grad_diffs, update_diffs


def parity_check(device: torch.device | str, model_fn: Callable[[], nn.Module] | None = None, steps: int = 5,
                 seed: int = 0, *, batch: int = 16, input_shape: tuple[int, int, int] = (3, 16, 16),
                 num_classes: int = 10, dtype: torch.dtype | str | None = None,
                 fault: Callable[[nn.Module], object] | None = None) -> ParityResult:
    """``steps`` SGD steps on the CPU (fp32), each made again on ``device`` from the same state: the difference.
    ``model_fn()``: a model without dropout (default ``probe_model``); ``dtype``: the device's autocast dtype;
    ``fault(model)``: breaks the device run on purpose (a gradient hook). The caller's RNG state is kept."""
    from .precision import parse_dtype, tf32

    if steps < 1 or batch < 1:
        raise ValueError("steps >= 1 and batch >= 1 are required")
    try:
        dev = devices.get_device(str(device))
    except devices.DeviceError as exc:
        raise ValueError(str(exc)) from None
    autocast = parse_dtype(dtype)
    tol = PARITY_TOLERANCES.get(autocast, PARITY_TOLERANCES[torch.bfloat16])
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        reference = (model_fn or (lambda: probe_model(input_shape[0], num_classes)))()
        inputs, labels = learnable_batch(batch, input_shape, num_classes, torch.Generator().manual_seed(seed))
        # IEEE fp32 on CUDA: TF32 is a chosen rounding, not a fault
        with tf32(False) if dev.type == "cuda" else contextlib.nullcontext():
            cpu_losses, dev_losses, grad_diffs, update_diffs = _compare(reference, inputs, labels, dev, steps, autocast,
                                                                        fault)
        devices.synchronize(dev)
    diff = max([*grad_diffs.values(), *update_diffs.values()], default=0.0)
    if not all(math.isfinite(v) for v in dev_losses):
        diff = math.inf
    return ParityResult(devices.describe(dev), diff, cpu_losses, dev_losses, diff <= tol, tol,
                        _DTYPE_NAMES.get(autocast, str(autocast)), grad_diffs=grad_diffs, update_diffs=update_diffs)


def parity_plot(runs: dict[str, ParityResult], ax: Any = None) -> Any:
    """Bars of each tensor's largest relative difference per run (label -> result), the first run's tolerance dashed."""
    import matplotlib.pyplot as plt

    if not runs:
        raise ValueError("plot needs at least one parity result")
    first = next(iter(runs.values()))
    names = list(first.grad_diffs)
    if ax is None:
        _, ax = plt.subplots(figsize=(8, 3))
    width = 0.8 / len(runs)
    for k, (label, res) in enumerate(runs.items()):
        ax.bar([i + width * k for i in range(len(names))],
               [max(res.grad_diffs.get(n, 0.0), res.update_diffs.get(n, 0.0), 1e-9) for n in names], width, label=label)
    ax.axhline(first.tolerance, ls="--", color="black", label=f"tolerance ({first.dtype})")
    ax.set_xticks([i + width * (len(runs) - 1) / 2 for i in range(len(names))], names, fontsize=8)
    ax.set(yscale="log", ylabel="gradient or update:\nrelative difference",
           title=f"parity: {first.device} ({first.dtype}) vs CPU fp32")
    ax.legend()
    return ax.figure
