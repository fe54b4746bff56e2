"""Numerics parity probe: does a device train the same numbers as the CPU?

A few training steps of one small model, with the same seed, the same initial weights and
the same batches, run once on the CPU (fp32, the reference) and once on the device under
test. The largest relative difference between the two loss curves tells whether the
device's kernels compute what the CPU's do. Rounding (TF32 convolutions on NVIDIA GPUs,
a different summation order) moves losses by about 1e-4 to 1e-3; a broken kernel moves
them by far more, or gives NaN. (One blog's YOLOX model trained on the CPU and silently did
not on an Intel Arc GPU: this probe flags such a device in seconds.)

``check("cuda")`` returns a :class:`ParityResult`; ``check("cpu")`` compares the CPU with
itself (differences 0), which is what the unit tests and machines without accelerators run.
Used by ``helpers.doctor`` (one probe per accelerator) and by chapter 12.
"""

from __future__ import annotations

import copy
import math
import time
from dataclasses import dataclass, field
from typing import Callable

import torch
from torch import nn

from . import devices
from .step import train_step

#: Largest relative loss difference accepted, by the device run's autocast dtype (None = fp32).
#: fp32 allows for TF32 math (on by default for cuDNN convolutions); low precision for its rounding.
TOLERANCES: dict[torch.dtype | None, float] = {None: 1e-2, torch.bfloat16: 5e-2, torch.float16: 5e-2}


@dataclass
class ParityResult:
    """The two loss curves and how far apart they are."""

    device: str
    max_rel_loss_diff: float
    cpu_losses: list[float]
    device_losses: list[float]
    ok: bool
    tolerance: float
    dtype: str = "fp32"
    seconds: float = 0.0
    settings: dict[str, object] = field(default_factory=dict)

    def summary(self) -> str:
        """One line: device, verdict, the difference against the tolerance."""
        verdict = "agrees with the CPU" if self.ok else "DISAGREES with the CPU"
        diff = "NaN/inf" if not math.isfinite(self.max_rel_loss_diff) else f"{self.max_rel_loss_diff:.2e}"
        return (f"{self.device} ({self.dtype}) {verdict}: largest relative loss difference {diff} over "
                f"{len(self.cpu_losses)} steps (tolerance {self.tolerance:.0e})")


def probe_model(in_channels: int = 3, num_classes: int = 10) -> nn.Module:
    """The default probe model: convolutions, batch norm, ReLU, pooling and a linear head --
    the kernels a vision training step leans on -- small enough to run in well under a second."""
    return nn.Sequential(
        nn.Conv2d(in_channels, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, num_classes),
    )


def relative_differences(reference: list[float], other: list[float]) -> list[float]:
    """|other - reference| / max(|reference|, 1e-12) step by step; inf where either is not finite."""
    if len(reference) != len(other):
        raise ValueError(f"loss curves of different lengths ({len(reference)} and {len(other)})")
    out = []
    for a, b in zip(reference, other):
        if not (math.isfinite(a) and math.isfinite(b)):
            out.append(math.inf)
        else:
            out.append(abs(b - a) / max(abs(a), 1e-12))
    return out


def _losses(model: nn.Module, batches: list[tuple[torch.Tensor, torch.Tensor]], device: torch.device,
            lr: float, dtype: torch.dtype | None) -> list[float]:
    """Train ``model`` on ``batches`` (host tensors, copied to ``device``); the loss before each update."""
    model = model.to(device).train()
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    losses = []
    for inputs, labels in batches:
        x, y = inputs.to(device), labels.to(device)
        loss = train_step(model, opt, lambda out, target: loss_fn(out.float(), target), x, y, autocast_dtype=dtype,
                          device_type=device.type)
        losses.append(float(loss.detach().cpu()))
    return losses


def check(device: torch.device | str, model_fn: Callable[[], nn.Module] | None = None, steps: int = 5,
          seed: int = 0, *, batch: int = 16, input_shape: tuple[int, int, int] = (3, 32, 32),
          num_classes: int = 10, lr: float = 0.05, dtype: torch.dtype | str | None = None,
          tolerance: float | None = None) -> ParityResult:
    """Train ``steps`` steps on the CPU (fp32) and on ``device`` from the same weights and batches.

    ``model_fn()`` builds the model (default :func:`probe_model`); it must take
    ``(batch, *input_shape)`` images and return ``num_classes`` logits, and should not use
    dropout (random draws differ between devices). ``dtype`` (``"bf16"``, ``"fp16"`` or a
    torch dtype) runs the device under autocast; the CPU reference stays fp32. The caller's
    random number state is left as it was.
    """
    from .precision import parse_dtype

    if steps < 1 or batch < 1:
        raise ValueError("steps >= 1 and batch >= 1 are required")
    try:
        dev = devices.get_device(str(device))
    except devices.DeviceError as exc:
        raise ValueError(str(exc)) from None
    autocast = parse_dtype(dtype)
    tol = TOLERANCES.get(autocast, 5e-2) if tolerance is None else float(tolerance)
    start = time.perf_counter()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        reference = (model_fn or (lambda: probe_model(input_shape[0], num_classes)))()
        gen = torch.Generator().manual_seed(seed)
        batches = [(torch.randn(batch, *input_shape, generator=gen),
                    torch.randint(num_classes, (batch,), generator=gen)) for _ in range(steps)]
        twin = copy.deepcopy(reference)
        cpu_losses = _losses(reference, batches, torch.device("cpu"), lr, None)
        device_losses = _losses(twin, batches, dev, lr, autocast)
        devices.synchronize(dev)
    diff = max(relative_differences(cpu_losses, device_losses))
    name = {None: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}.get(autocast, str(autocast))
    settings: dict[str, object] = {"steps": steps, "seed": seed, "batch": batch, "input_shape": list(input_shape),
                                   "lr": lr, "optimizer": "SGD momentum 0.9"}
    if dev.type == "cuda":
        settings["tf32_matmul"] = torch.backends.cuda.matmul.allow_tf32
        settings["tf32_cudnn"] = torch.backends.cudnn.allow_tf32
    return ParityResult(device=devices.describe(dev), max_rel_loss_diff=diff, cpu_losses=cpu_losses,
                        device_losses=device_losses, ok=diff <= tol, tolerance=tol, dtype=name,
                        seconds=time.perf_counter() - start, settings=settings)
