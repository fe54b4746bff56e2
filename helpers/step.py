"""The course's one training step, ``train_step``: clear gradients, forward and loss (optionally under autocast),
backward, update. Every loop steps through it (``training.train``, the DDP loop, the tuner's trials, the bench,
the compile timing, ``diagnose.phase_times``); chapter 01 writes the same step out in plain PyTorch."""

from __future__ import annotations

from typing import Callable

import torch

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
PHASES: tuple[str, ...] = ("zero_grad", "forward", "loss", "backward", "update")
"""The phases ``train_step`` reports to ``mark``, in order."""


def train_step(model: Callable[..., torch.Tensor], optimizer: torch.optim.Optimizer, loss_fn: LossFn,
               inputs: torch.Tensor | tuple[torch.Tensor, ...], targets: torch.Tensor, *,
               autocast_dtype: torch.dtype | None = None, scaler: torch.amp.GradScaler | None = None,
               device_type: str = "cpu", mark: Callable[[str], None] | None = None) -> torch.Tensor:
    """One training step (autocast when ``autocast_dtype`` is given, the update through ``scaler``); returns the loss.

    ``inputs``: a tensor, or a tuple passed as ``model(*inputs)``; ``mark(phase)`` is called after each of ``PHASES``
    (so a caller can time them)."""
    optimizer.zero_grad(set_to_none=True)
    if mark is not None:
        mark("zero_grad")
    args = inputs if isinstance(inputs, tuple) else (inputs,)
    with torch.autocast(device_type=device_type, dtype=autocast_dtype, enabled=autocast_dtype is not None):
        outputs = model(*args)
        if mark is not None:
            mark("forward")
        loss = loss_fn(outputs, targets)
    if mark is not None:
        mark("loss")
    (scaler.scale(loss) if scaler is not None else loss).backward()
    if mark is not None:
        mark("backward")
    if scaler is not None:
        scaler.step(optimizer)
        scaler.update()
    else:
        optimizer.step()
    if mark is not None:
        mark("update")
    return loss
