"""Tests of helpers.tune / tune_trial / tune_report: model loading, lever planning, the search
(with a stand-in runner, so it is fast and deterministic), the budget, failing levers, the
child-process timeout and one real end-to-end search on a non-image model."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import pytest
import torch

from helpers import results, tune, tune_report, tune_trial

SEQ_MODEL = '''
import torch
from torch import nn

class Tiny(nn.Module):  # sequences (batch, time, features): not an image model
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(6, 16)
        self.head = nn.Linear(16, 3)

    def forward(self, x):
        if torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16:
            raise RuntimeError("Tiny does not support bf16")
        return self.head(torch.relu(self.proj(x)).mean(dim=1))

def build():
    x = torch.randn(32, 5, 6)
    y = torch.randint(0, 3, (32,))
    return Tiny(), x, y, nn.CrossEntropyLoss()

def image():
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.Flatten(), nn.Linear(4 * 6 * 6, 2))
    return model, torch.randn(4, 3, 8, 8), torch.randint(0, 2, (4,)), nn.CrossEntropyLoss()

def three():
    return nn.Linear(2, 2), torch.randn(2, 2), torch.zeros(2)

def not_a_model():
    return "model", torch.randn(2, 2), torch.zeros(2), nn.MSELoss()

def slow():
    import time
    time.sleep(60)
'''


@pytest.fixture()
def model_file(tmp_path: Path) -> Path:
    path = tmp_path / "seq_model.py"
    path.write_text(SEQ_MODEL)
    return path


def fake_runner(step_ms: dict[str, float], fail: dict[str, str] | None = None, loss: dict[str, float] | None = None,
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


# --- loading a reader's model -------------------------------------------------------------

def test_load_function_and_checks(model_file: Path) -> None:
    work = tune_trial.load_workload(f"{model_file}:build")
    assert work.input_dims == 3 and work.batch_size == 32
    assert isinstance(work.make_optimizer(work.model.parameters()), torch.optim.Adam)  # Adam by default
    for spec, words in [(str(model_file), "FUNC"), (f"{model_file.parent}/missing.py:build", "does not exist"),
                        (f"{model_file}:nothing", "no function"), (f"{model_file}:three", "tuple of 3 items"),
                        (f"{model_file}:not_a_model", "torch.nn.Module"), (f"{model_file}:bad-name", "FILE.py:FUNC")]:
        with pytest.raises(tune_trial.ModelSpecError, match=words):
            tune_trial.load_workload(spec)


def test_tune_and_cli_give_one_clear_error(model_file: Path, tmp_path: Path, capsys) -> None:
    with pytest.raises(tune.TuneError, match="FUNC"):
        tune.tune(f"{model_file}:three", out=None, runner=fake_runner({}), progress=False)
    with pytest.raises(tune.TuneError, match="Unknown device"):
        tune.tune(f"{model_file}:build", device="tpu", runner=fake_runner({}), progress=False)
    assert tune.main(["--model", "nowhere.py:build", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:") and "does not exist" in err[0]


# --- planning the levers ---------------------------------------------------------------------

def test_plan_levers_skips_what_does_not_apply(model_file: Path) -> None:
    seq = tune_trial.load_workload(f"{model_file}:build")
    img = tune_trial.load_workload(f"{model_file}:image")
    cpu = torch.device("cpu")
    cands, skipped = tune.plan_levers(seq, cpu)
    reasons = {s["label"]: s["reason"] for s in skipped}
    assert {"channels_last": True} not in cands and "4-D" in reasons["channels_last"]
    assert "CUDA" in reasons["compile:reduce-overhead"]
    assert {"autocast": "bf16"} in cands and {"batch": 2} in cands
    kinds = [next(iter(c)) for c in cands]
    assert kinds.index("compile") > kinds.index("autocast")  # the expensive lever comes last
    assert {"channels_last": True} in tune.plan_levers(img, cpu)[0]
    only, _ = tune.plan_levers(img, cpu, kinds=["channels_last", "optimizer"])
    assert only == [{"channels_last": True}, {"optimizer": "foreach"}, {"optimizer": "fused"}]
    with pytest.raises(tune.TuneError, match="unknown lever"):
        tune.plan_levers(img, cpu, kinds=["warp-drive"])


def test_make_trial_projects_total_and_guards_loss() -> None:
    raw = {"ok": True, "step_ms": 10.0, "spread_ms": 1.0, "samples_ms": [9.0, 10.0, 11.0], "warmup_s": 2.0,
           "first_loss": 2.0, "guard_loss": 1.0, "batch_factor": 2}
    t = tune.make_trial({"batch": 2}, raw, planned_steps=100, guard_steps=10, base_raw=raw, loss_tol=0.05,
                        stage="single", wall_s=1.0)
    assert t["ok"] and math.isclose(t["total_s"], 2.0 + 0.010 * (50 - 10)) and t["loss_diff"] == 0
    off = dict(raw, guard_loss=1.5)
    t = tune.make_trial({"autocast": "fp16"}, off, planned_steps=100, guard_steps=10, base_raw=raw, loss_tol=0.05,
                        stage="single", wall_s=1.0)
    assert not t["ok"] and "accuracy guard" in t["error"] and math.isclose(t["loss_diff"], 0.25)


# --- the search --------------------------------------------------------------------------------

def test_search_combines_winners_and_records_failures(model_file: Path, tmp_path: Path) -> None:
    runner = fake_runner({"baseline": 10.0, "bf16": 5.0, "opt:fused": 8.0, "opt:foreach": 10.5,
                          "opt:fused + bf16": 4.0},
                         fail={"fp16": "RuntimeError: no fp16 kernel"}, loss={"opt:foreach": 1.9})
    out = tmp_path / "out"
    report = tune.tune(f"{model_file}:build", kinds=["autocast", "optimizer"], planned_steps=200, budget=60,
                       out=out, runner=runner, progress=False)
    labels = [t["label"] for t in report["trials"]]
    assert labels[0] == "baseline" and report["baseline"] == report["trials"][0]
    assert set(labels) == {"baseline", "bf16", "fp16", "opt:foreach", "opt:fused", "opt:fused + bf16"}
    by = {t["label"]: t for t in report["trials"]}
    assert not by["fp16"]["ok"] and "fp16 kernel" in by["fp16"]["error"]  # recorded, search went on
    assert not by["opt:foreach"]["ok"] and "accuracy guard" in by["opt:foreach"]["error"]
    assert report["best"]["levers"] == {"autocast": "bf16", "optimizer": "fused"}
    assert math.isclose(report["best"]["speedup"], by["baseline"]["total_s"] / by["opt:fused + bf16"]["total_s"])
    saved = json.loads((out / "tune.json").read_text())
    assert {"version", "device", "planned_steps", "baseline", "trials", "best"} <= set(saved)
    assert {"levers", "ok", "step_ms", "spread_ms", "warmup_s", "total_s", "loss_diff", "error"} <= set(saved["trials"][1])
    assert {"levers", "speedup", "total_s"} <= set(saved["best"])
    rows = results.read_rows(out / "rows.jsonl")
    assert {r.variant for r in rows} == {"baseline", "bf16", "opt:fused", "opt:fused + bf16"}
    assert (out / "tune.png").stat().st_size > 1000
    text = tune_report.summary(report)
    assert "torch.autocast(\"cpu\", dtype=torch.bfloat16)" in text and "fused=True" in text


def test_baseline_wins_gives_speedup_one(model_file: Path) -> None:
    report = tune.tune(f"{model_file}:build", kinds=["optimizer"], budget=30,
                       runner=fake_runner({"baseline": 5.0, "opt:foreach": 6.0, "opt:fused": 7.0}), progress=False)
    assert report["best"]["levers"] == {} and report["best"]["speedup"] == 1.0
    assert "keep your script" in tune_report.summary(report)


def test_budget_is_respected(model_file: Path) -> None:
    runner = fake_runner({"baseline": 10.0}, sleep=0.4)
    start = time.perf_counter()
    report = tune.tune(f"{model_file}:build", kinds=["autocast", "optimizer", "batch"], budget=3.6,
                       runner=runner, progress=False)
    elapsed = time.perf_counter() - start
    assert elapsed < 3.6 + 0.5
    assert 1 <= len(report["trials"]) < 7
    assert any(s["reason"].startswith("budget") for s in report["skipped"])
    assert all(timeout <= 3.6 for _, timeout in runner.calls)  # no child may outlive the budget


def test_failing_baseline_is_one_clear_error(model_file: Path) -> None:
    with pytest.raises(tune.TuneError, match="baseline"):
        tune.tune(f"{model_file}:build", budget=10, runner=fake_runner({}, fail={"baseline": "boom"}), progress=False)


def test_apply_lines() -> None:
    how = tune_report.apply_lines({"threads": 1, "channels_last": True, "compile": "max-autotune"}, "cpu")
    assert how["env"] == ["OMP_NUM_THREADS=1"]
    assert "torch.set_num_threads(1)" in how["code"]
    assert 'model = torch.compile(model, mode="max-autotune")' in how["code"]
    assert "model = model.to(memory_format=torch.channels_last)" in how["code"]
    cuda = tune_report.apply_lines({"autocast": "fp16"}, "cuda:0 (NVIDIA H100)")
    assert 'scaler = torch.amp.GradScaler("cuda")' in cuda["code"] and "scaler.update()" in cuda["code"]
    assert tune.child_env({"threads": 3}) == {"OMP_NUM_THREADS": "3"}


# --- real child processes ------------------------------------------------------------------------

def test_child_timeout_kills_the_trial(model_file: Path) -> None:
    start = time.perf_counter()
    raw = tune.subprocess_runner({"model": f"{model_file}:slow", "levers": {}, "device": "cpu", "guard_steps": 3}, 2.0)
    assert not raw["ok"] and "timed out" in raw["error"]
    assert time.perf_counter() - start < 15


def test_end_to_end_non_image_model(model_file: Path, tmp_path: Path) -> None:
    report = tune.tune(f"{model_file}:build", kinds=["autocast"], budget=60, planned_steps=100, guard_steps=3,
                       repeats=2, block_s=0.02, out=tmp_path / "e2e", progress=False)
    by = {t["label"]: t for t in report["trials"]}
    assert by["baseline"]["ok"] and by["baseline"]["step_ms"] > 0
    assert not by["bf16"]["ok"] and "does not support bf16" in by["bf16"]["error"]  # failing lever, not fatal
    assert by["fp16"]["ok"] or by["fp16"]["error"]
    assert report["best"]["speedup"] >= 1.0
    assert (tmp_path / "e2e" / "tune.json").exists()


def test_run_trial_in_process_applies_levers(model_file: Path) -> None:
    raw = tune_trial.run_trial(f"{model_file}:image", {"channels_last": True, "optimizer": "foreach", "batch": 2},
                               guard_steps=2, repeats=2, block_s=0.001)
    assert raw["ok"] and raw["batch_size"] == 8 and len(raw["samples_ms"]) == 2 and raw["optimizer"] == "Adam"
    opt = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(2))], lr=0.1, weight_decay=0.05)
    fused = tune_trial._rebuild_optimizer(opt, "fused")  # AdamW's defaults hold a key its __init__ refuses
    assert type(fused) is torch.optim.AdamW and fused.defaults["fused"] and fused.defaults["weight_decay"] == 0.05


def test_rescore_break_even_and_explain(model_file: Path) -> None:
    report = tune.tune(f"{model_file}:build", kinds=["optimizer"], planned_steps=100, budget=30, guard_steps=10,
                       runner=fake_runner({"baseline": 10.0, "opt:foreach": 8.0, "opt:fused": 12.0}), progress=False)
    base, foreach = report["trials"][0], report["trials"][1]
    assert tune_report.break_even_steps(base, foreach) == 0.0  # same warm-up, faster steps
    slow_start = dict(foreach, warmup_s=foreach["warmup_s"] + 2.0)
    assert math.isclose(tune_report.break_even_steps(base, slow_start), 2.0 / 0.002)
    assert tune_report.break_even_steps(base, report["trials"][2]) is None  # never catches up
    projected = tune_report.rescore(report, 10_000)
    assert projected.column("trial")[0] == "opt:foreach" and projected.column("speed-up (x)")[-1] < 1
    text = " ".join(tune_report.explain(report))
    assert "opt:foreach helped" in text and "opt:fused hurt" in text
    assert tune_report.short_name({"model": "/some/where/m.py:build"}) == "m.py:build"
    assert tune_report.busy_note({"load_average": 9.0, "logical_cores": 2}).startswith("Note")
    assert tune_report.busy_note({"load_average": 0.5, "logical_cores": 2}) == ""
