"""Tests of helpers.build_lock: an environment's build under a lock -- two builds at once build once, a failed or
killed build leaves the next to build, a Python without filelock goes through the lock tool. Stand-in builds only;
the Makefile's recipe with a stand-in build: test_environment.py."""

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import build_lock, install

ROOT = Path(__file__).resolve().parent.parent


# A stand-in for the 8 GB build: says it started, waits, counts itself, writes .installed (or fails: FAIL=1).
FAKE_BUILD = """
import os, pathlib, sys, time
venv, log = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
(log.parent / "started").touch()
while os.environ.get("HOLD") and not (log.parent / "release").exists():  # HOLD=1: build until the test says
    time.sleep(0.05)
with log.open("a") as f:
    f.write(f"built by {os.getpid()}\\n")
if os.environ.get("FAIL"):
    sys.exit(3)
venv.mkdir(parents=True, exist_ok=True)
(venv / ".installed").touch()
"""


def _build_locked(venv, log, python=sys.executable, flags=(), **env):
    return subprocess.Popen([python, *flags, "-m", "helpers.build_lock", "--venv", str(venv),
                             "--cache", str(venv.parent), "--", sys.executable, "-c", FAKE_BUILD, str(venv), str(log)],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, **env}, start_new_session=True)


def first_line(proc, seconds=60.0):
    """The first line ``proc`` prints, failing after ``seconds`` instead of hanging."""
    import select

    ready, _, _ = select.select([proc.stdout], [], [], seconds)
    assert ready, f"no output within {seconds} s"
    return proc.stdout.readline()


def _wait_for(path, seconds=30.0):
    end = time.monotonic() + seconds
    while not path.exists():
        assert time.monotonic() < end, f"{path} never appeared"
        time.sleep(0.05)


def test_two_setups_at_once_build_the_environment_once_and_the_second_reuses_it(tmp_path):
    venv, log = tmp_path / "cache" / "venv-py3.11-abc", tmp_path / "builds.log"
    first = _build_locked(venv, log, HOLD="1")
    _wait_for(tmp_path / "started")           # the first one holds the lock and is building
    second = _build_locked(venv, log)
    said = first_line(second)           # the second one waits, and says so; then the first one finishes
    (tmp_path / "release").touch()
    out1, out2 = first.communicate(timeout=60)[0], said + second.communicate(timeout=60)[0]
    assert first.returncode == 0 and second.returncode == 0, out1 + out2
    assert len(log.read_text().splitlines()) == 1, "built twice"
    assert (venv / ".installed").is_file() and build_lock.lock_path(venv) == venv.with_name("venv-py3.11-abc.lock")
    assert "Another `make setup` is building" in out2 and "waiting for it to finish" in out2
    assert f"{venv} is ready (built by the other run): reusing it" in out2
    assert "waiting" not in out1 and said.startswith(f"Another `make setup` is building {venv} (process {first.pid} (`")
    assert said.rstrip().endswith("waiting for it to finish, then reusing it")


def test_a_failed_or_killed_build_leaves_the_next_one_to_build(tmp_path):
    venv, log = tmp_path / "venv-x", tmp_path / "builds.log"
    failing = _build_locked(venv, log, FAIL="1", HOLD="1")
    _wait_for(tmp_path / "started")
    waiting = _build_locked(venv, log)
    said = first_line(waiting)
    (tmp_path / "release").touch()
    out = said + waiting.communicate(timeout=60)[0]
    assert failing.wait(timeout=60) == 3 and waiting.returncode == 0, out
    assert "did not finish" in out and "building it here" in out and len(log.read_text().splitlines()) == 2
    # kill -9 in the middle of a build: the kernel drops the lock, the next build does not hang
    (tmp_path / "started").unlink()
    (tmp_path / "release").unlink()
    venv2 = tmp_path / "venv-y"
    killed = _build_locked(venv2, log, HOLD="1")
    _wait_for(tmp_path / "started")
    os.killpg(killed.pid, signal.SIGKILL)  # the build-locked process and its build, as a killed make's group
    killed.communicate(timeout=10)
    start, said = time.monotonic(), []
    rc = build_lock.build_locked(venv2, [sys.executable, "-c", FAKE_BUILD, str(venv2), str(log)], say=said.append)
    assert rc == 0 and (venv2 / ".installed").is_file() and time.monotonic() - start < 30
    assert not any("waiting" in line for line in said), said


def test_build_locked_needs_a_command(tmp_path, capsys):
    with pytest.raises(install.InstallError, match="needs the build command"):
        build_lock.main(["--venv", str(tmp_path / "v"), "--"])
    assert build_lock.build_locked(tmp_path / "v", [sys.executable, "-c", "raise SystemExit(5)"], say=print) == 5


def _fake_lock_tool(folder):
    """A stand-in for the small filelock venv: a bin/python that runs this test's Python (which has filelock)."""
    python = build_lock.venv_python(folder)
    python.parent.mkdir(parents=True)
    python.write_text(f"#!/bin/sh\nexec {sys.executable} \"$@\"\n")
    python.chmod(0o755)


def test_a_python_without_filelock_takes_the_lock_through_the_lock_tool(tmp_path):
    """make runs build-locked with the system python3, which has no filelock (-S here: no site-packages)."""
    cache = tmp_path / "cache"
    _fake_lock_tool(cache / f".lock-tool-{install.python_tag()}")
    venv, log = cache / "venv-z", tmp_path / "builds.log"
    proc = _build_locked(venv, log, flags=("-S",))
    out = proc.communicate(timeout=60)[0]
    assert proc.returncode == 0, out
    assert (venv / ".installed").is_file() and len(log.read_text().splitlines()) == 1


def test_lock_tool_is_made_once_in_a_private_folder_and_renamed_into_place(tmp_path):
    made = []

    def make(folder):
        made.append(folder)
        assert folder.parent == tmp_path and folder.name.startswith(f".lock-tool-{install.python_tag()}.tmp-")
        _fake_lock_tool(folder)

    python = build_lock.lock_tool(tmp_path, make=make)
    assert python == build_lock.venv_python(tmp_path / f".lock-tool-{install.python_tag()}") and python.is_file()
    assert build_lock.lock_tool(tmp_path, make=make) == python and len(made) == 1  # made once
    assert sorted(p.name for p in tmp_path.iterdir()) == [f".lock-tool-{install.python_tag()}"]  # nothing left over

    other = tmp_path / "other"

    def race(folder):  # another clone renames its copy into place while this one is making its own
        _fake_lock_tool(folder)
        _fake_lock_tool(other / f".lock-tool-{install.python_tag()}")
        os.rename(other / f".lock-tool-{install.python_tag()}", other / "won")

    shutil.rmtree(tmp_path / f".lock-tool-{install.python_tag()}")
    (tmp_path / f".lock-tool-{install.python_tag()}").mkdir()  # a broken one (no python): replaced
    assert build_lock.lock_tool(tmp_path, make=race).is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == [f".lock-tool-{install.python_tag()}", "other"]


def test_filelock_requirement_follows_the_pins(tmp_path):
    pins = [install.parse_pin(p) for p in install.course_requirements(extras=())]
    pinned = [v for n, v, _ in pins if n == "filelock"]
    assert build_lock.filelock_requirement() == (f"filelock=={pinned[0]}" if pinned else "filelock")
    copy = tmp_path / "pyproject.toml"
    copy.write_text('[project]\nname = "x"\ndependencies = ["filelock==3.20.0", "torch==2.14.1"]\n')
    assert build_lock.filelock_requirement(copy) == "filelock==3.20.0"


def test_a_lock_tool_that_cannot_be_made_says_why(monkeypatch, tmp_path):
    def fail(cmd, **kwargs):
        return subprocess.CompletedProcess(cmd, 1, stdout="", stderr="ERROR: No matching distribution found for filelock")

    monkeypatch.setattr(build_lock.subprocess, "run", fail)
    with pytest.raises(install.InstallError, match="could not make the lock tool .*No matching distribution.*network"):
        build_lock.lock_tool(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == []   # the private folder is gone
