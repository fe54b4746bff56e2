"""helpers.locks with stand-in holders: child processes that import helpers.locks only (no torch)."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import locks

ROOT = Path(__file__).resolve().parent.parent
HOLDER = ("import sys\nfrom helpers import locks\n"
          "with locks.hold(sys.argv[1], wait=None, what='the thing'):\n"
          "    print('held', flush=True)\n    sys.stdin.read()\n")


def start_holder(path):
    """A child process that holds ``path`` until its stdin closes (or it is killed)."""
    child = subprocess.Popen([sys.executable, "-c", HOLDER, str(path)], cwd=ROOT, stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "held"
    return child


def test_a_held_lock_is_refused_naming_its_holder_then_taken_when_released(tmp_path, capsys):
    path = tmp_path / "sub" / "x.lock"
    child = start_holder(path)
    try:
        assert locks.holder(path)["pid"] == child.pid and "-c" in locks.holder(path)["command"]
        start = time.monotonic()
        with pytest.raises(locks.Held, match=rf"the thing is in use by process {child.pid} \(`.*`\): let it finish"):
            with locks.hold(path, wait=0.3, what="the thing"):
                pass
        assert 0.3 <= time.monotonic() - start < 3
    finally:
        child.stdin.close()  # it releases the lock and exits
    with locks.hold(path, wait=None, what="the thing") as held:  # waits for the release, however long
        assert held == path and locks.holder(path)["pid"] == os.getpid()
    assert child.wait(10) == 0
    assert locks.holder(path) is None  # the side file goes with the lock
    assert "took over" not in capsys.readouterr().err  # a released lock is not a stale one


def test_a_lock_whose_holder_was_killed_is_taken_over_with_a_note(tmp_path, capsys):
    path = tmp_path / "x.lock"
    child = start_holder(path)
    os.kill(child.pid, signal.SIGKILL)  # no clean-up runs: the holder file stays behind
    child.wait(10)
    child.stdin.close()
    child.stdout.close()
    assert locks.holder(path)["pid"] == child.pid
    start = time.monotonic()
    with locks.hold(path, wait=3, what="the thing"):
        pass
    assert time.monotonic() - start < 1  # the operating system released the lock: no wait, never a hang
    err = capsys.readouterr().err
    assert f"note: the thing: took over the lock of process {child.pid}" in err and "no longer running" in err
    assert err.count("\n") == 1 and locks.holder(path) is None


def test_holder_and_describe(tmp_path):
    assert locks.holder(tmp_path / "none.lock") is None
    (tmp_path / "bad.lock.holder").write_text("not json")
    assert locks.holder(tmp_path / "bad.lock") is None
    assert locks.describe(None) == "another process"
    assert locks.describe({"pid": 5, "command": "python -m x"}) == "process 5 (`python -m x`)"
    assert locks.describe({"pid": 5, "command": ""}) == "process 5"
    assert issubclass(locks.Held, TimeoutError)


def test_importing_locks_loads_no_torch():
    code = "import sys; from helpers import locks; print('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                          check=True).stdout.strip() == "False"

