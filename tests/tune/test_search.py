"""helpers.tune.search: one clear error, the search (with a stand-in runner, so it is fast and deterministic), the
budget, failing levers, the trial processes (a new one per trial, with an empty compile cache, killed past its
time), and the confirmation: which winners go to it, the A/A arm, a new process per arm and round, and what may be
recommended. The model file (``model_file``) is a fixture of tests/conftest.py, the stand-in runner
(``fake_runner``) and hand-made records of tests/tune/conftest.py."""

from __future__ import annotations

import json
import math
import os
import statistics
import sys
import time
from pathlib import Path

import pytest

from helpers import measure, results
from helpers.tune import search as tune
from helpers.tune import report as tune_report

confirm = tune  # the confirmation's functions live in the search module
ROOT = Path(__file__).resolve().parents[2]


# --- one clear error -------------------------------------------------------------------------

def test_tune_and_cli_give_one_clear_error(model_file: Path, tmp_path: Path, capsys, fake_runner) -> None:
    with pytest.raises(tune.TuneError, match="FUNC"):
        tune.tune(f"{model_file}:three", out=None, runner=fake_runner({}), progress=False)
    with pytest.raises(tune.TuneError, match="Unknown device"):
        tune.tune(f"{model_file}:build", device="tpu", runner=fake_runner({}), progress=False)
    assert tune.main(["--model", "nowhere.py:build", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:") and "does not exist" in err[0]


# --- planning the levers ---------------------------------------------------------------------


def test_make_trial_projects_total_and_guards_loss() -> None:
    raw = {"ok": True, "step_ms": 10.0, "spread_ms": 1.0, "samples_ms": [9.0, 10.0, 11.0], "warmup_s": 2.0,
           "first_loss": 2.0, "guard_loss": 1.0, "batch_factor": 2}
    t = tune.make_trial({"batch": 2}, raw, planned_steps=100, guard_steps=10, base_raw=raw,
                        stage="single", wall_s=1.0)
    assert t["ok"] and math.isclose(t["total_s"], 2.0 + 0.010 * (50 - 10)) and t["loss_diff"] == 0
    off = dict(raw, guard_loss=1.5)
    t = tune.make_trial({"autocast": "fp16"}, off, planned_steps=100, guard_steps=10, base_raw=raw,
                        stage="single", wall_s=1.0)
    assert not t["ok"] and "accuracy guard" in t["error"] and math.isclose(t["loss_diff"], 0.25)


# --- the search --------------------------------------------------------------------------------

def test_search_combines_winners_and_records_failures(model_file: Path, tmp_path: Path, fake_runner) -> None:
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


def test_baseline_wins_gives_speedup_one(model_file: Path, fake_runner) -> None:
    report = tune.tune(f"{model_file}:build", kinds=["optimizer"], budget=30,
                       runner=fake_runner({"baseline": 5.0, "opt:foreach": 8.0, "opt:fused": 9.0}), progress=False)
    assert report["best"]["levers"] == {} and report["best"]["speedup"] == 1.0
    text = tune_report.summary(report)
    assert "keep PyTorch's defaults on this machine" in text and "confirmed faster" not in text
    assert report["best"]["confirmed"]["word"] == "no candidate" and not report["confirmation"]["arms"]


def test_budget_is_respected(model_file: Path, fake_runner) -> None:
    runner = fake_runner({"baseline": 10.0}, sleep=0.4)
    start = time.perf_counter()
    report = tune.tune(f"{model_file}:build", kinds=["autocast", "optimizer", "batch"], budget=3.6,
                       runner=runner, progress=False)
    elapsed = time.perf_counter() - start
    assert elapsed < 3.6 + 0.5
    assert 1 <= len(report["trials"]) < 7
    assert any(s["reason"].startswith("budget") for s in report["skipped"])
    # the reason says where the budget went: what is kept back for the confirmation and the report
    assert all("kept for the confirmation and the report" in s["reason"] or "kept for the report" in s["reason"]
               for s in report["skipped"] if s["reason"].startswith("budget")), report["skipped"]
    assert all(timeout <= 3.6 for _, timeout in runner.calls)  # no child may outlive the budget


def test_the_confirmation_reserve_goes_to_trials_while_nothing_needs_confirming(model_file: Path, fake_runner) -> None:
    """Every lever is twice as slow (no winner, no near miss), so the reserve kept for a confirmation
    is never needed: the search spends it on trials instead of stopping after the first. Once a
    trial is a near miss, the reserve is kept again."""
    slow = {"baseline": 10.0, "bf16": 20.0, "fp16": 20.0, "opt:foreach": 20.0, "opt:fused": 20.0}
    budget = 8.0  # holds a few 0.4 s trials, but not those and a confirmation of 6 rounds (~9 s with the report's 4)
    kept = tune.tune(f"{model_file}:build", kinds=["autocast", "optimizer"], budget=budget, progress=False,
                     runner=fake_runner(slow, sleep=0.4), confirm_rounds=8)
    ran = [t["label"] for t in kept["trials"]]
    assert len(ran) >= 4, (ran, kept["skipped"])  # without borrowing the reserve only ~2 fit
    assert kept["confirmation"]["word"] == "no candidate"
    assert all("nothing to confirm yet" in s["reason"] for s in kept["skipped"] if s["reason"].startswith("budget"))
    near = dict(slow, **{ran[1]: 10.5})  # the first single is a near miss: from then on the reserve is kept
    report = tune.tune(f"{model_file}:build", kinds=["autocast", "optimizer"], budget=budget, progress=False,
                       runner=fake_runner(near, sleep=0.4), confirm_rounds=8)
    assert len(report["trials"]) < len(ran)
    assert any("kept for the confirmation" in s["reason"] for s in report["skipped"])


def test_failing_baseline_is_one_clear_error(model_file: Path, fake_runner) -> None:
    with pytest.raises(tune.TuneError, match="baseline"):
        tune.tune(f"{model_file}:build", budget=10, runner=fake_runner({}, fail={"baseline": "boom"}), progress=False)


# --- real child processes ------------------------------------------------------------------------


def test_end_to_end_non_image_model(model_file: Path, tmp_path: Path) -> None:
    report = tune.tune(f"{model_file}:build", kinds=["autocast"], budget=180, planned_steps=100, guard_steps=3,
                       confirm_rounds=0,  # the confirmation has its own tests; here: real child processes
                       diagnose=False,  # helpers.diagnose has its own tests (and measures roofs: tens of seconds)
                       repeats=2, block_s=0.02, out=tmp_path / "e2e", progress=False)
    by = {t["label"]: t for t in report["trials"]}  # the budget is a ceiling: a loaded machine needs more
    base = by["baseline"]
    assert base["ok"] and {"bf16", "fp16"} <= set(by), report["skipped"]
    # the step time is the median of the repeats (2 timed blocks), projected over the 97 steps after the guard's 3
    assert len(base["samples_ms"]) == 2 and base["step_ms"] == statistics.median(base["samples_ms"]) > 0
    assert base["total_s"] == pytest.approx(base["warmup_s"] + base["step_ms"] / 1000 * (100 - 3))
    assert not by["bf16"]["ok"] and "does not support bf16" in by["bf16"]["error"]  # failing lever, not fatal
    assert by["fp16"]["ok"] or by["fp16"]["error"]
    assert report["best"]["speedup"] >= 1.0
    assert (tmp_path / "e2e" / "tune.json").exists()
    assert report["version"] == 4 and not report["diagnosis"]["shares"] and report["diagnosis"]["error"]


def test_confirmation_rejects_a_search_fluke(model_file: Path, tmp_path: Path, fake_runner) -> None:
    """The candidate looked 25% faster in its one search trial; re-measured in interleaved rounds it
    is the baseline's equal: the tuner must keep the defaults and name the candidate as unconfirmed."""
    seen = {"opt:fused": 0}
    plain = fake_runner({"baseline": 10.0, "opt:fused": 10.0})

    def fluke(request, timeout):
        raw = plain(request, timeout)
        name = tune.label(request["levers"])
        if name == "opt:fused":
            seen[name] += 1
            if seen[name] == 1:  # only the search trial was lucky
                raw = dict(raw, step_ms=8.0, samples_ms=[8.0, 8.0, 8.0], spread_ms=0.0)
        return raw

    report = tune.tune(f"{model_file}:build", kinds=["optimizer"], planned_steps=100, budget=60, runner=fluke,
                       progress=False, out=tmp_path / "fluke")
    best = report["best"]
    assert best["levers"] == {} and best["speedup"] == 1.0
    assert best["unconfirmed"]["label"] == "opt:fused" and best["unconfirmed"]["search_speedup"] > 1.1
    assert best["confirmed"]["word"] == "no measurable difference" and best["confirmed"]["rounds"] == 8
    # one search trial, then one per confirmation round (and per round re-run because the machine was busy)
    assert seen["opt:fused"] == 1 + 8 + best["confirmed"]["reruns"]
    text = tune_report.summary(report)
    assert "keep PyTorch's defaults" in text and "opt:fused" in text and "unconfirmed" in text
    saved = json.loads((tmp_path / "fluke" / "tune.json").read_text())
    assert {"ratio", "low", "high", "word", "rounds"} <= set(saved["best"]["confirmed"])


def test_confirmation_recommends_a_real_gain(model_file: Path, fake_runner) -> None:
    report = tune.tune(f"{model_file}:build", kinds=["optimizer"], planned_steps=100, budget=60,
                       runner=fake_runner({"baseline": 10.0, "opt:fused": 7.0}), progress=False)
    conf = report["best"]["confirmed"]
    assert report["best"]["levers"] == {"optimizer": "fused"} and conf["word"] == "faster"
    assert math.isclose(report["best"]["speedup"], conf["ratio"]) and conf["low"] <= conf["ratio"] <= conf["high"]


def test_too_few_rounds_or_too_small_a_budget_confirm_nothing(model_file: Path, fake_runner) -> None:
    report = tune.tune(f"{model_file}:build", kinds=["optimizer"], planned_steps=100, budget=60, confirm_rounds=3,
                       runner=fake_runner({"baseline": 10.0, "opt:fused": 7.0}), progress=False)
    conf = report["best"]["confirmed"]
    assert report["best"]["levers"] == {} and conf["word"] == "no measurable difference"
    assert 3 <= conf["rounds"] < 6  # 3, or a whole design of 4
    assert "at least 6" in conf["reason"]  # measured, but too few rounds for any verdict
    plain = fake_runner({"baseline": 10.0, "opt:fused": 7.0})

    def costly_candidate(request, timeout):  # the candidate's trial takes 6x the baseline's
        time.sleep(0.6 if request["levers"] else 0.1)
        return plain(request, timeout)

    # the search keeps back room for confirming a candidate as cheap as the baseline, not this one
    report = tune.tune(f"{model_file}:build", kinds=["optimizer"], planned_steps=100, budget=6.4,
                       runner=costly_candidate, progress=False)
    conf = report["best"]["confirmed"]
    # nothing confirmed because the budget left the candidates unmeasured: inconclusive, not "keep the defaults"
    assert conf["word"] == "inconclusive (budget)" and conf["reason"].endswith(" of 2 candidates not measured"), report
    assert conf["front"]["word"] == "not confirmed" and "give a larger budget" in conf["front"]["reason"]
    assert tune_report.recommendation_line(report).startswith("Recommendation: inconclusive (budget): ")


def test_a_lever_2pct_faster_in_the_search_is_a_winner_whatever_its_spread() -> None:
    base = {"ok": True, "total_s": 10.0, "spread_total_s": 0.5}
    assert tune.is_winner(base, {"ok": True, "total_s": 9.0, "spread_total_s": 0.5})
    # the old gate (gain larger than the blocks' spread) dropped this one; now the confirmation decides
    assert tune.is_winner(base, {"ok": True, "total_s": 9.0, "spread_total_s": 1.5})
    assert tune.is_winner(base, {"ok": True, "total_s": 10.0 / 1.02})
    assert not tune.is_winner(base, {"ok": True, "total_s": 9.9, "spread_total_s": 0.0})  # under MIN_GAIN
    assert not tune.is_winner(base, {"ok": False, "total_s": 1.0})
    assert not tune.is_winner(base, base)


def test_a_single_lever_2pct_faster_is_sent_to_confirmation(model_file: Path, fake_runner) -> None:
    """opt:fused is 3% faster in the search, well inside the +-5% spread of its timed blocks (the old
    gate's reason to drop it): it goes to the interleaved confirmation, which finds it faster."""
    runner = fake_runner({"baseline": 10.0, "opt:fused": 9.6, "opt:foreach": 9.95})
    report = tune.tune(f"{model_file}:build", kinds=["optimizer"], planned_steps=100, budget=60, runner=runner,
                       progress=False)
    by = {t["label"]: t for t in report["trials"]}
    spread = max(by["opt:fused"]["totals_s"]) - min(by["opt:fused"]["totals_s"])
    assert spread > by["baseline"]["total_s"] - by["opt:fused"]["total_s"]
    arms = {a["label"]: a for a in report["confirmation"]["arms"]}
    # opt:foreach (0.5% faster: not a winner) is a near miss, confirmed too, and not faster
    assert set(arms) == {"opt:fused", "opt:foreach"} and arms["opt:foreach"]["word"] == "no measurable difference"
    conf = report["confirmation"]
    assert sum(levers == {"optimizer": "fused"} for levers, _ in runner.calls) == 1 + conf["rounds"] + conf["reruns"]
    assert arms["opt:fused"]["word"] == "faster" and report["best"]["levers"] == {"optimizer": "fused"}


def test_a_near_miss_goes_to_confirmation_and_can_be_recommended(model_file: Path, fake_runner) -> None:
    """Chapter 13's case: channels-last read 0.91x in its one search trial and 1.18x in interleaved
    rounds. Here opt:fused is really 20% faster but its search trial was unlucky (0.9x); opt:foreach
    is really twice as slow (0.5x in the search: no near miss). fused goes to the confirmation though
    it was no winner, the rounds find it faster, and it is recommended on its own."""
    plain = fake_runner({"baseline": 10.0, "opt:fused": 10.0 / 1.2, "opt:foreach": 20.0})
    runner = overriding(plain, "opt:fused", lambda n: dict(step_ms=11.2, samples_ms=[11.2] * 3) if n == 1 else {})
    report = tune.tune(f"{model_file}:build", kinds=["optimizer"], planned_steps=100, budget=60, runner=runner,
                       progress=False)
    by = {t["label"]: t for t in report["trials"]}
    assert tune.NEAR_MISS <= by["opt:fused"]["speedup"] < 1 + tune.MIN_GAIN and not tune.is_winner(by["baseline"], by["opt:fused"])
    assert tune.is_near_miss(by["baseline"], by["opt:fused"]) and not tune.is_near_miss(by["baseline"], by["opt:foreach"])
    arms = {a["label"]: a for a in report["confirmation"]["arms"]}
    assert set(arms) == {"opt:fused"} and arms["opt:fused"]["role"] == "candidate"
    assert arms["opt:fused"]["word"] == "faster" and report["best"]["levers"] == {"optimizer": "fused"}
    # a near miss that the rounds do not call faster is named as the unconfirmed front-runner
    report = tune.tune(f"{model_file}:build", kinds=["optimizer"], planned_steps=100, budget=60, progress=False,
                       runner=fake_runner({"baseline": 10.0, "opt:fused": 10.5, "opt:foreach": 20.0}))
    assert report["best"]["levers"] == {} and report["best"]["unconfirmed"]["label"] == "opt:fused"
    assert report["best"]["confirmed"]["word"] == "slower" and report["confirmation"]["rounds"] > 0
    assert "nothing that could be recommended was confirmed faster" in tune_report.recommendation_line(report)
    # a batch lever is never a near miss (it changes the training)
    assert not tune.is_near_miss({"ok": True, "total_s": 10.0}, {"ok": True, "total_s": 10.5, "levers": {"batch": 2}})


def test_a_batch_lever_is_never_recommended(model_file: Path, tmp_path: Path, fake_runner) -> None:
    """batch x2 is the fastest in the search and in the confirmation, yet only a throughput hint."""
    runner = fake_runner({"baseline": 10.0, "batch x2": 12.0, "batch x4": 22.0, "opt:fused": 9.0})
    report = tune.tune(f"{model_file}:build", kinds=["optimizer", "batch"], planned_steps=100, budget=60,
                       runner=runner, progress=False, out=tmp_path / "b")
    arms = {a["label"]: a for a in report["confirmation"]["arms"]}
    assert arms["batch x2"]["role"] == "hint" and arms["batch x2"]["word"] == "faster"
    assert arms["batch x2"]["ratio"] > arms["opt:fused"]["ratio"] > 1.02
    assert report["best"]["levers"] == {"optimizer": "fused"}
    assert not any("batch" in t["levers"] and t["stage"] == "combined" for t in report["trials"])  # not combined
    text = tune_report.summary(report)
    hint = next(ln for ln in text.splitlines() if ln.startswith("Throughput hint, not a recommendation: batch x2"))
    assert "over 50 steps of batch 64 (the samples of 100 steps of batch 32)" in hint and "planned steps" not in hint and "optimisation" in hint
    # with only batch levers faster, nothing is recommended: they are hints, confirmed or not
    report = tune.tune(f"{model_file}:build", kinds=["optimizer", "batch"], planned_steps=100, budget=60,
                       runner=fake_runner({"baseline": 10.0, "batch x2": 12.0, "batch x4": 22.0, "opt:fused": 20.0,
                                           "opt:foreach": 20.0}), progress=False)
    best = report["best"]
    assert best["levers"] == {} and best["speedup"] == 1.0 and best["unconfirmed"] is None
    assert best["confirmed"]["word"] == "no candidate" and "training unchanged" in best["confirmed"]["reason"]
    assert {a["role"] for a in report["confirmation"]["arms"]} == {"hint"}
    assert "Recommendation: keep PyTorch's defaults on this machine." in tune_report.summary(report)


def overriding(plain, label, change):
    """A fake runner that answers like ``plain`` except for the setting ``label``: its n-th call (from 1)
    gets the fields ``change(n)`` returns (none: unchanged)."""
    calls = {"n": 0}

    def runner(request, timeout):
        raw = plain(request, timeout)
        if tune.label(request["levers"]) == label:
            calls["n"] += 1
            raw = dict(raw, **change(calls["n"]))
        return raw
    return runner


def test_a_lever_the_combination_did_not_keep_is_never_recommended(model_file: Path, fake_runner) -> None:
    """bf16 leads the search, opt:fused is second and adding it to bf16 gains nothing, so the combination
    keeps bf16 alone. In the confirmation bf16 turns out a fluke and opt:fused is faster: nothing is
    recommended (opt:fused was not kept), and bf16 is named as the unconfirmed front-runner."""
    plain = fake_runner({"baseline": 10.0, "bf16": 10.0, "opt:fused": 8.0, "opt:fused + bf16": 7.0})
    runner = overriding(plain, "bf16", lambda n: {"step_ms": 7.0, "samples_ms": [7.0, 7.0, 7.0]} if n == 1 else {})

    report = tune.tune(f"{model_file}:build", kinds=["autocast", "optimizer"], planned_steps=100, budget=60,
                       runner=runner, progress=False)
    arms = {a["label"]: a for a in report["confirmation"]["arms"]}
    assert arms["opt:fused"]["role"] == "not kept" and arms["opt:fused"]["word"] == "faster"
    assert arms["bf16"]["role"] == "candidate" and arms["bf16"]["word"] == "no measurable difference"
    assert "opt:fused + bf16" not in arms  # measured in the search, not kept: not confirmed either
    best = report["best"]
    assert best["levers"] == {} and best["speedup"] == 1.0 and best["unconfirmed"]["label"] == "bf16"
    assert "not recommended" in tune_report.summary(report)


def test_nothing_confirmed_keeps_the_defaults(model_file: Path, fake_runner) -> None:
    plain = fake_runner({"baseline": 10.0, "opt:fused": 10.0, "opt:foreach": 10.0})
    calls = {"n": 0}

    def lucky_search(request, timeout):  # both levers look 20% faster in the search only
        raw = plain(request, timeout)
        if request["levers"] and calls["n"] < 2:
            calls["n"] += 1
            raw = dict(raw, step_ms=8.0)
        return raw

    report = tune.tune(f"{model_file}:build", kinds=["optimizer"], planned_steps=100, budget=60, runner=lucky_search,
                       progress=False)
    best, conf = report["best"], report["confirmation"]
    assert {a["label"] for a in conf["arms"]} == {"opt:foreach", "opt:fused"}
    assert all(a["word"] == "no measurable difference" for a in conf["arms"])
    assert conf["aa"]["word"] == "no measurable difference" and conf["attempts"] == 1  # two arms: an A/A arm rode along
    assert best["levers"] == {} and best["speedup"] == 1.0 and best["total_s"] == report["baseline"]["total_s"]
    assert {"ratio", "low", "high", "word", "rounds"} <= set(best["confirmed"])
    assert "nothing that could be recommended was confirmed faster" in tune_report.summary(report)


def test_fewer_levers_are_preferred_within_noise(model_file: Path, fake_runner) -> None:
    """The combination opt:fused + bf16 was kept in the search (4% faster than bf16 alone), but in the
    confirmation it is not measurably faster than bf16 alone: the recommendation is bf16."""
    plain = fake_runner({"baseline": 10.0, "bf16": 8.0, "opt:fused": 9.0, "opt:fused + bf16": 7.5})
    # confirmation rounds (every call after the search's): no better than bf16 alone
    runner = overriding(plain, "opt:fused + bf16", lambda n: {"step_ms": 7.95} if n > 1 else {})

    report = tune.tune(f"{model_file}:build", kinds=["autocast", "optimizer"], planned_steps=100, budget=60,
                       runner=runner, progress=False)
    arms = {a["label"]: a for a in report["confirmation"]["arms"]}
    assert arms["opt:fused + bf16"]["word"] == arms["bf16"]["word"] == "faster"
    assert arms["opt:fused + bf16"]["ratio"] > arms["bf16"]["ratio"]
    best = report["best"]
    assert best["levers"] == {"autocast": "bf16"} and math.isclose(best["speedup"], arms["bf16"]["ratio"])
    assert best["fewer_levers"]["over"] == "opt:fused + bf16"
    assert best["fewer_levers"]["word"] == "no measurable difference"
    assert "fewer levers than opt:fused + bf16" in tune_report.summary(report)


def test_batch_lever_is_untested_by_the_guard() -> None:
    raw = {"ok": True, "step_ms": 10.0, "spread_ms": 1.0, "samples_ms": [9.0, 10.0, 11.0], "warmup_s": 2.0,
           "first_loss": 2.0, "guard_loss": 1.0, "batch_factor": 2}
    t = tune.make_trial({"batch": 2}, raw, planned_steps=100, guard_steps=10, base_raw=raw,
                        stage="single", wall_s=1.0)
    assert t["guard"].startswith("untested")




# --- the diagnosis orders the trials -----------------------------------------------------------

@pytest.mark.parametrize("shares, regime", [({"compute": 0.6, "memory": 0.1, "overhead": 0.3}, "compute"),
                                            ({"compute": 0.2, "memory": 0.1, "overhead": 0.7}, "overhead")])
def test_the_first_trial_after_the_baseline_attacks_the_largest_regime(model_file: Path, tmp_path: Path, fake_runner,
                                                                        shares, regime) -> None:
    runner = fake_runner({"baseline": 10.0, "opt:fused": 8.0}, diagnosis=shares)
    report = tune.tune(f"{model_file}:build", kinds=["optimizer", "autocast"], planned_steps=100, budget=60,
                       out=tmp_path / "o", runner=runner, progress=False)
    diag = report["diagnosis"]
    assert report["trials"][1]["label"] == diag["first_trial"] and diag["attacks"][diag["first_trial"]] == regime
    assert diag["top"] == regime and diag["shares"] == shares
    assert diag["attacks"]["opt:fused"] == "overhead" and diag["attacks"].get("bf16", "compute") == "compute"
    saved = json.loads((tmp_path / "o" / "tune.json").read_text())
    assert saved["version"] == tune.FORMAT_VERSION == 4 and saved["diagnosis"]["top"] == regime
    text = tune_report.summary(report)
    assert f"attacks {regime}" in text
    assert "No tuner lever attacks input or communication" in text and "chapters 08-09" in text  # both 0% here
    assert report["best"]["levers"] == {"optimizer": "fused"}  # it attacks overhead: said when compute was named
    assert ("attacks overhead, not compute, the regime the diagnosis named" in text) == (regime == "compute")


def test_input_and_communication_have_no_lever_and_the_tuner_says_where_to_look(model_file: Path, fake_runner) -> None:
    shares = {"compute": 0.2, "memory": 0.1, "overhead": 0.1, "input": 0.45, "communication": 0.15}
    report = tune.tune(f"{model_file}:build", kinds=["optimizer"], planned_steps=100, budget=60, progress=False,
                       runner=fake_runner({"baseline": 10.0}, diagnosis=shares))
    assert set(report["diagnosis"]["no_lever"]) == {"input", "communication"}  # always named, with where to look
    assert report["trials"][1]["label"] in ("opt:foreach", "opt:fused")  # the largest regime a lever attacks
    text = tune_report.summary(report)
    assert "Input takes 45% of the step and no tuner lever attacks it: see chapter 05" in text
    assert "Communication takes 15% of the step" in text and "see chapters 08-09" in text


def test_without_a_diagnosis_the_trials_keep_the_plan_order(model_file: Path, fake_runner) -> None:
    report = tune.tune(f"{model_file}:build", kinds=["optimizer"], planned_steps=100, budget=60, progress=False,
                       runner=fake_runner({"baseline": 10.0}))
    assert [t["label"] for t in report["trials"][1:3]] == ["opt:foreach", "opt:fused"]
    assert report["diagnosis"]["first_trial"] is None and report["diagnosis"]["error"]
    assert "Diagnosis: none" in tune_report.summary(report)


def test_a_baseline_whose_diagnosis_overruns_runs_again_without_it(model_file: Path, fake_runner) -> None:
    runner = fake_runner({"baseline": 10.0}, diagnosis={"compute": 0.7, "memory": 0.3})
    plain = runner

    def slow_diagnosis(request, timeout):
        if request.get("diagnose"):
            runner.calls.append((request["levers"], timeout))
            return {"ok": False, "error": f"timed out after {timeout:.0f} s (killed: the trial ran past its time limit)"}
        return plain(request, timeout)

    slow_diagnosis.calls = runner.calls
    report = tune.tune(f"{model_file}:build", kinds=["optimizer"], planned_steps=100, budget=60, progress=False,
                       runner=slow_diagnosis)
    first, second = runner.calls[:2]
    assert first[0] == {} == second[0] and first[1] <= 30  # the diagnosing baseline gets half the budget at most
    assert report["trials"][0]["ok"] and "ran again without" in report["diagnosis"]["error"]
    assert len(report["trials"]) > 1  # the search went on


# --- the confirmation ------------------------------------------------------------------------

def t(label, levers, total, child_s=1.0):
    return {"label": label, "levers": levers, "total_s": total, "child_s": child_s}


KEPT = {"autocast": "bf16", "optimizer": "fused"}
WINNERS = [t("batch x2", {"batch": 2}, 5.0), t("opt:foreach", {"optimizer": "foreach"}, 8.5),
           t("opt:fused", {"optimizer": "fused"}, 8.0), t("bf16", {"autocast": "bf16"}, 7.0),
           t("opt:fused + bf16", KEPT, 6.0), t("bf16", {"autocast": "bf16"}, 7.0)]


def test_the_confirmation_takes_the_best_few_the_budget_holds(monkeypatch) -> None:
    arms = confirm.order_arms(WINNERS, KEPT)
    # what may be recommended first (lowest projected total first), then the rest: hints and levers not kept
    assert [a["label"] for a in arms] == ["opt:fused + bf16", "bf16", "opt:fused", "batch x2", "opt:foreach"]
    assert [confirm.role(a, KEPT) for a in arms] == ["candidate"] * 3 + ["hint", "not kept"]
    # one arm: 2 s a round (the baseline and it); a second adds itself and the A/A arm
    chosen, left_out, rounds = confirm.fit_arms(arms, base_s=1.0, left_s=20.0, rounds=8)
    assert [a["label"] for a in chosen] == ["opt:fused + bf16"] and rounds == 8
    assert all(x["reason"].startswith("budget") for x in left_out) and len(left_out) == 4
    chosen, left_out, rounds = confirm.fit_arms(arms, base_s=1.0, left_s=1000.0, rounds=8, kept=KEPT)
    assert len(chosen) == confirm.MAX_ARMS and rounds == 12  # 6 arms with the baseline and A/A: 2 x 6 orders
    assert left_out == [{"label": "opt:foreach", "levers": {"optimizer": "foreach"}, "role": "not kept",
                         "reason": f"a confirmation measures the best {confirm.MAX_ARMS} arms at most"}]
    # 60 s: three arms (5 with the baseline and A/A, 5 s a round) take a complete design of 10 rounds; a fourth
    # would need 12 rounds of 6 s, so it stays out rather than run an incomplete design or over the budget
    chosen, left_out, rounds = confirm.fit_arms(arms, base_s=1.0, left_s=60.0, rounds=8, kept=KEPT)
    assert len(chosen) == 3 and rounds == 10 and 10 * confirm.round_s(chosen, 1.0) <= 60
    assert left_out[0]["reason"] == "budget: 12 rounds with it would take about 72 s, 60 s were left"
    monkeypatch.setenv("COURSE_PROFILE", "smoke")  # smoke runs keep the rounds asked for
    assert confirm.fit_arms(arms, base_s=1.0, left_s=1000.0, rounds=8, kept=KEPT)[2] == 8
    assert confirm.fit_arms(arms, base_s=1.0, left_s=11.0, rounds=8)[0] == []  # 5 rounds: too few for a verdict
    assert confirm.round_s(arms[:2], 1.0) == 1.0 + 1.0 + 2.0  # baseline, A/A, two arms
    # starting the processes is paid from the same budget: 9 s of it leave 5 rounds, too few
    assert confirm.fit_arms(arms, base_s=1.0, left_s=20.0, rounds=8, startup=lambda n: 4.5 * n)[0] == []
    started = []  # processes per round: the baseline, each arm, the A/A arm from two arms on
    for n in (1, 2, 3):
        confirm.round_s(arms[:n], 1.0, startup=lambda k: started.append(k) or 0.0)
    assert started == [2, 4, 5]


def arm(label, levers, ratio, role="candidate", word="faster", rounds=8):
    return {"label": label, "levers": levers, "role": role, "ratio": ratio, "low": ratio, "high": ratio,
            "word": word, "rounds": rounds, "reason": "", "totals_s": [10.0 / ratio] * rounds}


def test_recommend_only_a_kept_setting_confirmed_faster_with_the_fewest_levers() -> None:
    front = {"label": "opt:fused + bf16", "levers": KEPT, "speedup": 1.4}
    record = {"rounds": 8, "attempts": 1, "reruns": 0, "disturbed": False,
              "arms": [arm("opt:fused + bf16", KEPT, 1.31), arm("bf16", {"autocast": "bf16"}, 1.30),
                       arm("opt:fused", {"optimizer": "fused"}, 1.1),
                       arm("batch x2", {"batch": 2}, 1.9, role="hint"),
                       arm("opt:foreach", {"optimizer": "foreach"}, 1.5, role="not kept")]}
    best = confirm.recommend(record, 10.0, front)
    # batch x2 and opt:foreach are faster than all, but a hint and a lever not kept; the combination is
    # not measurably faster than bf16 alone (1.31 / 1.30), so the fewer levers win
    assert best["levers"] == {"autocast": "bf16"} and best["speedup"] == 1.30 and best["total_s"] == 10.0 / 1.30
    assert best["fewer_levers"]["over"] == "opt:fused + bf16"
    assert {"ratio", "low", "high", "word", "rounds"} <= set(best["confirmed"])
    # the combination clearly ahead of every single lever: it is the recommendation
    record["arms"][0] = arm("opt:fused + bf16", KEPT, 1.6)
    assert confirm.recommend(record, 10.0, front)["levers"] == KEPT
    # nothing that may be recommended is faster: the defaults, the front-runner named as unconfirmed
    record["arms"] = [arm("opt:fused + bf16", KEPT, 1.01, word="no measurable difference"),
                      arm("batch x2", {"batch": 2}, 1.9, role="hint"),
                      arm("opt:foreach", {"optimizer": "foreach"}, 1.5, role="not kept")]
    best = confirm.recommend(record, 10.0, front)
    assert best["levers"] == {} and best["speedup"] == 1.0 and best["total_s"] == 10.0
    assert best["unconfirmed"] == {"label": "opt:fused + bf16", "levers": KEPT, "search_speedup": 1.4}
    assert best["confirmed"]["word"] == "no measurable difference" and best["confirmed"]["ratio"] == 1.01


def test_a_disturbed_confirmation_recommends_nothing() -> None:
    front = {"label": "bf16", "levers": {"autocast": "bf16"}, "speedup": 1.4}
    record = {"rounds": 8, "attempts": 2, "reruns": 0, "disturbed": True,
              "aa": {"ratio": 1.2, "low": 1.1, "high": 1.3, "word": "faster", "rounds": 8, "reason": ""},
              "arms": [arm("bf16", {"autocast": "bf16"}, 1.4, word=measure.DISTURBED)]}
    best = confirm.recommend(record, 10.0, front)
    assert best["levers"] == {} and best["speedup"] == 1.0
    assert best["confirmed"]["word"] == measure.DISTURBED and best["confirmed"]["attempts"] == 2
    # even a "faster" word in a run marked disturbed recommends nothing
    record["arms"] = [arm("bf16", {"autocast": "bf16"}, 1.4)]
    assert confirm.recommend(record, 10.0, front)["levers"] == {}


class FakeArms:
    """A confirmation runner that answers from a table of step times per arm (the A/A arm included)."""

    def __init__(self, step_ms):
        self.step_ms, self.asked = step_ms, []

    def __call__(self, request, timeout):
        self.asked.append(request["arm"])
        ms = self.step_ms[request["arm"]]
        return {"ok": True, "step_ms": ms, "spread_ms": 0.0, "samples_ms": [ms], "warmup_s": 0.5,
                "first_loss": 2.0, "guard_loss": 1.0, "batch_factor": 1}


def total(raw):
    return raw["warmup_s"] + raw["step_ms"] / 1000 * 90


def test_measure_arms_adds_an_a_a_arm_and_measures_a_disturbed_run_again() -> None:
    arms = [t("opt:fused", {"optimizer": "fused"}, 1.0), t("opt:foreach", {"optimizer": "foreach"}, 1.1)]
    quiet = FakeArms({"baseline": 10.0, confirm.AA: 10.0, "opt:fused": 7.0, "opt:foreach": 8.0})
    rec = confirm.measure_arms(arms, {"model": "m.py:build"}, rounds=6, kept={"optimizer": "fused"}, runner=quiet,
                               timeout=30, total=total)
    assert not rec["disturbed"] and rec["attempts"] == 1 and rec["aa"]["word"] == "no measurable difference"
    assert quiet.asked.count(confirm.AA) == rec["rounds"] + rec["reruns"]  # whole designs: rounds may grow
    assert [(a["label"], a["role"], a["word"]) for a in rec["arms"]] == [("opt:fused", "candidate", "faster"),
                                                                        ("opt:foreach", "not kept", "faster")]
    one = FakeArms({"baseline": 10.0, "opt:fused": 7.0})
    rec = confirm.measure_arms(arms[:1], {}, rounds=6, kept=None, runner=one, timeout=30, total=total)
    assert rec["aa"] is None and confirm.AA not in one.asked  # one arm: a plain pair, no A/A arm
    noisy = FakeArms({"baseline": 10.0, confirm.AA: 8.0, "opt:fused": 7.0, "opt:foreach": 8.0})
    rec = confirm.measure_arms(arms, {}, rounds=6, kept={"optimizer": "fused"}, runner=noisy, timeout=30, total=total,
                               attempts=2)
    assert rec["disturbed"] and rec["aa"]["word"] == "faster" and rec["attempts"] == 2
    assert noisy.asked.count("opt:fused") >= 2 * 6  # measured again as a whole (busy rounds re-run too)
    assert {a["word"] for a in rec["arms"]} == {measure.DISTURBED}  # no verdict words for the arms


def test_a_disturbed_a_a_arm_gives_no_conclusion_in_the_search(model_file: Path, fake_runner) -> None:
    """With two settings to confirm, the A/A arm (the baseline again) rides along; here it measures 25%
    faster than the baseline in every attempt, so nothing is concluded."""
    report = tune.tune(f"{model_file}:build", kinds=["optimizer"], planned_steps=100, budget=60, progress=False,
                       runner=fake_runner({"baseline": 10.0, confirm.AA: 8.0, "opt:fused": 7.0, "opt:foreach": 8.0}))
    conf, best = report["confirmation"], report["best"]
    assert conf["disturbed"] and conf["aa"]["word"] == "faster" and conf["attempts"] >= 1
    assert best["levers"] == {} and best["speedup"] == 1.0 and best["confirmed"]["word"] == measure.DISTURBED
    text = tune_report.summary(report)
    assert "no conclusion" in text and "confirmed faster" not in text


def test_a_failing_confirmation_trial_is_a_reason_not_a_crash() -> None:
    rec = confirm.measure_arms([t("bf16", {"autocast": "bf16"}, 1.0)], {}, rounds=6, kept=None, timeout=30, total=total,
                               runner=lambda request, timeout: {"ok": False, "error": "RuntimeError: boom"})
    assert rec["word"] == "not confirmed" and "boom" in rec["reason"]
    best = confirm.recommend(rec, 10.0, {"label": "bf16", "levers": {"autocast": "bf16"}, "speedup": 1.3})
    assert best["levers"] == {} and best["confirmed"] == {"word": "not confirmed", "rounds": 0, "reason": rec["reason"]}


@pytest.mark.parametrize("levers, expected", [({"batch": 2}, "hint"), ({"autocast": "bf16"}, "candidate"),
                                              ({"optimizer": "foreach"}, "not kept"), ({}, "not kept")])
def test_role(levers, expected) -> None:
    assert confirm.role({"levers": levers}, KEPT) == expected


def test_a_near_miss_is_a_candidate_unless_it_changes_the_training() -> None:
    """A near miss (a single lever the combination step never judged) may be recommended alone; a
    combination or a batch lever never becomes a candidate by being marked as one."""
    near = lambda levers: {"levers": levers, "near_miss": True}  # noqa: E731
    assert confirm.role(near({"optimizer": "foreach"}), KEPT) == "candidate"
    assert confirm.role(near({"batch": 2}), KEPT) == "hint"
    assert confirm.role(near({"optimizer": "foreach", "channels_last": True}), KEPT) == "not kept"
    assert confirm.role({**near({"optimizer": "foreach"}), "near_miss": False}, KEPT) == "not kept"


def test_nothing_recommended_with_candidates_unmeasured_is_inconclusive_not_the_defaults(hand_report) -> None:
    front = {"label": "bf16", "levers": {"autocast": "bf16"}, "speedup": 1.3}
    record = {"rounds": 8, "attempts": 1, "reruns": 0, "disturbed": False,
              "arms": [arm("bf16", {"autocast": "bf16"}, 1.01, word="no measurable difference")]}
    best = confirm.recommend(record, 10.0, front, unmeasured=(2, 5))
    assert best["levers"] == {} and best["confirmed"]["word"] == confirm.INCONCLUSIVE == "inconclusive (budget)"
    assert best["confirmed"]["reason"] == "2 of 5 candidates not measured"
    assert best["confirmed"]["front"]["word"] == "no measurable difference"
    assert confirm.recommend(record, 10.0, front)["confirmed"]["word"] == "no measurable difference"  # all measured
    record["arms"] = [arm("bf16", {"autocast": "bf16"}, 1.3)]  # a confirmed winner is recommended all the same
    assert confirm.recommend(record, 10.0, front, unmeasured=(2, 5))["levers"] == {"autocast": "bf16"}
    report = hand_report(best_levers={}, confirmed=best["confirmed"], unconfirmed={"label": "bf16", "search_speedup": 1.3})
    line = tune_report.recommendation_line(report)
    assert line.startswith("Recommendation: inconclusive (budget): 2 of 5 candidates not measured") and "keep" not in line.split(";")[0]
    assert tune_report.confirmation_line(report).startswith("Confirmation: bf16 vs the baseline in 8")


# --- trial processes -------------------------------------------------------------------------

STUB = """
import os, sys, time
from helpers.processes import serve

def handle(request):
    cache = os.environ["TORCHINDUCTOR_CACHE_DIR"]
    empty = not os.listdir(cache)
    with open(os.path.join(cache, "kernel.py"), "w") as f:  # what a compile would leave
        f.write("x")
    return {"ok": True, "pid": os.getpid(), "cache": cache, "triton": os.environ["TRITON_CACHE_DIR"],
            "was_empty": empty, "torch": "torch" in sys.modules, "arm": request.get("arm"),
            "threads_env": os.environ.get("OMP_NUM_THREADS"), "step_ms": 10.0, "warmup_s": 0.5}

serve(handle)
"""


def stub(levers):
    """A stand-in trial process with the trial's environment: answers at once, never imports torch."""
    return [sys.executable, "-c", STUB], {**tune.child_env(levers), "PYTHONPATH": str(ROOT)}


def test_the_confirmation_starts_a_new_process_per_arm_and_round(monkeypatch) -> None:
    got = []
    monkeypatch.setattr(tune, "trial_command", stub)
    arms = [{"label": "opt:fused", "levers": {"optimizer": "fused"}, "total_s": 1.0},
            {"label": "threads=1", "levers": {"threads": 1}, "total_s": 1.1}]
    rec = tune.measure_arms(arms, {"model": "m.py:build"}, rounds=2, kept=None, timeout=60, attempts=1,
                            total=lambda raw: got.append(raw) or raw["warmup_s"] + raw["step_ms"] / 1000 * 90)
    names = ["baseline", "opt:fused", "threads=1", tune.AA]
    assert len(got) == len(names) * (rec["rounds"] + rec["reruns"]) and {r["arm"] for r in got} == set(names)
    assert len({r["pid"] for r in got}) == len(got)  # never the same process twice, the A/A arm's included
    assert {r["threads_env"] for r in got if r["arm"] == "threads=1"} == {"1"}  # each arm its own environment
    caches = [r["cache"] for r in got]
    assert len(set(caches)) == len(caches) and all(r["was_empty"] and r["triton"].startswith(r["cache"]) for r in got)
    assert not any(os.path.exists(c) for c in caches) and not any(r["torch"] for r in got)
    assert rec["arms"][0]["warmup_s"] == 0.5 and rec["arms"][0]["step_ms"] == 10.0  # the cold start beside the steady


def test_a_search_trial_gets_an_empty_cache_removed_afterwards(monkeypatch) -> None:
    monkeypatch.setattr(tune, "trial_command", stub)
    raw = tune.subprocess_runner({"levers": {"compile": "default"}}, 60)
    assert raw["ok"] and raw["was_empty"] and not os.path.exists(raw["cache"])


def test_child_timeout_kills_the_trial(model_file: Path) -> None:
    start = time.perf_counter()
    raw = tune.subprocess_runner({"model": f"{model_file}:slow", "levers": {}, "device": "cpu", "guard_steps": 3}, 2.0)
    assert not raw["ok"] and "timed out" in raw["error"]
    assert time.perf_counter() - start < 15


def test_real_trial_processes(model_file: Path) -> None:
    req = {"model": f"{model_file}:build", "device": "cpu", "guard_steps": 2, "repeats": 1, "block_s": 0.001}
    a = tune.subprocess_runner({**req, "levers": {}}, 120)
    b = tune.subprocess_runner({**req, "levers": {"optimizer": "foreach", "threads": 1}}, 120)
    assert a["ok"] and b["ok"] and b["threads"] == 1  # the candidate's process got its lever's environment
    assert abs(a["first_loss"] - b["first_loss"]) < 1e-4  # both a fresh model of the same seed
