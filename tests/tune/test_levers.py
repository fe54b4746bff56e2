"""helpers.tune.levers: which levers are tried on a model and device, which are skipped and why, and the
environment a trial's child gets for its thread levers."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from helpers.tune import levers
from helpers.tune import trial as tune_trial


def test_plan_levers_skips_what_does_not_apply(model_file: Path) -> None:
    seq = tune_trial.load_workload(f"{model_file}:build")
    img = tune_trial.load_workload(f"{model_file}:image")
    cpu = torch.device("cpu")
    cands, skipped = levers.plan_levers(seq, cpu)
    reasons = {s["label"]: s["reason"] for s in skipped}
    assert {"channels_last": True} not in cands and "4-D" in reasons["channels_last"]
    assert "CUDA" in reasons["compile:reduce-overhead"]
    assert {"autocast": "bf16"} in cands and {"batch": 2} in cands
    kinds = [next(iter(c)) for c in cands]
    assert kinds.index("compile") > kinds.index("autocast")  # the expensive lever comes last
    assert {"channels_last": True} in levers.plan_levers(img, cpu)[0]
    only, _ = levers.plan_levers(img, cpu, kinds=["channels_last", "optimizer"])
    assert only == [{"channels_last": True}, {"optimizer": "foreach"}, {"optimizer": "fused"}]
    with pytest.raises(tune_trial.TuneError, match="unknown lever"):
        levers.plan_levers(img, cpu, kinds=["warp-drive"])


def test_child_env_sets_the_thread_count() -> None:
    assert levers.child_env({"threads": 3}) == {"OMP_NUM_THREADS": "3"}


def test_there_is_no_ipex_lever(model_file: Path) -> None:
    """IPEX is retired and needs torch 2.8; the course's environment runs current PyTorch (chapter 04)."""
    img = tune_trial.load_workload(f"{model_file}:image")
    assert "ipex" not in levers.KINDS
    cands, skipped = levers.plan_levers(img, torch.device("cpu"))
    assert not any("ipex" in c for c in cands + [s["levers"] for s in skipped])
    with pytest.raises(tune_trial.TuneError, match="retired and needs torch 2.8.*chapter 04"):
        levers.plan_levers(img, torch.device("cpu"), kinds=["channels_last", "ipex"])


def test_only_the_batch_lever_changes_training() -> None:
    assert levers.changes_training({"batch": 2}) and levers.changes_training({"optimizer": "fused", "batch": 4})
    assert not any(levers.changes_training({k: v}) for k, v in
                   [("threads", 1), ("omp", "gnu-bound"), ("channels_last", True), ("optimizer", "fused"),
                    ("autocast", "bf16"), ("compile", "default")])
