"""Fixtures of the tuner's tests (tests/tune/): ``fake_runner``, a stand-in for the child process that runs
one trial, so a search is fast and deterministic; ``hand_report`` and ``make_arm``, a tune.json report
and a confirmed setting written out by hand (their numbers are known exactly). The reader's model file
(``model_file``) is a fixture of tests/conftest.py."""

from __future__ import annotations

import time

import pytest

from helpers.tune import search as tune


def _fake_runner(step_ms: dict[str, float], fail: dict[str, str] | None = None, loss: dict[str, float] | None = None,
                 sleep: float = 0.0, diagnosis: dict[str, float] | None = None):
    """A stand-in for the child process: step time per label, errors per label, guard loss per label, and
    for the baseline's request a diagnosis with the regime ``shares`` given (as helpers.tune.trial returns it)."""
    calls = []

    def run(request, timeout):
        calls.append((request["levers"], timeout))
        time.sleep(sleep)
        name = request.get("arm") or tune.label(request["levers"])  # the confirmation names its arms
        if fail and name in fail:
            return {"ok": False, "error": fail[name]}
        ms = step_ms.get(name, 10.0)
        found = {}
        if request.get("diagnose") and diagnosis:
            top = max(diagnosis, key=diagnosis.get)
            found = {"diagnosis": {"shares": dict(diagnosis), "top": top, "findings": ["a stand-in finding"],
                                   "line": ", ".join(f"{r} {v:.0%}" for r, v in diagnosis.items()), "detail": {}}}
        return {**found, "ok": True, "step_ms": ms, "spread_ms": 0.1 * ms, "samples_ms": [0.95 * ms, ms, 1.05 * ms],
                "warmup_s": 0.5, "first_loss": 2.0, "guard_loss": (loss or {}).get(name, 1.0),
                "batch_factor": int(request["levers"].get("batch", 1)),
                "batch_size": 32 * int(request["levers"].get("batch", 1)), "threads": 2,
                "optimizer": "Adam"}

    run.calls = calls
    return run


@pytest.fixture()
def fake_runner():
    """``fake_runner(step_ms, fail=None, loss=None, sleep=0.0, diagnosis=None)``: a runner for
    ``tune.tune(runner=...)`` giving each label's step time, error or guard loss, and the baseline a
    diagnosis (regime -> share); ``runner.calls`` lists (levers, timeout)."""
    return _fake_runner


def _trial(label, levers, step_ms, warmup_s=1.0, steps_left=90, **more):
    """A successful trial as helpers.tune records it: 100 planned steps, 10 guard steps."""
    samples = [0.95 * step_ms, step_ms, 1.05 * step_ms]
    out = {"label": label, "levers": levers, "stage": "single", "ok": True, "batch_size": 32, "step_ms": step_ms,
           "spread_ms": 0.1 * step_ms, "samples_ms": samples, "warmup_s": warmup_s,
           "total_s": warmup_s + step_ms / 1000 * steps_left,
           "totals_s": [warmup_s + s / 1000 * steps_left for s in samples], "loss_diff": 0.0, "error": "",
           "guard": "checked"}
    out.update(more)
    return out


def _arm(label, levers, ratio, role="candidate", word="faster", low=None, high=None, rounds=8, search=None):
    """A setting as the confirmation records it (helpers.tune.search.measure_arms)."""
    return {"label": label, "levers": levers, "role": role, "search_speedup": search, "ratio": ratio,
            "low": ratio - 0.1 if low is None else low, "high": ratio + 0.1 if high is None else high, "word": word,
            "rounds": rounds, "reason": "", "totals_s": [1.9 / ratio] * rounds}


def _hand_report(best_levers=None, confirmed=None, unconfirmed=None, confirmation=None):
    """Baseline 10 ms/step, bf16 5 ms, a failed fp16, a 2x batch (18 ms per doubled step) and a compile
    that is faster per step (8 ms) after a 5 s warm-up; 100 planned steps, 10 of them the guard's.
    By default the confirmation measured bf16 (1.31x, faster) and the batch hint (1.10x, faster)."""
    base = _trial("baseline", {}, 10.0, stage="baseline")
    trials = [base, _trial("bf16", {"autocast": "bf16"}, 5.0),
              {"label": "fp16", "levers": {"autocast": "fp16"}, "stage": "single", "ok": False, "step_ms": None,
               "spread_ms": None, "warmup_s": None, "total_s": None, "loss_diff": None,
               "error": "RuntimeError: no fp16 kernel"},
              _trial("batch x2", {"batch": 2}, 18.0, steps_left=40, guard=tune.BATCH_GUARD, batch_size=64),
              _trial("compile:default", {"compile": "default"}, 8.0, warmup_s=5.0)]
    for t in trials:
        t["speedup"] = base["total_s"] / t["total_s"] if t["ok"] else None
    levers = {"autocast": "bf16"} if best_levers is None else best_levers
    best = {"levers": levers, "label": tune.label(levers) if levers else "baseline",
            "speedup": 1.9 / 1.45 if levers == {"autocast": "bf16"} else 1.0,
            "confirmed": confirmed if confirmed is not None else
            {"ratio": 1.31, "low": 1.2, "high": 1.4, "word": "faster", "rounds": 8, "reruns": 0}}
    if unconfirmed:
        best["unconfirmed"] = unconfirmed
    if confirmation is None:
        confirmation = {"rounds": 8, "attempts": 1, "reruns": 0, "disturbed": False,
                        "aa": {"ratio": 1.0, "low": 0.97, "high": 1.03, "word": "no measurable difference",
                               "rounds": 8, "reason": ""},
                        "arms": [_arm("bf16", {"autocast": "bf16"}, 1.31, search=1.31),
                                 _arm("batch x2", {"batch": 2}, 1.1, role="hint", low=1.05, high=1.15, search=1.1)],
                        "left_out": []}
    return {"model": "/home/someone/models/m.py:build", "device": "cpu", "planned_steps": 100, "guard_steps": 10,
            "baseline": base, "trials": trials, "best": best, "optimizer": "SGD", "confirmation": confirmation,
            "skipped": [{"label": "compile:max-autotune", "reason": "budget: needs about 90 s, 20 s left"}]}


@pytest.fixture()
def hand_report():
    """``hand_report(best_levers=None, confirmed=None, unconfirmed=None, confirmation=None)``: see ``_hand_report``."""
    return _hand_report


@pytest.fixture()
def make_arm():
    """``make_arm(label, levers, ratio, role="candidate", word="faster", ...)``: a confirmed setting (``_arm``)."""
    return _arm
