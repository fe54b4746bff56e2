"""No orphans: the course's child processes stop when the process that started them dies.

Linux: ``PR_SET_PDEATHSIG`` (SIGTERM), set by the child itself or by ``guard``'s wrapper; elsewhere,
and for long-lived children in the middle of a request, a watcher that polls for the parent.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Sequence

POLL_S = 0.25
"""How often a watcher checks that its parent is alive."""
_PR_SET_PDEATHSIG = 1


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
    """``command`` behind a small wrapper that stops it (and all it starts) when this process dies."""
    # On Linux, from the main thread, the wrapper sets PR_SET_PDEATHSIG and execs the command (same
    # pid, same exit status, ~40 ms more start-up). A wrapper rather than a preexec_fn: that runs
    # Python between fork and exec, which can deadlock when the parent has threads (a Jupyter kernel
    # has several). Elsewhere, from another thread (the signal fires when the starting *thread*
    # ends) or with watch=True, the wrapper stays the command's parent and stops its tree once this
    # process is gone.
    # mpirun is watched too: on SIGTERM it may leave its local ranks running (seen under load).
    if watch is None:
        watch = (not sys.platform.startswith("linux") or threading.current_thread() is not threading.main_thread()
                 or Path(command[0]).name in ("mpirun", "mpiexec"))
    code = "import sys; from helpers.orphans import _guard; _guard(sys.argv[1:])"
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
            _stop_tree(proc.pid)
        try:
            proc.wait(timeout=POLL_S)
        except subprocess.TimeoutExpired:
            pass
    if proc.returncode < 0:  # die by the same signal: our parent sees the command's own exit status
        signal.signal(-proc.returncode, signal.SIG_DFL)
        os.kill(os.getpid(), -proc.returncode)
    sys.exit(proc.returncode)


def _stop_tree(pid: int) -> None:
    """SIGTERM to process ``pid`` and all its descendants, SIGKILL to those left after 5 s."""
    import psutil

    try:
        root = psutil.Process(pid)
        tree = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return
    for p in tree:
        try:
            p.terminate()
        except psutil.NoSuchProcess:
            pass
    for p in psutil.wait_procs(tree, timeout=5)[1]:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass


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
