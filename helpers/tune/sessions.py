"""How the tuner runs trials: each one in a ``helpers.tune.trial`` child process (``helpers.children``)
with a hard timeout, one-shot during the search (``subprocess_runner``) or long-lived and taking turns
during the confirmation (``ChildSession``); ``RunnerSession`` wraps any single-trial runner (tests).
"""

from __future__ import annotations

import sys
import time
from typing import Any, Callable, Protocol

from .. import children
from .levers import child_env


Runner = Callable[[dict[str, Any], float], dict[str, Any]]


class Session(Protocol):
    """Long-lived trial processes, one per name, that answer one trial request at a time."""

    def ask(self, name: str) -> dict[str, Any]: ...

    def close(self) -> None: ...


SessionFactory = Callable[[dict[str, dict[str, Any]], float], Session]


def _trial_command(levers: dict[str, Any]) -> tuple[list[str], dict[str, str]]:
    return [sys.executable, "-m", "helpers.tune.trial"], child_env(levers)


def subprocess_runner(request: dict[str, Any], timeout: float) -> dict[str, Any]:
    """Run one trial in a child process (``helpers.children``); kill it and its compile workers on timeout."""
    start = time.monotonic()
    try:
        with children.Children({"trial": _trial_command(request.get("levers", {}))},
                               startup_timeout=max(timeout, 1.0)) as kids:
            return kids.ask("trial", request, timeout=max(1.0, timeout - (time.monotonic() - start)))
    except children.ChildError as exc:
        if "within" in str(exc):
            return {"ok": False, "error": f"timed out after {timeout:.0f} s (killed: the trial ran past its time limit)"}
        return {"ok": False, "error": f"the trial process failed: {children.tail(str(exc), 1)[:300]}"}


class ChildSession:
    """The confirmation's processes: one long-lived ``helpers.tune.trial`` child per request."""

    def __init__(self, requests: dict[str, dict[str, Any]], timeout: float) -> None:
        self.requests, self.timeout = requests, timeout
        self.kids = children.Children({name: _trial_command(req.get("levers", {})) for name, req in requests.items()},
                                      startup_timeout=timeout)
        self.kids.start()

    def ask(self, name: str) -> dict[str, Any]:
        return self.kids.ask(name, self.requests[name], timeout=self.timeout)

    def close(self) -> None:
        self.kids.close()


class RunnerSession:
    """A session made of a single-trial runner (tests, or a runner given to ``tune``)."""

    def __init__(self, runner: Runner, requests: dict[str, dict[str, Any]], timeout: float) -> None:
        self.runner, self.requests, self.timeout = runner, requests, timeout

    def ask(self, name: str) -> dict[str, Any]:
        return self.runner(self.requests[name], self.timeout)

    def close(self) -> None:
        pass
