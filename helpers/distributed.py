"""One DDP training entry point for torchrun, mpirun and sbatch: ``python -m helpers.distributed``.

Who this process is (torchrun, Open MPI or SLURM variables) and which cores it gets; the backend and process
group; the training loop and the collectives it sends (float32, on the training device); one ``error:`` line
from rank 0 for a user error. docs/tools.md (Distributed runs) says why; ``helpers.launch`` starts the jobs.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import signal
import sys
import time
from dataclasses import dataclass
from datetime import timedelta
from functools import partial
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

BACKENDS: tuple[str, ...] = ("auto", "gloo", "nccl", "xccl", "ccl", "mpi")
SBATCH_SCRIPT = Path(__file__).resolve().parent / "launchers" / "ddp.sbatch"
EXIT_SETUP_ERROR = 2
ERROR_LINGER_S = 15.0  # the other ranks wait this long before exiting, so torchrun keeps rank 0's message


class DistributedSetupError(RuntimeError):
    """A launch or configuration problem, with what to do about it."""


class JoinError(DistributedSetupError):
    """This rank could not reach the rendezvous: a local problem, so every rank that has it says so."""


# ----- who this process is ------------------------------------------------------------------

@dataclass(frozen=True)
class RankInfo:
    """Who this process is in the job, and which launcher said so."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    launcher: str


def _int(env: Mapping[str, str], key: str) -> int:
    try:
        return int(env[key])
    except ValueError:
        raise DistributedSetupError(f"{key}={env[key]!r} is not an integer") from None


def rank_info(env: Mapping[str, str] | None = None) -> RankInfo:
    """Rank, world size and local rank from torchrun, Open MPI or SLURM variables (in that order)."""
    env = os.environ if env is None else env
    if "RANK" in env and "WORLD_SIZE" in env:
        world = _int(env, "WORLD_SIZE")
        return RankInfo(_int(env, "RANK"), world, int(env.get("LOCAL_RANK", "0")),
                        int(env.get("LOCAL_WORLD_SIZE", str(world))),
                        "torchrun" if "TORCHELASTIC_RUN_ID" in env else "environment")
    if "OMPI_COMM_WORLD_RANK" in env:
        return RankInfo(_int(env, "OMPI_COMM_WORLD_RANK"), _int(env, "OMPI_COMM_WORLD_SIZE"),
                        _int(env, "OMPI_COMM_WORLD_LOCAL_RANK"),
                        int(env.get("OMPI_COMM_WORLD_LOCAL_SIZE", env["OMPI_COMM_WORLD_SIZE"])), "mpirun")
    if "SLURM_PROCID" in env:
        return RankInfo(_int(env, "SLURM_PROCID"), _int(env, "SLURM_NTASKS"), _int(env, "SLURM_LOCALID"),
                        int(env.get("SLURM_NTASKS_PER_NODE", "1")), "slurm")  # ddp.sbatch's --ntasks-per-node
    return RankInfo(0, 1, 0, 1, "single process")


def node_rank(info: RankInfo, env: Mapping[str, str] | None = None) -> int:
    """This rank's machine in the job: GROUP_RANK (torchrun), SLURM_NODEID, else rank // ranks per node."""
    env = os.environ if env is None else env
    for key in ("GROUP_RANK", "SLURM_NODEID"):
        if key in env:
            return _int(env, key)
    return info.rank // max(1, info.local_world_size)


def export_torch_env(info: RankInfo, env: dict[str, str] | None = None) -> dict[str, str]:
    """Write RANK / WORLD_SIZE / LOCAL_RANK / LOCAL_WORLD_SIZE; check MASTER_ADDR/PORT when needed."""
    env = os.environ if env is None else env
    env.update({"RANK": str(info.rank), "WORLD_SIZE": str(info.world_size),
                "LOCAL_RANK": str(info.local_rank), "LOCAL_WORLD_SIZE": str(info.local_world_size)})
    if info.world_size > 1:
        missing = [k for k in ("MASTER_ADDR", "MASTER_PORT") if not env.get(k)]
        if missing:
            raise DistributedSetupError(
                f"{' and '.join(missing)} not set: with {info.world_size} processes started by "
                f"{info.launcher}, every rank must know where rank 0 listens. "
                "Example: export MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 (use rank 0's host name on a cluster); "
                "torchrun sets them itself."
            )
    else:
        env.setdefault("MASTER_ADDR", "127.0.0.1")
        env.setdefault("MASTER_PORT", "0")  # one process: any free port
    return env


# ----- which cores it gets ------------------------------------------------------------------

def rank_cpus(info: RankInfo, *, allowed: Sequence[int], core_groups: Sequence[Sequence[int]],
              nodes_per_host: int = 1, node: int = 0) -> list[int]:
    """This rank's even share of the whole physical cores (``core_groups``: SMT siblings) in ``allowed``, over the
    ranks of ``nodes_per_host`` simulated nodes; under SLURM ``allowed`` (srun's choice) as it is."""
    allowed_set = set(allowed)
    if info.launcher == "slurm":
        return sorted(allowed_set)
    groups = [[c for c in g if c in allowed_set] for g in core_groups]
    groups = [g for g in groups if g]
    slots = nodes_per_host * info.local_world_size
    slot = (node % nodes_per_host) * info.local_world_size + info.local_rank
    if slots > len(groups):
        raise DistributedSetupError(
            f"{slots} ranks on this machine ({nodes_per_host} node(s) x {info.local_world_size}) but only "
            f"{len(groups)} physical cores available to them: each CPU rank gets whole cores, so start at most "
            f"{len(groups)} ranks here (or pass --no-pin to share cores knowingly)."
        )
    per = len(groups) // slots
    return [c for g in groups[slot * per:(slot + 1) * per] for c in g]


def threads_per_rank(ranks_here: int, topo: Any = None) -> int:
    """Threads for each of ``ranks_here`` unpinned ranks: the physical cores of this process's affinity, shared."""
    from . import system

    if ranks_here < 1:
        raise ValueError(f"ranks_here must be at least 1, got {ranks_here}")
    cores = (topo or system.topology()).physical_cores
    return max(1, cores // ranks_here)


def pin_rank(info: RankInfo, threads: int | None = None, nodes_per_host: int = 1) -> list[int]:
    """Bind this process to its own physical cores and use one thread per core of it."""
    import torch

    from . import system

    topo = system.topology()
    allowed = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else \
        [c for g in topo.smt_siblings() for c in g]
    cpus = rank_cpus(info, allowed=allowed, core_groups=topo.smt_siblings(), nodes_per_host=nodes_per_host,
                     node=node_rank(info))
    if hasattr(os, "sched_setaffinity") and info.launcher != "slurm":
        os.sched_setaffinity(0, cpus)
    cores = sum(1 for g in topo.smt_siblings() if set(g) & set(cpus))
    torch.set_num_threads(threads or max(1, cores))
    return cpus


# ----- backend, device and process group ----------------------------------------------------

def choose_backend(device_type: str, requested: str = "auto") -> str:
    """The process-group backend for a device: gloo (cpu), nccl (cuda), xccl (xpu)."""
    import torch
    import torch.distributed as dist

    from . import devices

    requested = requested.lower()
    if requested not in BACKENDS:
        raise DistributedSetupError(f"Unknown backend {requested!r}; choose one of {', '.join(BACKENDS)}.")
    if requested == "auto":
        requested = {"cuda": "nccl", "xpu": "xccl"}.get(device_type, "gloo")
    if requested == "nccl":
        if device_type != "cuda":
            raise DistributedSetupError("The nccl backend needs CUDA GPUs (device 'cuda'); on CPUs use gloo.")
        if not torch.cuda.is_available() or not dist.is_nccl_available():
            raise DistributedSetupError(f"The nccl backend needs CUDA GPUs, but {devices.cuda_missing_reason()}, "
                                        "or train on --device cpu --backend gloo.")
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
    """The device this rank trains on: ``cuda:<LOCAL_RANK>`` / ``xpu:<LOCAL_RANK>`` (never the global rank) or the CPU."""
    import torch

    from . import devices

    try:
        device = devices.get_device(kind.strip().lower().split(":")[0])
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


def init_process_group(backend: str, info: RankInfo, timeout: timedelta) -> None:
    """``init_process_group`` by env://; under torchrun through the agent's store with a prefix per restart."""
    import torch.distributed as dist

    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT")
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True" or restart is None:
        dist.init_process_group(backend, timeout=timeout)  # env://
        return
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), info.world_size,
                          is_master=False, timeout=timeout)  # restarted ranks meet in a fresh namespace (torch 2.8)
    dist.init_process_group(backend, store=dist.PrefixStore(f"course/attempt-{restart}", store),
                            rank=info.rank, world_size=info.world_size, timeout=timeout)


# ----- collectives: every payload made on the training device, in float32 --------------------

def handshake(rank: int, device: Any, comm: Any) -> Any:
    """all_reduce(rank + 1) over the job: proves every rank joined (world 2 gives 3)."""
    return sum_across_ranks([rank + 1], device, comm)


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


# ----- the training loop --------------------------------------------------------------------

def warmup_lr(step: int, *, base_lr: float, peak_lr: float, warmup_steps: int) -> float:
    """Step ``step``'s learning rate: linear from ``base_lr`` to ``peak_lr`` at ``warmup_steps``, then constant."""
    if warmup_steps <= 0 or step >= warmup_steps:
        return float(peak_lr)
    return float(base_lr + (peak_lr - base_lr) * step / warmup_steps)


def train_ddp(ddp: Any, loader: Any, optimizer: Any, *, epochs: int, device: Any, lr_at: Callable[[int], float],
              progress: dict[str, Any] | None = None,
              after_epoch: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """Train the DDP model on from ``progress`` at ``lr_at(step)``, calling ``after_epoch(progress)``; return it."""
    import torch

    from . import checkpoints, devices
    from .step import train_step

    loss_fn = torch.nn.CrossEntropyLoss()
    non_blocking = device.type in ("cuda", "xpu")
    progress = progress or checkpoints.fresh_progress()
    ddp.train()
    for epoch in range(progress["epoch"], epochs):
        loader.sampler.set_epoch(epoch)  # a new shuffle each epoch, the same split on every rank
        running = torch.zeros((), device=device)
        devices.synchronize(device)
        started = time.perf_counter()
        for inputs, targets in loader:
            for group in optimizer.param_groups:
                group["lr"] = lr_at(progress["step"])
            # DDP all-reduces the gradients during the step's backward pass
            loss = train_step(ddp, optimizer, loss_fn, inputs.to(device, non_blocking=non_blocking),
                              targets.to(device, non_blocking=non_blocking), device_type=device.type)
            running += loss.detach().float()
            progress["step"] += 1
        devices.synchronize(device)
        progress["epoch_times"].append(time.perf_counter() - started)
        progress["epoch_losses"].append(float(running) / max(1, len(loader)))
        progress["epoch"] = epoch + 1
        if after_epoch is not None:
            after_epoch(progress)
    return progress


def evaluate_on_all_ranks(model: Any, test_set: Any, info: RankInfo, device: Any, comm: Any) -> dict[str, Any]:
    """Each rank scores its share of the test set; the per-image ``correct`` flags are summed over ranks."""
    import torch
    from torch.utils.data import DataLoader, Subset

    mine = range(info.rank, len(test_set), info.world_size)
    right: list[bool] = []
    model.eval()
    with torch.no_grad():
        for inputs, targets in DataLoader(Subset(test_set, mine), batch_size=512):
            right += (model(inputs.to(device)).argmax(1) == targets.to(device)).tolist()
    model.train()
    hits = [0.0] * len(test_set)
    hits[info.rank::info.world_size] = map(float, right)  # this rank's share, in test-set order
    correct = [v > 0.5 for v in sum_across_ranks(hits, device, comm).tolist()]
    return {"accuracy": 100.0 * sum(correct) / max(1, len(correct)), "count": len(correct), "correct": correct}


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


def parser() -> argparse.ArgumentParser:
    """The entry point's command line; ``helpers.launch`` reads a job's options with it too."""
    p = _Parser(prog="python -m helpers.distributed", description="Train the book's CNN with DistributedDataParallel.")
    p.add_argument("--dataset", default="cifar10", choices=["fashionmnist", "cifar10"])
    p.add_argument("--backend", default="auto", choices=BACKENDS)
    p.add_argument("--scale-lr", action="store_true", help="multiply the learning rate by the world size (warm-up)")
    p.add_argument("--no-pin", action="store_true", help="do not bind ranks to cores")
    p.add_argument("--seeds", type=int, nargs="+", default=None, metavar="SEED",
                   help="train once per seed in this job, each from scratch; --out holds {'seeds': [summaries]}")
    for flag, kind, default, words in (
            ("--epochs", int, 2, None), ("--batch-size", int, 64, "per rank; the global batch is this x world size"),
            ("--global-batch", int, None, "fix the global batch instead: each rank takes this / world size"),
            ("--lr", float, 1e-3, None), ("--warmup-epochs", float, 1.0, "with --scale-lr: epochs of linear warm-up"),
            ("--train-size", int, None, None), ("--test-size", int, None, None), ("--device", str, "cpu", None),
            ("--threads", int, 0, "threads per rank (0: one per core of the rank)"),
            ("--nodes-per-host", int, 1, "simulated nodes sharing this machine (they split its cores)"),
            ("--timeout", float, 300.0, "seconds a collective waits for a lost rank before the job fails"),
            ("--checkpoint", str, None, "checkpoint file: rank 0 writes it after each epoch, every rank resumes from it"),
            ("--crash-rank", int, None, argparse.SUPPRESS),  # the restart test: this rank dies after epoch 1, once
            ("--seed", int, 0, None), ("--out", str, None, "rank 0 writes a JSON summary here")):
        p.add_argument(flag, type=kind, default=default, help=words)
    return p


def run(args: argparse.Namespace, info: RankInfo) -> dict[str, Any] | None:
    """The DDP job itself (``main`` without the error handling)."""
    import torch
    import torch.distributed as dist

    from . import data, files

    # Everything a user can get wrong is checked before the ranks wait for each other.
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
    if args.seeds is not None and args.checkpoint:  # argparse already refuses an empty --seeds
        raise DistributedSetupError("--seeds trains one model per seed and --checkpoint holds one: use --seed with it")
    if args.global_batch is not None and args.global_batch % info.world_size:
        raise DistributedSetupError(f"--global-batch {args.global_batch} does not split evenly over "
                                    f"{info.world_size} ranks.")
    batch_size = args.batch_size if args.global_batch is None else args.global_batch // info.world_size
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
        runs = [_train_one(args, seed, info, device, backend, cpus, batch_size, train_set, test_set)
                for seed in args.seeds or [args.seed]]
        summary = runs[0] if args.seeds is None or info.rank != 0 else {"seeds": runs}
        if summary is not None and args.out:
            files.atomic_write_text(args.out, json.dumps(summary, indent=2))
        wait_for_all(device, dist)
        return summary
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

    sampler = DistributedSampler(train_set, num_replicas=info.world_size, rank=info.rank, shuffle=True, seed=seed)
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

    def after_epoch(done: dict[str, Any]) -> None:
        if args.checkpoint:
            if info.rank == 0:
                checkpoints.save_checkpoint(args.checkpoint, checkpoints.training_state(ddp, optimizer, done,
                                                                                        device=device))
            wait_for_all(device, dist)  # the file is complete before any rank goes on (or dies)
        if info.rank == args.crash_rank and done["epoch"] == 1 and os.environ.get("TORCHELASTIC_RESTART_COUNT") == "0":
            print(f"rank {info.rank}: simulated failure after epoch 1 -- killing this process", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)

    progress = train_ddp(ddp, loader, optimizer, epochs=args.epochs, device=device, lr_at=lr_at, progress=progress,
                         after_epoch=after_epoch)
    prints = replica_fingerprints(model, device, dist)
    identical = all(torch.equal(p, prints[0]) for p in prints)
    ev = evaluate_on_all_ranks(model, test_set, info, device, dist)
    summary = None
    if info.rank == 0:
        summary = {"world_size": info.world_size, "launcher": info.launcher, "backend": backend, "device": str(device),
                   "threads_per_rank": torch.get_num_threads(), "cpus": cpus, "seed": seed, "lr": lr,
                   "global_batch": batch_size * info.world_size, "warmup_steps": warmup_steps, "steps": progress["step"],
                   **{k: progress[k] for k in ("epoch_times", "epoch_losses", "resumed_from")},
                   "accuracy": ev["accuracy"], "test_count": ev["count"], "correct": ev["correct"],
                   "replicas_identical": identical, "standin": data.is_standin(train_set)}
        print(f"rank 0: {progress['step']} steps, {sum(progress['epoch_times']):.2f} s, accuracy "
              f"{ev['accuracy']:.2f}%, replicas identical: {identical}" + (f" (seed {seed})" if args.seeds else ""),
              flush=True)
    del ddp  # free the reducer while the group lives: its destructor could deadlock with gloo's thread (torch 2.8)
    gc.collect()
    wait_for_all(device, dist)
    return summary


def main(argv: Sequence[str] | None = None) -> dict[str, Any] | None:
    """Every distributed launch's entry point: a user error prints ``error: ...`` once (rank 0) and exits 2."""
    from . import checkpoints, data, devices, run_sizes

    try:
        info = rank_info()
    except DistributedSetupError as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        sys.exit(EXIT_SETUP_ERROR)
    args = parser().parse_args(argv)
    os.environ.setdefault("TQDM_DISABLE", "1")
    try:
        export_torch_env(info)
        return run(args, info)
    except (DistributedSetupError, data.DatasetUnavailableError, devices.DeviceError, checkpoints.CheckpointError,
            run_sizes.ProfileError) as exc:
        if info.rank == 0 or isinstance(exc, JoinError):
            print(f"error: {exc}", file=sys.stderr, flush=True)
        else:
            print(f"rank {info.rank}: stopped ({type(exc).__name__}; rank 0 prints the message)",
                  file=sys.stderr, flush=True)
            time.sleep(ERROR_LINGER_S)
        sys.exit(EXIT_SETUP_ERROR)


if __name__ == "__main__":
    from .processes import die_with_parent, import_frozen

    die_with_parent()  # a rank stops when its torchrun agent or mpirun dies, even by SIGKILL
    import_frozen("torch")  # a rank starts sooner (see helpers.processes)
    main()
    gc.freeze()  # the exit skips the collection over every object left
