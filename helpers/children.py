"""The course's one child-process runner: start, take turns, time out, stop the whole process tree.

Two ways to run children, on the same start/stop code:

* ``Job``: one-shot commands started together (two torchrun "nodes", a notebook runner, an import
  probe), their stdout and stderr merged into one text that threads drain while they run (a
  full pipe cannot block them); ``wait`` gives the exit code, the seconds and the output, and
  on a timeout or Ctrl-C stops everything the job started. ``stop`` is that stop: a schedule of
  signals sent to each process group and every descendant (torchrun starts its ranks in
  sessions of their own), with a wait after each.
* ``Children``: long-lived children that start side by side and take turns.

A long-lived child is any command that speaks a small line protocol on stdin/stdout:

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
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from .orphans import guard, watch_parent

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


def _tree(proc: subprocess.Popen) -> list[Any]:
    """The process and every descendant (as psutil processes; empty when it has ended)."""
    import psutil

    try:
        parent = psutil.Process(proc.pid)
        return [parent, *parent.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


TERMINATE: tuple[tuple[int | None, float], ...] = ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0))
"""The default stop: SIGTERM, 5 s to exit, then SIGKILL."""


def stop(procs: Sequence[subprocess.Popen], schedule: Sequence[tuple[int | None, float]] = TERMINATE) -> None:
    """Stop ``procs`` and every process they started: for each ``(signal, seconds)`` of ``schedule``,
    send the signal (None: send nothing, only wait) to each process group started with
    ``start_new_session`` and to every descendant, then wait up to ``seconds`` for all to exit.
    Processes that have already ended are left alone."""
    import psutil

    def alive(p: Any) -> bool:
        try:
            return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False

    def own_group(proc: subprocess.Popen) -> bool:
        try:
            return os.getpgid(proc.pid) == proc.pid
        except (ProcessLookupError, PermissionError):
            return False

    everyone = [p for proc in procs for p in _tree(proc)]
    for sig, seconds in schedule:
        running = [p for p in everyone if alive(p)]
        if not running and all(proc.poll() is not None for proc in procs):
            break
        if sig is not None:
            for proc in procs:
                if proc.poll() is None and own_group(proc):
                    try:
                        os.killpg(proc.pid, sig)
                    except (ProcessLookupError, PermissionError):
                        pass
            for p in running:
                try:
                    p.send_signal(sig)
                except psutil.NoSuchProcess:
                    pass
        end = time.monotonic() + seconds
        psutil.wait_procs(running, timeout=seconds)
        for proc in procs:
            try:
                proc.wait(timeout=max(0.0, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass


def _check_command(command: Sequence[str], env: Mapping[str, str] | None, cwd: str | None) -> None:
    """Raise FileNotFoundError for a command that cannot start (as Popen would, before the wrapper hides it)."""
    name = command[0]
    if os.sep in name:
        found = os.access(os.path.join(cwd or "", name), os.X_OK)
    else:
        found = shutil.which(name, path=(os.environ if env is None else env).get("PATH", os.defpath)) is not None
    if not found:
        raise FileNotFoundError(2, "No such file or directory", name)


@dataclass
class Finished:
    """A finished ``Job``: the first non-zero exit code (0 when all succeeded), seconds, merged output."""

    returncode: int
    seconds: float
    output: str


class JobTimeout(ChildError):
    """A ``Job`` ran past its timeout; everything it started was stopped. ``output`` is what it printed."""

    def __init__(self, message: str, output: str) -> None:
        super().__init__(message)
        self.output = output


class Job:
    """One-shot commands started together; ``wait`` collects them.

    ``new_session=True`` (the default) puts each command in a process group of its own, so a stop
    reaches everything it started; ``False`` keeps it in the caller's group, so a Ctrl-C in the
    terminal reaches it too (a notebook runner that shuts its kernel down on SIGINT).
    """

    def __init__(self, commands: Sequence[Sequence[str]], *, env: Mapping[str, str] | None = None,
                 new_session: bool = True, cwd: str | None = None) -> None:
        if not commands:
            raise ValueError("Job needs at least one command")
        self.commands = [list(c) for c in commands]
        self.env, self.new_session, self.cwd = env, new_session, cwd
        self.procs: list[subprocess.Popen[str]] = []
        self._chunks: list[list[str]] = []
        self._readers: list[threading.Thread] = []
        self.started = 0.0

    def start(self) -> "Job":
        """Start every command; a command that cannot start stops the ones already started."""
        self.started = time.perf_counter()
        try:
            for c in self.commands:
                _check_command(c, self.env, self.cwd)
                proc = subprocess.Popen(guard(c), env=None if self.env is None else dict(self.env), cwd=self.cwd,
                                        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                        text=True, errors="replace", start_new_session=self.new_session)
                self.procs.append(proc)
                sink: list[str] = []
                self._chunks.append(sink)
                reader = threading.Thread(target=lambda f=proc.stdout, s=sink: s.extend(iter(f.readline, "")),
                                          daemon=True)
                reader.start()
                self._readers.append(reader)
        except BaseException:
            self.stop()
            raise
        return self

    @property
    def output(self) -> str:
        """What the commands have printed so far, one command after the other."""
        return "\n".join("".join(sink) for sink in self._chunks)

    def wait(self, timeout: float, grace: float = 15.0,
             on_interrupt: Sequence[tuple[int | None, float]] = TERMINATE) -> Finished:
        """Wait for every command. Once one has failed, the others get ``grace`` seconds to notice and
        exit on their own (a node whose peer died would otherwise wait for its rendezvous timeout),
        then they are stopped. Past ``timeout`` seconds everything is stopped and JobTimeout raised;
        on Ctrl-C (or any error) everything is stopped with the ``on_interrupt`` schedule, then the
        exception goes on."""
        if grace < 0:
            raise ValueError(f"grace must be >= 0 seconds, got {grace}")
        deadline = self.started + timeout
        failed_at = None
        try:
            while [p.poll() for p in self.procs].count(None):
                now = time.perf_counter()
                if now > deadline:
                    self.stop()
                    self._join()
                    raise JobTimeout(f"the job did not finish within {timeout:.0f} s; all its processes were "
                                     "stopped", self.output)
                if failed_at is None and any(p.returncode not in (None, 0) for p in self.procs):
                    failed_at = now
                if failed_at is not None and now - failed_at > grace:
                    self.stop()
                    break
                time.sleep(0.1)
        except JobTimeout:
            raise
        except BaseException:
            self.stop(on_interrupt)
            raise
        finally:
            self._join()
        code = next((p.returncode for p in self.procs if p.returncode), 0)
        return Finished(code, time.perf_counter() - self.started, self.output)

    def stop(self, schedule: Sequence[tuple[int | None, float]] = TERMINATE) -> None:
        """Stop every command and everything it started (see ``stop``)."""
        stop(self.procs, schedule)

    def _join(self) -> None:
        for reader in self._readers:
            reader.join(timeout=5)


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
            _check_command(argv, {**os.environ, **env}, self.cwd)
            self.logs[name] = tempfile.TemporaryFile("w+")
            self.procs[name] = subprocess.Popen(
                guard(argv), env={**os.environ, **env}, cwd=self.cwd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
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
    busy = threading.Event()
    if stdin is None:  # stdin is read between requests only: a watcher stops us mid-request if the parent is gone
        threading.Thread(target=watch_parent, args=(busy, sys.stdin.fileno()), daemon=True).start()
    stdin = stdin or sys.stdin
    stdout = stdout or sys.stdout
    print(READY, file=stdout, flush=True)
    for line in iter(stdin.readline, ""):
        line = line.strip()
        if line == STOP:
            break
        if not line:
            continue
        busy.set()
        try:
            result = handle(json.loads(line))
        finally:
            busy.clear()
        print(RESULT + json.dumps(result, default=str), file=stdout, flush=True)
