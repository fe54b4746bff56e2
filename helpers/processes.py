"""Child processes: start them, take turns, time them out, stop whole process trees, and never leave orphans.

``Job`` runs one-shot commands together; ``Children`` keeps long-lived workers side by side and asks one at a
time; ``serve`` and ``worker_main`` are a worker's side of that line protocol. docs/running.md says why.
"""

from __future__ import annotations

import gc
import importlib
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, NoReturn, Sequence

READY, STOP, RESULT = "child-ready", "STOP", "RESULT "
TERMINATE: tuple[tuple[int | None, float], ...] = ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0))
KILL: tuple[tuple[int | None, float], ...] = ((signal.SIGKILL, 10.0),)
POLL_S = 0.25  # how often a watcher checks that its parent is alive
_PR_SET_PDEATHSIG = 1
Handler = Callable[[dict[str, Any]], dict[str, Any]]


class ChildError(RuntimeError):
    """A child failed, timed out or broke the protocol; the message names it."""


def tail(text: str, lines: int = 5) -> str:
    """The last ``lines`` non-empty lines of ``text``."""
    return "\n".join([ln for ln in text.strip().splitlines() if ln.strip()][-lines:])


def stop(procs: Sequence[subprocess.Popen], schedule: Sequence[tuple[int | None, float]] = TERMINATE) -> None:
    """Stop ``procs`` and all they started: per ``(signal, seconds)`` of ``schedule``, signal (None: only wait) each
    own process group and every descendant still running, then wait up to ``seconds`` for all to exit."""
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

    everyone = []
    for proc in procs:
        try:
            parent = psutil.Process(proc.pid)
            everyone += [parent, *parent.children(recursive=True)]
        except psutil.NoSuchProcess:
            pass
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
        own = {proc.pid for proc in procs}  # reaped by Popen.wait below, which then keeps their exit status
        psutil.wait_procs([p for p in running if p.pid not in own], timeout=seconds)
        for proc in procs:
            try:
                proc.wait(timeout=max(0.0, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass


def _check_command(command: Sequence[str], env: Mapping[str, str] | None, cwd: str | None) -> None:
    """Raise FileNotFoundError for a command that cannot start (as Popen would, before the guard hides it)."""
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
    """One-shot commands started together, stdout and stderr merged; ``wait`` collects them.

    ``new_session=False`` keeps them in the caller's process group, so a Ctrl-C in the terminal reaches them too."""

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
        """Wait for every command; once one failed, the others get ``grace`` s to exit on their own, then stop.
        Past ``timeout`` s everything stops and JobTimeout is raised; on Ctrl-C (or any error) everything stops
        with the ``on_interrupt`` schedule and the exception goes on."""
        if grace < 0:
            raise ValueError(f"grace must be >= 0 seconds, got {grace}")
        deadline = self.started + timeout
        failed_at, first = None, None
        try:
            while [p.poll() for p in self.procs].count(None):
                now = time.perf_counter()
                if now > deadline:
                    self.stop()
                    self._join()
                    raise JobTimeout(f"the job did not finish within {timeout:.0f} s; all its processes were "
                                     "stopped", self.output)
                if failed_at is None and any(p.returncode not in (None, 0) for p in self.procs):
                    failed_at, first = now, next(p for p in self.procs if p.returncode not in (None, 0))
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
        code = first.returncode if first else next((p.returncode for p in self.procs if p.returncode), 0)  # who failed first
        return Finished(code, time.perf_counter() - self.started, self.output)

    def stop(self, schedule: Sequence[tuple[int | None, float]] = TERMINATE) -> None:
        """Stop every command and everything it started (see ``stop``)."""
        stop(self.procs, schedule)

    def _join(self) -> None:
        for reader in self._readers:
            reader.join(timeout=5)


class Children:
    """Long-lived workers ``{name: (argv, extra_env)}`` started side by side, asked one at a time.

    ``with Children(cmds) as kids: kids.ask("a", {...})``; on exit each is told to stop, and killed after ``grace`` s."""

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
            stop([proc], KILL)
            if proc.stdout is not None:
                proc.stdout.close()
        for log in self.logs.values():
            log.close()
        self.logs = {}

    def _read_until(self, name: str, wanted: Callable[[str], bool], deadline: float) -> str | None:
        proc = self.procs[name]
        assert proc.stdout is not None
        timer = threading.Timer(max(0.0, deadline - time.monotonic()), stop, args=([proc], KILL))
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
        stop([proc], KILL)
        err = tail(self.stderr(name)) if name in self.logs else ""
        return ChildError(f"{name!r}: the child process {what} (exit {proc.returncode})" + (f":\n{err}" if err else ""))


def serve(handle: Handler, *, stdin: Any = None, stdout: Any = None) -> None:
    """The worker's side: print the ready line, answer each request line with ``handle``, stop on STOP/EOF."""
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


def worker_main(module: str, argv: Sequence[str] | None = None, *, quiet_stdout: bool = False) -> NoReturn:
    """Run this process as ``module``'s worker: import torch and ``module`` frozen, ``serve`` the handler that
    ``module.worker(argv)`` returns (argv: default ``sys.argv[1:]``), exit without the final collection.
    ``quiet_stdout``: answer on a copy of stdout; all else written there (C libraries too) goes to stderr."""
    protocol = None
    if quiet_stdout:
        protocol = os.fdopen(os.dup(1), "w")
        os.dup2(2, 1)
    import_frozen("torch", module)
    handle = sys.modules[module].worker(list(sys.argv[1:] if argv is None else argv))
    serve(handle, stdout=protocol)
    exit_without_collection()
    sys.exit(0)


def import_frozen(*modules: str) -> None:
    """Import ``modules`` with the garbage collector paused, then freeze what was imported (state restored)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        for name in modules:
            importlib.import_module(name)
    finally:
        gc.freeze()
        if was_enabled:
            gc.enable()


def exit_without_collection() -> None:
    """Call last in a child process: its exit skips the collection over every object left."""
    gc.freeze()


def die_with_parent(parent: int | None = None) -> bool:
    """Linux: get SIGTERM when the parent dies (PR_SET_PDEATHSIG); exit now if it already has. False elsewhere."""
    if not sys.platform.startswith("linux"):
        return False
    import ctypes

    if ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0) != 0:
        return False
    if orphaned(parent):  # it died before the signal was set: nobody will send it
        sys.exit(128 + signal.SIGTERM)
    return True


def orphaned(parent: int | None = None) -> bool:
    """True when this process lost its parent: it is no longer ``parent``'s child, or init adopted it."""
    ppid = os.getppid()
    return ppid == 1 or (parent is not None and ppid != parent)


def guard(command: Sequence[str], watch: bool | None = None) -> list[str]:
    """``command`` behind a small wrapper that stops it (and all it starts) when this process dies.

    ``watch``: the wrapper stays the command's parent and watches (default: off Linux, off the main thread, mpirun)."""
    if watch is None:
        watch = (not sys.platform.startswith("linux") or threading.current_thread() is not threading.main_thread()
                 or Path(command[0]).name in ("mpirun", "mpiexec"))
    code = "import sys; from helpers.processes import _guard; _guard(sys.argv[1:])"
    return [sys.executable, "-c", code, str(os.getpid()), "watch" if watch else "exec", "--", *command]


def _guard(argv: Sequence[str]) -> None:
    parent, mode, command = int(argv[0]), argv[1], list(argv[3:])
    if mode == "exec" and die_with_parent(parent):
        try:
            os.execvp(command[0], command)  # PR_SET_PDEATHSIG survives exec
        except OSError as exc:
            print(f"cannot start {command[0]}: {exc}", file=sys.stderr, flush=True)
            os._exit(127)
    if orphaned(parent):
        sys.exit(128 + signal.SIGTERM)
    for sig in (signal.SIGINT, signal.SIGTERM):  # a stop signals the command itself: wait for it
        signal.signal(sig, lambda *_: None)
    proc = subprocess.Popen(command)
    while proc.poll() is None:
        if orphaned(parent):
            stop([proc])
        try:
            proc.wait(timeout=POLL_S)
        except subprocess.TimeoutExpired:
            pass
    if proc.returncode < 0:  # die by the same signal: our parent sees the command's own exit status
        signal.signal(-proc.returncode, signal.SIG_DFL)
        os.kill(os.getpid(), -proc.returncode)
    sys.exit(proc.returncode)


def watch_parent(busy: threading.Event, fd: int) -> None:
    """Run in a thread: stop this process once its parent died, or (while ``busy``) closed our input ``fd``."""
    parent = os.getppid()
    poller = select.poll() if hasattr(select, "poll") else None
    if poller is not None:
        poller.register(fd, select.POLLHUP)
    while True:
        hung_up = poller is not None and any(ev & select.POLLHUP for _, ev in poller.poll(POLL_S * 1000))
        if poller is None or (hung_up and not busy.is_set()):  # idle: the main thread reads the end of input
            time.sleep(POLL_S)
        if orphaned(parent) or (hung_up and busy.is_set()):
            if hasattr(os, "killpg") and os.getpgrp() == os.getpid():
                os.killpg(os.getpid(), signal.SIGTERM)  # with the workers this process started
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)
            os._exit(128 + signal.SIGTERM)
