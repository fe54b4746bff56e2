"""Numerics parity probe: does a device train the same numbers as the CPU?

One small model, the same initial weights and one fixed *learnable* batch (each class has its
own colour and pattern under the noise), trained ``steps`` steps of SGD with momentum on the CPU
in fp32: the reference, whose loss falls clearly (about 2.3 to 1.2 in 5 steps with the
defaults). Before each step the device under test takes the reference's weights and optimizer
state and makes the same step, so its differences cannot compound from step to step and the
comparison can be tight. Per tensor, the largest over the steps of two relative differences:

* the **gradients** (same weights, same batch: only the device's forward and backward kernels
  can make them differ);
* the **update** (weights after the step minus before): what the optimizer made of them.

A relative difference is ``||device - cpu|| / ||cpu||`` (norms over the tensor), the denominator
never below a thousandth of the largest tensor's norm, so a gradient that should be zero is not
divided by its own rounding noise. The probe's figure, ``max_rel_diff``, is the largest over all
tensors; NaN or inf counts as infinitely different. (One blog's YOLOX model trained on the CPU
and silently did not on an Intel Arc GPU: this probe flags such a device in seconds. Losses
alone do not: on random labels every loss sits near ln 10 whatever the backward pass computes.)

Tolerances (:data:`TOLERANCES`), by the autocast dtype of the device run (the CPU stays fp32).
The figures quoted were measured on the CPU over seeds 0-19 at 5 and 8 steps:

* **fp32: 1e-3.** Two correct fp32 implementations differ only in rounding and summation
  order: recomputing convolutions, matrix products, batch norm and sums in float64 (rounded
  back) moved the figure by at most 1.2e-5, so 1e-3 leaves a margin of about 80 and still flags
  a gradient off by 0.1% in any tensor. On CUDA the probe turns TF32 off for its run
  (``precision.tf32(False)``): emulated TF32 rounding moved the figure by up to 2e-2, and TF32
  is a chosen rounding, not a fault.
* **bf16: 1.5e-1.** 8 bits of precision (rounding error up to 2**-9 = 2e-3 per value): bf16
  autocast on the CPU gave up to 5e-2 (median 3e-2), largest in a batch-norm bias gradient (a
  sum over the batch that mostly cancels); the tolerance allows 3 times that for other
  devices' kernels and still flags a gradient off by 15%.
* **fp16: 5e-2.** 11 bits (5e-4 per value): fp16 autocast on the CPU gave up to 2.1e-2. The
  probe's values stay far inside fp16's range, so it needs no loss scaling.

Why SGD: Adam divides each gradient by its own running size, so a gradient scaled by a constant
gives almost the same update and the fault would hide; SGD's update is proportional to the
gradient.

``check("cuda")`` returns a :class:`ParityResult`; ``check("cpu")`` compares the CPU with
itself (differences 0), which is what the unit tests and machines without accelerators run.
``fault=`` breaks the device run on purpose (a gradient hook that scales or perturbs one
tensor's gradient) to show that the probe flags it. Used by ``helpers.doctor`` (one probe per
accelerator) and by chapter 12.
"""

from __future__ import annotations

import contextlib
import copy
import math
import time
from dataclasses import dataclass, field
from typing import Callable

import torch
from torch import nn

from . import devices
from .step import train_step

#: Largest relative difference of gradients or updates accepted, by the device run's autocast
#: dtype (None = fp32). The module docstring says where each number comes from.
TOLERANCES: dict[torch.dtype | None, float] = {None: 1e-3, torch.bfloat16: 1.5e-1, torch.float16: 5e-2}

#: A tensor's denominator is at least this fraction of the largest tensor's norm.
FLOOR = 1e-3

_DTYPE_NAMES = {None: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}


@dataclass
class ParityResult:
    """What the two runs computed, and how far apart their gradients and updates are.

    ``cpu_losses`` / ``device_losses``: each step's loss, both computed from the CPU run's weights
    (the device starts every step from them), so a wrong gradient need not show in them.
    ``grad_diffs`` / ``update_diffs``: per parameter tensor, the largest relative difference over
    the steps; ``max_rel_diff`` is the largest of all (inf for NaN or inf on the device).
    """

    device: str
    max_rel_diff: float
    cpu_losses: list[float]
    device_losses: list[float]
    ok: bool
    tolerance: float
    dtype: str = "fp32"
    seconds: float = 0.0
    settings: dict[str, object] = field(default_factory=dict)
    grad_diffs: dict[str, float] = field(default_factory=dict)
    update_diffs: dict[str, float] = field(default_factory=dict)

    @property
    def worst(self) -> str:
        """Which tensor differs most, and in what ('' when nothing was compared)."""
        cands = [(v, f"{k} gradient") for k, v in self.grad_diffs.items()]
        cands += [(v, f"{k} update") for k, v in self.update_diffs.items()]
        if not cands:
            return ""
        return max(cands, key=lambda c: math.inf if not math.isfinite(c[0]) else c[0])[1]

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
    """The default probe model: convolutions, batch norm, ReLU, pooling and a linear head --
    the kernels a vision training step leans on -- small enough to run in well under a second.
    The convolutions have no bias: the batch norm after each would cancel it."""
    return nn.Sequential(
        nn.Conv2d(in_channels, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1, bias=False), nn.BatchNorm2d(32), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, num_classes),
    )


def learnable_batch(batch: int, input_shape: tuple[int, ...], num_classes: int,
                    generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """One batch a model learns in a few steps: each class has a fixed random pattern plus a random
    colour (an offset per channel, twice the noise's size, which survives global pooling); an
    image is its class's pattern and colour plus unit noise."""
    labels = torch.randint(num_classes, (batch,), generator=generator)
    patterns = torch.randn(num_classes, *input_shape, generator=generator)
    colours = 2.0 * torch.randn(num_classes, input_shape[0], *([1] * (len(input_shape) - 1)), generator=generator)
    return (patterns + colours)[labels] + torch.randn(batch, *input_shape, generator=generator), labels


def relative_differences(reference: dict[str, torch.Tensor], other: dict[str, torch.Tensor],
                         floor: float = FLOOR) -> dict[str, float]:
    """Per tensor ``||other - reference|| / max(||reference||, floor * largest ||reference||)``;
    inf where ``other`` is not finite."""
    if reference.keys() != other.keys():
        raise ValueError(f"different tensors: {sorted(reference)} and {sorted(other)}")
    norms = {k: float(v.double().norm()) for k, v in reference.items()}
    smallest = floor * max(norms.values(), default=0.0)
    out = {}
    for k, ref in reference.items():
        o = other[k].double()
        if o.shape != ref.shape:
            raise ValueError(f"{k}: shapes {tuple(ref.shape)} and {tuple(o.shape)}")
        if not bool(torch.isfinite(o).all()):
            out[k] = math.inf
        else:
            out[k] = float((o - ref.double()).norm()) / max(norms[k], smallest, 1e-30)
    return out


def _grads(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: torch.zeros(p.shape) if p.grad is None else p.grad.detach().float().cpu().clone()
            for k, p in model.named_parameters()}


def _weights(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: p.detach().float().cpu().clone() for k, p in model.named_parameters()}


def _step(model: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor, device: torch.device,
          dtype: torch.dtype | None) -> tuple[float, dict[str, torch.Tensor]]:
    """One course training step; returns the loss and the gradients it stepped with."""
    loss_fn = nn.CrossEntropyLoss()
    grads: dict[str, torch.Tensor] = {}

    def mark(phase: str) -> None:
        if phase == "backward":
            grads.update(_grads(model))

    loss = train_step(model, opt, lambda out, target: loss_fn(out.float(), target), x, y, autocast_dtype=dtype,
                      device_type=device.type, mark=mark)
    return float(loss.detach().cpu()), grads


def _compare(reference: nn.Module, twin: nn.Module, inputs: torch.Tensor, labels: torch.Tensor, device: torch.device,
             steps: int, lr: float, dtype: torch.dtype | None, fault: Callable[[nn.Module], object] | None
             ) -> tuple[list[float], list[float], dict[str, float], dict[str, float]]:
    """Train ``reference`` on the CPU; before each step, ``twin`` on ``device`` takes the reference's
    weights and optimizer state and makes the same step. Losses of both, and per tensor the largest
    relative difference over the steps of the gradients and of the updates."""
    cpu = torch.device("cpu")
    reference = reference.train()
    twin = twin.to(device).train()
    if fault is not None:
        fault(twin)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=lr, momentum=0.9)
    twin_opt = torch.optim.SGD(twin.parameters(), lr=lr, momentum=0.9)
    x, y = inputs.to(device), labels.to(device)
    cpu_losses, dev_losses = [], []
    grad_diffs: dict[str, float] = {}
    update_diffs: dict[str, float] = {}
    for _ in range(steps):
        twin.load_state_dict(reference.state_dict())
        twin_opt.load_state_dict(copy.deepcopy(ref_opt.state_dict()))   # a copy: the CPU's buffers stay its own
        before = _weights(reference)
        loss, ref_grads = _step(reference, ref_opt, inputs, labels, cpu, None)
        cpu_losses.append(loss)
        loss, twin_grads = _step(twin, twin_opt, x, y, device, dtype)
        dev_losses.append(loss)
        ref_update = {k: w - before[k] for k, w in _weights(reference).items()}
        twin_update = {k: w - before[k] for k, w in _weights(twin).items()}
        for into, new in ((grad_diffs, relative_differences(ref_grads, twin_grads)),
                          (update_diffs, relative_differences(ref_update, twin_update))):
            for k, v in new.items():
                into[k] = max(into.get(k, 0.0), v)
    return cpu_losses, dev_losses, grad_diffs, update_diffs


def check(device: torch.device | str, model_fn: Callable[[], nn.Module] | None = None, steps: int = 5,
          seed: int = 0, *, batch: int = 16, input_shape: tuple[int, int, int] = (3, 16, 16),
          num_classes: int = 10, lr: float = 0.1, dtype: torch.dtype | str | None = None,
          tolerance: float | None = None, fault: Callable[[nn.Module], object] | None = None) -> ParityResult:
    """Train ``steps`` steps on the CPU (fp32); at each, the device makes the same step from the same
    weights and optimizer state; compare gradients and updates tensor by tensor.

    ``model_fn()`` builds the model (default :func:`probe_model`); it must take
    ``(batch, *input_shape)`` images and return ``num_classes`` logits, and should not use
    dropout (random draws differ between devices). ``dtype`` (``"bf16"``, ``"fp16"`` or a
    torch dtype) runs the device under autocast; the CPU reference stays fp32. ``tolerance``
    overrides :data:`TOLERANCES`. ``fault(model)``, when given, is called on the device run's
    model before it trains (after it is moved to the device): the unit tests register a
    gradient hook there to break the backward pass on purpose. The caller's random number
    state is left as it was.
    """
    from .precision import parse_dtype, tf32, tf32_defaults

    if steps < 1 or batch < 1:
        raise ValueError("steps >= 1 and batch >= 1 are required")
    try:
        dev = devices.get_device(str(device))
    except devices.DeviceError as exc:
        raise ValueError(str(exc)) from None
    autocast = parse_dtype(dtype)
    tol = TOLERANCES.get(autocast, TOLERANCES[torch.bfloat16]) if tolerance is None else float(tolerance)
    start = time.perf_counter()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        reference = (model_fn or (lambda: probe_model(input_shape[0], num_classes)))()
        twin = copy.deepcopy(reference)
        inputs, labels = learnable_batch(batch, input_shape, num_classes, torch.Generator().manual_seed(seed))
        # IEEE fp32 on CUDA: TF32 is a chosen rounding, not a fault
        with tf32(False) if dev.type == "cuda" else contextlib.nullcontext():
            cpu_losses, dev_losses, grad_diffs, update_diffs = _compare(reference, twin, inputs, labels, dev, steps,
                                                                        lr, autocast, fault)
        devices.synchronize(dev)
    diff = max([*grad_diffs.values(), *update_diffs.values()], default=0.0)
    if not all(math.isfinite(v) for v in dev_losses):
        diff = math.inf
    settings: dict[str, object] = {"steps": steps, "seed": seed, "batch": batch, "input_shape": list(input_shape),
                                   "lr": lr, "optimizer": "SGD momentum 0.9", "fault injected": fault is not None}
    if dev.type == "cuda":
        settings["tf32 outside the probe"] = tf32_defaults()
    return ParityResult(device=devices.describe(dev), max_rel_diff=diff, cpu_losses=cpu_losses,
                        device_losses=dev_losses, ok=diff <= tol, tolerance=tol,
                        dtype=_DTYPE_NAMES.get(autocast, str(autocast)), seconds=time.perf_counter() - start,
                        settings=settings, grad_diffs=grad_diffs, update_diffs=update_diffs)


def plot(runs: dict[str, ParityResult], ax=None):
    """Bars of every tensor's largest relative difference (gradient or update) per run (label -> result, the
    first taken as the honest one), on a log axis, with the first run's tolerance as a dashed line."""
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
