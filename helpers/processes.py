"""Child processes (``Job``: one-shot commands, ``Children``: long-lived workers asked in turn,
``serve``/``worker_main``: a worker's side), whole trees stopped and no orphans left; docs/running.md says why."""

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
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Callable, Mapping, NoReturn, Sequence

READY, STOP, RESULT = "child-ready", "STOP", "RESULT "
TERMINATE: tuple[tuple[int | None, float], ...] = ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0))
KILL: tuple[tuple[int | None, float], ...] = ((signal.SIGKILL, 10.0),)
POLL_S = 0.25  # how often a watcher checks that its parent is alive
CLOSE_S = 10.0  # how long a worker told to stop gets to exit before it is killed


class ChildError(RuntimeError):
    """A child failed, timed out or broke the protocol; the message names it."""


def tail(text: str, lines: int = 5) -> str:
    """The last ``lines`` non-empty lines of ``text``."""
    return "\n".join([ln for ln in text.strip().splitlines() if ln.strip()][-lines:])


def stop(procs: Sequence[subprocess.Popen], schedule: Sequence[tuple[int | None, float]] = TERMINATE) -> None:
    """Stop ``procs``, their process groups and descendants: per ``(signal or None, seconds)`` signal, then wait."""
    import psutil

    def alive(p: Any) -> bool:
        with suppress(psutil.NoSuchProcess):
            return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
        return False

    everyone = []
    for proc in procs:
        with suppress(psutil.NoSuchProcess):
            parent = psutil.Process(proc.pid)
            everyone += [parent, *parent.children(recursive=True)]
    own = {proc.pid for proc in procs}  # reaped by Popen.wait below, which then keeps their exit status
    for sig, seconds in schedule:
        running = [p for p in everyone if alive(p)]
        if not running and all(proc.poll() is not None for proc in procs):
            break
        if sig is not None:
            for proc in procs:
                with suppress(ProcessLookupError, PermissionError):
                    if proc.poll() is None and os.getpgid(proc.pid) == proc.pid:  # it leads its own group
                        os.killpg(proc.pid, sig)
            for p in running:
                with suppress(psutil.NoSuchProcess):
                    p.send_signal(sig)
        end = time.monotonic() + seconds
        psutil.wait_procs([p for p in running if p.pid not in own], timeout=seconds)
        for proc in procs:
            with suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=max(0.0, end - time.monotonic()))


def _popen(command: Sequence[str], env: Mapping[str, str] | None, **options: Any) -> subprocess.Popen:
    """Popen of ``command`` behind ``guard``; FileNotFoundError for one that cannot start (the guard would hide it)."""
    name, path = command[0], (os.environ if env is None else env).get("PATH", os.defpath)
    if not (os.access(name, os.X_OK) if os.sep in name else shutil.which(name, path=path)):
        raise FileNotFoundError(2, "No such file or directory", name)
    return subprocess.Popen(guard(command), env=None if env is None else dict(env), **options)


def _read(log: IO[bytes]) -> str:
    """What a child wrote to its log file so far (read without moving the offset the child writes at)."""
    text = os.pread(log.fileno(), os.fstat(log.fileno()).st_size, 0).decode(errors="replace")
    return text.replace("\r\n", "\n").replace("\r", "\n")


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
    """One-shot commands started together, output merged; ``new_session=False``: in our process group (Ctrl-C too)."""

    def __init__(self, commands: Sequence[Sequence[str]], *, env: Mapping[str, str] | None = None,
                 new_session: bool = True) -> None:
        self.commands = [list(c) for c in commands]
        self.env, self.new_session = env, new_session
        self.procs: list[subprocess.Popen[bytes]] = []
        self.logs: list[IO[bytes]] = []
        self.started = 0.0

    def start(self) -> "Job":
        """Start every command; a command that cannot start stops the ones already started."""
        self.started = time.perf_counter()
        try:
            for c in self.commands:
                self.logs.append(tempfile.TemporaryFile())
                self.procs.append(_popen(c, self.env, stdin=subprocess.DEVNULL, stdout=self.logs[-1],
                                         stderr=subprocess.STDOUT, start_new_session=self.new_session))
        except BaseException:
            stop(self.procs)
            raise
        return self

    @property
    def output(self) -> str:
        """What the commands have printed so far, one command after the other."""
        return "\n".join(_read(log) for log in self.logs)

    def wait(self, timeout: float, grace: float = 15.0,
             on_interrupt: Sequence[tuple[int | None, float]] = TERMINATE) -> Finished:
        """Wait for all (after a failure the rest get ``grace`` s); JobTimeout past ``timeout``; stop on Ctrl-C."""
        failed, timed_out = None, False  # failed: the first process that failed, and when
        try:
            while None in [p.poll() for p in self.procs]:
                now = time.perf_counter()
                timed_out = now > self.started + timeout
                failed = failed or next(((p, now) for p in self.procs if p.returncode), None)
                if timed_out or (failed and now - failed[1] > grace):
                    stop(self.procs)
                    break
                time.sleep(0.1)
        except BaseException:
            stop(self.procs, on_interrupt)
            raise
        if timed_out:
            raise JobTimeout(f"the job did not finish within {timeout:.0f} s; all its processes were stopped",
                             self.output)
        code = failed[0].returncode if failed else next((p.returncode for p in self.procs if p.returncode), 0)
        return Finished(code, time.perf_counter() - self.started, self.output)


class Children:
    """Long-lived workers ``{name: (argv, extra_env)}`` started side by side, asked one at a time, stopped on exit."""

    def __init__(self, commands: Mapping[str, tuple[Sequence[str], Mapping[str, str] | None]], *,
                 startup_timeout: float = 600.0) -> None:
        self.commands = {name: (list(argv), dict(env or {})) for name, (argv, env) in commands.items()}
        self.startup_timeout = startup_timeout
        self.procs: dict[str, subprocess.Popen[str]] = {}
        self.logs: dict[str, IO[bytes]] = {}

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
            self.logs[name] = tempfile.TemporaryFile()
            self.procs[name] = _popen(argv, {**os.environ, **env}, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                      stderr=self.logs[name], text=True, start_new_session=True)
        deadline = time.monotonic() + self.startup_timeout
        for name in self.procs:
            if self._read_until(name, lambda line: line == READY, deadline) is None:
                raise self._error(name, f"did not start within {self.startup_timeout:g} s"
                                  if time.monotonic() >= deadline else "ended before it was ready")

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
        if line is None:  # its output ended: give an exiting child a moment, so the message says what happened
            with suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)
            raise self._error(name, f"gave no result within {timeout:g} s" if proc.poll() is None or
                              proc.returncode == -signal.SIGKILL else "ended without a result")
        return json.loads(line[len(RESULT):])

    def stderr(self, name: str) -> str:
        return _read(self.logs[name])

    def close(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None and proc.stdin is not None:
                with suppress(BrokenPipeError, ValueError, OSError):
                    proc.stdin.write(STOP + "\n")
                    proc.stdin.close()
        end = time.monotonic() + CLOSE_S
        for proc in self.procs.values():
            with suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=max(0.0, end - time.monotonic()))
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


def serve(handle: Callable[[dict[str, Any]], dict[str, Any]], *, stdout: Any = None) -> None:
    """The worker's side: print the ready line, answer each request line with ``handle``, stop on STOP/EOF."""
    busy = threading.Event()  # stdin is read between requests: a watcher stops us mid-request if the parent is gone
    threading.Thread(target=watch_parent, args=(busy, sys.stdin.fileno()), daemon=True).start()
    stdout = stdout or sys.stdout
    print(READY, file=stdout, flush=True)
    for line in map(str.strip, iter(sys.stdin.readline, "")):
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


def worker_main(module: str, *, quiet_stdout: bool = False) -> NoReturn:
    """``serve`` what ``module.worker(sys.argv[1:])`` returns; ``quiet_stdout``: all but the answers go to stderr."""
    protocol = None
    if quiet_stdout:
        protocol = os.fdopen(os.dup(1), "w")
        os.dup2(2, 1)
    import_frozen("torch", module)
    serve(sys.modules[module].worker(sys.argv[1:]), stdout=protocol)
    gc.freeze()  # the exit skips the collection over every object left
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


def die_with_parent(parent: int | None = None) -> bool:
    """Linux: get SIGTERM when the parent dies (PR_SET_PDEATHSIG); exit now if it already has. False elsewhere."""
    if not sys.platform.startswith("linux"):
        return False
    import ctypes

    if ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM), 0, 0, 0) != 0:  # 1: PR_SET_PDEATHSIG
        return False
    if orphaned(parent):  # it died before the signal was set: nobody will send it
        sys.exit(128 + signal.SIGTERM)
    return True


def orphaned(parent: int | None = None) -> bool:
    """True when this process lost its parent: it is no longer ``parent``'s child, or init adopted it."""
    ppid = os.getppid()
    return ppid == 1 or (parent is not None and ppid != parent)


def guard(command: Sequence[str]) -> list[str]:
    """``command`` behind a wrapper that stops it (and all it starts) when this process dies (docs/running.md)."""
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
        with suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=POLL_S)
    if proc.returncode < 0:  # die by the same signal: our parent sees the command's own exit status
        signal.signal(-proc.returncode, signal.SIG_DFL)
        os.kill(os.getpid(), -proc.returncode)
    sys.exit(proc.returncode)


def watch_parent(busy: threading.Event, fd: int) -> None:
    """Run in a thread: stop this process once its parent died, or (while ``busy``) closed our input ``fd``."""
    parent = os.getppid()
    poller = select.poll()  # POSIX: the course runs on Linux and macOS (Windows: WSL2)
    poller.register(fd, select.POLLHUP)
    while True:
        hung_up = any(ev & select.POLLHUP for _, ev in poller.poll(POLL_S * 1000))
        if hung_up and not busy.is_set():  # idle: the main thread reads the end of input
            time.sleep(POLL_S)
        if orphaned(parent) or (hung_up and busy.is_set()):
            if os.getpgrp() == os.getpid():
                os.killpg(os.getpid(), signal.SIGTERM)  # with the workers this process started
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)
            os._exit(128 + signal.SIGTERM)
