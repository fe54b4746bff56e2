"""The DDP training loop of ``python -m helpers.distributed`` and the collectives it sends.

* Every tensor handed to a collective is made by a function that takes the training device
  and the collectives module (``handshake``, ``sum_across_ranks``, ``replica_fingerprints``,
  ``evaluate_on_all_ranks``), in float32, so a unit test can call them with
  ``torch.device("meta")`` and a recording stand-in and catch a CPU or float64 payload (nccl
  and xccl refuse CPU tensors; Intel Arc has no float64).
* ``train_ddp`` is the training loop: DistributedSampler.set_epoch, DDP, the course's one
  training step (``helpers.step.train_step``), checkpoints in the course's one format
  (``helpers.checkpoints.training_state``: the plain model state_dict without ``module.``,
  optimizer, CPU and accelerator RNG, progress) written by rank 0, which every rank resumes
  from after a restart (``helpers.checkpoints.restore``).
* ``warmup_lr``: with ``--scale-lr`` the learning rate is multiplied by the world size and
  reached by a linear ramp over the first ``--warmup-epochs`` (Goyal et al. 2017, "Accurate,
  Large Minibatch SGD": linear scaling with a gradual warm-up).
* ``evaluate_on_all_ranks`` scores a shard of the test set on every rank and sums the counts,
  so no rank waits in a collective while rank 0 works alone.

The command line, the backend and the process group are ``helpers.distributed``.
"""

from __future__ import annotations

import itertools
import time
from pathlib import Path
from typing import Any, Callable, Sequence

from .ranks import RankInfo

# ----- collectives: every payload made on the training device, in float32 --------------------

def handshake(rank: int, device: Any, comm: Any) -> Any:
    """all_reduce(rank + 1) over the job: proves every rank joined (world 2 gives 3)."""
    import torch

    value = torch.tensor([float(rank + 1)], dtype=torch.float32, device=device)
    comm.all_reduce(value)
    return value


def sum_across_ranks(values: Sequence[float], device: Any, comm: Any) -> Any:
    """Element-wise sum of ``values`` over all ranks (counts, loss sums), as a float32 tensor."""
    import torch

    total = torch.tensor([float(v) for v in values], dtype=torch.float32, device=device)
    comm.all_reduce(total)
    return total


def replica_fingerprints(model: Any, device: Any, comm: Any) -> list[Any]:
    """Every rank's per-parameter float32 sums; DDP replicas must produce identical ones."""
    import torch

    with torch.no_grad():
        mine = torch.stack([p.detach().float().sum() for p in model.parameters()]).to(device)
    gathered = [torch.empty_like(mine) for _ in range(comm.get_world_size())]
    comm.all_gather(gathered, mine)
    return gathered


def wait_for_all(device: Any, comm: Any) -> None:
    """Barrier (no payload); on GPUs name this rank's device so nccl does not guess it."""
    if device.type in ("cuda", "xpu"):
        comm.barrier(device_ids=[device.index])
    else:
        comm.barrier()


# ----- the learning rate ----------------------------------------------------------------------

def warmup_lr(step: int, *, base_lr: float, peak_lr: float, warmup_steps: int) -> float:
    """The learning rate of optimizer step ``step`` (0-based) under a linear warm-up.

    Goyal et al. 2017 ("Accurate, Large Minibatch SGD: Training ImageNet in 1 Hour") scale the
    learning rate with the global batch (``peak_lr = base_lr * k`` for k times the batch) and
    reach it gradually: from ``base_lr`` at step 0, by equal increments, to ``peak_lr`` at step
    ``warmup_steps``, then constant. ``warmup_steps <= 0`` means no warm-up. (The linear rule
    was derived for SGD; for Adam, which this entry point uses, it is a heuristic: Adam's step
    hardly depends on the gradient's scale, and a square-root rule is the one derived for it --
    Malladi et al. 2022, "On the SDEs and Scaling Rules for Adaptive Gradient Algorithms".)
    """
    if step < 0:
        raise ValueError(f"step must be >= 0, got {step}")
    if warmup_steps <= 0 or step >= warmup_steps:
        return float(peak_lr)
    return float(base_lr + (peak_lr - base_lr) * step / warmup_steps)


def set_lr(optimizer: Any, lr: float) -> None:
    """Set the learning rate of every parameter group of ``optimizer``."""
    for group in optimizer.param_groups:
        group["lr"] = lr


# ----- the training loop ----------------------------------------------------------------------

def train_ddp(ddp: Any, loader: Any, optimizer: Any, *, epochs: int, device: Any, progress: dict[str, Any],
              checkpoint: str | Path | None = None, checkpoint_every: int = 0, write: bool = True,
              stop_after: int | None = None, lr_at: Callable[[int], float] | None = None) -> dict[str, Any]:
    """Train the DDP-wrapped model; ``progress`` (from ``fresh_progress`` or ``resume_from``) is
    updated in place and returned. ``write``: this rank writes the checkpoints (rank 0 only).
    ``lr_at(step)``: the learning rate of each optimizer step, counted over the whole run
    (a resumed run continues the schedule where the checkpoint left it)."""
    import torch

    from . import devices
    from .checkpoints import save_checkpoint, training_state
    from .step import train_step
    from .training import StopTraining

    loss_fn = torch.nn.CrossEntropyLoss()
    non_blocking = device.type in ("cuda", "xpu")
    calls = 0

    def save(epoch: int, batch: int) -> None:
        if checkpoint is not None and write:
            save_checkpoint(checkpoint, training_state(ddp, optimizer, {**progress, "epoch": epoch, "batch": batch},
                                                       device=device))

    first = progress["epoch"]
    for epoch in range(first, epochs):
        ddp.train()
        loader.sampler.set_epoch(epoch)  # a new shuffle each epoch, the same split on every rank
        skip = progress["batch"] if epoch == first else 0
        if not skip:
            progress["loss_sum"] = 0.0
        running = torch.zeros((), device=device)
        batch, waited = skip, 0.0
        devices.synchronize(device)
        started = asked = time.perf_counter()
        for inputs, targets in itertools.islice(iter(loader), skip, None):
            waited += time.perf_counter() - asked
            inputs = inputs.to(device, non_blocking=non_blocking)
            targets = targets.to(device, non_blocking=non_blocking)
            if lr_at is not None:
                set_lr(optimizer, lr_at(progress["step"]))
            # DDP all-reduces the gradients during the step's backward pass
            loss = train_step(ddp, optimizer, loss_fn, inputs, targets, device_type=device.type)
            running += loss.detach().float()
            batch += 1
            progress["step"] += 1
            calls += 1
            if checkpoint_every and progress["step"] % checkpoint_every == 0:
                progress["loss_sum"] += float(running)
                running.zero_()
                save(epoch, batch)
            if stop_after is not None and calls >= stop_after:
                raise StopTraining(f"stopped after {calls} steps (epoch {epoch}, batch {batch})")
            asked = time.perf_counter()
        devices.synchronize(device)
        progress["loss_sum"] += float(running)
        progress["epoch_times"].append(time.perf_counter() - started)
        progress["data_wait"].append(waited)
        progress["epoch_losses"].append(progress["loss_sum"] / max(1, batch))
        progress["epoch"], progress["batch"] = epoch + 1, 0
        save(epoch + 1, 0)
    return progress


def evaluate_on_all_ranks(model: Any, test_set: Any, info: RankInfo, device: Any, comm: Any) -> dict[str, Any]:
    """Each rank scores its share of the test set; counts and per-image ``correct`` are summed over ranks."""
    import torch
    from torch.utils.data import DataLoader, Subset

    mine = range(info.rank, len(test_set), info.world_size)
    hits = [0.0] * len(test_set)
    correct = count = 0
    loss = 0.0
    model.eval()
    with torch.no_grad():
        at = 0
        for inputs, targets in DataLoader(Subset(test_set, mine), batch_size=512):
            inputs, targets = inputs.to(device), targets.to(device)
            out = model(inputs)
            loss += float(torch.nn.functional.cross_entropy(out, targets, reduction="sum"))
            right = (out.argmax(1) == targets).tolist()
            for k, ok in enumerate(right):
                hits[mine[at + k]] = float(ok)
            at += len(right)
            correct += sum(right)
            count += len(targets)
    model.train()
    c, n, total, *per_image = sum_across_ranks([correct, count, loss, *hits], device, comm).tolist()
    return {"accuracy": 100.0 * c / max(1.0, n), "loss": total / max(1.0, n), "count": n,
            "correct": [v > 0.5 for v in per_image]}
