"""The distributed entry point: rank mapping (unit) and real jobs launched by torchrun and mpirun."""

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
from helpers import system

TINY = ["--dataset", "fashionmnist", "--train-size", "256", "--test-size", "128", "--batch-size", "32", "--epochs", "2"]
JOB_ENV = {"COURSE_DATA": "standin", "COURSE_PROFILE": "smoke", "OMP_NUM_THREADS": "1"}
one_rank_per_core = system.topology().physical_cores >= 2
needs_two_cores = pytest.mark.skipif(not one_rank_per_core, reason="2-rank jobs pin one rank per physical core")


# ----- rank mapping ---------------------------------------------------------------------------

def test_torchrun_variables():
    info = D.rank_info({"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
                        "TORCHELASTIC_RUN_ID": "x"})
    assert info == D.RankInfo(3, 4, 1, 2, "torchrun")


def test_open_mpi_variables():
    info = D.rank_info({"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2",
                        "OMPI_COMM_WORLD_LOCAL_RANK": "1", "OMPI_COMM_WORLD_LOCAL_SIZE": "2"})
    assert info == D.RankInfo(1, 2, 1, 2, "mpirun")


@pytest.mark.parametrize("env,expected", [
    ({"SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1", "SLURM_NTASKS_PER_NODE": "4"}, (5, 8, 1, 4)),
    ({"SLURM_PROCID": "4", "SLURM_NTASKS": "5", "SLURM_LOCALID": "0", "SLURM_TASKS_PER_NODE": "2(x2),1",
      "SLURM_NODEID": "2"}, (4, 5, 0, 1)),
    ({"SLURM_PROCID": "1", "SLURM_NTASKS": "4", "SLURM_LOCALID": "1", "SLURM_TASKS_PER_NODE": "2(x2)",
      "SLURM_NODEID": "0"}, (1, 4, 1, 2)),
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


def test_missing_master_address_is_a_clear_error():
    with pytest.raises(D.DistributedSetupError, match="MASTER_ADDR and MASTER_PORT not set"):
        D.export_torch_env(D.RankInfo(0, 2, 0, 2, "environment"), {})
    D.export_torch_env(D.RankInfo(0, 1, 0, 1, "single process"), {})  # one process needs no rendezvous
    with pytest.raises(D.DistributedSetupError, match="not an integer"):
        D.rank_info({"RANK": "zero", "WORLD_SIZE": "2"})


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
    if not torch.distributed.is_mpi_available():
        with pytest.raises(D.DistributedSetupError, match="no MPI backend"):
            D.choose_backend("cpu", "mpi")


def test_more_ranks_than_cores_is_refused():
    cores = system.topology().physical_cores
    with pytest.raises(D.DistributedSetupError, match=f"this machine has {cores} physical cores"):
        D.check_ranks(cores + 1)
    with pytest.raises(D.DistributedSetupError):
        D.check_ranks(0)
    D.check_ranks(cores)


def test_command_lines():
    cmd = D.torchrun_command(2, ["--epochs", "1"], nnodes=2, node_rank=1, master_port=1234, max_restarts=3)
    assert cmd[1:3] == ["-m", "torch.distributed.run"] and "--node-rank=1" in cmd and "--max-restarts=3" in cmd
    assert cmd[-4:] == ["-m", "helpers.distributed", "--epochs", "1"] and "--master-port=1234" in cmd
    assert 1024 < D.free_port() < 65536


def test_mpirun_missing_is_explained(monkeypatch):
    monkeypatch.setattr(D.shutil, "which", lambda name: None)
    with pytest.raises(D.DistributedSetupError, match="apt-get install openmpi-bin"):
        D.mpirun_command(2, [])


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
           "MASTER_PORT": str(D.free_port())}
    proc = subprocess.run([sys.executable, "-m", "helpers.distributed", "--timeout", "5", "--no-pin"], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "could not join the job" in proc.stderr


# ----- real jobs ------------------------------------------------------------------------------

@needs_two_cores
def test_torchrun_two_ranks(tmp_path):
    out = tmp_path / "job.json"
    job = D.run_job([D.torchrun_command(2, TINY + ["--out", str(out)])], out=out, timeout=120, env=JOB_ENV)
    assert job.returncode == 0, job.output[-2000:]
    s = job.summary
    assert s["world_size"] == 2 and s["backend"] == "gloo" and s["launcher"] == "torchrun"
    assert s["replicas_identical"] is True and s["global_batch"] == 64 and s["steps"] == 2 * 4
    lines = D.rank_lines(job.output)
    assert len(lines) == 2 and all("all_reduce(rank+1) = 3" in ln for ln in lines)
    assert job.seconds < 120


@needs_two_cores
def test_two_nodes_on_localhost(tmp_path):
    out, port = tmp_path / "job.json", D.free_port()
    cmds = [D.torchrun_command(1, TINY + ["--out", str(out)], nnodes=2, node_rank=r, master_port=port)
            for r in (0, 1)]
    job = D.run_job(cmds, out=out, timeout=120, env=JOB_ENV)
    assert job.returncode == 0, job.output[-2000:]
    assert job.summary["world_size"] == 2 and job.summary["replicas_identical"] is True
    assert job.seconds < 120


@needs_two_cores
@pytest.mark.skipif(shutil.which("mpirun") is None, reason="Open MPI not installed (CI installs openmpi-bin)")
def test_mpirun_two_ranks(tmp_path):
    out = tmp_path / "job.json"
    job = D.run_job([D.mpirun_command(2, TINY + ["--out", str(out)])], out=out, timeout=120, env=JOB_ENV)
    assert job.returncode == 0, job.output[-2000:]
    assert job.summary["launcher"] == "mpirun" and job.summary["world_size"] == 2
    assert job.summary["replicas_identical"] is True


@needs_two_cores
def test_killed_rank_restarts_and_resumes_to_identical_weights(tmp_path):
    ref_w, ref_out = tmp_path / "ref.pt", tmp_path / "ref.json"
    ref = D.run_job([D.torchrun_command(2, TINY + ["--save-weights", str(ref_w), "--out", str(ref_out)])],
                    out=ref_out, timeout=120, env=JOB_ENV)
    assert ref.returncode == 0, ref.output[-2000:]

    w, out, ckpt = tmp_path / "w.pt", tmp_path / "job.json", tmp_path / "ckpt.pt"
    args = TINY + ["--checkpoint", str(ckpt), "--checkpoint-every", "2", "--save-weights", str(w), "--out", str(out),
                   "--crash-rank", "1", "--crash-at-step", "5"]
    job = D.run_job([D.torchrun_command(2, args, max_restarts=1)], out=out, timeout=180, env=JOB_ENV)
    assert job.returncode == 0, job.output[-2000:]
    assert "simulated failure" in job.output
    assert job.summary["resumed_from"] == [1, 0]  # checkpoint after step 4 = end of epoch 0
    a = torch.load(ref_w, weights_only=True)["model"]
    b = torch.load(w, weights_only=True)["model"]
    assert all(torch.equal(a[k], b[k]) for k in a)


@needs_two_cores
def test_lost_rank_without_restarts_fails_fast(tmp_path):
    args = TINY + ["--crash-rank", "1", "--crash-at-step", "2", "--timeout", "20"]
    job = D.run_job([D.torchrun_command(2, args, max_restarts=0)], timeout=120, env=JOB_ENV)
    assert job.returncode != 0 and job.seconds < 60


@needs_two_cores
def test_sbatch_script_runs_the_entry_point(tmp_path):
    """Run the sbatch script with stand-ins for srun/scontrol that start two SLURM-like tasks."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text("#!/bin/bash\necho localhost\n")
    (bin_dir / "srun").write_text(textwrap.dedent("""\
        #!/bin/bash
        shift  # --kill-on-bad-exit=1
        pids=()
        for i in 0 1; do
          SLURM_PROCID=$i SLURM_LOCALID=$i SLURM_NTASKS=2 SLURM_NTASKS_PER_NODE=2 SLURM_NODEID=0 "$@" & pids+=($!)
        done
        status=0; for p in "${pids[@]}"; do wait "$p" || status=1; done; exit $status
        """))
    for f in bin_dir.iterdir():
        f.chmod(f.stat().st_mode | stat.S_IEXEC)
    env = {**os.environ, **JOB_ENV, "PATH": f"{bin_dir}:{Path(sys.executable).parent}:{os.environ['PATH']}",
           "SLURM_JOB_NODELIST": "localhost", "SLURM_JOB_ID": "42", "SLURM_CPUS_PER_TASK": "1",
           "MASTER_PORT": str(D.free_port())}
    proc = subprocess.run(["bash", str(D.SBATCH_SCRIPT), *TINY], env=env, cwd=tmp_path, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-1500:] + proc.stderr[-1500:]
    summary = json.loads((tmp_path / "results" / "ddp-42.json").read_text())
    assert summary["launcher"] == "slurm" and summary["world_size"] == 2 and summary["replicas_identical"]


@needs_two_cores
def test_measure_job_protocol(tmp_path):
    res = D.measure_job("one", lambda out: [D.torchrun_command(1, TINY + ["--out", str(out)])], tmp_path,
                        repeats=1, timeout=120, env=JOB_ENV)
    assert res.name == "one" and len(res.samples) == 1 and len(res.warmup) == 1
    assert res.metrics["world_size"] == 1 and res.metrics["steps"] == 2 * 8
    with pytest.raises(D.DistributedSetupError, match="failed"):
        D.measure_job("bad", lambda out: [D.torchrun_command(1, ["--epochs", "x"])], tmp_path, env=JOB_ENV)
