"""The course's one child-process runner: long-lived children that start side by side and take turns.

A child is any command that speaks a small line protocol on stdin/stdout:

* after its start-up (imports, data) it prints ``READY`` on a line of its own and waits;
* for every request line (one JSON object) it does the work and prints one line
  ``RESULT <json>``; other output lines are ignored, stderr is kept for error messages;
* a line ``STOP`` (or the end of stdin) ends it.

``Children`` starts every child at once (start-ups overlap and are never timed), then lets the
caller ask one child at a time, so no two measured pieces of work ever run side by side.
Each child runs in its own process group: on an error, a timeout or Ctrl-C the whole group
(a child's own workers included) is killed, and the message names the child and ends with the
last lines of its stderr. ``serve`` is the child's side of the protocol.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any, Callable, Mapping, Sequence

READY, STOP, RESULT = "child-ready", "STOP", "RESULT "


class ChildError(RuntimeError):
    """A child failed, timed out or broke the protocol; the message names it."""


def kill_group(proc: subprocess.Popen) -> None:
    """Kill ``proc`` and everything in its process group (started with ``start_new_session``)."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            proc.kill()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass


def tail(text: str, lines: int = 5) -> str:
    """The last ``lines`` non-empty lines of ``text``."""
    return "\n".join([ln for ln in text.strip().splitlines() if ln.strip()][-lines:])


class Children:
    """Long-lived child processes, ``{name: (argv, extra_env)}``, started side by side.

    Use as a context manager: ``with Children(cmds) as kids: kids.ask("a", {...})``. On exit
    every child is told to stop and, if it does not within ``grace`` seconds, killed.
    """

    def __init__(self, commands: Mapping[str, tuple[Sequence[str], Mapping[str, str] | None]], *,
                 startup_timeout: float = 600.0, grace: float = 10.0, cwd: str | None = None) -> None:
        if not commands:
            raise ValueError("Children needs at least one command")
        self.commands = {name: (list(argv), dict(env or {})) for name, (argv, env) in commands.items()}
        self.startup_timeout, self.grace, self.cwd = startup_timeout, grace, cwd
        self.procs: dict[str, subprocess.Popen[str]] = {}
        self.logs: dict[str, Any] = {}
        self.ready_at: dict[str, float] = {}

    def __enter__(self) -> "Children":
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def start(self) -> None:
        """Start every child, then wait until each has printed its ready line."""
        for name, (argv, env) in self.commands.items():
            self.logs[name] = tempfile.TemporaryFile("w+")
            self.procs[name] = subprocess.Popen(
                argv, env={**os.environ, **env}, cwd=self.cwd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                stderr=self.logs[name], text=True, start_new_session=True)
        deadline = time.monotonic() + self.startup_timeout
        for name in self.procs:
            if self._read_until(name, lambda line: line == READY, deadline) is None:
                raise self._error(name, f"did not start within {self.startup_timeout:g} s"
                                  if time.monotonic() >= deadline else "ended before it was ready")
            self.ready_at[name] = time.time()

    def ask(self, name: str, request: Mapping[str, Any] | None = None, timeout: float = 3600.0) -> dict[str, Any]:
        """Send one request to child ``name`` and return its result (a dict)."""
        proc = self.procs[name]
        if proc.poll() is not None:
            raise self._error(name, "is no longer running")
        assert proc.stdin is not None
        try:
            proc.stdin.write(json.dumps(dict(request or {})) + "\n")
            proc.stdin.flush()
        except BrokenPipeError:
            raise self._error(name, "closed its input") from None
        line = self._read_until(name, lambda ln: ln.startswith(RESULT), time.monotonic() + timeout)
        if line is None:
            try:  # its output ended: give an exiting child a moment, so the message says what happened
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
            raise self._error(name, f"gave no result within {timeout:g} s" if proc.poll() is None or
                              proc.returncode == -signal.SIGKILL else "ended without a result")
        return json.loads(line[len(RESULT):])

    def stderr(self, name: str) -> str:
        log = self.logs[name]
        log.flush()
        log.seek(0)
        text = log.read()
        log.seek(0, 2)
        return text

    def close(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None and proc.stdin is not None:
                try:
                    proc.stdin.write(STOP + "\n")
                    proc.stdin.close()
                except (BrokenPipeError, ValueError, OSError):
                    pass
        end = time.monotonic() + self.grace
        for proc in self.procs.values():
            try:
                proc.wait(timeout=max(0.0, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            kill_group(proc)
            if proc.stdout is not None:
                proc.stdout.close()
        for log in self.logs.values():
            log.close()
        self.logs = {}

    def _read_until(self, name: str, wanted: Callable[[str], bool], deadline: float) -> str | None:
        proc = self.procs[name]
        assert proc.stdout is not None
        timer = threading.Timer(max(0.0, deadline - time.monotonic()), kill_group, args=(proc,))
        timer.start()
        try:
            for line in iter(proc.stdout.readline, ""):
                if wanted(line.rstrip("\n")):
                    return line.rstrip("\n")
            return None
        finally:
            timer.cancel()

    def _error(self, name: str, what: str) -> ChildError:
        proc = self.procs[name]
        if proc.poll() is None:
            kill_group(proc)
        err = tail(self.stderr(name)) if name in self.logs else ""
        return ChildError(f"{name!r}: the child process {what} (exit {proc.returncode})" + (f":\n{err}" if err else ""))


def serve(handle: Callable[[dict[str, Any]], dict[str, Any]], *, stdin: Any = None, stdout: Any = None) -> None:
    """The child's side: print the ready line, answer each request line with ``handle``, stop on STOP/EOF."""
    stdin = stdin or sys.stdin
    stdout = stdout or sys.stdout
    print(READY, file=stdout, flush=True)
    for line in iter(stdin.readline, ""):
        line = line.strip()
        if line == STOP:
            break
        if not line:
            continue
        print(RESULT + json.dumps(handle(json.loads(line)), default=str), file=stdout, flush=True)
