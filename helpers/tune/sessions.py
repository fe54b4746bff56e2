"""How the tuner runs trials: every trial is a new ``helpers.tune.trial`` process (``TrialProcess``) with a
hard timeout and an empty compile cache of its own, removed when it ends. ``subprocess_runner`` runs one
(the search); ``RoundSession`` starts a round's processes side by side and asks each once (the
confirmation); ``RunnerSession`` wraps any single-trial runner (tests)."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import threading
import time
from typing import Any, Callable, Protocol, Sequence

from .. import children
from .levers import child_env

Runner = Callable[[dict[str, Any], float], dict[str, Any]]
Command = Callable[[dict[str, Any]], tuple[list[str], dict[str, str]]]


class Session(Protocol):
    """Trial processes by name that answer one trial request at a time."""

    def ask(self, name: str) -> dict[str, Any]: ...

    def close(self) -> None: ...


SessionFactory = Callable[[dict[str, dict[str, Any]], float], Session]


def trial_command(levers: dict[str, Any]) -> tuple[list[str], dict[str, str]]:
    """The command line and extra environment of a trial process with ``levers``."""
    return [sys.executable, "-m", "helpers.tune.trial"], child_env(levers)


class TrialProcess:
    """One new trial process (``helpers.children``) whose Inductor and Triton caches start empty."""

    def __init__(self, name: str, command: tuple[list[str], dict[str, str]], timeout: float) -> None:
        self.name, self.cache = name, tempfile.mkdtemp(prefix="tune-cache-")
        argv, env = command
        cache = {"TORCHINDUCTOR_CACHE_DIR": self.cache, "TRITON_CACHE_DIR": os.path.join(self.cache, "triton")}
        self.kids = children.Children({name: (argv, {**env, **cache})}, startup_timeout=timeout)

    def start(self) -> None:
        """Start the process and wait until it is ready (imports done)."""
        self.kids.start()

    def ask(self, request: dict[str, Any], timeout: float) -> dict[str, Any]:
        """One trial in this process."""
        return self.kids.ask(self.name, request, timeout=timeout)

    def close(self) -> None:
        """Stop the process and remove its cache folder."""
        try:
            self.kids.close()
        finally:
            shutil.rmtree(self.cache, ignore_errors=True)


def start_all(procs: Sequence[TrialProcess]) -> None:
    """Start ``procs`` side by side and wait until each is ready; on a failure close them all and raise."""
    errors: list[BaseException] = []

    def one(p: TrialProcess) -> None:
        try:
            p.start()
        except BaseException as exc:  # noqa: BLE001  (raised in the caller's thread below)
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(p,), daemon=True) for p in procs]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        if errors or any(t.is_alive() for t in threads):
            for p in procs:
                p.close()
    if errors:
        raise errors[0]


def subprocess_runner(request: dict[str, Any], timeout: float) -> dict[str, Any]:
    """Run one trial in a new process; kill it and its compile workers on timeout."""
    start = time.monotonic()
    proc = TrialProcess("trial", trial_command(request.get("levers", {})), max(timeout, 1.0))
    try:
        proc.start()
        return proc.ask(request, timeout=max(1.0, timeout - (time.monotonic() - start)))
    except children.ChildError as exc:
        if "within" in str(exc):
            return {"ok": False, "error": f"timed out after {timeout:.0f} s (killed: the trial ran past its time limit)"}
        return {"ok": False, "error": f"the trial process failed: {children.tail(str(exc), 1)[:300]}"}
    finally:
        proc.close()


class RoundSession:
    """The confirmation's processes: a new one per arm and round, started side by side when a round begins
    (``begin``, ``measure.interleaved``'s ``before_round``), each closed after its one answer."""

    def __init__(self, requests: dict[str, dict[str, Any]], timeout: float, command: Command = trial_command) -> None:
        self.requests, self.timeout, self.command = requests, timeout, command
        self.waiting: dict[str, TrialProcess] = {}

    def begin(self, order: Sequence[str] | None = None) -> None:
        """Start a round: what is left of the last one is closed, every arm gets a new process."""
        self.close()
        self.waiting = {n: TrialProcess(n, self.command(self.requests[n].get("levers", {})), self.timeout)
                        for n in (order or self.requests)}
        try:
            start_all(list(self.waiting.values()))
        except BaseException:
            self.waiting = {}
            raise

    def ask(self, name: str) -> dict[str, Any]:
        """Arm ``name``'s trial in its process of this round (its first ask after every arm was asked
        starts the next round), which is then closed."""
        if name not in self.waiting:
            self.begin()
        proc = self.waiting.pop(name)
        try:
            return proc.ask(self.requests[name], self.timeout)
        finally:
            proc.close()

    def close(self) -> None:
        """Close the processes of this round that were not asked."""
        waiting, self.waiting = self.waiting, {}
        for p in waiting.values():
            p.close()


class RunnerSession:
    """A session made of a single-trial runner (tests, or a runner given to ``tune``)."""

    def __init__(self, runner: Runner, requests: dict[str, dict[str, Any]], timeout: float) -> None:
        self.runner, self.requests, self.timeout = runner, requests, timeout

    def ask(self, name: str) -> dict[str, Any]:
        return self.runner(self.requests[name], self.timeout)

    def close(self) -> None:
        pass
