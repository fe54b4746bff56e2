"""helpers.processes: Job and Children, the worker's side (serve, worker_main), start-up and exit
(import_frozen, a frozen exit), and no orphans: a stand-in parent starts each kind of job (Job,
Children, a 2-rank torchrun and an mpirun job through helpers.launch) and is interrupted or killed; every
process of the job must be gone within 10 s, and its scratch folders too."""

import gc
import importlib
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil
import pytest

from helpers import launch, processes

ECHO = textwrap.dedent("""
    import os, sys, time
    from helpers import processes
    def handle(req):
        if req.get("sleep"):
            time.sleep(req["sleep"])
        if req.get("fail"):
            print("something broke inside", file=sys.stderr)
            sys.exit(3)
        return {"pid": os.getpid(), "echo": req.get("x"), "env": os.environ.get("MARK"), "at": time.time()}
    if os.environ.get("SLOW_START"):
        time.sleep(float(os.environ["SLOW_START"]))
    print("chatter that is not a result")
    processes.serve(handle)
""")


def cmd(**env):
    return ([sys.executable, "-c", ECHO], env)


def test_children_start_side_by_side_and_answer_in_turn():
    with processes.Children({"a": cmd(MARK="A"), "b": cmd(MARK="B")}) as kids:
        assert all(p.poll() is None for p in kids.procs.values())  # both started (and ready) before any request
        ra = kids.ask("a", {"x": 1})
        rb = kids.ask("b", {"x": 2})
        ra2 = kids.ask("a", {"x": 3})
        assert (ra["echo"], rb["echo"], ra2["echo"]) == (1, 2, 3)
        assert (ra["env"], rb["env"]) == ("A", "B")  # each child has its own environment
        assert ra["pid"] == ra2["pid"] != rb["pid"]  # long-lived: the same process answers again
        procs = list(kids.procs.values())
    assert all(p.poll() is not None for p in procs)  # stopped on exit


def test_failure_names_the_child_with_its_stderr():
    with processes.Children({"bad": cmd()}) as kids:
        with pytest.raises(processes.ChildError, match=r"(?s)'bad': the child process ended without a result.*broke inside"):
            kids.ask("bad", {"fail": True})


def test_timeouts_kill_the_child():
    with pytest.raises(processes.ChildError, match="did not start within 0.5 s"):
        with processes.Children({"slow": cmd(SLOW_START="30")}, startup_timeout=0.5):
            pass
    with processes.Children({"a": cmd()}) as kids:
        with pytest.raises(processes.ChildError, match="gave no result within 0.3 s"):
            kids.ask("a", {"sleep": 30}, timeout=0.3)
        assert kids.procs["a"].poll() is not None


def test_serve_protocol():
    code = "from helpers import processes; processes.serve(lambda req: {'double': req['n'] * 2})"
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    proc.stdin.write('{"n": 2}\n\n{"n": 5}\nSTOP\n{"n": 9}\n')
    proc.stdin.flush()  # kept open: a closed input mid-request would stop the worker
    assert proc.stdout.read().splitlines() == [processes.READY, 'RESULT {"double": 4}', 'RESULT {"double": 10}']
    assert proc.wait(timeout=60) == 0
    proc.stdin.close()
    proc.stdout.close()
    assert processes.tail("a\n\nb\nc\n", 2) == "b\nc"


def _ended(pid):
    import psutil

    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_stop_with_kill_kills_the_child_and_what_it_started():
    import os
    import subprocess
    import time

    # a child (own session, as Children starts it) that starts a worker of its own and waits
    code = ("import subprocess, sys, time\n"
            "w = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'])\n"
            "print(w.pid, flush=True)\ntime.sleep(120)\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, start_new_session=True)
    worker = int(proc.stdout.readline())
    assert os.getpgid(worker) == proc.pid  # the worker is in the child's process group
    processes.stop([proc], processes.KILL)
    assert proc.returncode == -9
    end = time.monotonic() + 10
    while not _ended(worker):  # SIGKILL to the group: the worker ends too (a zombie until it is reaped)
        assert time.monotonic() < end, "the child's worker survived the stop"
        time.sleep(0.05)
    proc.stdout.close()
    processes.stop([proc], processes.KILL)  # an ended child: nothing to kill, no error
    assert proc.returncode == -9


def test_stop_leaves_finished_processes_alone_and_stops_the_rest(monkeypatch):
    """A launcher that already exited gets no signal and costs no wait for the grace period;
    a live one beside it is still stopped, by SIGTERM to its process group."""
    signalled = []
    real_killpg = os.killpg
    monkeypatch.setattr(processes.os, "killpg", lambda pgid, sig: signalled.append((pgid, sig)) or real_killpg(pgid, sig))
    done = subprocess.Popen([sys.executable, "-c", "pass"], start_new_session=True)
    done.wait()
    start = time.perf_counter()
    processes.stop([done], ((signal.SIGTERM, 10), (signal.SIGKILL, 10)))
    assert signalled == [] and done.returncode == 0 and time.perf_counter() - start < 5
    running = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True)
    start = time.perf_counter()
    processes.stop([done, running], ((signal.SIGTERM, 10), (signal.SIGKILL, 10)))
    assert signalled == [(running.pid, signal.SIGTERM)] and done.returncode == 0
    assert running.poll() is not None and not psutil.pid_exists(running.pid)
    assert time.perf_counter() - start < 5  # SIGTERM stopped it: no SIGKILL after the 10 s grace


def test_job_merges_output_reports_the_first_failure_and_stops_the_others_after_grace():
    ok = [sys.executable, "-c", "import sys; print('out'); print('err', file=sys.stderr)"]
    failing = [sys.executable, "-c", "import sys; sys.exit(4)"]
    sleeper = [sys.executable, "-c", "import time; time.sleep(60)"]
    done = processes.Job([ok]).start().wait(timeout=60)
    assert done.returncode == 0 and "out" in done.output and "err" in done.output and done.seconds < 60
    start = time.perf_counter()
    mixed = processes.Job([sleeper, failing]).start().wait(timeout=60, grace=1)
    assert mixed.returncode != 0 and time.perf_counter() - start < 30  # the sleeper was stopped after 1 s


def test_job_timeout_stops_everything_and_keeps_the_output():
    talker = [sys.executable, "-c", "import time; print('started', flush=True); time.sleep(60)"]
    job = processes.Job([talker]).start()
    with pytest.raises(processes.JobTimeout, match="did not finish within 2 s") as caught:
        job.wait(timeout=2)
    assert "started" in caught.value.output
    assert all(p.poll() is not None for p in job.procs)


def test_import_frozen_pauses_the_collector_then_freezes_and_restores_it(monkeypatch):
    seen = []
    real = importlib.import_module
    monkeypatch.setattr(processes.importlib, "import_module", lambda name: seen.append((name, gc.isenabled())) or real(name))
    before = gc.get_freeze_count()
    try:
        processes.import_frozen("json", "colorsys")
        assert seen == [("json", False), ("colorsys", False)]  # imported with the collector off
        assert gc.isenabled() and gc.get_freeze_count() > before  # back on, the objects moved out of its reach
    finally:
        gc.unfreeze()


def test_import_frozen_restores_the_collector_after_a_failed_import():
    try:
        with pytest.raises(ModuleNotFoundError):
            processes.import_frozen("no_such_module_for_the_course")
        assert gc.isenabled()
        gc.disable()
        with pytest.raises(ModuleNotFoundError):
            processes.import_frozen("no_such_module_for_the_course")
        assert not gc.isenabled()  # a collector that was off stays off
    finally:
        gc.enable()
        gc.unfreeze()


DEADLINE_S = 10.0
SERVED = textwrap.dedent("""
    import time
    from helpers import processes
    processes.serve(lambda req: time.sleep(req["sleep"]) or {})
""")
# The stand-in parent: starts one kind of job, prints "PIDS [...]" (every process of the job), then
# waits on the job until the test interrupts or kills it.
PARENT = textwrap.dedent("""
    import json, os, subprocess, sys, threading, time
    import psutil
    from helpers import launch, processes

    kind = sys.argv[1]
    SLEEPER = [sys.executable, "-c", "import time; time.sleep(60)"]
    SERVED = sys.argv[2]
    ENTRY = ["--dataset", "fashionmnist", "--train-size", "64", "--test-size", "64", "--batch-size", "32",
             "--epochs", "100000", "--no-pin", "--threads", "1"]

    def say(pids):
        print("PIDS " + json.dumps(sorted(set(pids))), flush=True)

    jobs = []

    class Job(processes.Job):  # keeps the job, to read its output while run_job waits for it
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
        job = processes.Job([SLEEPER, SLEEPER])
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
        with processes.Children({"a": ([sys.executable, "-c", SERVED], None)}) as kids:
            say([kids.procs["a"].pid])
            kids.ask("a", {"sleep": 60})
    elif kind == "served-unguarded":  # serve's own watcher, without the guard's help
        proc = subprocess.Popen([sys.executable, "-c", SERVED], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                text=True, start_new_session=True)
        assert proc.stdout.readline().strip() == processes.READY
        proc.stdin.write('{"sleep": 60}\\n')
        proc.stdin.flush()
        say([proc.pid])
        proc.wait()
    else:  # the real launchers; stand-in ranks that do not import torch, but for "torchrun-real"
        RANK = [sys.executable, "-c", "import time; print('stand-in rank', flush=True); time.sleep(120)"]
        marker = ": all_reduce(rank+1)" if kind == "torchrun-real" else "stand-in rank"

        def line():  # a new port on every attempt: a parallel test may take the free one first
            if kind == "torchrun-real":
                return [launch.torchrun_command(2, ENTRY)]
            if kind == "torchrun":
                return [[sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2",
                         f"--master-port={launch.free_port()}", "--no-python", *RANK]]
            return [["mpirun", *(["--allow-run-as-root"] if os.geteuid() == 0 else []), "--oversubscribe",
                     "--bind-to", "none", "-np", "2", "-x", "MASTER_ADDR=127.0.0.1", "-x",
                     f"MASTER_PORT={launch.free_port()}", *RANK]]  # mpirun's own line, stand-in ranks
        threading.Thread(target=ranks_started, args=(marker,), daemon=True).start()
        launch.run_job(line, timeout=120, env={"COURSE_DATA": "standin", "COURSE_PROFILE": "smoke"}, retries=2)
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
    def torchrun(*rank):  # a new port on every attempt: a parallel test may take the free one first
        return lambda: [[sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2",
                         f"--master-port={launch.free_port()}", "--no-python", *rank]]
    ok = launch.run_job(torchrun("sh", "-c", 'ls -d "$TMPDIR"/torchelastic_*'), timeout=120, retries=2)
    assert ok.returncode == 0 and str(launch.scratch_root()) in ok.output and "torchelastic_" in ok.output
    failed = launch.run_job(torchrun("false"), timeout=120, retries=2)
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
    line = processes.guard(["echo", "hi"])
    assert line[0] == sys.executable and line[-3:] == ["--", "echo", "hi"] and "exec" in line
    watched = lambda command: ThreadPoolExecutor(1).submit(processes.guard, command).result()  # noqa: E731
    assert "watch" in watched(["echo"])  # off the main thread the wrapper watches (PR_SET_PDEATHSIG follows threads)
    out = subprocess.run(processes.guard([sys.executable, "-c", "import sys; sys.exit(5)"]))
    assert out.returncode == 5  # the command's own exit status, in both modes
    out = subprocess.run(watched([sys.executable, "-c", "import os; os.kill(os.getpid(), 15)"]))
    assert out.returncode == -15
    assert not processes.orphaned() and not processes.orphaned(os.getppid()) and processes.orphaned(os.getppid() + 1)
    with pytest.raises(FileNotFoundError):
        processes.Job([["no-such-command-here"]]).start()
    if sys.platform.startswith("linux"):
        # in a child: PR_SET_PDEATHSIG is set (read back with PR_GET_PDEATHSIG)
        code = ("import ctypes, sys\nfrom helpers import processes\nassert processes.die_with_parent()\n"
                "v = ctypes.c_int()\nctypes.CDLL(None).prctl(2, ctypes.byref(v), 0, 0, 0)\nprint(v.value)")
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        assert out.stdout.strip() == str(int(signal.SIGTERM)), out.stderr


def test_worker_main_imports_frozen_and_serves_what_the_module_builds(tmp_path):
    (tmp_path / "echo_worker.py").write_text(textwrap.dedent("""
        import gc, sys
        def worker(argv):
            print("noise from the worker", flush=True)  # quiet_stdout: it goes to stderr, not to the protocol
            return lambda req: {"argv": argv, "x": req["x"], "torch": "torch" in sys.modules,
                                "frozen": gc.get_freeze_count() > 0}
    """))
    code = "from helpers.processes import worker_main; worker_main('echo_worker', quiet_stdout=True)"
    env = {"PYTHONPATH": os.pathsep.join([str(tmp_path), os.getcwd()])}
    with processes.Children({"w": ([sys.executable, "-c", code, "a", "b"], env)}) as kids:
        assert kids.ask("w", {"x": 3}) == {"argv": ["a", "b"], "x": 3, "torch": True, "frozen": True}
        assert "noise from the worker" in kids.stderr("w")
        proc = kids.procs["w"]
    assert proc.returncode == 0
