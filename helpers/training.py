"""``train`` (timed epochs through ``train_step``, checkpoints resumed mid-epoch, docs/running.md) and ``evaluate``."""

from __future__ import annotations

import contextlib
import itertools
import math
import operator
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Iterable, Iterator

import torch
from torch import nn

from . import devices, run_sizes
from .checkpoints import fresh_progress, restore, save_checkpoint, training_state
from .step import LossFn, train_step


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


@contextlib.contextmanager
def _ctrl_c() -> Iterator[SimpleNamespace]:
    """Ctrl-C as a request: ``requested`` turns True (a second Ctrl-C stops at once); off the main thread, nothing."""
    asked = SimpleNamespace(requested=False)

    def on_sigint(signum: int, frame: Any) -> None:
        if asked.requested:
            raise KeyboardInterrupt
        asked.requested = True

    main = threading.current_thread() is threading.main_thread()
    old = signal.signal(signal.SIGINT, on_sigint) if main else None
    try:
        yield asked
    finally:
        if old is not None:
            signal.signal(signal.SIGINT, old)


def _progress_bar(loader: Iterable, epochs: int, max_steps_per_epoch: int | None, desc: str, show: bool) -> Any:
    """A tqdm.auto bar over every step of the run."""
    from tqdm.auto import tqdm

    limit = math.inf if max_steps_per_epoch is None else max_steps_per_epoch
    steps_per_epoch = min(operator.length_hint(loader), limit)  # 0: not known
    bar = tqdm(total=steps_per_epoch * epochs or None, desc=desc, unit="step", disable=run_sizes.bars_off(show))
    bar.steps_per_epoch = steps_per_epoch
    return bar


def _epoch_batches(loader: Iterable, epoch: int, skip: int) -> Iterable:
    """The batches of ``epoch`` from batch ``skip`` on (the sampler skips ahead, or batches are drawn and dropped)."""
    batch_size = getattr(loader, "batch_size", None) or 1
    if set_loader_epoch(loader, epoch, skip * batch_size) or not skip:
        return iter(loader)
    return itertools.islice(iter(loader), skip, None)


def train(model: nn.Module, loader: Iterable, optimizer: torch.optim.Optimizer, loss_fn: LossFn, *,
          epochs: int, device: torch.device | str = "cpu", autocast_dtype: torch.dtype | None = None,
          grad_scaler: bool = False, compile: bool | str = False, max_steps_per_epoch: int | None = None,
          checkpoint: Path | str | None = None, checkpoint_every: int = 0,
          progress: bool = True, desc: str = "train") -> TrainResult:
    """Train ``model`` for ``epochs`` epochs; ``compile``: True or a mode name; ``checkpoint``: written every
    ``checkpoint_every`` steps, at each epoch's end and on Ctrl-C, and resumed from."""
    if epochs < 1:
        raise ValueError("epochs must be >= 1")
    device = torch.device(device)
    model.to(device)
    mode = None if compile is True or compile == "default" else str(compile)
    step_model: nn.Module = torch.compile(model, mode=mode) if compile else model
    scaler = torch.amp.GradScaler(device.type) if grad_scaler else None
    resumed = checkpoint is not None and Path(checkpoint).exists()
    state = restore(checkpoint, model, optimizer, scaler=scaler, device=device) if resumed else fresh_progress()
    # the result's lists are the checkpoint's: resumed epochs included, saved with every snapshot
    result = TrainResult(state["epoch_times"], state["epoch_losses"], state["data_wait"],
                         resumed_from=(state["epoch"], state["batch"]) if resumed else None)

    def snapshot(epoch: int, batch: int) -> None:
        if checkpoint is not None:
            save_checkpoint(checkpoint, training_state(model, optimizer, {**state, "epoch": epoch, "batch": batch},
                                                       scaler=scaler, device=device))

    bar = _progress_bar(loader, epochs, max_steps_per_epoch, desc, progress)
    bar.update(state["epoch"] * bar.steps_per_epoch + state["batch"])
    non_blocking = device.type in ("cuda", "xpu")
    with _ctrl_c() as ctrl_c:
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
                    bar.update(1)
                    if checkpoint_every and state["step"] % checkpoint_every == 0 or ctrl_c.requested:
                        state["loss_sum"] += float(running)
                        running = torch.zeros((), device=device)
                        snapshot(epoch, batch)
                    if ctrl_c.requested:
                        where = f" (checkpoint saved in {checkpoint})" if checkpoint is not None else ""
                        raise KeyboardInterrupt(f"training interrupted at epoch {epoch}, batch {batch}{where}")
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
    loss_total = 0.0
    try:
        for inputs, targets in loader:
            inputs, targets = inputs.to(device), targets.to(device)
            with torch.autocast(device_type=device.type, dtype=autocast_dtype, enabled=autocast_dtype is not None):
                out = model(inputs)
                loss_total += float(loss_fn(out.float(), targets)) * len(targets)
            correct += (out.argmax(1) == targets).tolist()
    finally:
        model.train(was_training)
    if not correct:
        raise ValueError("evaluate() got an empty loader")
    return {"accuracy": 100.0 * sum(correct) / len(correct), "loss": loss_total / len(correct), "correct": correct}
