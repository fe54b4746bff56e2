"""What a training step costs: FLOPs counted with torch.utils.flop_counter, the machine's matmul peak, time per phase.

``training_step_flops`` counts the FLOPs of one forward + loss + backward pass;
``matmul_peak`` measures the machine's best matmul throughput in a given math mode (fp32,
TF32, bf16, fp16; ``math_mode`` says which one a step runs in), so a step can be compared
with what the hardware can do in the mode the step ran in; ``phase_times`` times the four
phases of a step (forward, loss, backward, update) separately. The timing itself follows the
course's protocol (``helpers.measure``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

import torch

from . import devices
from .measure import Stats, time_fn
from .step import train_step


def training_step_flops(model: torch.nn.Module, inputs: torch.Tensor, targets: torch.Tensor,
                        loss_fn: Callable) -> int:
    """FLOPs of one forward + loss + backward pass, counted by torch.utils.flop_counter.

    The optimizer update is elementwise and not counted; the model's gradients are cleared.
    """
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with counter:
        loss_fn(model(inputs), targets).backward()
    model.zero_grad(set_to_none=True)
    return int(counter.get_total_flops())


@dataclass(frozen=True)
class MatmulPeak:
    """The best matmul throughput measured on a device in one math mode (``fp32``, ``tf32``,
    ``bf16``, ``fp16``), the denominator of an honest "% of peak"."""

    flops: float
    mode: str
    n: int = 0
    repeats: int = 0

    def __bool__(self) -> bool:
        return self.flops > 0


MATH_MODES: dict[str, torch.dtype] = {"fp32": torch.float32, "tf32": torch.float32, "bf16": torch.bfloat16,
                                      "fp16": torch.float16}


def math_mode(device: torch.device | str, autocast: torch.dtype | None = None) -> str:
    """The math mode a training step runs in: the autocast dtype, else fp32 -- or TF32 on CUDA
    when matmuls or cuDNN convolutions may use it (``torch.backends.cudnn.allow_tf32`` is on by
    default, so an "fp32" CNN step on an NVIDIA GPU mostly runs TF32 convolutions)."""
    if autocast is not None and autocast != torch.float32:
        return {torch.bfloat16: "bf16", torch.float16: "fp16"}.get(autocast, str(autocast).removeprefix("torch."))
    if torch.device(device).type == "cuda" and (torch.backends.cuda.matmul.allow_tf32
                                                 or torch.backends.cudnn.allow_tf32):
        return "tf32"
    return "fp32"


def matmul_peak(device: torch.device | str = "cpu", mode: str = "fp32", n: int | None = None,
                repeats: int = 5) -> MatmulPeak:
    """The best (not median) n x n matmul throughput in ``mode``, in FLOP/s.

    ``tf32`` allows TF32 for the measurement only (the caller's setting is restored); ``fp32``
    forbids it. The default size is large enough to approach a GPU's peak (8192) and quick on
    a CPU (1024)."""
    if mode not in MATH_MODES:
        raise ValueError(f"unknown math mode {mode!r}; use one of {', '.join(MATH_MODES)}")
    device = torch.device(device)
    n = n or (1024 if device.type == "cpu" else 8192)
    before = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = mode == "tf32"
    try:
        dtype = MATH_MODES[mode]
        a = torch.randn(n, n, device=device, dtype=dtype)
        b = torch.randn(n, n, device=device, dtype=dtype)
        res = time_fn(lambda: a @ b, repeats=repeats, warmup=2, device=device)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before
    return MatmulPeak(2 * n**3 / res.stats.minimum, mode, n, repeats)


def phase_times(model: torch.nn.Module, inputs: torch.Tensor, targets: torch.Tensor,
                loss_fn: Callable, optimizer: torch.optim.Optimizer, *, steps: int = 20,
                warmup: int = 3, device: torch.device | str = "cpu") -> dict[str, Stats]:
    """Time the four phases of a training step (forward, loss, backward, update) separately.

    The step is the course's one (``helpers.step.train_step``); the device is synchronized after
    each of its phases, which is what makes the split honest on a GPU (and costs a little
    overall speed: use it to see shares, not the total). Clearing the old gradients counts
    with backward, as chapter 01 times it.
    """
    if steps < 1:
        raise ValueError("steps must be >= 1")
    model.train()
    names = ("forward", "loss", "backward", "update")
    times: dict[str, list[float]] = {k: [] for k in names}
    device = torch.device(device)

    for step in range(warmup + steps):
        clock: dict[str, float] = {}

        def mark(phase: str) -> None:
            devices.synchronize(device)
            clock[phase] = time.perf_counter()

        mark("start")
        train_step(model, optimizer, loss_fn, inputs, targets, device_type=device.type, mark=mark)
        if step >= warmup:
            times["forward"].append(clock["forward"] - clock["zero_grad"])
            times["loss"].append(clock["loss"] - clock["forward"])
            times["backward"].append(clock["backward"] - clock["loss"] + clock["zero_grad"] - clock["start"])
            times["update"].append(clock["update"] - clock["backward"])
    return {k: Stats.of(v) for k, v in times.items()}
