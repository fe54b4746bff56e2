"""Train and evaluate: seeded, shuffled, timed per epoch, resumable.

``train`` runs epochs over a DataLoader with optional autocast, GradScaler and
torch.compile, shows a tqdm.auto progress bar (set ``TQDM_DISABLE=1`` to hide it), and,
given a checkpoint path, writes atomic checkpoints that ``train`` resumes from -- also
in the middle of an epoch, with the same data order, so an interrupted run ends with the
same weights as an uninterrupted one. Ctrl-C (or the notebook's interrupt button)
finishes the current step and saves a checkpoint before stopping.

``run_variant`` applies the measurement protocol to a training run (fresh seeded model
per repeat, first epoch reported apart as warm-up), ``run_in_fresh_process`` runs a
variant in a new Python process (for settings such as OpenMP's that are read only at
start-up), and ``overhead_vs_bare_loop`` checks what this helper costs.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import pickle
import random
import signal
import statistics
import subprocess
import threading
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

import numpy as np
import torch
from torch import nn

from . import devices
from .measure import Result

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


class CheckpointError(RuntimeError):
    """A checkpoint file that cannot be read or does not fit the model."""


class StopTraining(Exception):
    """Raised by a ``stop_after`` hook to simulate an interruption (used by tests)."""


def set_seed(seed: int) -> None:
    """Seed Python, NumPy and torch (all devices)."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


@dataclass
class TrainResult:
    """What a training run did: per-epoch wall times, mean losses, seconds spent waiting for
    the next batch (``data_wait``), optimizer steps and the resume point."""

    epoch_times: list[float] = field(default_factory=list)
    epoch_losses: list[float] = field(default_factory=list)
    data_wait: list[float] = field(default_factory=list)
    steps: int = 0
    resumed_from: tuple[int, int] | None = None

    @property
    def total_time(self) -> float:
        return sum(self.epoch_times)


def save_checkpoint(path: Path | str, state: dict[str, Any]) -> Path:
    """Write ``state`` with torch.save to a temporary file, then rename it over ``path``.

    The rename is atomic, so a crash while writing leaves the previous checkpoint intact.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return path


def load_checkpoint(path: Path | str) -> dict[str, Any]:
    """Load a checkpoint with ``weights_only=True``; a damaged file raises CheckpointError."""
    path = Path(path)
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise
    except (RuntimeError, EOFError, OSError, pickle.UnpicklingError, ValueError) as exc:
        raise CheckpointError(
            f"Checkpoint {path} is damaged or not a checkpoint ({type(exc).__name__}). "
            "Delete it to start training from scratch, or pass another checkpoint path."
        ) from None
    if not isinstance(state, dict) or "model" not in state:
        raise CheckpointError(f"{path} is not a training checkpoint written by helpers.training.")
    return state


def _set_epoch(loader: Iterable, epoch: int, start: int) -> bool:
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


def train(model: nn.Module, loader: Iterable, optimizer: torch.optim.Optimizer, loss_fn: LossFn, *,
          epochs: int, device: torch.device | str = "cpu", autocast_dtype: torch.dtype | None = None,
          grad_scaler: bool = False, compile: bool | str = False, max_steps_per_epoch: int | None = None,
          checkpoint: Path | str | None = None, checkpoint_every: int = 0, resume: bool = True,
          progress: bool = True, stop_after: int | None = None, desc: str = "train",
          write_checkpoints: bool = True) -> TrainResult:
    """Train ``model`` for ``epochs`` epochs and return per-epoch times and losses.

    * ``autocast_dtype``: run forward and loss under ``torch.autocast`` with this dtype;
    * ``grad_scaler``: scale the loss with ``torch.amp.GradScaler`` (fp16 on GPUs);
    * ``compile``: True or a mode name ('default', 'reduce-overhead', 'max-autotune');
    * ``checkpoint``: file to write every ``checkpoint_every`` steps, at every epoch end and
      on Ctrl-C (after the step in flight), and to resume from when it exists and
      ``resume`` is True;
    * ``stop_after``: raise StopTraining after this many steps of this call (for tests);
    * ``write_checkpoints=False``: read the checkpoint but never write it (DDP ranks other
      than 0, which hold identical replicas).
    """
    if epochs < 1:
        raise ValueError("epochs must be >= 1")
    device = torch.device(device)
    model.to(device)
    step_model: nn.Module = model
    if compile:
        mode = None if compile is True or compile == "default" else str(compile)
        step_model = torch.compile(model, mode=mode)
    scaler = torch.amp.GradScaler(device.type) if grad_scaler else None
    result = TrainResult()
    start_epoch, start_batch, global_step = 0, 0, 0
    loss_sum = 0.0

    if checkpoint is not None and resume and Path(checkpoint).exists():
        state = load_checkpoint(checkpoint)
        try:
            model.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optimizer"])
        except (RuntimeError, ValueError, KeyError) as exc:
            raise CheckpointError(
                f"Checkpoint {checkpoint} does not fit this model/optimizer ({exc.__class__.__name__}). "
                "Delete it or use a different checkpoint path."
            ) from None
        if scaler is not None and state.get("scaler"):
            scaler.load_state_dict(state["scaler"])
        torch.set_rng_state(state["rng"])
        start_epoch, start_batch, global_step = state["epoch"], state["batch"], state["step"]
        loss_sum = state.get("loss_sum", 0.0)
        result.epoch_times = list(state.get("epoch_times", []))
        result.epoch_losses = list(state.get("epoch_losses", []))
        result.resumed_from = (start_epoch, start_batch)

    def snapshot(epoch: int, batch: int) -> None:
        if checkpoint is None or not write_checkpoints:
            return
        save_checkpoint(checkpoint, {
            "model": model.state_dict(), "optimizer": optimizer.state_dict(),
            "scaler": scaler.state_dict() if scaler is not None else None,
            "rng": torch.get_rng_state(), "epoch": epoch, "batch": batch, "step": global_step,
            "loss_sum": loss_sum, "epoch_times": result.epoch_times, "epoch_losses": result.epoch_losses,
        })

    try:
        steps_per_epoch = len(loader)  # type: ignore[arg-type]
    except TypeError:
        steps_per_epoch = None
    if max_steps_per_epoch is not None and steps_per_epoch is not None:
        steps_per_epoch = min(steps_per_epoch, max_steps_per_epoch)
    total = steps_per_epoch * epochs if steps_per_epoch is not None else None

    from tqdm.auto import tqdm

    bar_kwargs: dict[str, Any] = {"total": total, "desc": desc, "unit": "step"}
    # tqdm's notebook bar ignores TQDM_DISABLE, so honour it here (CI and committed runs set it)
    if not progress or os.environ.get("TQDM_DISABLE", "").lower() in ("1", "true", "yes"):
        bar_kwargs["disable"] = True
    bar = tqdm(**bar_kwargs)
    bar.update(start_epoch * (steps_per_epoch or 0) + start_batch)
    calls = 0
    epoch, batch = start_epoch, start_batch
    running = torch.zeros((), device=device)
    # Ctrl-C (or Jupyter's interrupt) asks for a stop; the current step finishes, a
    # consistent checkpoint is written, then KeyboardInterrupt is raised. A second Ctrl-C
    # stops at once (the last periodic checkpoint stays valid).
    stop_requested = False

    def on_sigint(signum: int, frame: Any) -> None:
        nonlocal stop_requested
        if stop_requested:
            raise KeyboardInterrupt
        stop_requested = True

    old_handler = None
    if threading.current_thread() is threading.main_thread():
        old_handler = signal.signal(signal.SIGINT, on_sigint)
    use_autocast = autocast_dtype is not None
    non_blocking = device.type in ("cuda", "xpu")
    try:
        for epoch in range(start_epoch, epochs):
            model.train()
            skip = start_batch if epoch == start_epoch else 0
            if skip:
                batch_size = getattr(loader, "batch_size", None) or 1
                iterator: Iterable = (iter(loader) if _set_epoch(loader, epoch, skip * batch_size)
                                      else itertools.islice(iter(loader), skip, None))
            else:
                loss_sum = 0.0
                _set_epoch(loader, epoch, 0)
                iterator = iter(loader)
            devices.synchronize(device)
            started = time.perf_counter()
            running = torch.zeros((), device=device)
            batch = skip
            waited = 0.0
            asked = time.perf_counter()
            for inputs, targets in iterator:
                waited += time.perf_counter() - asked
                if max_steps_per_epoch is not None and batch >= max_steps_per_epoch:
                    break
                inputs = inputs.to(device, non_blocking=non_blocking)
                targets = targets.to(device, non_blocking=non_blocking)
                with torch.autocast(device_type=device.type, dtype=autocast_dtype, enabled=use_autocast):
                    loss = loss_fn(step_model(inputs), targets)
                optimizer.zero_grad(set_to_none=True)
                if scaler is not None:
                    scaler.scale(loss).backward()
                    scaler.step(optimizer)
                    scaler.update()
                else:
                    loss.backward()
                    optimizer.step()
                running += loss.detach().float()
                batch += 1
                global_step += 1
                calls += 1
                bar.update(1)
                if checkpoint_every and global_step % checkpoint_every == 0:
                    loss_sum_now = loss_sum + float(running)
                    loss_sum, running = loss_sum_now, torch.zeros((), device=device)
                    snapshot(epoch, batch)
                if stop_requested:
                    loss_sum, running = loss_sum + float(running), torch.zeros((), device=device)
                    snapshot(epoch, batch)
                    where = f" (checkpoint saved in {checkpoint})" if checkpoint is not None else ""
                    raise KeyboardInterrupt(f"training interrupted at epoch {epoch}, batch {batch}{where}")
                if stop_after is not None and calls >= stop_after:
                    raise StopTraining(f"stopped after {calls} steps (epoch {epoch}, batch {batch})")
                asked = time.perf_counter()
            devices.synchronize(device)
            loss_sum += float(running)
            result.epoch_times.append(time.perf_counter() - started)
            result.data_wait.append(waited)
            result.epoch_losses.append(loss_sum / max(1, batch))
            bar.set_postfix(loss=f"{result.epoch_losses[-1]:.4f}")
            start_batch = 0
            snapshot(epoch + 1, 0)
    finally:
        if old_handler is not None:
            signal.signal(signal.SIGINT, old_handler)
        bar.close()
    result.steps = global_step
    return result


@torch.no_grad()
def evaluate(model: nn.Module, loader: Iterable, loss_fn: LossFn | None = None, *,
             device: torch.device | str = "cpu", autocast_dtype: torch.dtype | None = None) -> dict[str, float]:
    """Accuracy (%) and mean loss of ``model`` on ``loader``, in eval mode without gradients."""
    device = torch.device(device)
    loss_fn = loss_fn or nn.CrossEntropyLoss()
    was_training = model.training
    model.eval()
    correct, count, loss_total = 0, 0, 0.0
    try:
        for inputs, targets in loader:
            inputs, targets = inputs.to(device), targets.to(device)
            with torch.autocast(device_type=device.type, dtype=autocast_dtype, enabled=autocast_dtype is not None):
                out = model(inputs)
                loss_total += float(loss_fn(out.float(), targets)) * len(targets)
            correct += int((out.argmax(1) == targets).sum())
            count += len(targets)
    finally:
        model.train(was_training)
    if count == 0:
        raise ValueError("evaluate() got an empty loader")
    return {"accuracy": 100.0 * correct / count, "loss": loss_total / count}


def run_variant(name: str, build_model: Callable[[], nn.Module], train_loader: Iterable,
                test_loader: Iterable | None, *, epochs: int, repeats: int = 3,
                make_optimizer: Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer] | None = None,
                loss_fn: LossFn | None = None, device: torch.device | str = "cpu", seed: int = 0,
                settings: dict[str, Any] | None = None, **train_kwargs: Any) -> Result:
    """Measure one training variant with the course protocol.

    Every repeat builds a fresh model with the same seed, trains ``epochs`` epochs and
    evaluates it. The first epoch of each repeat is reported as warm-up; the timed sample
    is the median time of the remaining epochs. Metrics: accuracy and loss (median over
    repeats), total training time, optimizer steps and the steady-state seconds per epoch
    spent waiting for data (``data_wait_s``).
    """
    if epochs < 2:
        raise ValueError("run_variant needs epochs >= 2 to keep the first (warm-up) epoch apart")
    if repeats < 1:
        raise ValueError("repeats must be >= 1")
    loss_fn = loss_fn or nn.CrossEntropyLoss()
    make_optimizer = make_optimizer or (lambda params: torch.optim.Adam(params, lr=1e-3))
    samples, warm, accs, losses, totals, waits = [], [], [], [], [], []
    steps = 0
    for r in range(repeats):
        set_seed(seed)
        model = build_model().to(device)
        opt = make_optimizer(model.parameters())
        res = train(model, train_loader, opt, loss_fn, epochs=epochs, device=device,
                    desc=f"{name} {r + 1}/{repeats}", **train_kwargs)
        warm.append(res.epoch_times[0])
        samples.append(statistics.median(res.epoch_times[1:]))
        totals.append(res.total_time)
        waits.append(statistics.median(res.data_wait[1:]))
        steps = res.steps
        if test_loader is not None:
            ev = evaluate(model, test_loader, loss_fn, device=device,
                          autocast_dtype=train_kwargs.get("autocast_dtype"))
            accs.append(ev["accuracy"])
            losses.append(ev["loss"])
        else:
            losses.append(res.epoch_losses[-1])
    metrics = {"total_s": statistics.median(totals), "steps": float(steps),
               "loss": statistics.median(losses), "data_wait_s": statistics.median(waits)}
    if accs:
        metrics["accuracy"] = statistics.median(accs)
    return Result(name=name, samples=samples, warmup=warm, metrics=metrics, settings=dict(settings or {}))


def overhead_vs_bare_loop(model_fn: Callable[[], nn.Module], loader: Iterable, *, epochs: int = 2,
                          repeats: int = 3, device: torch.device | str = "cpu", seed: int = 0) -> dict[str, float]:
    """Time ``train`` against a minimal hand-written loop on the same model and data.

    Returns both medians (seconds per run) and ``ratio`` = helper / bare (1.0 = no overhead).
    Runs alternate between the two so machine noise hits both alike.
    """
    device = torch.device(device)
    loss_fn = nn.CrossEntropyLoss()

    def bare() -> float:
        set_seed(seed)
        model = model_fn().to(device)
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        devices.synchronize(device)
        t = time.perf_counter()
        for epoch in range(epochs):
            _set_epoch(loader, epoch, 0)
            model.train()
            for x, y in loader:
                x, y = x.to(device), y.to(device)
                loss = loss_fn(model(x), y)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
        devices.synchronize(device)
        return time.perf_counter() - t

    def helper() -> float:
        set_seed(seed)
        model = model_fn().to(device)
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        t = time.perf_counter()
        train(model, loader, opt, loss_fn, epochs=epochs, device=device, progress=False)
        return time.perf_counter() - t

    bare(), helper()  # warm-up both
    b, h = [], []
    for _ in range(repeats):
        b.append(bare())
        h.append(helper())
    mb, mh = statistics.median(b), statistics.median(h)
    return {"bare_s": mb, "helper_s": mh, "ratio": mh / mb}


# ----------------------------------------------------------------------------------------
# One training variant in a fresh process: OpenMP and friends read their settings at start.
# ----------------------------------------------------------------------------------------

def _variant_from_args(args: argparse.Namespace) -> dict[str, Any]:
    from . import data, models, system

    if args.threads:
        torch.set_num_threads(args.threads)
    train_ds = data.take(data.load_dataset(args.dataset, train=True), args.train_size, seed=1)
    test_ds = data.take(data.load_dataset(args.dataset, train=False), args.test_size, seed=2)
    train_loader = data.make_loader(train_ds, args.batch_size, train=True, seed=args.seed)
    test_loader = data.make_loader(test_ds, 256, train=False)
    res = run_variant(
        args.name, lambda: models.book_cnn(args.dataset, bias=not args.no_bias), train_loader, test_loader,
        epochs=args.epochs, repeats=args.repeats, seed=args.seed, progress=False,
        make_optimizer=lambda p: torch.optim.Adam(p, lr=args.lr),
    )
    return {
        "result": asdict(res),
        "torch_threads": torch.get_num_threads(),
        "openmp": system.openmp_runtimes(),
        "standin": data.is_standin(train_ds),
    }


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m helpers.training",
                                description="Train the book's CNN once per repeat and print a JSON result.")
    p.add_argument("--name", default="variant")
    p.add_argument("--dataset", default="fashionmnist", choices=["fashionmnist", "cifar10"])
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--train-size", type=int, default=None)
    p.add_argument("--test-size", type=int, default=None)
    p.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0: leave to OpenMP)")
    p.add_argument("--no-bias", action="store_true")
    p.add_argument("--seed", type=int, default=0)
    return p


def run_in_fresh_process(env: dict[str, str] | None = None, timeout: float = 3600, **options: Any) -> dict[str, Any]:
    """Run one variant via ``python -m helpers.training`` in a new process with ``env`` added.

    ``options`` are the command-line options with underscores (``epochs=2``,
    ``batch_size=64``, ``train_size=2000`` ...). Returns the child's JSON: the Result as a
    dict, its torch thread count and the OpenMP runtimes it had loaded.
    """
    argv = [sys.executable, "-m", "helpers.training"]
    known = {a.dest for a in _parser()._actions}
    for key, value in options.items():
        if key not in known:
            raise ValueError(f"unknown option {key!r}; known: {', '.join(sorted(known - {'help'}))}")
        if isinstance(value, bool):
            if value:
                argv.append("--" + key.replace("_", "-"))
        elif value is not None:
            argv += ["--" + key.replace("_", "-"), str(value)]
    child_env = {**os.environ, **(env or {}), "TQDM_DISABLE": "1"}
    proc = subprocess.run(argv, env=child_env, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        tail = "\n".join(proc.stderr.strip().splitlines()[-5:])
        raise RuntimeError(f"the training process failed (exit {proc.returncode}):\n{tail}")
    payload = json.loads(proc.stdout.strip().splitlines()[-1])
    payload["stderr"] = proc.stderr
    return payload


def result_from_payload(payload: dict[str, Any]) -> Result:
    """The measure.Result inside a ``run_in_fresh_process`` payload."""
    r = payload["result"]
    return Result(r["name"], r["samples"], r["warmup"], r["metrics"], r["settings"])


def main(argv: list[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    print(json.dumps(_variant_from_args(args), default=str))


if __name__ == "__main__":
    main()
