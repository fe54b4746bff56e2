"""The course's one training step, ``train_step``: zero_grad, forward, loss (maybe autocast), backward, update."""

from __future__ import annotations

from typing import Callable

import torch

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
PHASES: tuple[str, ...] = ("zero_grad", "forward", "loss", "backward", "update")  # reported to ``mark``, in order


def train_step(model: Callable[..., torch.Tensor], optimizer: torch.optim.Optimizer, loss_fn: LossFn,
               inputs: torch.Tensor | tuple[torch.Tensor, ...], targets: torch.Tensor, *,
               autocast_dtype: torch.dtype | None = None, scaler: torch.amp.GradScaler | None = None,
               device_type: str = "cpu", mark: Callable[[str], None] | None = None) -> torch.Tensor:
    """One training step, returning the loss; ``inputs``: a tensor or a tuple; ``mark(phase)`` after each phase."""
    mark = mark or (lambda phase: None)
    optimizer.zero_grad(set_to_none=True)
    mark("zero_grad")
    args = inputs if isinstance(inputs, tuple) else (inputs,)
    with torch.autocast(device_type=device_type, dtype=autocast_dtype, enabled=autocast_dtype is not None):
        outputs = model(*args)
        mark("forward")
        loss = loss_fn(outputs, targets)
    mark("loss")
    (scaler.scale(loss) if scaler is not None else loss).backward()
    mark("backward")
    if scaler is not None:
        scaler.step(optimizer)
        scaler.update()
    else:
        optimizer.step()
    mark("update")
    return loss
