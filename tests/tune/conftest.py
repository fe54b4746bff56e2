"""Fixtures of the tuner's tests (tests/tune/): ``fake_runner``, a stand-in for the child process that runs
one trial, so a search is fast and deterministic. The reader's model file (``model_file``) is a fixture
of tests/conftest.py."""

from __future__ import annotations

import time

import pytest

from helpers.tune import search as tune


def _fake_runner(step_ms: dict[str, float], fail: dict[str, str] | None = None, loss: dict[str, float] | None = None,
                 sleep: float = 0.0):
    """A stand-in for the child process: step time per label, errors per label, guard loss per label."""
    calls = []

    def run(request, timeout):
        calls.append((request["levers"], timeout))
        time.sleep(sleep)
        name = tune.label(request["levers"])
        if fail and name in fail:
            return {"ok": False, "error": fail[name]}
        ms = step_ms.get(name, 10.0)
        return {"ok": True, "step_ms": ms, "spread_ms": 0.1 * ms, "samples_ms": [0.95 * ms, ms, 1.05 * ms],
                "warmup_s": 0.5, "first_loss": 2.0, "guard_loss": (loss or {}).get(name, 1.0),
                "batch_factor": int(request["levers"].get("batch", 1)), "batch_size": 32, "threads": 2,
                "optimizer": "Adam"}

    run.calls = calls
    return run


@pytest.fixture()
def fake_runner():
    """``fake_runner(step_ms, fail=None, loss=None, sleep=0.0)``: a runner for ``tune.tune(runner=...)``
    giving each label's step time, error or guard loss; ``runner.calls`` lists (levers, timeout)."""
    return _fake_runner
