"""A killed parent leaves nothing behind: a stand-in parent process starts each kind of job
(``Job``, ``Children``, a 2-rank torchrun and an mpirun job through ``helpers.launch``), prints
the job's pids, and is interrupted (SIGINT) or killed (SIGKILL); every process of the job must
be gone within 10 s. Jobs' scratch folders (torchrun's ``torchelastic_*``) must be gone too."""

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import psutil
import pytest

from helpers import children, launch, orphans

DEADLINE_S = 10.0
SERVED = textwrap.dedent("""
    import time
    from helpers import children
    children.serve(lambda req: time.sleep(req["sleep"]) or {})
""")
# The stand-in parent: starts one kind of job, prints "PIDS [...]" (every process of the job), then
# waits on the job until the test interrupts or kills it.
PARENT = textwrap.dedent("""
    import json, os, subprocess, sys, threading, time
    import psutil
    from helpers import children, launch

    kind = sys.argv[1]
    SLEEPER = [sys.executable, "-c", "import time; time.sleep(60)"]
    SERVED = sys.argv[2]
    ENTRY = ["--dataset", "fashionmnist", "--train-size", "64", "--test-size", "64", "--batch-size", "32",
             "--epochs", "100000", "--no-pin", "--threads", "1"]

    def say(pids):
        print("PIDS " + json.dumps(sorted(set(pids))), flush=True)

    jobs = []

    class Job(children.Job):  # keeps the job, to read its output while run_job waits for it
        def start(self):
            jobs.append(self)
            return super().start()

    launch.Job = Job

    def ranks_started(marker):  # torchrun / mpirun: wait until both ranks have started (and print nothing
        while not jobs or jobs[0].output.count(marker) < 2:  # more: a print would fail on the dead parent's
            time.sleep(0.1)                                   # pipe, and end the job without our help)
        time.sleep(0.5)
        say([p.pid for p in psutil.Process().children(recursive=True)])

    if kind in ("job", "job-thread"):
        job = children.Job([SLEEPER, SLEEPER])
        if kind == "job":
            job.start()
        else:  # started from another thread: the guard watches instead of PR_SET_PDEATHSIG
            t = threading.Thread(target=job.start)
            t.start()
            t.join()
            while not all(psutil.Process(p.pid).children() for p in job.procs):  # the wrappers' commands
                time.sleep(0.05)
        time.sleep(0.5)
        say([q.pid for p in job.procs for q in [psutil.Process(p.pid), *psutil.Process(p.pid).children(True)]])
        job.wait(60)
    elif kind == "children":
        with children.Children({"a": ([sys.executable, "-c", SERVED], None)}) as kids:
            say([kids.procs["a"].pid])
            kids.ask("a", {"sleep": 60})
    elif kind == "served-unguarded":  # serve's own watcher, without the guard's help
        proc = subprocess.Popen([sys.executable, "-c", SERVED], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                text=True, start_new_session=True)
        assert proc.stdout.readline().strip() == children.READY
        proc.stdin.write('{"sleep": 60}\\n')
        proc.stdin.flush()
        say([proc.pid])
        proc.wait()
    else:  # the real launchers; stand-in ranks that do not import torch, but for "torchrun-real"
        RANK = [sys.executable, "-c", "import time; print('stand-in rank', flush=True); time.sleep(120)"]
        marker = "stand-in rank"
        if kind == "torchrun-real":
            line, marker = launch.torchrun_command(2, ENTRY), ": all_reduce(rank+1)"
        elif kind == "torchrun":
            line = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2",
                    f"--master-port={launch.free_port()}", "--no-python", *RANK]
        else:  # mpirun's own line, with the stand-in for the entry point
            line = launch.mpirun_command(2, [], check=False)[:-1 - len(launch.ENTRY)] + RANK
        threading.Thread(target=ranks_started, args=(marker,), daemon=True).start()
        launch.run_job([line], timeout=120, env={"COURSE_DATA": "standin", "COURSE_PROFILE": "smoke"})
""")


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _start_parent(kind: str, timeout: float = 120.0) -> tuple[subprocess.Popen, list[int]]:
    """Start the stand-in parent; return it with the pids it printed."""
    parent = subprocess.Popen([sys.executable, "-c", PARENT, kind, SERVED], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(parent.stdout.readline, "")), daemon=True)
    reader.start()
    end = time.monotonic() + timeout
    while not any(ln.startswith("PIDS ") for ln in lines):
        if parent.poll() is not None or time.monotonic() > end:
            reader.join(5)
            _kill([parent.pid], parent)
            pytest.fail(f"the stand-in parent printed no pids (exit {parent.returncode}):\n{''.join(lines)[-3000:]}")
        time.sleep(0.05)
    pids = json.loads(next(ln for ln in lines if ln.startswith("PIDS "))[5:])
    assert pids and all(_alive(p) for p in pids)
    return parent, pids


def _kill(pids: list[int], parent: subprocess.Popen | None = None) -> None:
    """Leave nothing behind, also when a test failed."""
    for pid in pids:
        if _alive(pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    if parent is not None:
        parent.kill()
        parent.wait()
        parent.stdout.close()
        launch.reclaim_scratch()  # the folder of a job whose parent was killed


def _check_all_end(parent: subprocess.Popen, pids: list[int], sig: int) -> None:
    """Send ``sig`` to the parent, then poll until no process of its job is left (at most 10 s)."""
    start = time.monotonic()
    parent.send_signal(sig)
    try:
        while [p for p in pids if _alive(p)]:
            left = [p for p in pids if _alive(p)]
            assert time.monotonic() - start < DEADLINE_S, \
                f"{len(left)} process(es) of the job still run {DEADLINE_S:g} s after the parent got signal {sig}: " \
                + ", ".join(" ".join(psutil.Process(p).cmdline()[:6]) for p in left if _alive(p))
            time.sleep(0.1)
        parent.wait(timeout=30)
    finally:
        _kill(pids, parent)


def _no_scratch_of(pid: int) -> bool:
    root = launch.scratch_root()
    return not root.is_dir() or not [f for f in root.iterdir() if f.name.startswith(f"{pid}-")]


@pytest.mark.parametrize("kind,sig", [("job", signal.SIGINT), ("job", signal.SIGKILL), ("job-thread", signal.SIGKILL),
                                      ("children", signal.SIGINT), ("children", signal.SIGKILL),
                                      ("served-unguarded", signal.SIGKILL)])
def test_stand_in_children_end_with_their_parent(kind, sig):
    parent, pids = _start_parent(kind)
    _check_all_end(parent, pids, sig)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL])
def test_torchrun_job_ends_with_its_parent_and_leaves_no_folder(sig):
    parent, pids = _start_parent("torchrun")
    assert len(pids) >= 3  # the torchrun agent (behind the guard) and its two ranks
    _check_all_end(parent, pids, sig)
    launch.reclaim_scratch()  # after a SIGKILL the next job's start removes the dead parent's folder
    assert _no_scratch_of(parent.pid)  # (and the jobs' root with it, when no other job is running)


def test_ranks_end_when_torchrun_itself_is_killed():
    """torchrun's agent stops its ranks on SIGTERM, not when it is SIGKILLed: the entry point's ranks
    (real ones here) watch it themselves."""
    parent, pids = _start_parent("torchrun-real")
    agent = [p for p in pids if _alive(p) and "torch.distributed.run" in psutil.Process(p).cmdline()]
    ranks = [p for p in pids if p not in agent]
    assert len(agent) == 1 and len(ranks) >= 2
    try:
        os.kill(agent[0], signal.SIGKILL)
        end = time.monotonic() + DEADLINE_S
        while [p for p in ranks if _alive(p)]:
            assert time.monotonic() < end, "the ranks outlived their killed torchrun agent"
            time.sleep(0.1)
        parent.wait(timeout=30)  # the parent's job ended (failed): it removed its folder itself
        assert _no_scratch_of(parent.pid)
    finally:
        _kill(pids, parent)


@pytest.mark.skipif(shutil.which("mpirun") is None, reason="Open MPI (mpirun) is not installed")
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL])
def test_mpirun_job_ends_with_its_parent(sig):
    parent, pids = _start_parent("mpirun")
    _check_all_end(parent, pids, sig)
    launch.reclaim_scratch()
    assert _no_scratch_of(parent.pid)


def _elastic_folders(root: Path) -> list[Path]:
    return list(root.rglob("torchelastic_*"))


def test_a_two_rank_job_leaves_no_folder(tmp_path, monkeypatch):
    """torchrun writes a torchelastic_* folder per job: it lives in the job's own TMPDIR and goes with it,
    whether the job succeeds or fails. (Counted in an empty temporary folder of its own: other tests'
    jobs may run beside this one.)"""
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr("tempfile.tempdir", None)  # gettempdir() reads TMPDIR again
    before = _elastic_folders(tmp_path), sorted(tmp_path.iterdir())
    assert before == ([], [])
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2",
                f"--master-port={launch.free_port()}", "--no-python"]
    show = ["sh", "-c", 'ls -d "$TMPDIR"/torchelastic_*']
    ok = launch.run_job([torchrun + show], timeout=120)
    assert ok.returncode == 0 and str(launch.scratch_root()) in ok.output and "torchelastic_" in ok.output
    failed = launch.run_job([torchrun + ["false"]], timeout=120)
    assert failed.returncode != 0
    assert _elastic_folders(tmp_path) == [] and sorted(tmp_path.iterdir()) == []  # the jobs' root folder too


def test_reclaim_scratch_removes_only_folders_of_dead_processes(tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr("tempfile.tempdir", None)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    root = launch.scratch_root()
    root.mkdir()
    (root / f"{dead.pid}-abc" / "torchelastic_x").mkdir(parents=True)
    (root / f"{os.getpid()}-def").mkdir()
    (root / "not-a-job").mkdir()
    assert launch.reclaim_scratch() == [root / f"{dead.pid}-abc"]
    assert sorted(p.name for p in root.iterdir()) == [f"{os.getpid()}-def", "not-a-job"]
    with launch.job_scratch() as scratch:
        assert scratch.parent == root and scratch.name.startswith(f"{os.getpid()}-")
        (scratch / "torchelastic_y").mkdir()
    assert not scratch.exists() and root.exists()  # the root stays while other folders are in it
    shutil.rmtree(root / "not-a-job")
    shutil.rmtree(root / f"{os.getpid()}-def")
    with launch.job_scratch():
        pass
    assert not root.exists()


def test_guard_and_die_with_parent():
    line = orphans.guard(["echo", "hi"])
    assert line[0] == sys.executable and line[-3:] == ["--", "echo", "hi"] and "exec" in line
    assert "watch" in orphans.guard(["echo"], watch=True)
    out = subprocess.run(orphans.guard([sys.executable, "-c", "import sys; sys.exit(5)"]))
    assert out.returncode == 5  # the command's own exit status, in both modes
    out = subprocess.run(orphans.guard([sys.executable, "-c", "import os; os.kill(os.getpid(), 15)"], watch=True))
    assert out.returncode == -15
    assert not orphans.orphaned() and not orphans.orphaned(os.getppid()) and orphans.orphaned(os.getppid() + 1)
    with pytest.raises(FileNotFoundError):
        children.Job([["no-such-command-here"]]).start()
    if sys.platform.startswith("linux"):
        # in a child: PR_SET_PDEATHSIG is set (read back with PR_GET_PDEATHSIG)
        code = ("import ctypes, sys\nfrom helpers import orphans\nassert orphans.die_with_parent()\n"
                "v = ctypes.c_int()\nctypes.CDLL(None).prctl(2, ctypes.byref(v), 0, 0, 0)\nprint(v.value)")
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        assert out.stdout.strip() == str(int(signal.SIGTERM)), out.stderr
