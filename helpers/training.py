"""Train and evaluate: ``train`` runs timed epochs through ``step.train_step`` (autocast, GradScaler,
torch.compile as options) with a tqdm bar (``TQDM_DISABLE=1`` hides it), writing checkpoints it resumes from,
mid-epoch too, and saving one on Ctrl-C (docs/running.md); ``evaluate`` scores a model in eval mode."""

from __future__ import annotations

import itertools
import os
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

import torch
from torch import nn

from . import devices
from .checkpoints import fresh_progress, restore, save_checkpoint, training_state
from .step import LossFn, train_step


class StopTraining(Exception):
    """Raised by a ``stop_after`` hook to simulate an interruption (used by tests)."""


@dataclass
class TrainResult:
    """Per-epoch wall times, mean losses and seconds waiting for batches (``data_wait``), steps, the resume point."""

    epoch_times: list[float] = field(default_factory=list)
    epoch_losses: list[float] = field(default_factory=list)
    data_wait: list[float] = field(default_factory=list)
    steps: int = 0
    resumed_from: tuple[int, int] | None = None

    @property
    def total_time(self) -> float:
        return sum(self.epoch_times)


def set_loader_epoch(loader: Iterable, epoch: int, start: int) -> bool:
    """Tell the loader's sampler the epoch; True when it can also skip ``start`` samples."""
    sampler = getattr(loader, "sampler", None)
    if sampler is None or not hasattr(sampler, "set_epoch"):
        return False
    try:
        sampler.set_epoch(epoch, start=start)
        return True
    except TypeError:  # e.g. DistributedSampler: no start argument
        sampler.set_epoch(epoch)
        return False


class _CtrlC:
    """Ctrl-C as a request: ``requested`` turns True (a second Ctrl-C stops at once); off the main thread, nothing."""

    def __init__(self) -> None:
        self.requested = False
        self._old: Any = None

    def _on_sigint(self, signum: int, frame: Any) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True

    def __enter__(self) -> "_CtrlC":
        if threading.current_thread() is threading.main_thread():
            self._old = signal.signal(signal.SIGINT, self._on_sigint)
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._old is not None:
            signal.signal(signal.SIGINT, self._old)


def _progress_bar(loader: Iterable, epochs: int, max_steps_per_epoch: int | None, desc: str, show: bool) -> Any:
    """A tqdm.auto bar over every step of the run."""
    from tqdm.auto import tqdm

    try:
        steps_per_epoch: int | None = len(loader)  # type: ignore[arg-type]
    except TypeError:
        steps_per_epoch = None
    if max_steps_per_epoch is not None and steps_per_epoch is not None:
        steps_per_epoch = min(steps_per_epoch, max_steps_per_epoch)
    total = steps_per_epoch * epochs if steps_per_epoch is not None else None
    # tqdm's notebook bar ignores TQDM_DISABLE, so honour it here (CI and committed runs set it)
    off = not show or os.environ.get("TQDM_DISABLE", "").lower() in ("1", "true", "yes")
    bar = tqdm(total=total, desc=desc, unit="step", disable=off)
    bar.steps_per_epoch = steps_per_epoch or 0
    return bar


def _epoch_batches(loader: Iterable, epoch: int, skip: int) -> Iterable:
    """The batches of ``epoch`` from batch ``skip`` on (the sampler skips ahead, or the batches are drawn and dropped)."""
    if not skip:
        set_loader_epoch(loader, epoch, 0)
        return iter(loader)
    batch_size = getattr(loader, "batch_size", None) or 1
    if set_loader_epoch(loader, epoch, skip * batch_size):
        return iter(loader)
    return itertools.islice(iter(loader), skip, None)


def train(model: nn.Module, loader: Iterable, optimizer: torch.optim.Optimizer, loss_fn: LossFn, *,
          epochs: int, device: torch.device | str = "cpu", autocast_dtype: torch.dtype | None = None,
          grad_scaler: bool = False, compile: bool | str = False, max_steps_per_epoch: int | None = None,
          checkpoint: Path | str | None = None, checkpoint_every: int = 0, resume: bool = True,
          progress: bool = True, stop_after: int | None = None, desc: str = "train",
          write_checkpoints: bool = True) -> TrainResult:
    """Train ``model`` for ``epochs`` epochs and return per-epoch times and losses.

    ``compile``: True or a mode name; ``checkpoint``: written every ``checkpoint_every`` steps, each epoch's end and on
    Ctrl-C, resumed from; ``stop_after``: raise StopTraining after that many steps; ``write_checkpoints=False``: DDP."""
    if epochs < 1:
        raise ValueError("epochs must be >= 1")
    device = torch.device(device)
    model.to(device)
    step_model: nn.Module = model
    if compile:
        step_model = torch.compile(model, mode=None if compile is True or compile == "default" else str(compile))
    scaler = torch.amp.GradScaler(device.type) if grad_scaler else None
    state = fresh_progress()
    result = TrainResult()
    if checkpoint is not None and resume and Path(checkpoint).exists():
        state = restore(checkpoint, model, optimizer, scaler=scaler, device=device)
        result.resumed_from = (state["epoch"], state["batch"])
    # the result's lists are the checkpoint's: resumed epochs included, saved with every snapshot
    result.epoch_times, result.epoch_losses, result.data_wait = state["epoch_times"], state["epoch_losses"], \
        state["data_wait"]

    def snapshot(epoch: int, batch: int) -> None:
        if checkpoint is not None and write_checkpoints:
            save_checkpoint(checkpoint, training_state(model, optimizer, {**state, "epoch": epoch, "batch": batch},
                                                       scaler=scaler, device=device))

    bar = _progress_bar(loader, epochs, max_steps_per_epoch, desc, progress)
    bar.update(state["epoch"] * bar.steps_per_epoch + state["batch"])
    calls = 0
    non_blocking = device.type in ("cuda", "xpu")
    with _CtrlC() as ctrl_c:
        try:
            for epoch in range(state["epoch"], epochs):
                model.train()
                batch = state["batch"] if epoch == state["epoch"] else 0
                if not batch:
                    state["loss_sum"] = 0.0
                batches = _epoch_batches(loader, epoch, batch)
                devices.synchronize(device)
                started = asked = time.perf_counter()
                running = torch.zeros((), device=device)
                waited = 0.0
                for inputs, targets in batches:
                    waited += time.perf_counter() - asked
                    if max_steps_per_epoch is not None and batch >= max_steps_per_epoch:
                        break
                    loss = train_step(step_model, optimizer, loss_fn, inputs.to(device, non_blocking=non_blocking),
                                      targets.to(device, non_blocking=non_blocking), autocast_dtype=autocast_dtype,
                                      scaler=scaler, device_type=device.type)
                    running += loss.detach().float()
                    batch += 1
                    state["step"] += 1
                    calls += 1
                    bar.update(1)
                    if checkpoint_every and state["step"] % checkpoint_every == 0 or ctrl_c.requested:
                        state["loss_sum"] += float(running)
                        running = torch.zeros((), device=device)
                        snapshot(epoch, batch)
                    if ctrl_c.requested:
                        where = f" (checkpoint saved in {checkpoint})" if checkpoint is not None else ""
                        raise KeyboardInterrupt(f"training interrupted at epoch {epoch}, batch {batch}{where}")
                    if stop_after is not None and calls >= stop_after:
                        raise StopTraining(f"stopped after {calls} steps (epoch {epoch}, batch {batch})")
                    asked = time.perf_counter()
                devices.synchronize(device)
                state["loss_sum"] += float(running)
                result.epoch_times.append(time.perf_counter() - started)
                result.data_wait.append(waited)
                result.epoch_losses.append(state["loss_sum"] / max(1, batch))
                bar.set_postfix(loss=f"{result.epoch_losses[-1]:.4f}")
                snapshot(epoch + 1, 0)
        finally:
            bar.close()
    result.steps = state["step"]
    return result


@torch.no_grad()
def evaluate(model: nn.Module, loader: Iterable, loss_fn: LossFn | None = None, *,
             device: torch.device | str = "cpu", autocast_dtype: torch.dtype | None = None) -> dict[str, Any]:
    """Accuracy (%), mean loss and per-image ``correct`` (for ``accuracy.compare``), in eval mode, no gradients."""
    device = torch.device(device)
    loss_fn = loss_fn or nn.CrossEntropyLoss()
    was_training = model.training
    model.eval()
    correct: list[bool] = []
    count, loss_total = 0, 0.0
    try:
        for inputs, targets in loader:
            inputs, targets = inputs.to(device), targets.to(device)
            with torch.autocast(device_type=device.type, dtype=autocast_dtype, enabled=autocast_dtype is not None):
                out = model(inputs)
                loss_total += float(loss_fn(out.float(), targets)) * len(targets)
            correct += (out.argmax(1) == targets).tolist()
            count += len(targets)
    finally:
        model.train(was_training)
    if count == 0:
        raise ValueError("evaluate() got an empty loader")
    return {"accuracy": 100.0 * sum(correct) / count, "loss": loss_total / count, "correct": correct}
