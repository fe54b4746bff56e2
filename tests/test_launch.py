"""Launch helpers: command lines, the rank check, run_job's output draining and clean stops, and
measure_job's bookkeeping (real torchrun/mpirun/sbatch jobs of the entry point: test_distributed.py)."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

from helpers import launch as L
from helpers import system
from helpers.distributed import SBATCH_SCRIPT, DistributedSetupError

MPIRUN_SCRIPT = SBATCH_SCRIPT.parent / "ddp_mpirun.sh"

CORES = system.topology().physical_cores


def test_torchrun_command_line():
    cmd = L.torchrun_command(1, ["--epochs", "1"])
    assert cmd[:3] == [sys.executable, "-m", "torch.distributed.run"] and "--nproc-per-node=1" in cmd
    assert "--master-addr=127.0.0.1" in cmd and any(a.startswith("--master-port=") for a in cmd)
    assert cmd[-4:] == ["-m", "helpers.distributed", "--epochs", "1"]


def test_first_host_of_a_hostfile(tmp_path):
    hosts = tmp_path / "hosts"
    hosts.write_text("# the cluster\n\n  node07 slots=2  # head node\nnode08 slots=2\n")
    assert L.first_host(hosts) == "node07"
    hosts.write_text("# nothing\n\n")
    with pytest.raises(DistributedSetupError, match="names no host"):
        L.first_host(hosts)


def test_free_port_is_bindable():
    port = L.free_port()
    assert 1024 < port < 65536
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))


def test_more_ranks_than_cores_is_refused_once_before_launch():
    with pytest.raises(DistributedSetupError, match=f"this machine has {CORES} physical cores"):
        L.check_ranks(CORES + 1)
    with pytest.raises(DistributedSetupError, match="must be at least 1"):
        L.check_ranks(0)
    assert L.check_ranks(CORES) is None  # as many ranks as cores: allowed
    assert L.check_ranks(CORES + 1, device="cuda") is None  # GPU ranks are not pinned to cores
    with pytest.raises(DistributedSetupError, match=r"\(2 nodes x"):
        L.check_ranks(CORES, nodes_per_host=2)
    # the command builders check too: a 3-rank request on 2 cores never starts torchrun
    with pytest.raises(DistributedSetupError, match="physical cores"):
        L.torchrun_command(CORES + 1, ["--epochs", "1"])
    # ... but sharing cores knowingly and GPU ranks build the line, for every rank asked for
    for args in (["--no-pin"], ["--device", "cuda"], ["--device=cuda:0"]):
        cmd = L.torchrun_command(CORES + 1, args)
        assert f"--nproc-per-node={CORES + 1}" in cmd and cmd[-len(args):] == args, (args, cmd)


def _fake_mpirun(tmp_path):
    """An 'mpirun' that prints the MASTER_ADDR it was given and its arguments."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "mpirun"
    fake.write_text('#!/bin/bash\necho "MASTER_ADDR=$MASTER_ADDR"\necho "ARGS $*"\n')
    fake.chmod(0o755)
    return {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "MASTER_PORT": "29501"}


def test_mpirun_launcher_script_takes_master_addr_from_the_hostfile(tmp_path):
    env = _fake_mpirun(tmp_path)
    env.pop("MASTER_ADDR", None)
    hosts = tmp_path / "hosts"
    hosts.write_text("# cluster\nnode05 slots=2\nnode06 slots=2\n")
    proc = subprocess.run(["bash", str(MPIRUN_SCRIPT), str(hosts), "4", "--epochs", "1"], env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "MASTER_ADDR=node05\n" in proc.stdout
    args = proc.stdout.split("ARGS ", 1)[1].split()
    assert args[args.index("--hostfile") + 1] == str(hosts) and args[args.index("-np") + 1] == "4"
    assert args[-4:] == ["-m", "helpers.distributed", "--epochs", "1"]
    hosts.write_text("# empty\n")
    proc = subprocess.run(["bash", str(MPIRUN_SCRIPT), str(hosts), "2"], env=env, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 2 and "names no host" in proc.stderr


def test_rank_lines():
    merged = ("rank 1/2 (local 1, launcher torchrun, cpus [1]): all_reduce(rank+1) = 3"
              "rank 0/2 (local 0, launcher torchrun, cpus [0]): all_reduce(rank+1) = 3\n")
    lines = L.rank_lines(merged)
    assert [ln.split()[1] for ln in lines] == ["0/2", "1/2"]


def test_run_job_drains_two_chatty_processes(tmp_path):
    """Two launchers that each write 2 MB to stdout and stderr: no pipe may fill up and block."""
    chatty = [sys.executable, "-c", "import sys\nfor i in range(20000):\n"
              "    sys.stdout.write('o' * 50 + '\\n'); sys.stderr.write('e' * 50 + '\\n')"]
    job = L.run_job([chatty, chatty], timeout=60)
    assert job.returncode == 0 and job.output.count("o" * 50) == 40000 and job.output.count("e" * 50) == 40000
    assert job.summary is None and job.error is None


def test_run_job_returns_first_failure_and_error_line():
    ok = [sys.executable, "-c", "pass"]
    bad = [sys.executable, "-c", "import sys; print('noise\\nerror: no data here \\nTraceback\\nerror: second', "
           "file=sys.stderr); sys.exit(2)"]
    job = L.run_job([ok, bad], timeout=60)
    assert job.returncode == 2 and job.error == "no data here"  # the entry point's own message, the first one
    assert L.run_job([ok], timeout=60).error is None


def _spawner(tmp_path):
    """A 'launcher' that starts a grandchild in a session of its own (as torchrun does) and sleeps."""
    script = tmp_path / "launcher.py"
    script.write_text(textwrap.dedent(f"""\
        import subprocess, sys, time
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True)
        open({str(tmp_path / 'child.pid')!r}, "w").write(str(child.pid))
        time.sleep(120)
        """))
    return [sys.executable, str(script)]


def _wait_for(path, seconds=30):
    end = time.time() + seconds
    while not path.exists() or not path.read_text():
        assert time.time() < end, "the launcher did not start its child"
        time.sleep(0.1)
    return int(path.read_text())


def test_timeout_stops_the_whole_job(tmp_path):
    start = time.perf_counter()
    with pytest.raises(DistributedSetupError, match="did not finish within 3 s"):
        L.run_job([_spawner(tmp_path)], timeout=3)
    assert time.perf_counter() - start < 30
    child = _wait_for(tmp_path / "child.pid")
    assert not psutil.pid_exists(child) or psutil.Process(child).status() == psutil.STATUS_ZOMBIE


def test_ctrl_c_stops_the_whole_job(tmp_path):
    """SIGINT to the caller's process group (Ctrl-C in a terminal, or `make test`): run_job
    stops the launcher and the rank it started in another session, then re-raises."""
    driver = tmp_path / "driver.py"
    driver.write_text(textwrap.dedent(f"""\
        import sys
        from helpers import launch
        try:
            launch.run_job([{_spawner(tmp_path)!r}], timeout=120)
        except KeyboardInterrupt:
            print("interrupted cleanly", flush=True)
            sys.exit(130)
        """))
    proc = subprocess.Popen([sys.executable, str(driver)], stdout=subprocess.PIPE, text=True,
                            start_new_session=True)
    child = _wait_for(tmp_path / "child.pid")
    os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C sends
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 130 and "interrupted cleanly" in out
    assert not psutil.pid_exists(child) or psutil.Process(child).status() == psutil.STATUS_ZOMBIE


@pytest.mark.parametrize("failure", ["Gloo connectFullMesh failed with ... Connection refused",
                                     "DistNetworkError: The server socket has failed to listen ... code: -98, "
                                     "name: EADDRINUSE"])  # torchrun's store: another process took the port
def test_run_job_retries_when_the_ranks_could_not_connect(tmp_path, failure):
    counter = tmp_path / "attempts"
    flaky = [sys.executable, "-c", textwrap.dedent(f"""\
        import pathlib, sys
        p = pathlib.Path({str(counter)!r}); n = int(p.read_text()) if p.exists() else 0; p.write_text(str(n + 1))
        if n == 0:
            print({failure!r}); sys.exit(1)
        print("trained")
        """)]
    built = []
    job = L.run_job(lambda: built.append(1) or [flaky], retries=1, timeout=60)
    assert job.returncode == 0 and "trained" in job.output and len(built) == 2
    counter.unlink()
    job = L.run_job([flaky], timeout=60)  # no retries: the failure is returned as it is
    assert job.returncode == 1 and failure in job.output
    bad = [sys.executable, "-c", "import sys; print('error: bad option'); sys.exit(2)"]
    assert L.run_job([bad], retries=3, timeout=60).returncode == 2  # other failures are not retried


def test_a_failed_node_does_not_leave_the_other_waiting(tmp_path):
    """Node 1 dies at once; node 0 would wait for its rendezvous timeout: run_job stops it."""
    dead = [sys.executable, "-c", "import sys; sys.exit(3)"]
    start = time.perf_counter()
    job = L.run_job([_spawner(tmp_path), dead], timeout=120, grace=3)
    assert job.returncode == 3 and time.perf_counter() - start < 30   # the grace, not the 120 s timeout
    child = _wait_for(tmp_path / "child.pid")
    assert not psutil.pid_exists(child) or psutil.Process(child).status() == psutil.STATUS_ZOMBIE


# ----- measure_job: the course protocol over repeated jobs ----------------------------------------

def _fake_job(out, epoch_times, accuracy=50.0, steps=16, world_size=1, global_batch=32):
    """A launcher stand-in that writes the summary the entry point writes (measure_job's bookkeeping
    is under test here; real torchrun jobs run in test_distributed.py and in chapters 09/10)."""
    summary = {"epoch_times": epoch_times, "accuracy": accuracy, "steps": steps, "world_size": world_size,
               "global_batch": global_batch}
    return [[sys.executable, "-c", "import json, sys; open(sys.argv[1], 'w').write(sys.argv[2]); print('done')",
             str(out), json.dumps(summary)]]


def test_measure_job_protocol(tmp_path):
    calls = []

    def one(out):
        calls.append(out)
        return _fake_job(out, [9.0, 2.0 + len(calls), 7.0], accuracy=40.0 + len(calls), steps=24)

    res = L.measure_job("one", one, tmp_path)
    assert len(calls) == 1 and res.name == "one"
    assert res.warmup == [9.0]                           # the first epoch, kept apart
    assert res.samples == [5.0]                          # one sample: the median of the other epochs
    assert res.metrics == {"accuracy": 41.0, "steps": 24.0, "world_size": 1.0, "global_batch": 32.0}
    assert "done" in res.settings["last_output"] and res.settings["summary"]["steps"] == 24
    with pytest.raises(DistributedSetupError, match="--epochs >= 2"):
        L.measure_job("short", lambda out: _fake_job(out, [9.0]), tmp_path)
    with pytest.raises(DistributedSetupError, match="failed"):
        L.measure_job("bad", lambda out: [[sys.executable, "-c", "import sys; sys.exit(3)"]], tmp_path)


def test_measure_seeds_gives_one_result_per_seed_from_one_job(tmp_path):
    lines = []

    def job(out):
        runs = [{"epoch_times": [9.0, 2.0 + s, 4.0 + s], "accuracy": 60.0 + s, "steps": 8, "world_size": 2,
                 "global_batch": 64, "seed": s} for s in (3, 4)]
        line = [sys.executable, "-c", "import json, sys; open(sys.argv[1], 'w').write(sys.argv[2]); print('done')",
                str(out), json.dumps({"seeds": runs})]
        lines.append(line)
        return [line]

    a, b = L.measure_seeds("arm", job, tmp_path, [3, 4])
    assert len(lines) == 1                                   # one job for both seeds
    assert (a.name, b.name) == ("arm seed 3", "arm seed 4")
    assert (a.samples, a.warmup, b.samples) == ([6.0], [9.0], [7.0])  # epochs after the first, median
    assert a.metrics == {"accuracy": 63.0, "steps": 8.0, "world_size": 2.0, "global_batch": 64.0}
    with pytest.raises(DistributedSetupError, match="no summary per seed"):
        L.measure_seeds("one", lambda out: _fake_job(out, [9.0, 2.0]), tmp_path, [0, 1])


def test_job_arm_runs_a_fresh_job_per_call_and_keeps_its_output(tmp_path):
    calls, outputs = [], {}

    def one(out):
        calls.append(out)
        return _fake_job(out, [9.0, 2.0 + len(calls)])

    arm = L.job_arm("arm", one, tmp_path, outputs)
    first, second = arm(), arm()
    assert len(calls) == 2 and (first.samples, second.samples) == ([3.0], [4.0])  # a new job each call
    assert "done" in outputs["arm"]
    assert L.job_arm("quiet", one, tmp_path)().samples == [5.0]               # outputs are optional
    printing = lambda out: _fake_job(out, [9.0, 2.0]) + [[sys.executable, "-c",
                                                        "import os; print('NCCL_DEBUG=' + os.environ['NCCL_DEBUG'])"]]
    L.job_arm("env", printing, tmp_path, outputs, env={"NCCL_DEBUG": "WARN"})()   # env reaches the job's processes
    assert "NCCL_DEBUG=WARN" in outputs["env"]
