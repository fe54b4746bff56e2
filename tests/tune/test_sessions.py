"""helpers.tune.sessions: every trial is a new process with an empty compile cache of its own, removed
when it ends; the confirmation starts a new process per arm and round, a round's processes side by side
before its first answer. Stand-in children (no torch) keep it fast; one test runs real trial processes."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from helpers.tune import confirm, sessions

ROOT = Path(__file__).resolve().parents[2]
STUB = """
import os, sys, time
started = time.time()
from helpers.children import serve

def handle(request):
    cache = os.environ["TORCHINDUCTOR_CACHE_DIR"]
    empty = not os.listdir(cache)
    with open(os.path.join(cache, "kernel.py"), "w") as f:  # what a compile would leave
        f.write("x")
    return {"ok": True, "pid": os.getpid(), "cache": cache, "triton": os.environ["TRITON_CACHE_DIR"],
            "was_empty": empty, "started": started, "answered": time.time(), "torch": "torch" in sys.modules,
            "levers": request.get("levers"), "step_ms": 10.0, "warmup_s": 0.5}

serve(handle)
"""


def stub(levers):
    """A stand-in trial process: answers at once with its pid and cache folder; never imports torch."""
    return [sys.executable, "-c", STUB], {"PYTHONPATH": str(ROOT)}


class Recording(sessions.RoundSession):
    """A RoundSession of stand-in processes that keeps every answer."""

    answers: list[tuple[str, dict]] = []
    begun: list[list[str]] = []

    def __init__(self, requests, timeout):
        super().__init__(requests, timeout, command=stub)

    def begin(self, order=None):
        Recording.begun.append(list(order or self.requests))
        super().begin(order)

    def ask(self, name):
        raw = super().ask(name)
        Recording.answers.append((name, raw))
        return raw


def test_the_confirmation_starts_a_new_process_per_arm_and_round() -> None:
    Recording.answers, Recording.begun = [], []
    arms = [{"label": "opt:fused", "levers": {"optimizer": "fused"}, "total_s": 1.0},
            {"label": "bf16", "levers": {"autocast": "bf16"}, "total_s": 1.1}]
    rec = confirm.measure_arms(arms, {"model": "m.py:build"}, rounds=2, kept=None, factory=Recording, timeout=60,
                               total=lambda levers, raw: raw["warmup_s"] + raw["step_ms"] / 1000 * 90, attempts=1)
    names = ["baseline", "opt:fused", "bf16", confirm.AA]
    got = Recording.answers
    assert len(got) == len(names) * (rec["rounds"] + rec["reruns"])
    pids = [raw["pid"] for _, raw in got]
    assert len(set(pids)) == len(pids)  # never the same process twice, the A/A arm's included
    for name in names:
        assert len({raw["pid"] for n, raw in got if n == name}) == rec["rounds"] + rec["reruns"]
    assert len(Recording.begun) == rec["rounds"] + rec["reruns"]  # every round begun by interleaved's hook
    for i in range(0, len(got), len(names)):  # a round's processes all started before its first answer
        one = [raw for _, raw in got[i:i + len(names)]]
        assert [n for n, _ in got[i:i + len(names)]] == Recording.begun[i // len(names)]  # asked in the design's order
        assert max(r["started"] for r in one) < min(r["answered"] for r in one)
    caches = [raw["cache"] for _, raw in got]
    assert len(set(caches)) == len(caches) and all(raw["was_empty"] for _, raw in got)
    assert all(raw["triton"].startswith(raw["cache"]) for _, raw in got)
    assert not any(os.path.exists(c) for c in caches)  # removed with their processes
    assert not any(raw["torch"] for _, raw in got)
    assert rec["arms"][0]["warmup_s"] == 0.5 and rec["arms"][0]["step_ms"] == 10.0  # the cold start beside the steady


def test_a_round_starts_every_process_at_its_first_ask_and_closes_each_after_its_answer() -> None:
    session = sessions.RoundSession({"a": {"levers": {}}, "b": {"levers": {"threads": 1}}}, 60, command=stub)
    try:
        first = session.ask("a")
        waiting = session.waiting["b"]
        assert waiting.kids.procs["b"].poll() is None and os.path.isdir(waiting.cache)  # ready, its turn to come
        second = session.ask("b")
        assert not session.waiting and not os.path.exists(waiting.cache)
        third = session.ask("a")  # a new round: new processes
        assert len({first["pid"], second["pid"], third["pid"]}) == 3 and "b" in session.waiting
    finally:
        session.close()
    assert not session.waiting


def test_a_search_trial_gets_an_empty_cache_removed_afterwards(monkeypatch) -> None:
    monkeypatch.setattr(sessions, "trial_command", stub)
    raw = sessions.subprocess_runner({"levers": {"compile": "default"}}, 60)
    assert raw["ok"] and raw["was_empty"] and not os.path.exists(raw["cache"])


def test_child_timeout_kills_the_trial(model_file: Path) -> None:
    start = time.perf_counter()
    raw = sessions.subprocess_runner({"model": f"{model_file}:slow", "levers": {}, "device": "cpu", "guard_steps": 3}, 2.0)
    assert not raw["ok"] and "timed out" in raw["error"]
    assert time.perf_counter() - start < 15


def test_real_trial_processes_take_turns(model_file: Path) -> None:
    req = {"model": f"{model_file}:build", "device": "cpu", "guard_steps": 2, "repeats": 1, "block_s": 0.001}
    session = sessions.RoundSession({"baseline": {**req, "levers": {}},
                                     "candidate": {**req, "levers": {"optimizer": "foreach", "threads": 1}}}, 120)
    try:
        a, b = session.ask("baseline"), session.ask("candidate")
    finally:
        session.close()
    assert a["ok"] and b["ok"]
    assert b["threads"] == 1  # the candidate's process got its lever's environment
    assert abs(a["first_loss"] - b["first_loss"]) < 1e-4  # both a fresh model of the same seed
