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


def test_every_lever_attacks_one_regime_and_input_and_communication_have_none() -> None:
    table = levers.regime_table()
    assert tuple(table) == levers.REGIMES == ("compute", "memory", "overhead", "input", "communication")
    assert set(levers.ATTACKS) == set(levers.KINDS)  # every lever kind is in the table
    assert table["input"] == table["communication"] == [] and set(levers.NO_LEVER) == {"input", "communication"}
    assert "chapter 05" in levers.NO_LEVER["input"] and "08-09" in levers.NO_LEVER["communication"]
    assert levers.attacks({"compile": "reduce-overhead"}) == {"overhead"} and levers.attacks({"compile": "default"}) == {"memory"}
    assert levers.attacks({"autocast": "bf16", "channels_last": True}) == {"compute", "memory"}


def test_the_diagnosis_orders_the_levers_by_the_share_of_their_regime() -> None:
    cands = [{"threads": 1}, {"channels_last": True}, {"optimizer": "fused"}, {"autocast": "bf16"}, {"compile": "default"}]
    assert levers.by_diagnosis(cands, None) == cands
    order = levers.by_diagnosis(cands, {"memory": 0.5, "compute": 0.3, "overhead": 0.2})
    assert order == [{"channels_last": True}, {"compile": "default"}, {"autocast": "bf16"}, {"threads": 1},
                     {"optimizer": "fused"}]  # within a regime the plan's order (cheapest first) stays
    rec = levers.diagnosis_record({"shares": {"overhead": 0.6, "input": 0.3, "memory": 0.1}, "top": "overhead",
                                   "line": "overhead 60%", "findings": []}, cands)
    assert rec["first_trial"] == "threads=1" and rec["attacks"]["compile:default"] == "memory"
    assert rec["no_lever"] == levers.NO_LEVER and rec["error"] is None
    assert levers.diagnosis_record(None, cands)["first_trial"] is None


def test_the_regimes_are_those_of_helpers_diagnose() -> None:
    try:
        from helpers import diagnose
    except ImportError:  # not there yet: the tuner then keeps the plan's order (test_search.py)
        return
    assert levers.REGIMES == diagnose.REGIMES
