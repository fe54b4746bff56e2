"""helpers.tune.sessions: a trial's child process is killed at its timeout; the confirmation's two
long-lived trial processes take turns, each request a fresh seeded model."""

from __future__ import annotations

import time
from pathlib import Path


from helpers.tune import sessions


def test_child_timeout_kills_the_trial(model_file: Path) -> None:
    start = time.perf_counter()
    raw = sessions.subprocess_runner({"model": f"{model_file}:slow", "levers": {}, "device": "cpu", "guard_steps": 3}, 2.0)
    assert not raw["ok"] and "timed out" in raw["error"]
    assert time.perf_counter() - start < 15


def test_child_session_keeps_two_trial_processes_taking_turns(model_file: Path) -> None:
    req = {"model": f"{model_file}:build", "device": "cpu", "guard_steps": 2, "repeats": 1, "block_s": 0.001}
    session = sessions.ChildSession({"baseline": {**req, "levers": {}},
                                 "candidate": {**req, "levers": {"optimizer": "foreach", "threads": 1}}}, timeout=120)
    try:
        a, b, a2 = session.ask("baseline"), session.ask("candidate"), session.ask("baseline")
    finally:
        session.close()
    assert a["ok"] and b["ok"] and a2["ok"]
    assert b["threads"] == 1  # the candidate's process got its lever's environment
    assert a["first_loss"] == a2["first_loss"]  # every request is a fresh seeded model
