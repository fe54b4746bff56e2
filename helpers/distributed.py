"""One DDP training entry point for torchrun, mpirun and sbatch: ``python -m helpers.distributed``.

* ``rank_info()`` reads who this process is from whichever launcher started it -- torchrun
  (RANK / WORLD_SIZE / LOCAL_RANK), Open MPI (OMPI_COMM_WORLD_*), SLURM (SLURM_PROCID ...) --
  and ``export_torch_env`` writes the torch variables so ``init_process_group`` works alike.
* ``choose_backend`` maps the device to gloo (CPU), nccl (CUDA) or xccl (Intel XPU, torch >=
  2.8); ``ccl`` only when the end-of-life oneCCL bindings are importable.
* ``pin_rank`` gives each rank its own whole physical cores, computed from LOCAL_RANK and the
  topology, and as many threads as it has cores.
* ``main`` trains the book's CNN with DistributedSampler (set_epoch), DDP, periodic atomic
  checkpoints written by rank 0 (resumed after a restart), rank-0 evaluation, a check that
  all replicas hold identical weights, and a process-group timeout so a lost rank ends the
  job instead of hanging it.
* ``torchrun_command`` / ``mpirun_command`` / ``run_job`` build and run the launchers.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, Mapping, Sequence

BACKENDS: tuple[str, ...] = ("auto", "gloo", "nccl", "xccl", "ccl", "mpi")
SBATCH_SCRIPT = Path(__file__).resolve().parent / "launchers" / "ddp.sbatch"


class DistributedSetupError(RuntimeError):
    """A launch or configuration problem, with what to do about it."""


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


def _slurm_tasks_on_node(env: Mapping[str, str]) -> int:
    """SLURM_NTASKS_PER_NODE, or this node's entry of SLURM_TASKS_PER_NODE ('2(x3),1')."""
    if "SLURM_NTASKS_PER_NODE" in env:
        return _int(env, "SLURM_NTASKS_PER_NODE")
    spec = env.get("SLURM_TASKS_PER_NODE")
    if not spec:
        return 1
    counts: list[int] = []
    for part in spec.split(","):
        if "(x" in part:
            n, times = part.rstrip(")").split("(x")
            counts += [int(n)] * int(times)
        else:
            counts.append(int(part))
    node = int(env.get("SLURM_NODEID", "0"))
    return counts[node] if node < len(counts) else counts[-1]


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
                        _slurm_tasks_on_node(env), "slurm")
    return RankInfo(0, 1, 0, 1, "single process")


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
    return env


def choose_backend(device_type: str, requested: str = "auto") -> str:
    """The process-group backend for a device: gloo (cpu), nccl (cuda), xccl (xpu)."""
    import torch.distributed as dist

    requested = requested.lower()
    if requested not in BACKENDS:
        raise DistributedSetupError(f"Unknown backend {requested!r}; choose one of {', '.join(BACKENDS)}.")
    if requested == "auto":
        requested = {"cuda": "nccl", "xpu": "xccl"}.get(device_type, "gloo")
    if requested == "nccl" and (device_type != "cuda" or not dist.is_nccl_available()):
        raise DistributedSetupError("The nccl backend needs CUDA GPUs (device 'cuda'); on CPUs use gloo.")
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


def pin_rank(info: RankInfo, threads: int | None = None) -> list[int]:
    """Bind this process to its share of physical cores and use one thread per core of it."""
    import torch

    from . import system

    topo = system.topology()
    try:
        cpus = system.rank_cpus(info.local_rank, info.local_world_size, topo)
    except ValueError as exc:
        raise DistributedSetupError(f"{exc} (or start the job with --no-pin to share the cores)") from None
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, cpus)
    torch.set_num_threads(threads or max(1, len(cpus) // topo.threads_per_core))
    return cpus


def _params_digest(model: Any) -> float:
    import torch

    with torch.no_grad():
        return float(sum((p.double() * (i + 1)).sum() for i, p in enumerate(model.parameters())))


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m helpers.distributed",
                                description="Train the book's CNN with DistributedDataParallel.")
    p.add_argument("--dataset", default="cifar10", choices=["fashionmnist", "cifar10"])
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=64, help="per rank; the global batch is this x world size")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--scale-lr", action="store_true", help="multiply the learning rate by the world size")
    p.add_argument("--train-size", type=int, default=None)
    p.add_argument("--test-size", type=int, default=None)
    p.add_argument("--device", default="cpu")
    p.add_argument("--backend", default="auto", choices=BACKENDS)
    p.add_argument("--threads", type=int, default=0, help="threads per rank (0: one per core of the rank)")
    p.add_argument("--no-pin", action="store_true", help="do not bind ranks to cores")
    p.add_argument("--checkpoint", default=None, help="checkpoint file (rank 0 writes, all ranks resume)")
    p.add_argument("--checkpoint-every", type=int, default=0, help="also checkpoint every N steps")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds before a collective with a lost rank fails")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="rank 0 writes a JSON summary here")
    p.add_argument("--save-weights", default=None, help="rank 0 saves the final state_dict here")
    p.add_argument("--crash-rank", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--crash-at-step", type=int, default=None, help=argparse.SUPPRESS)
    return p


def main(argv: Sequence[str] | None = None) -> dict[str, Any] | None:
    """Entry point of every distributed launch in the course."""
    args = _parser().parse_args(argv)
    info = rank_info()
    export_torch_env(info)
    os.environ.setdefault("TQDM_DISABLE", "1")

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import DataLoader, DistributedSampler

    from . import data, devices, models, training

    device = devices.get_device(args.device)
    if device.type in ("cuda", "xpu"):
        device = torch.device(device.type, info.local_rank)  # one GPU per local rank, never the global rank
        getattr(torch, device.type).set_device(device)
    backend = choose_backend(device.type, args.backend)
    cpus = pin_rank(info, args.threads or None) if (device.type == "cpu" and not args.no_pin) else []
    if args.threads and not cpus:
        torch.set_num_threads(args.threads)

    addr, port = os.environ.get("MASTER_ADDR", "127.0.0.1"), os.environ.get("MASTER_PORT", "29500")
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    try:
        # Under torchrun the agent hosts the key-value store; otherwise (mpirun, srun, by hand) rank 0 does.
        # Keys are prefixed with the restart count: after a restart the ranks must not read the peer
        # addresses that the previous attempt left in the store.
        store = dist.TCPStore(addr, int(port), info.world_size,
                              is_master=info.rank == 0 and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True",
                              timeout=timedelta(seconds=args.timeout))
        dist.init_process_group(backend, store=dist.PrefixStore(f"course/attempt-{restart}", store),
                                rank=info.rank, world_size=info.world_size, timeout=timedelta(seconds=args.timeout))
    except (RuntimeError, ValueError, TimeoutError, dist.DistStoreError) as exc:
        raise DistributedSetupError(
            f"rank {info.rank} could not join the job at {addr}:{port} within {args.timeout:.0f} s "
            f"({type(exc).__name__}). Is rank 0 running, and is that address reachable from here?"
        ) from None
    try:
        demo = torch.tensor([float(info.rank + 1)])
        dist.all_reduce(demo)
        print(f"rank {info.rank}/{info.world_size} (local {info.local_rank}, launcher {info.launcher}, backend "
              f"{backend}, cpus {cpus or 'all'}, threads {torch.get_num_threads()}): all_reduce(rank+1) = "
              f"{demo.item():g}", flush=True)

        train_set = data.take(data.load_dataset(args.dataset, train=True), args.train_size, seed=1)
        sampler = DistributedSampler(train_set, num_replicas=info.world_size, rank=info.rank, shuffle=True,
                                     seed=args.seed)
        loader = DataLoader(train_set, batch_size=args.batch_size, sampler=sampler)
        training.set_seed(args.seed)  # same initial weights everywhere (DDP also broadcasts rank 0's)
        model = models.book_cnn(args.dataset).to(device)
        ddp = DDP(model, device_ids=[device.index] if device.type in ("cuda", "xpu") else None)
        lr = args.lr * (info.world_size if args.scale_lr else 1)
        optimizer = torch.optim.Adam(ddp.parameters(), lr=lr)
        crash = None
        if args.crash_at_step is not None and info.rank == args.crash_rank \
                and os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0":
            crash = args.crash_at_step
        result = training.train(ddp, loader, optimizer, torch.nn.CrossEntropyLoss(), epochs=args.epochs,
                                device=device, checkpoint=args.checkpoint, checkpoint_every=args.checkpoint_every,
                                write_checkpoints=info.rank == 0, progress=False,
                                stop_after=crash, desc=f"rank {info.rank}")
        digest = torch.tensor([_params_digest(model)], dtype=torch.float64)
        digests = [torch.zeros(1, dtype=torch.float64) for _ in range(info.world_size)]
        dist.all_gather(digests, digest)
        identical = all(torch.equal(d, digests[0]) for d in digests)
        summary = None
        if info.rank == 0:
            test_set = data.take(data.load_dataset(args.dataset, train=False), args.test_size, seed=2)
            ev = training.evaluate(model, DataLoader(test_set, batch_size=512), device=device)
            summary = {
                "world_size": info.world_size, "launcher": info.launcher, "backend": backend,
                "threads_per_rank": torch.get_num_threads(), "global_batch": args.batch_size * info.world_size,
                "lr": lr, "epochs": args.epochs, "steps": result.steps, "epoch_times": result.epoch_times,
                "time_s": result.total_time, "accuracy": ev["accuracy"], "replicas_identical": identical,
                "resumed_from": result.resumed_from, "standin": data.is_standin(train_set),
            }
            if args.save_weights:
                training.save_checkpoint(args.save_weights, {"model": model.state_dict()})
            if args.out:
                Path(args.out).parent.mkdir(parents=True, exist_ok=True)
                Path(args.out).write_text(json.dumps(summary, indent=2))
            print(f"rank 0: {result.steps} steps, {result.total_time:.2f} s, accuracy {ev['accuracy']:.2f}%, "
                  f"replicas identical: {identical}", flush=True)
        dist.barrier()
        return summary
    except training.StopTraining:
        print(f"rank {info.rank}: simulated failure -- killing this process", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
        raise  # not reached
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


# ------------------------------------------------------------------------------------------
# Launchers
# ------------------------------------------------------------------------------------------

def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def check_ranks(ranks_per_node: int, device: str = "cpu") -> None:
    """Refuse more CPU ranks than physical cores on this machine, with the numbers."""
    from . import system

    if ranks_per_node < 1:
        raise DistributedSetupError("the number of ranks must be at least 1")
    cores = system.topology().physical_cores
    if device == "cpu" and ranks_per_node > cores:
        raise DistributedSetupError(
            f"{ranks_per_node} ranks requested but this machine has {cores} physical cores: "
            f"use at most {cores} CPU ranks per machine (or pass --no-pin to oversubscribe knowingly)."
        )


def torchrun_command(nproc: int, args: Sequence[str], *, nnodes: int = 1, node_rank: int = 0,
                     master_addr: str = "127.0.0.1", master_port: int | None = None,
                     max_restarts: int = 0, monitor_interval: float = 0.5) -> list[str]:
    """A torchrun command line (static rendezvous at master_addr:master_port) for the entry point."""
    port = master_port or free_port()
    return [sys.executable, "-m", "torch.distributed.run", f"--nnodes={nnodes}", f"--nproc-per-node={nproc}",
            f"--node-rank={node_rank}", f"--master-addr={master_addr}", f"--master-port={port}",
            f"--max-restarts={max_restarts}", f"--monitor-interval={monitor_interval}",
            "-m", "helpers.distributed", *args]


def mpirun_command(np: int, args: Sequence[str], master_port: int | None = None) -> list[str]:
    """An Open MPI command line running the entry point on this machine (gloo for the collectives)."""
    mpirun = shutil.which("mpirun")
    if mpirun is None:
        raise DistributedSetupError("mpirun not found: install Open MPI (Debian/Ubuntu: apt-get install openmpi-bin).")
    extra = ["--allow-run-as-root"] if hasattr(os, "geteuid") and os.geteuid() == 0 else []
    forwarded = [x for var in ("PATH", "COURSE_PROFILE", "COURSE_DATA", "COURSE_DATA_DIR", "OMP_NUM_THREADS")
                 if var in os.environ for x in ("-x", var)]
    # --bind-to none: the entry point pins each rank itself, from its local rank and the topology
    return [mpirun, *extra, "--oversubscribe", "--bind-to", "none", "-np", str(np),
            "-x", "MASTER_ADDR=127.0.0.1", "-x", f"MASTER_PORT={master_port or free_port()}", *forwarded,
            sys.executable, "-m", "helpers.distributed", *args]


@dataclass
class JobResult:
    """A finished launch: exit code, seconds, output and the rank-0 summary (if written)."""

    returncode: int
    seconds: float
    output: str
    summary: dict[str, Any] | None


def run_job(commands: Sequence[Sequence[str]], out: str | Path | None = None, timeout: float = 300,
            env: Mapping[str, str] | None = None) -> JobResult:
    """Start one or more launcher processes (e.g. two torchrun 'nodes'), wait, collect output."""
    child_env = {**os.environ, "TQDM_DISABLE": "1", **(env or {})}
    if out is not None and Path(out).exists():
        Path(out).unlink()
    start = time.perf_counter()
    procs = [subprocess.Popen(list(c), env=child_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for c in commands]
    outputs, code = [], 0
    try:
        for p in procs:
            text, _ = p.communicate(timeout=max(1.0, timeout - (time.perf_counter() - start)))
            outputs.append(text)
            code = code or p.returncode
    except subprocess.TimeoutExpired:
        for p in procs:
            p.kill()
        raise DistributedSetupError(f"the job did not finish within {timeout:.0f} s") from None
    summary = json.loads(Path(out).read_text()) if out is not None and Path(out).exists() else None
    return JobResult(code, time.perf_counter() - start, "\n".join(outputs), summary)


def measure_job(name: str, command: Any, out_dir: str | Path, *, repeats: int = 1, timeout: float = 600,
                env: Mapping[str, str] | None = None) -> "Result":
    """Run a job ``repeats`` times and summarise it with the course protocol.

    ``command(out_path)`` returns the list of launcher command lines of one run. Each run's
    first epoch is its warm-up; its timed sample is the median of the other epochs.
    Metrics: accuracy (median), optimizer steps, world size and global batch of the last run.
    """
    import statistics

    from .measure import Result

    samples, warm, accs = [], [], []
    summary: dict[str, Any] = {}
    for r in range(repeats):
        out = Path(out_dir) / f"{name}-{r}.json"
        job = run_job(command(out), out=out, timeout=timeout, env=env)
        if job.returncode != 0 or job.summary is None:
            raise DistributedSetupError(f"job {name!r} failed (exit {job.returncode}):\n{job.output[-1500:]}")
        summary = job.summary
        times = summary["epoch_times"]
        if len(times) < 2:
            raise DistributedSetupError("measure_job needs --epochs >= 2 to keep the warm-up epoch apart")
        warm.append(times[0])
        samples.append(statistics.median(times[1:]))
        accs.append(summary["accuracy"])
    return Result(name, samples, warm, {"accuracy": statistics.median(accs), "steps": float(summary["steps"]),
                                        "world_size": float(summary["world_size"]),
                                        "global_batch": float(summary["global_batch"])},
                  {"last_output": job.output[-3000:]})


def rank_lines(output: str) -> list[str]:
    """The per-rank report lines of a job's output, sorted by rank (ranks printing at the
    same moment can share a line of the merged output, so they are matched, not split)."""
    import re

    found = re.findall(r"rank \d+/\d+ \(.*?\): all_reduce\(rank\+1\) = [\d.e+]+", output)
    return sorted(found, key=lambda line: int(line.split()[1].split("/")[0]))


if __name__ == "__main__":
    try:
        main()
    except DistributedSetupError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
