"""The distributed entry point: rank discovery and pinning, backend choice, the training loop and the payloads
of its collectives, one-message errors, and real jobs launched by torchrun, mpirun and sbatch."""

import ast
import inspect
import json
import os
import shutil
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from helpers import distributed as D
from helpers import launch as L
from helpers import checkpoints, models, system

TINY = ["--dataset", "fashionmnist", "--train-size", "256", "--test-size", "128", "--batch-size", "32", "--epochs", "2"]
MPIRUN_SCRIPT = D.SBATCH_SCRIPT.parent / "ddp_mpirun.sh"
JOB_ENV = {"COURSE_DATA": "standin", "COURSE_PROFILE": "smoke", "OMP_NUM_THREADS": "1"}
PORT_RETRIES = 2  # a parallel test can take a free port before rank 0 binds it: run_job retries on a new one
one_rank_per_core = system.topology().physical_cores >= 2
needs_two_cores = pytest.mark.skipif(not one_rank_per_core, reason="2-rank jobs pin one rank per physical core")


# ----- rank mapping ---------------------------------------------------------------------------

def test_torchrun_variables():
    info = D.rank_info({"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
                        "TORCHELASTIC_RUN_ID": "x"})
    assert info == D.RankInfo(3, 4, 1, 2, "torchrun")
    assert D.node_rank(info, {"GROUP_RANK": "1"}) == 1 and D.node_rank(info, {}) == 1


def test_open_mpi_variables():
    info = D.rank_info({"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2",
                        "OMPI_COMM_WORLD_LOCAL_RANK": "1", "OMPI_COMM_WORLD_LOCAL_SIZE": "2"})
    assert info == D.RankInfo(1, 2, 1, 2, "mpirun")


@pytest.mark.parametrize("env,expected", [
    ({"SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1", "SLURM_NTASKS_PER_NODE": "4"}, (5, 8, 1, 4)),
    ({"SLURM_PROCID": "1", "SLURM_NTASKS": "4", "SLURM_LOCALID": "0"}, (1, 4, 0, 1)),  # no --ntasks-per-node
])
def test_slurm_variables(env, expected):
    info = D.rank_info(env)
    assert (info.rank, info.world_size, info.local_rank, info.local_world_size) == expected
    assert info.launcher == "slurm"


def test_single_process_and_export():
    info = D.rank_info({})
    assert info == D.RankInfo(0, 1, 0, 1, "single process")
    env = D.export_torch_env(D.RankInfo(1, 2, 1, 2, "mpirun"), {"MASTER_ADDR": "h", "MASTER_PORT": "1"})
    assert (env["RANK"], env["WORLD_SIZE"], env["LOCAL_RANK"], env["LOCAL_WORLD_SIZE"]) == ("1", "2", "1", "2")
    one = D.export_torch_env(info, {})
    assert one["MASTER_ADDR"] == "127.0.0.1"  # one process needs no rendezvous address from the user


def test_missing_master_address_is_a_clear_error():
    with pytest.raises(D.DistributedSetupError, match="MASTER_ADDR and MASTER_PORT not set"):
        D.export_torch_env(D.RankInfo(0, 2, 0, 2, "environment"), {})
    with pytest.raises(D.DistributedSetupError, match="not an integer"):
        D.rank_info({"RANK": "zero", "WORLD_SIZE": "2"})


# ----- CPU pinning ----------------------------------------------------------------------------

FOUR_CORES_SMT = [[0, 4], [1, 5], [2, 6], [3, 7]]


def test_ranks_split_whole_cores():
    info = lambda r, n, launcher="torchrun": D.RankInfo(r, n, r, n, launcher)
    assert D.rank_cpus(info(0, 2), allowed=range(8), core_groups=FOUR_CORES_SMT) == [0, 4, 1, 5]
    assert D.rank_cpus(info(1, 2), allowed=range(8), core_groups=FOUR_CORES_SMT) == [2, 6, 3, 7]
    # only the CPUs this process may use are split (taskset, a container's cpuset, mpirun binding)
    assert D.rank_cpus(info(1, 2), allowed=[2, 3, 6, 7], core_groups=FOUR_CORES_SMT) == [3, 7]
    with pytest.raises(D.DistributedSetupError, match="only 4 physical cores"):
        D.rank_cpus(info(0, 5), allowed=range(8), core_groups=FOUR_CORES_SMT)


def test_simulated_nodes_get_different_cores():
    """Two 'nodes' of one rank each on a 2-core machine: node 0 -> core 0, node 1 -> core 1."""
    one = D.RankInfo(0, 2, 0, 1, "torchrun")
    got = [D.rank_cpus(one, allowed=[0, 1], core_groups=[[0], [1]], nodes_per_host=2, node=n) for n in (0, 1)]
    assert got == [[0], [1]]
    got = [D.rank_cpus(D.RankInfo(0, 4, lr, 2, "torchrun"), allowed=range(8), core_groups=FOUR_CORES_SMT,
                       nodes_per_host=2, node=n) for n in (0, 1) for lr in (0, 1)]
    assert got == [[0, 4], [1, 5], [2, 6], [3, 7]]


def test_slurm_cpu_set_is_respected(monkeypatch):
    info = D.RankInfo(1, 2, 1, 2, "slurm")
    assert D.rank_cpus(info, allowed=[6, 2], core_groups=FOUR_CORES_SMT) == [2, 6]  # not re-split
    monkeypatch.setattr(D.os, "sched_getaffinity", lambda pid: {2, 6}, raising=False)
    set_calls = []
    monkeypatch.setattr(D.os, "sched_setaffinity", lambda pid, cpus: set_calls.append(cpus), raising=False)
    monkeypatch.setattr(system, "topology", lambda: system.Topology(
        cpus=tuple(system.LogicalCPU(cpu, core, 0) for core, g in enumerate(FOUR_CORES_SMT) for cpu in g)))
    threads = torch.get_num_threads()
    try:
        assert D.pin_rank(info) == [2, 6] and set_calls == [] and torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(threads)


def test_threads_per_rank_counts_physical_cores_of_the_affinity():
    """4 physical cores with 2 hyper-threads each: 2 ranks get 2 threads each, not the 4 that
    os.cpu_count() // 2 would give (8 logical CPUs); an affinity of 2 cores gives 1 each."""
    smt = system.Topology(cpus=tuple(system.LogicalCPU(cpu, core, 0)
                                     for core, g in enumerate(FOUR_CORES_SMT) for cpu in g))
    assert smt.logical_cores == 8
    assert D.threads_per_rank(2, smt) == 2 and D.threads_per_rank(1, smt) == 4 and D.threads_per_rank(8, smt) == 1
    two_cores = system.Topology(cpus=tuple(system.LogicalCPU(cpu, core, 0) for core, cpu in ((0, 0), (0, 4), (1, 1))))
    assert D.threads_per_rank(2, two_cores) == 1
    with pytest.raises(ValueError, match="at least 1"):
        D.threads_per_rank(0, smt)


COLLECTIVES = ("all_reduce", "all_gather", "all_gather_into_tensor", "broadcast", "reduce", "gather", "scatter",
               "reduce_scatter", "reduce_scatter_tensor", "all_to_all", "all_to_all_single", "send", "recv")
AUDITED_MODULES = (D,)  # the entry point's module


# ----- the learning rate: linear scaling with a linear warm-up ---------------------------------

def test_warmup_lr_rises_linearly_to_the_scaled_rate():
    lr = lambda step: D.warmup_lr(step, base_lr=0.1, peak_lr=0.4, warmup_steps=4)
    assert [round(lr(s), 6) for s in range(6)] == [0.1, 0.175, 0.25, 0.325, 0.4, 0.4]
    assert D.warmup_lr(0, base_lr=0.1, peak_lr=0.4, warmup_steps=0) == 0.4  # no warm-up


class _RecordingSGD(torch.optim.SGD):
    def __init__(self, params, lr):
        super().__init__(params, lr=lr)
        self.used = []

    def step(self, closure=None):
        self.used.append(self.param_groups[0]["lr"])
        return super().step(closure)


def _tiny_loader(samples=12, batch=4):
    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

    data = TensorDataset(torch.randn(samples, 3), torch.randint(0, 2, (samples,)))
    return DataLoader(data, batch_size=batch, sampler=DistributedSampler(data, num_replicas=1, rank=0, seed=0))


def test_train_ddp_applies_the_warmup_to_every_step():
    """train_ddp sets each step's rate from lr_at(global step), across epochs."""
    lr_at = lambda step: D.warmup_lr(step, base_lr=0.01, peak_lr=0.04, warmup_steps=4)
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    opt = _RecordingSGD(model.parameters(), lr=lr_at(0))
    seen = []
    done = D.train_ddp(model, _tiny_loader(), opt, epochs=2, device=torch.device("cpu"), lr_at=lr_at,
                       after_epoch=lambda p: seen.append((p["epoch"], p["step"])))
    assert done["step"] == 6 and opt.used == pytest.approx([0.01, 0.0175, 0.025, 0.0325, 0.04, 0.04])
    assert len(done["epoch_times"]) == len(done["epoch_losses"]) == 2 and all(v > 0 for v in done["epoch_losses"])
    assert seen == [(1, 3), (2, 6)]
    # a run resumed after epoch 0 (as checkpoints.restore returns it) continues the schedule at step 3
    opt = _RecordingSGD(model.parameters(), lr=lr_at(0))
    resumed = D.train_ddp(model, _tiny_loader(), opt, epochs=2, device=torch.device("cpu"), lr_at=lr_at,
                          progress={**checkpoints.fresh_progress(), "epoch": 1, "step": 3})
    assert resumed["step"] == 6 and opt.used == pytest.approx([0.0325, 0.04, 0.04])


# ----- collectives: payloads on the training device, never float64 -----------------------------

class Recorder:
    """A stand-in for torch.distributed that records the device and dtype of every payload."""

    def __init__(self, world: int = 2):
        self.world, self.calls = world, []

    def get_world_size(self):
        return self.world

    def _record(self, name, tensors):
        self.calls += [(name, t.device, t.dtype) for t in tensors]

    def all_reduce(self, tensor, *args, **kwargs):
        self._record("all_reduce", [tensor])

    def all_gather(self, outputs, tensor, *args, **kwargs):
        self._record("all_gather", [tensor, *outputs])

    def broadcast(self, tensor, *args, **kwargs):
        self._record("broadcast", [tensor])

    def barrier(self, *args, device_ids=None, **kwargs):
        self.calls.append(("barrier", device_ids))


def _check_payloads(calls, device):
    calls = [c for c in calls if c[0] != "barrier"]
    assert calls, "no collective was called"
    bad = [c for c in calls if c[1] != device or c[2] == torch.float64]
    assert not bad, f"collective payloads not on the training device {device} or in float64: {bad}"


def _comm_functions():
    """The functions defined in the entry point's modules that take a collectives module."""
    return [f for module in AUDITED_MODULES for f in vars(module).values()
            if inspect.isfunction(f) and f.__module__ == module.__name__ and "comm" in inspect.signature(f).parameters]


def test_every_collective_payload_is_on_the_training_device():
    """Called with torch.device('meta'): a payload built on the CPU (or in float64) shows up
    even on a CPU-only machine -- nccl and xccl refuse CPU tensors, Intel Arc has no float64."""
    meta = torch.device("meta")
    with torch.device("meta"):
        model = models.book_cnn("fashionmnist")
    calls = {}
    for rank in (0, 1):
        comm = Recorder()
        D.handshake(rank, meta, comm)
        D.sum_across_ranks([3, 4.5, 1e9], meta, comm)
        D.replica_fingerprints(model, meta, comm)
        D.wait_for_all(meta, comm)
        _check_payloads(comm.calls, meta)
        calls[rank] = {c[0] for c in comm.calls}
    assert calls[0] == {"all_reduce", "all_gather", "barrier"}
    gpu = Recorder()
    D.wait_for_all(torch.device("cuda", 1), gpu)  # a device object only: nothing runs on it
    assert gpu.calls == [("barrier", [1])]  # nccl is told which GPU this rank uses
    tested = {"handshake", "sum_across_ranks", "replica_fingerprints", "evaluate_on_all_ranks", "wait_for_all"}
    assert {f.__name__ for f in _comm_functions()} <= tested, "a new function takes comm: add it to this test"


def test_no_collective_bypasses_the_audited_functions():
    """Every collective call in the entry point's modules goes through a function that takes
    ``comm`` and calls it on ``comm`` -- so the test above sees every payload the entry point sends."""
    problems = []
    functions = [(module.__name__, n) for module in AUDITED_MODULES
                 for n in ast.walk(ast.parse(Path(module.__file__).read_text())) if isinstance(n, ast.FunctionDef)]
    for where, fn in functions:
        params = {a.arg for a in fn.args.args + fn.args.kwonlyargs}
        for call in [n for n in ast.walk(fn) if isinstance(n, ast.Call)]:
            f = call.func
            if isinstance(f, ast.Attribute) and f.attr in COLLECTIVES:
                owner = f.value.id if isinstance(f.value, ast.Name) else ast.unparse(f.value)
                if owner != "comm" or "comm" not in params:
                    problems.append(f"{where}.{fn.name}() calls {owner}.{f.attr} directly (line {call.lineno})")
    assert not problems, "; ".join(problems)


# ----- evaluation on every rank ----------------------------------------------------------------

class _AddOtherRanks:
    """A stand-in for torch.distributed on one rank: all_reduce adds what the other ranks hold."""

    def __init__(self, others=()):
        self.others, self.sent = list(others), []

    def all_reduce(self, tensor, *args, **kwargs):
        self.sent.append(tensor.clone())
        for other in self.others:
            tensor += other


def test_evaluate_on_all_ranks_scores_each_share_and_sums_the_counts():
    from torch.utils.data import TensorDataset

    class AlwaysThree(torch.nn.Module):
        def forward(self, x):
            out = torch.zeros(len(x), 10)
            out[:, 3] = 1.0
            return out

    targets = torch.tensor([3, 3, 1, 3, 0, 3, 3, 2, 3, 3])
    test_set = TensorDataset(torch.zeros(10, 2), targets)
    model, cpu = AlwaysThree(), torch.device("cpu")
    rank1 = _AddOtherRanks()
    one = D.evaluate_on_all_ranks(model, test_set, D.RankInfo(1, 2, 1, 2, "torchrun"), cpu, rank1)
    assert one["count"] == 10 and one["accuracy"] == 40.0  # rank 1 alone: right on samples 1, 3, 5, 9 of 1, 3, ..., 9
    rank0 = _AddOtherRanks(rank1.sent)
    both = D.evaluate_on_all_ranks(model, test_set, D.RankInfo(0, 2, 0, 2, "torchrun"), cpu, rank0)
    own = [1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0, 1.0, 0.0]  # rank 0 scores 0, 2, 4, 6, 8: right on 0, 6 and 8
    assert rank0.sent[0].tolist() == own
    assert both["count"] == 10 and both["accuracy"] == 70.0
    assert both["correct"] == [t == 3 for t in targets.tolist()]  # per image, in test-set order
    assert model.training  # left in training mode


# ----- backend and device ----------------------------------------------------------------------

def test_backend_choice():
    assert D.choose_backend("cpu") == "gloo" and D.choose_backend("cpu", "GLOO") == "gloo"
    with pytest.raises(D.DistributedSetupError, match="Unknown backend 'smoke'"):
        D.choose_backend("cpu", "smoke")
    with pytest.raises(D.DistributedSetupError, match="needs CUDA"):
        D.choose_backend("cpu", "nccl")
    with pytest.raises(D.DistributedSetupError, match="xccl"):
        D.choose_backend("cpu", "xccl")
    with pytest.raises(D.DistributedSetupError, match="end-of-life"):
        D.choose_backend("cpu", "ccl")
    with pytest.raises(D.DistributedSetupError, match="cannot communicate xpu"):
        D.choose_backend("xpu", "gloo")
    if not torch.distributed.is_mpi_available():
        with pytest.raises(D.DistributedSetupError, match="no MPI backend"):
            D.choose_backend("cpu", "mpi")


@pytest.mark.skipif(torch.cuda.is_available(), reason="the messages for a machine without CUDA")
def test_cuda_message_matches_the_installed_build(monkeypatch):
    monkeypatch.setattr(torch.version, "cuda", None)
    with pytest.raises(D.DistributedSetupError, match="CPU-only build.*--device cpu --backend gloo"):
        D.choose_backend("cuda", "nccl")
    monkeypatch.setattr(torch.version, "cuda", "12.8")
    with pytest.raises(D.DistributedSetupError, match="built for CUDA 12.8"):
        D.training_device("cuda", D.RankInfo(0, 1, 0, 1, "single process"))
    with pytest.raises(D.DistributedSetupError, match="built for CUDA 12.8"):
        D.choose_backend("cuda", "nccl")


# ----- the payloads main() sends: on the training device, never float64 ------------------------

def _one_rank_env(monkeypatch):
    """One rank of a one-rank job, as a launcher would describe it (a new port: a new job)."""
    for key, value in {**JOB_ENV, "TQDM_DISABLE": "1", "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0",
                       "LOCAL_WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(L.free_port())}.items():
        monkeypatch.setenv(key, value)


def test_entry_point_in_process_sends_float32_on_its_device(monkeypatch, tmp_path):
    """The real main() on one gloo rank, every collective recorded on its way to gloo."""
    import torch.distributed as dist

    seen = []
    for name in ("all_reduce", "all_gather", "broadcast"):
        real = getattr(dist, name)

        def spy(*args, _real=real, _name=name, **kwargs):
            tensors = [a for a in args if isinstance(a, torch.Tensor)]
            tensors += [t for a in args if isinstance(a, list) for t in a if isinstance(t, torch.Tensor)]
            seen.extend((_name, t.device, t.dtype) for t in tensors)
            return _real(*args, **kwargs)
        monkeypatch.setattr(dist, name, spy)
    _one_rank_env(monkeypatch)
    threads = torch.get_num_threads()
    try:
        summary = D.main([*TINY, "--epochs", "1", "--no-pin", "--out", str(tmp_path / "s.json")])
    finally:
        torch.set_num_threads(threads)
    _check_payloads(seen, torch.device("cpu"))
    assert summary is not None and summary["replicas_identical"] is True and summary["test_count"] == 128
    assert {s[0] for s in seen} == {"all_reduce", "all_gather"}


def test_seeds_refuse_a_checkpoint(monkeypatch, tmp_path, capsys):
    _one_rank_env(monkeypatch)
    with pytest.raises(SystemExit) as info:
        D.main([*TINY, "--no-pin", "--seeds", "0", "1", "--checkpoint", str(tmp_path / "c.pt")])
    assert info.value.code == D.EXIT_SETUP_ERROR
    assert "--checkpoint holds one: use --seed with it" in capsys.readouterr().err


def test_seeds_in_one_job_train_as_one_job_per_seed_would(monkeypatch, tmp_path):
    """--seeds 0 1: the second run is bit for bit the run of a job started with --seed 1."""
    threads = torch.get_num_threads()
    try:
        _one_rank_env(monkeypatch)
        both = D.main([*TINY, "--no-pin", "--seeds", "0", "1", "--out", str(tmp_path / "both.json")])
        _one_rank_env(monkeypatch)  # a new port: a new job
        alone = D.main([*TINY, "--no-pin", "--seed", "1"])
    finally:
        torch.set_num_threads(threads)
    assert json.loads((tmp_path / "both.json").read_text()) == both
    first, second = both["seeds"]
    assert (first["seed"], second["seed"], alone["seed"]) == (0, 1, 1)
    assert second["epoch_losses"] == alone["epoch_losses"] and second["accuracy"] == alone["accuracy"]
    assert first["epoch_losses"] != second["epoch_losses"]  # the seed does change the run


# ----- one clear message instead of a traceback per rank ------------------------------------------

def test_entry_point_by_hand_without_master_fails_clearly():
    env = {**os.environ, **JOB_ENV, "RANK": "0", "WORLD_SIZE": "2"}
    env.pop("MASTER_ADDR", None)
    env.pop("MASTER_PORT", None)
    proc = subprocess.run([sys.executable, "-m", "helpers.distributed"], env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2 and "MASTER_ADDR and MASTER_PORT not set" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_unreachable_rendezvous_times_out_with_a_message():
    env = {**os.environ, **JOB_ENV, "RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(L.free_port())}
    proc = subprocess.run([sys.executable, "-m", "helpers.distributed", "--timeout", "2", "--no-pin"], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "error: rank 1 could not join the job" in proc.stderr  # a local problem: this rank says so itself


def _ours(output):
    """Traceback frames from the course's code (torchrun's own failure summary is not ours)."""
    return [ln for ln in output.splitlines() if "helpers/" in ln and ln.strip().startswith("File ")]


@needs_two_cores
def test_offline_data_through_torchrun_gives_one_message(tmp_path):
    env = {**JOB_ENV, "COURSE_DATA": "real", "COURSE_DATA_DIR": str(tmp_path / "none")}
    job = L.run_job([L.torchrun_command(2, TINY)], timeout=180, env=env)
    assert job.returncode != 0 and job.error is not None and "could not be downloaded" in job.error
    assert job.output.count("could not be downloaded") == 1 and not _ours(job.output)


@needs_two_cores
def test_too_many_ranks_through_plain_torchrun_gives_one_message():
    ranks = system.topology().physical_cores + 1  # torchrun started by hand: no check before the launch
    line = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={ranks}",
            f"--master-port={L.free_port()}", "-m", "helpers.distributed", *TINY]
    job = L.run_job([line], timeout=180, env=JOB_ENV)
    assert job.returncode != 0 and "physical cores" in (job.error or "")
    assert job.output.count("physical cores available") == 1 and not _ours(job.output)


def test_bad_option_is_reported_once():
    env = {**os.environ, **JOB_ENV}
    proc = subprocess.run([sys.executable, "-m", "helpers.distributed", "--epochs", "x"], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stderr.count("invalid int value") == 1
    env.update({"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "1"})
    proc = subprocess.run([sys.executable, "-m", "helpers.distributed", "--epochs", "x"], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stderr == ""  # other ranks stay quiet: rank 0 says it


# ----- real jobs ------------------------------------------------------------------------------

@needs_two_cores
def test_torchrun_two_ranks_with_portable_checkpoint(tmp_path):
    out, ckpt = tmp_path / "job.json", tmp_path / "ckpt.pt"
    job = L.run_job(lambda: [L.torchrun_command(2, TINY + ["--checkpoint", str(ckpt), "--out", str(out)])], out=out,
                    timeout=180, env=JOB_ENV, retries=PORT_RETRIES)
    assert job.returncode == 0, job.output[-2000:]
    s = job.summary
    assert s["world_size"] == 2 and s["backend"] == "gloo" and s["launcher"] == "torchrun"
    assert s["replicas_identical"] is True and s["global_batch"] == 64 and s["steps"] == 2 * 4
    # rank 0 is pinned to the first half of the physical cores this process may use (here: the first core)
    assert s["cpus"] == D.rank_cpus(D.RankInfo(0, 2, 0, 2, "torchrun"), allowed=sorted(os.sched_getaffinity(0)),
                                    core_groups=system.topology().smt_siblings())
    lines = L.rank_lines(job.output)
    assert len(lines) == 2 and all("all_reduce(rank+1) = 3" in ln for ln in lines)
    assert len(s["epoch_times"]) == len(s["epoch_losses"]) == 2 and s["test_count"] == 128
    state = torch.load(ckpt, weights_only=True)
    model = models.book_cnn("fashionmnist")
    model.load_state_dict(state["model"])  # the plain state_dict: no "module." to strip
    assert state["epoch"] == 2 and state["step"] == 8 and state["optimizer"]["state"]

    # a rank killed after epoch 1 under torchrun --max-restarts 1: every rank restarts from the checkpoint
    out2, ckpt2 = tmp_path / "restarted.json", tmp_path / "ckpt2.pt"
    def restarting():
        cmd = L.torchrun_command(2, TINY + ["--checkpoint", str(ckpt2), "--out", str(out2), "--crash-rank", "1"])
        return [cmd[:4] + ["--max-restarts=1"] + cmd[4:]]
    job = L.run_job(restarting, out=out2, timeout=240, env=JOB_ENV, retries=PORT_RETRIES)
    assert job.returncode == 0, job.output[-2000:]
    assert "simulated failure" in job.output and job.summary["resumed_from"] == [1, 0]
    restarted = torch.load(ckpt2, weights_only=True)["model"]
    assert all(torch.equal(state["model"][k], restarted[k]) for k in restarted)  # the same weights as no failure


@needs_two_cores
def test_two_nodes_on_localhost_use_different_cores(tmp_path):
    out = tmp_path / "job.json"

    def cmds():
        port = L.free_port()
        return [[sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc-per-node=1",
                 f"--node-rank={r}", "--master-addr=127.0.0.1", f"--master-port={port}", "-m", "helpers.distributed",
                 *TINY, "--nodes-per-host", "2", "--out", str(out)] for r in (0, 1)]
    job = L.run_job(cmds, out=out, timeout=180, env=JOB_ENV, retries=PORT_RETRIES)
    assert job.returncode == 0, job.output[-2000:]
    assert job.summary["world_size"] == 2 and job.summary["replicas_identical"] is True
    cpus = [ln.split("cpus ")[1].split(",")[0] for ln in L.rank_lines(job.output)]
    assert cpus == ["[0]", "[1]"] if system.topology().physical_cores == 2 else len(set(cpus)) == 2


@needs_two_cores
@pytest.mark.skipif(shutil.which("mpirun") is None, reason="Open MPI (mpirun) is not installed")
def test_mpirun_launcher_two_ranks(tmp_path):
    """The launcher script with a one-host hostfile: MASTER_ADDR is that host, two ranks train."""
    out, hosts = tmp_path / "job.json", tmp_path / "hosts"
    hosts.write_text("localhost slots=2\n")
    env = {**JOB_ENV, "PYTHON": sys.executable}
    job = L.run_job(lambda: [["env", f"MASTER_PORT={L.free_port()}", "bash", str(MPIRUN_SCRIPT), str(hosts), "2",
                              *TINY, "--out", str(out)]], out=out, timeout=180, env=env, retries=PORT_RETRIES)
    assert job.returncode == 0, job.output[-2000:]
    assert "MASTER_ADDR=localhost" in job.output
    assert job.summary["launcher"] == "mpirun" and job.summary["world_size"] == 2
    assert job.summary["replicas_identical"] is True


@needs_two_cores
def test_sbatch_script_runs_the_entry_point(tmp_path):
    """Run the sbatch script with stand-ins for srun/scontrol that start two SLURM-like tasks."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text("#!/bin/bash\necho localhost\n")
    (bin_dir / "srun").write_text(textwrap.dedent("""\
        #!/bin/bash
        while [[ "$1" == --* ]]; do shift; done  # srun's own options
        pids=()
        for i in 0 1; do
          SLURM_PROCID=$i SLURM_LOCALID=$i SLURM_NTASKS=2 SLURM_NTASKS_PER_NODE=2 SLURM_NODEID=0 \\
            taskset -c $i "$@" & pids+=($!)
        done
        status=0; for p in "${pids[@]}"; do wait "$p" || status=1; done; exit $status
        """))
    for f in bin_dir.iterdir():
        f.chmod(f.stat().st_mode | stat.S_IEXEC)
    env = {**os.environ, **JOB_ENV, "PATH": f"{bin_dir}:{Path(sys.executable).parent}:{os.environ['PATH']}",
           "SLURM_JOB_NODELIST": "localhost", "SLURM_JOB_ID": "42", "SLURM_CPUS_PER_TASK": "1"}
    job = L.run_job(lambda: [["env", "-C", str(tmp_path), f"MASTER_PORT={L.free_port()}", "bash", str(D.SBATCH_SCRIPT),
                              *TINY]], out=tmp_path / "results" / "ddp-42.json", timeout=180, env=env,
                    retries=PORT_RETRIES)  # env -C: the script writes results/ where it is submitted
    assert job.returncode == 0, job.output[-3000:]
    summary = job.summary
    assert summary["launcher"] == "slurm" and summary["world_size"] == 2 and summary["replicas_identical"]
    assert summary["cpus"] == [0]  # srun's CPU set (taskset -c 0 for task 0), not re-split
    assert "cpus [1]" in job.output


@pytest.mark.parametrize("rank,error,printed", [
    ("0", checkpoints.CheckpointError("bad checkpoint"), "error: bad checkpoint\n"),
    ("1", D.JoinError("cannot join"), "error: cannot join\n"),  # a rank that could not join says so itself
    ("1", checkpoints.CheckpointError("bad"), "rank 1: stopped (CheckpointError; rank 0 prints the message)\n"),
])
def test_a_user_error_is_one_line_and_exit_2(monkeypatch, capsys, rank, error, printed):
    _one_rank_env(monkeypatch)
    monkeypatch.setenv("RANK", rank)
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setattr("helpers.distributed.ERROR_LINGER_S", 0.0)

    def fail(args, info):
        raise error
    monkeypatch.setattr("helpers.distributed.run", fail)
    with pytest.raises(SystemExit) as info:
        D.main(TINY)
    assert info.value.code == D.EXIT_SETUP_ERROR and capsys.readouterr().err == printed
