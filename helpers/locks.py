"""Inter-process locks (``filelock``) that name their holder (``<path>.holder``) in a refusal. No torch here."""

from __future__ import annotations

import contextlib
import json
import os
import sys
from pathlib import Path
from typing import Iterator

from filelock import FileLock, Timeout


class Held(TimeoutError):
    """Another process held the lock for longer than the wait; the message names it."""


def holder(path: Path | str) -> dict | None:
    """The process that holds (or last held, without releasing) ``path``: {"pid", "command"}, or None."""
    try:
        return json.loads(Path(f"{path}.holder").read_text())
    except (OSError, ValueError):
        return None


def describe(info: dict | None) -> str:
    """'process N (command)' for a holder, or 'another process' when it is not known."""
    if not info:
        return "another process"
    return f"process {info['pid']}" + (f" (`{info['command']}`)" if info.get("command") else "")


@contextlib.contextmanager
def hold(path: Path | str, *, wait: float | None, what: str) -> Iterator[Path]:
    """Hold the lock ``path`` for the block, waiting up to ``wait`` s (None: as long as it takes), else raise Held."""
    path = Path(path)
    side = Path(f"{path}.holder")
    path.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(path, timeout=-1 if wait is None else wait)
    try:
        lock.acquire()
    except Timeout:
        raise Held(f"{what} is in use by {describe(holder(path))}: let it finish, or stop it, "
                   f"then run again (waited {wait:g} s)") from None
    try:
        previous = holder(path)
        if previous:  # it is removed on release: its writer died holding the lock
            print(f"note: {what}: took over the lock of {describe(previous)}, which is no longer running",
                  file=sys.stderr, flush=True)
        command = " ".join(" ".join(sys.orig_argv).split())[:200]  # one line, however it was started
        side.write_text(json.dumps({"pid": os.getpid(), "command": command}))
        yield path
    finally:
        side.unlink(missing_ok=True)
        lock.release()
