"""helpers.ranks: rank, world size and local rank from torchrun, Open MPI and SLURM variables, the
torch variables written for env://, and per-rank CPU pinning (whole physical cores, SLURM's CPU set)."""

import pytest
import torch

from helpers import ranks as R
from helpers import system


# ----- rank mapping ---------------------------------------------------------------------------

def test_torchrun_variables():
    info = R.rank_info({"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
                        "TORCHELASTIC_RUN_ID": "x"})
    assert info == R.RankInfo(3, 4, 1, 2, "torchrun")
    assert R.node_rank(info, {"GROUP_RANK": "1"}) == 1 and R.node_rank(info, {}) == 1


def test_open_mpi_variables():
    info = R.rank_info({"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2",
                        "OMPI_COMM_WORLD_LOCAL_RANK": "1", "OMPI_COMM_WORLD_LOCAL_SIZE": "2"})
    assert info == R.RankInfo(1, 2, 1, 2, "mpirun")


@pytest.mark.parametrize("env,expected", [
    ({"SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1", "SLURM_NTASKS_PER_NODE": "4"}, (5, 8, 1, 4)),
    ({"SLURM_PROCID": "4", "SLURM_NTASKS": "5", "SLURM_LOCALID": "0", "SLURM_TASKS_PER_NODE": "2(x2),1",
      "SLURM_NODEID": "2"}, (4, 5, 0, 1)),
    ({"SLURM_PROCID": "1", "SLURM_NTASKS": "4", "SLURM_LOCALID": "1", "SLURM_TASKS_PER_NODE": "2(x2)",
      "SLURM_NODEID": "0"}, (1, 4, 1, 2)),
])
def test_slurm_variables(env, expected):
    info = R.rank_info(env)
    assert (info.rank, info.world_size, info.local_rank, info.local_world_size) == expected
    assert info.launcher == "slurm"


def test_single_process_and_export():
    info = R.rank_info({})
    assert info == R.RankInfo(0, 1, 0, 1, "single process")
    env = R.export_torch_env(R.RankInfo(1, 2, 1, 2, "mpirun"), {"MASTER_ADDR": "h", "MASTER_PORT": "1"})
    assert (env["RANK"], env["WORLD_SIZE"], env["LOCAL_RANK"], env["LOCAL_WORLD_SIZE"]) == ("1", "2", "1", "2")
    one = R.export_torch_env(info, {})
    assert one["MASTER_ADDR"] == "127.0.0.1"  # one process needs no rendezvous address from the user


def test_missing_master_address_is_a_clear_error():
    with pytest.raises(R.DistributedSetupError, match="MASTER_ADDR and MASTER_PORT not set"):
        R.export_torch_env(R.RankInfo(0, 2, 0, 2, "environment"), {})
    with pytest.raises(R.DistributedSetupError, match="not an integer"):
        R.rank_info({"RANK": "zero", "WORLD_SIZE": "2"})


# ----- CPU pinning ----------------------------------------------------------------------------

FOUR_CORES_SMT = [[0, 4], [1, 5], [2, 6], [3, 7]]


def test_ranks_split_whole_cores():
    info = lambda r, n, launcher="torchrun": R.RankInfo(r, n, r, n, launcher)
    assert R.rank_cpus(info(0, 2), allowed=range(8), core_groups=FOUR_CORES_SMT) == [0, 4, 1, 5]
    assert R.rank_cpus(info(1, 2), allowed=range(8), core_groups=FOUR_CORES_SMT) == [2, 6, 3, 7]
    # only the CPUs this process may use are split (taskset, a container's cpuset, mpirun binding)
    assert R.rank_cpus(info(1, 2), allowed=[2, 3, 6, 7], core_groups=FOUR_CORES_SMT) == [3, 7]
    with pytest.raises(R.DistributedSetupError, match="only 4 physical cores"):
        R.rank_cpus(info(0, 5), allowed=range(8), core_groups=FOUR_CORES_SMT)


def test_simulated_nodes_get_different_cores():
    """Two 'nodes' of one rank each on a 2-core machine: node 0 -> core 0, node 1 -> core 1."""
    one = R.RankInfo(0, 2, 0, 1, "torchrun")
    got = [R.rank_cpus(one, allowed=[0, 1], core_groups=[[0], [1]], nodes_per_host=2, node=n) for n in (0, 1)]
    assert got == [[0], [1]]
    got = [R.rank_cpus(R.RankInfo(0, 4, lr, 2, "torchrun"), allowed=range(8), core_groups=FOUR_CORES_SMT,
                       nodes_per_host=2, node=n) for n in (0, 1) for lr in (0, 1)]
    assert got == [[0, 4], [1, 5], [2, 6], [3, 7]]


def test_slurm_cpu_set_is_respected(monkeypatch):
    info = R.RankInfo(1, 2, 1, 2, "slurm")
    assert R.rank_cpus(info, allowed=[6, 2], core_groups=FOUR_CORES_SMT) == [2, 6]  # not re-split
    monkeypatch.setattr(R.os, "sched_getaffinity", lambda pid: {2, 6}, raising=False)
    set_calls = []
    monkeypatch.setattr(R.os, "sched_setaffinity", lambda pid, cpus: set_calls.append(cpus), raising=False)
    monkeypatch.setattr(system, "topology", lambda: system.Topology(
        cpus=tuple(system.LogicalCPU(cpu, core, 0) for core, g in enumerate(FOUR_CORES_SMT) for cpu in g)))
    threads = torch.get_num_threads()
    try:
        assert R.pin_rank(info) == [2, 6] and set_calls == [] and torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(threads)


def test_threads_per_rank_counts_physical_cores_of_the_affinity():
    """4 physical cores with 2 hyper-threads each: 2 ranks get 2 threads each, not the 4 that
    os.cpu_count() // 2 would give (8 logical CPUs); an affinity of 2 cores gives 1 each."""
    smt = system.Topology(cpus=tuple(system.LogicalCPU(cpu, core, 0)
                                     for core, g in enumerate(FOUR_CORES_SMT) for cpu in g))
    assert smt.logical_cores == 8
    assert R.threads_per_rank(2, smt) == 2 and R.threads_per_rank(1, smt) == 4 and R.threads_per_rank(8, smt) == 1
    two_cores = system.Topology(cpus=tuple(system.LogicalCPU(cpu, core, 0) for core, cpu in ((0, 0), (0, 4), (1, 1))))
    assert R.threads_per_rank(2, two_cores) == 1
    with pytest.raises(ValueError, match="at least 1"):
        R.threads_per_rank(0, smt)
