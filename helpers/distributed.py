"""One DDP training entry point for torchrun, mpirun and sbatch: ``python -m helpers.distributed``.

This module is the command line, the backend and process-group setup, and the error handling:

* ``choose_backend`` maps the device to gloo (CPU), nccl (CUDA) or xccl (Intel XPU, torch >=
  2.8); ``ccl`` only when the end-of-life oneCCL bindings are importable. ``training_device``
  gives each GPU rank the device numbered by its local rank.
* ``init_process_group`` initialises the standard way (``env://``), under torchrun through a
  store prefix per restart.
* ``run`` is the job: pin, load the data, join, train (``helpers.ddp_training``), check the
  replicas, evaluate on every rank, write the summary. With ``--seeds`` it trains once per seed,
  each run from scratch, and the job's start-up is paid once for all of them.
* ``main`` turns errors a user can cause (offline data, bad options, too many ranks) into one
  ``error:`` message from rank 0 and exit status 2, instead of a traceback per rank.

Who this process is and which CPUs it gets (``rank_info``, ``export_torch_env``, ``rank_cpus``,
``pin_rank``, ``threads_per_rank``) is ``helpers.ranks``; the training loop and the collectives'
payloads (``train_ddp``, ``handshake``, ...) are ``helpers.ddp_training``; its checkpoints
(``training_state``, ``restore``) the course's one format in ``helpers.checkpoints``. The
names the chapters call through this module (``rank_info``,
``node_rank``, ``rank_cpus``, ``pin_rank``, ``threads_per_rank``, ``RankInfo``, ``handshake``,
``DistributedSetupError``) are imported here as well. Building and running launch commands
is ``helpers.launch``.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import signal
import sys
import time
from datetime import timedelta
from functools import partial
from pathlib import Path
from typing import Any, Sequence

from .ddp_training import evaluate_on_all_ranks, handshake, replica_fingerprints, train_ddp, wait_for_all, warmup_lr
from .ranks import (  # noqa: F401  (node_rank, rank_cpus: re-exported, chapters 10-11 call them from here)
    DistributedSetupError,
    RankInfo,
    export_torch_env,
    node_rank,
    pin_rank,
    rank_cpus,
    rank_info,
    threads_per_rank,
)

BACKENDS: tuple[str, ...] = ("auto", "gloo", "nccl", "xccl", "ccl", "mpi")
SBATCH_SCRIPT = Path(__file__).resolve().parent / "launchers" / "ddp.sbatch"
EXIT_SETUP_ERROR = 2
# On a user error every rank stops, but only rank 0 prints the message. torchrun stops all workers
# as soon as one exits with an error, so the other ranks wait this long first: otherwise a rank
# that got there sooner (rank 0 still importing torch, or still trying a download) would take the
# message down.
ERROR_LINGER_S = 15.0  # free when rank 0 is on time: torchrun stops the others once it exits


class JoinError(DistributedSetupError):
    """This rank could not reach the rendezvous: a local problem, so every rank that has it says so."""


def cuda_missing_message() -> str:
    """Why ``cuda`` cannot be used here, worded for the installed build, with the CPU fallback."""
    from . import devices

    return devices.cuda_missing_reason() + ", or train on --device cpu --backend gloo."


def choose_backend(device_type: str, requested: str = "auto") -> str:
    """The process-group backend for a device: gloo (cpu), nccl (cuda), xccl (xpu)."""
    import torch
    import torch.distributed as dist

    requested = requested.lower()
    if requested not in BACKENDS:
        raise DistributedSetupError(f"Unknown backend {requested!r}; choose one of {', '.join(BACKENDS)}.")
    if requested == "auto":
        requested = {"cuda": "nccl", "xpu": "xccl"}.get(device_type, "gloo")
    if requested == "nccl":
        if device_type != "cuda":
            raise DistributedSetupError("The nccl backend needs CUDA GPUs (device 'cuda'); on CPUs use gloo.")
        if not torch.cuda.is_available() or not dist.is_nccl_available():
            raise DistributedSetupError("The nccl backend needs CUDA GPUs, but " + cuda_missing_message())
    if requested == "xccl":
        available = getattr(dist, "is_xccl_available", lambda: False)()
        if device_type != "xpu" or not available:
            raise DistributedSetupError("The xccl backend needs Intel GPUs (device 'xpu') and a PyTorch >= 2.8 XPU build.")
    if requested == "ccl":
        try:
            import oneccl_bindings_for_pytorch  # noqa: F401
        except ImportError:
            raise DistributedSetupError(
                "The ccl backend needs Intel's oneCCL bindings (oneccl_bind_pt), which are end-of-life and not "
                "on PyPI. Use gloo on CPUs, or xccl (built into PyTorch >= 2.8) on Intel GPUs."
            ) from None
    if requested == "mpi" and not dist.is_mpi_available():
        raise DistributedSetupError("This PyTorch build has no MPI backend (it needs a source build); use gloo. "
                                    "mpirun can still launch a gloo job: ranks come from OMPI_COMM_WORLD_*.")
    if requested == "gloo" and device_type not in ("cpu", "cuda"):
        raise DistributedSetupError(f"gloo cannot communicate {device_type} tensors; use the device's own backend.")
    return requested


def training_device(kind: str, info: RankInfo) -> Any:
    """The device this rank trains on: ``cuda:<LOCAL_RANK>`` / ``xpu:<LOCAL_RANK>`` (one GPU per
    process, numbered by its rank on this machine, never the global rank) or the CPU."""
    import torch

    from . import devices

    kind = kind.strip().lower().split(":")[0]
    if kind == "cuda" and not torch.cuda.is_available():
        raise DistributedSetupError("--device cuda: " + cuda_missing_message())
    try:
        device = devices.get_device(kind)
    except devices.DeviceError as exc:
        raise DistributedSetupError(str(exc)) from None
    if device.type in ("cuda", "xpu"):
        count = getattr(torch, device.type).device_count()
        if info.local_rank >= count:
            raise DistributedSetupError(f"local rank {info.local_rank} needs {device.type}:{info.local_rank}, but this "
                                        f"machine has {count} {device.type} device(s): start at most {count} "
                                        "processes per machine (--nproc-per-node).")
        device = torch.device(device.type, info.local_rank)
        getattr(torch, device.type).set_device(device)
    return device


# ----- command line ---------------------------------------------------------------------------

class _Parser(argparse.ArgumentParser):
    """argparse that prints a usage error from rank 0 only (every rank parses the same line)."""

    def error(self, message: str) -> Any:  # type: ignore[override]
        try:
            first = rank_info().rank == 0
        except DistributedSetupError:
            first = True
        if first:
            self.print_usage(sys.stderr)
            print(f"error: {message}", file=sys.stderr, flush=True)
        sys.exit(EXIT_SETUP_ERROR)


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="python -m helpers.distributed",
                description="Train the book's CNN with DistributedDataParallel.")
    p.add_argument("--dataset", default="cifar10", choices=["fashionmnist", "cifar10"])
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=64, help="per rank; the global batch is this x world size")
    p.add_argument("--global-batch", type=int, default=None,
                   help="fix the global batch instead: each rank takes this / world size (same steps for any size)")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--scale-lr", action="store_true",
                   help="multiply the learning rate by the world size, reached by a linear warm-up")
    p.add_argument("--warmup-epochs", type=float, default=1.0,
                   help="with --scale-lr: epochs over which the learning rate rises linearly from --lr to "
                        "--lr x world size (Goyal et al. 2017); 0: no warm-up")
    p.add_argument("--train-size", type=int, default=None)
    p.add_argument("--test-size", type=int, default=None)
    p.add_argument("--device", default="cpu")
    p.add_argument("--backend", default="auto", choices=BACKENDS)
    p.add_argument("--threads", type=int, default=0, help="threads per rank (0: one per core of the rank)")
    p.add_argument("--no-pin", action="store_true", help="do not bind ranks to cores")
    p.add_argument("--nodes-per-host", type=int, default=1,
                   help="simulated nodes sharing this machine: split its cores between them by node rank")
    p.add_argument("--checkpoint", default=None, help="checkpoint file (rank 0 writes, all ranks resume)")
    p.add_argument("--checkpoint-every", type=int, default=0, help="also checkpoint every N steps")
    p.add_argument("--timeout", type=float, default=300.0,
                   help="seconds a collective waits for a lost rank before the job fails")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--seeds", type=int, nargs="+", default=None, metavar="SEED",
                   help="train once per seed, one after another in this job, each from scratch (model, "
                        "optimizer, sampler), as one job per seed would; --out then holds {'seeds': [one "
                        "summary per seed]}. Saves a job's start-up per extra seed")
    p.add_argument("--out", default=None, help="rank 0 writes a JSON summary here")
    p.add_argument("--save-weights", default=None, help="rank 0 saves the final state_dict here")
    p.add_argument("--crash-rank", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--crash-at-step", type=int, default=None, help=argparse.SUPPRESS)
    return p


def init_process_group(backend: str, info: RankInfo, timeout: timedelta) -> None:
    """``init_process_group`` the standard way (env://: RANK, WORLD_SIZE, MASTER_ADDR/PORT from the
    launcher), with one documented exception.

    Under torchrun with a static rendezvous (``--master-addr/--master-port``, as in this course),
    the agent keeps one key-value store for the whole job, restarts included (torch 2.8's
    static_tcp_rendezvous reuses it). A restarted rank would then read the peer addresses the
    failed attempt left there and hang or fail to connect. So under torchrun the ranks use the
    agent's store through a prefix named after the restart count -- exactly env:// otherwise.
    """
    import torch.distributed as dist

    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT")
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True" or restart is None:
        dist.init_process_group(backend, timeout=timeout)  # env://
        return
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), info.world_size,
                          is_master=False, timeout=timeout)
    dist.init_process_group(backend, store=dist.PrefixStore(f"course/attempt-{restart}", store),
                            rank=info.rank, world_size=info.world_size, timeout=timeout)


def _per_rank_batch(args: argparse.Namespace, world: int) -> int:
    if args.global_batch is None:
        return args.batch_size
    if args.global_batch % world:
        raise DistributedSetupError(f"--global-batch {args.global_batch} does not split evenly over {world} ranks.")
    return args.global_batch // world


def run(args: argparse.Namespace, info: RankInfo) -> dict[str, Any] | None:
    """The DDP job itself (``main`` without the error handling)."""
    import torch
    import torch.distributed as dist

    from . import data, training

    # Everything a user can get wrong is checked before the ranks wait for each other.
    one_model = [o for o, v in (("--checkpoint", args.checkpoint), ("--save-weights", args.save_weights),
                                ("--crash-at-step", args.crash_at_step)) if v is not None]
    if args.seeds is not None and one_model:  # argparse already refuses an empty --seeds
        raise DistributedSetupError(f"--seeds trains one model per seed, and {', '.join(one_model)} "
                                    "holds one model: use --seed with it")
    device = training_device(args.device, info)
    backend = choose_backend(device.type, args.backend)
    cpus = pin_rank(info, args.threads or None, args.nodes_per_host) \
        if device.type == "cpu" and not args.no_pin else []
    if args.threads and not cpus:
        torch.set_num_threads(args.threads)
    elif device.type == "cpu" and not cpus:  # unpinned CPU ranks share the cores instead of each taking all
        torch.set_num_threads(threads_per_rank(info.local_world_size * max(1, args.nodes_per_host)))
    if args.warmup_epochs < 0:
        raise DistributedSetupError(f"--warmup-epochs must be >= 0, got {args.warmup_epochs}")
    batch_size = _per_rank_batch(args, info.world_size)
    train_set = data.take(data.load_dataset(args.dataset, train=True), args.train_size, seed=1)
    test_set = data.take(data.load_dataset(args.dataset, train=False), args.test_size, seed=2)

    try:
        init_process_group(backend, info, timedelta(seconds=args.timeout))
    except (RuntimeError, ValueError, TimeoutError, dist.DistStoreError) as exc:
        raise JoinError(
            f"rank {info.rank} could not join the job at {os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']} "
            f"within {args.timeout:.0f} s ({type(exc).__name__}). Is rank 0 running, and is that address "
            "reachable from here?") from None
    try:
        demo = handshake(info.rank, device, dist)
        print(f"rank {info.rank}/{info.world_size} (local {info.local_rank}, launcher {info.launcher}, backend "
              f"{backend}, device {device}, cpus {cpus or 'all'}, threads {torch.get_num_threads()}): "
              f"all_reduce(rank+1) = {demo.item():g}", flush=True)
        if args.seeds is None:
            summary = _train_one(args, args.seed, info, device, backend, cpus, batch_size, train_set, test_set)
        else:
            runs = [_train_one(args, seed, info, device, backend, cpus, batch_size, train_set, test_set)
                    for seed in args.seeds]
            summary = {"seeds": runs} if info.rank == 0 else None
        if summary is not None and args.out:
            from .files import atomic_write_text

            atomic_write_text(args.out, json.dumps(summary, indent=2))
        wait_for_all(device, dist)
        return summary
    except training.StopTraining:
        print(f"rank {info.rank}: simulated failure -- killing this process", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
        raise  # not reached
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _train_one(args: argparse.Namespace, seed: int, info: RankInfo, device: Any, backend: str, cpus: list[int],
               batch_size: int, train_set: Any, test_set: Any) -> dict[str, Any] | None:
    """One training run from scratch with ``seed``: rank 0's summary (None on the other ranks)."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data import DataLoader, DistributedSampler

    from . import checkpoints, data, models, seeds

    sampler = DistributedSampler(train_set, num_replicas=info.world_size, rank=info.rank, shuffle=True,
                                 seed=seed)
    loader = DataLoader(train_set, batch_size=batch_size, sampler=sampler)
    seeds.set_seed(seed)  # same initial weights everywhere (DDP also broadcasts rank 0's)
    model = models.book_cnn(args.dataset).to(device)
    lr = args.lr * (info.world_size if args.scale_lr else 1)
    warmup_steps = round(args.warmup_epochs * len(loader)) if args.scale_lr and lr != args.lr else 0
    lr_at = partial(warmup_lr, base_lr=args.lr, peak_lr=lr, warmup_steps=warmup_steps)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr_at(0))
    progress = checkpoints.fresh_progress()
    if args.checkpoint and Path(args.checkpoint).exists():
        progress = checkpoints.restore(args.checkpoint, model, optimizer, device=device)
    ddp = DistributedDataParallel(model, device_ids=[device.index] if device.type in ("cuda", "xpu") else None)
    crash = None
    if args.crash_at_step is not None and info.rank == args.crash_rank \
            and os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0":
        crash = args.crash_at_step
    progress = train_ddp(ddp, loader, optimizer, epochs=args.epochs, device=device, progress=progress,
                         checkpoint=args.checkpoint, checkpoint_every=args.checkpoint_every,
                         write=info.rank == 0, stop_after=crash, lr_at=lr_at)
    prints = replica_fingerprints(model, device, dist)
    identical = all(torch.equal(p, prints[0]) for p in prints)
    ev = evaluate_on_all_ranks(model, test_set, info, device, dist)
    summary = None
    if info.rank == 0:
        summary = {
            "world_size": info.world_size, "launcher": info.launcher, "backend": backend,
            "device": str(device), "threads_per_rank": torch.get_num_threads(), "cpus": cpus,
            "batch_per_rank": batch_size, "global_batch": batch_size * info.world_size,
            "lr": lr, "base_lr": args.lr, "warmup_steps": warmup_steps, "epochs": args.epochs, "steps": progress["step"], "epoch_times": progress["epoch_times"],
            "epoch_losses": progress["epoch_losses"], "data_wait": progress["data_wait"],
            "time_s": sum(progress["epoch_times"]), "accuracy": ev["accuracy"], "test_count": ev["count"],
            "correct": ev["correct"],
            "replicas_identical": identical, "resumed_from": progress["resumed_from"],
            "standin": data.is_standin(train_set), "seed": seed,
        }
        if args.save_weights:
            checkpoints.save_checkpoint(args.save_weights, {"model": model.state_dict()})
        print(f"rank 0: {progress['step']} steps, {summary['time_s']:.2f} s, accuracy {ev['accuracy']:.2f}%, "
              f"replicas identical: {identical}" + (f" (seed {seed})" if args.seeds else ""), flush=True)
    # Free DDP's reducer while the process group is still registered: when the reducer held the
    # group's last reference, its destructor could deadlock with gloo's worker thread at exit
    # (seen with torch 2.8). Then the ranks leave this run together.
    del ddp
    gc.collect()
    wait_for_all(device, dist)
    return summary


def user_errors() -> tuple[type[BaseException], ...]:
    """Exceptions that mean 'fix your input or setup', reported as one message, not a traceback."""
    from . import checkpoints, data, devices, run_sizes

    return (DistributedSetupError, data.DatasetUnavailableError, devices.DeviceError,
            checkpoints.CheckpointError, run_sizes.ProfileError)


def main(argv: Sequence[str] | None = None) -> dict[str, Any] | None:
    """Entry point of every distributed launch in the course.

    A user error prints ``error: <message>`` once (rank 0; other ranks one short line) and
    exits with status 2 instead of a traceback per rank.
    """
    try:
        info = rank_info()
    except DistributedSetupError as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        sys.exit(EXIT_SETUP_ERROR)
    args = _parser().parse_args(argv)
    os.environ.setdefault("TQDM_DISABLE", "1")
    try:
        export_torch_env(info)
        return run(args, info)
    except user_errors() as exc:
        if info.rank == 0 or isinstance(exc, JoinError):
            print(f"error: {exc}", file=sys.stderr, flush=True)
        else:
            print(f"rank {info.rank}: stopped ({type(exc).__name__}; rank 0 prints the message)",
                  file=sys.stderr, flush=True)
            time.sleep(ERROR_LINGER_S)
        sys.exit(EXIT_SETUP_ERROR)


if __name__ == "__main__":
    from .orphans import die_with_parent
    from .startup import exit_without_collection, import_frozen

    die_with_parent()  # a rank stops when its torchrun agent or mpirun dies, even by SIGKILL
    import_frozen("torch")  # a rank starts sooner (see helpers.startup)
    main()
    exit_without_collection()
