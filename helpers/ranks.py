"""Who this process is in a distributed job and which CPUs it gets: torchrun/mpirun/SLURM variables, per-rank pinning.

* ``rank_info()`` reads who this process is from whichever launcher started it -- torchrun
  (RANK / WORLD_SIZE / LOCAL_RANK), Open MPI (OMPI_COMM_WORLD_*), SLURM (SLURM_PROCID ...) --
  and ``export_torch_env`` writes the torch variables, so ``init_process_group`` initialises
  the standard way (``env://``) whoever launched the job. ``node_rank`` says which machine of
  the job this rank runs on.
* ``rank_cpus`` / ``pin_rank`` give each CPU rank whole physical cores of its own: split from
  the CPUs this process may use, offset by the node rank when several simulated nodes share
  one machine (``--nodes-per-host``), and taken as given under SLURM (srun's CPU set).
  ``threads_per_rank`` is the thread count of a rank that is not pinned: the physical cores
  this process may use (its affinity, SMT siblings counted once -- not ``os.cpu_count()``,
  which counts every logical CPU of the machine) shared by the ranks on the machine.

``DistributedSetupError`` (a launch or configuration problem, with what to do about it) lives
here, the lowest layer, so ``helpers.distributed`` and ``helpers.launch`` share one class.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Mapping, Sequence


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


def node_rank(info: RankInfo, env: Mapping[str, str] | None = None) -> int:
    """Which machine ("node") of the job this rank runs on: torchrun's GROUP_RANK, SLURM_NODEID,
    else the global rank divided by the ranks per node."""
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


# ----- CPU pinning ----------------------------------------------------------------------------

def rank_cpus(info: RankInfo, *, allowed: Sequence[int], core_groups: Sequence[Sequence[int]],
              nodes_per_host: int = 1, node: int = 0) -> list[int]:
    """Logical CPUs for this rank: whole physical cores, split from the ``allowed`` CPUs.

    ``core_groups`` lists each physical core's logical CPUs (SMT siblings). The allowed cores
    are split evenly between ``nodes_per_host * local_world_size`` slots; this rank takes slot
    ``node * local_world_size + local_rank`` (on 2 cores with two simulated nodes of one rank:
    node 0 gets core 0, node 1 core 1). Under SLURM the allowed set is srun's choice for this
    task and is returned as it is.
    """
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
    """Threads for each of ``ranks_here`` unpinned ranks sharing this machine: the physical cores
    this process may use (``os.sched_getaffinity``, SMT siblings counted once), divided evenly,
    at least 1. ``os.cpu_count() // ranks`` would count hyper-threads and CPUs outside the
    affinity (a container's or srun's CPU set) and oversubscribe the cores."""
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
