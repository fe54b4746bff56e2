import io
import os
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

from helpers import children

ECHO = textwrap.dedent("""
    import os, sys, time
    from helpers import children
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
    children.serve(handle)
""")


def cmd(**env):
    return ([sys.executable, "-c", ECHO], env)


def test_children_start_side_by_side_and_answer_in_turn():
    with children.Children({"a": cmd(MARK="A"), "b": cmd(MARK="B")}) as kids:
        ra = kids.ask("a", {"x": 1})
        rb = kids.ask("b", {"x": 2})
        ra2 = kids.ask("a", {"x": 3})
        assert (ra["echo"], rb["echo"], ra2["echo"]) == (1, 2, 3)
        assert (ra["env"], rb["env"]) == ("A", "B")  # each child has its own environment
        assert ra["pid"] == ra2["pid"] != rb["pid"]  # long-lived: the same process answers again
        assert max(kids.ready_at.values()) < ra["at"]  # both were ready before the first worked
        procs = list(kids.procs.values())
    assert all(p.poll() is not None for p in procs)  # stopped on exit


def test_failure_names_the_child_with_its_stderr():
    with children.Children({"bad": cmd()}) as kids:
        with pytest.raises(children.ChildError, match=r"(?s)'bad': the child process ended without a result.*broke inside"):
            kids.ask("bad", {"fail": True})


def test_timeouts_kill_the_child():
    with pytest.raises(children.ChildError, match="did not start within 0.5 s"):
        with children.Children({"slow": cmd(SLOW_START="30")}, startup_timeout=0.5):
            pass
    with children.Children({"a": cmd()}) as kids:
        with pytest.raises(children.ChildError, match="gave no result within 0.3 s"):
            kids.ask("a", {"sleep": 30}, timeout=0.3)
        assert kids.procs["a"].poll() is not None


def test_serve_protocol_in_process():
    out = io.StringIO()
    children.serve(lambda req: {"double": req["n"] * 2}, stdin=io.StringIO('{"n": 2}\n\n{"n": 5}\nSTOP\n{"n": 9}\n'),
                   stdout=out)
    assert out.getvalue().splitlines() == [children.READY, 'RESULT {"double": 4}', 'RESULT {"double": 10}']
    assert children.tail("a\n\nb\nc\n", 2) == "b\nc"
    with pytest.raises(ValueError):
        children.Children({})


def _ended(pid):
    import psutil

    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_kill_group_kills_the_child_and_what_it_started():
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
    children.kill_group(proc)
    assert proc.returncode == -9
    end = time.monotonic() + 10
    while not _ended(worker):  # SIGKILL to the group: the worker ends too (a zombie until it is reaped)
        assert time.monotonic() < end, "the child's worker survived kill_group"
        time.sleep(0.05)
    proc.stdout.close()
    children.kill_group(proc)  # an ended child: nothing to kill, no error
    assert proc.returncode == -9


def test_stop_leaves_finished_processes_alone_and_stops_the_rest(monkeypatch):
    """A launcher that already exited gets no signal and costs no wait for the grace period;
    a live one beside it is still stopped, by SIGTERM to its process group."""
    signalled = []
    real_killpg = os.killpg
    monkeypatch.setattr(children.os, "killpg", lambda pgid, sig: signalled.append((pgid, sig)) or real_killpg(pgid, sig))
    done = subprocess.Popen([sys.executable, "-c", "pass"], start_new_session=True)
    done.wait()
    start = time.perf_counter()
    children.stop([done], ((signal.SIGTERM, 10), (signal.SIGKILL, 10)))
    assert signalled == [] and done.returncode == 0 and time.perf_counter() - start < 5
    running = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True)
    start = time.perf_counter()
    children.stop([done, running], ((signal.SIGTERM, 10), (signal.SIGKILL, 10)))
    assert signalled == [(running.pid, signal.SIGTERM)] and done.returncode == 0
    assert running.poll() is not None and not psutil.pid_exists(running.pid)
    assert time.perf_counter() - start < 5  # SIGTERM stopped it: no SIGKILL after the 10 s grace


def test_job_merges_output_reports_the_first_failure_and_stops_the_others_after_grace():
    ok = [sys.executable, "-c", "import sys; print('out'); print('err', file=sys.stderr)"]
    failing = [sys.executable, "-c", "import sys; sys.exit(4)"]
    sleeper = [sys.executable, "-c", "import time; time.sleep(60)"]
    done = children.Job([ok]).start().wait(timeout=60)
    assert done.returncode == 0 and "out" in done.output and "err" in done.output and done.seconds < 60
    start = time.perf_counter()
    mixed = children.Job([sleeper, failing]).start().wait(timeout=60, grace=1)
    assert mixed.returncode != 0 and time.perf_counter() - start < 30  # the sleeper was stopped after 1 s
    with pytest.raises(ValueError):
        children.Job([])


def test_job_timeout_stops_everything_and_keeps_the_output():
    talker = [sys.executable, "-c", "import time; print('started', flush=True); time.sleep(60)"]
    job = children.Job([talker]).start()
    with pytest.raises(children.JobTimeout, match="did not finish within 2 s") as caught:
        job.wait(timeout=2)
    assert "started" in caught.value.output
    assert all(p.poll() is not None for p in job.procs)
