"""Tests of helpers.tune.report: what the tuner shows and writes -- the trial table and figure, the
summary with the lines that apply the recommendation, the result rows and files, and the projection
to another run length. Most tests use a report written out by hand (``hand_report``, its numbers are
known exactly); one builds a report with helpers.tune and a stand-in runner (``fake_runner``; both
in tests/tune/conftest.py). The sentences themselves are tested in test_advice.py."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from helpers import results
from helpers.tune import search as tune
from helpers.tune import report as tune_report


def test_hand_report_numbers_are_what_helpers_tune_computes(hand_report) -> None:
    """The report above follows tune.make_trial's arithmetic, so the tests below test real numbers."""
    raw = {"ok": True, "step_ms": 18.0, "spread_ms": 1.8, "samples_ms": [17.1, 18.0, 18.9], "warmup_s": 1.0,
           "first_loss": 2.0, "guard_loss": 1.0, "batch_factor": 2}
    made = tune.make_trial({"batch": 2}, raw, planned_steps=100, guard_steps=10, base_raw=raw, loss_tol=0.05,
                           stage="single", wall_s=1.0)
    by_hand = hand_report()["trials"][3]
    assert made["total_s"] == pytest.approx(by_hand["total_s"]) and made["totals_s"] == pytest.approx(by_hand["totals_s"])


# --- what the report says ----------------------------------------------------------------------

def test_table_has_a_row_per_trial_and_marks_the_untested_guard(hand_report) -> None:
    t = tune_report.table(hand_report())
    assert t.title == "Tuning m.py:build on cpu" and "total for 100 steps (s)" in t.columns
    assert t.column("trial") == ["baseline", "bf16", "fp16", "batch x2", "compile:default"]
    assert t.column("ok") == ["yes", "yes", "no", "yes", "yes"]
    assert t.column("loss diff (% of start)") == [0.0, 0.0, None, "untested", 0.0]
    assert t.column("error")[2] == "RuntimeError: no fp16 kernel"
    assert t.column("total for 100 steps (s)")[:2] == pytest.approx([1.9, 1.45])
    assert t.note.startswith("search speed-up: one trial each, not a verdict") and "Confirmation: bf16" in t.note
    assert "Confirmation" not in tune_report.table(hand_report(), with_confirmation=False).note
    assert tune_report.summary(hand_report()).count(tune_report.confirmation_line(hand_report())) == 1


def test_summary_recommends_the_confirmed_levers_with_the_lines_to_apply_them(hand_report) -> None:
    text = tune_report.summary(hand_report())
    assert "skipped compile:max-autotune: budget: needs about 90 s, 20 s left" in text
    assert "Recommendation: bf16, 1.31x faster than the baseline over 100 planned steps (confirmed" in text
    assert '  with torch.autocast("cpu", dtype=torch.bfloat16):' in text and "environment" not in text
    assert "Confirmation of m.py:build" in text and "A/A: baseline again" in text  # the confirmation table
    keep = tune_report.summary(hand_report({}, {"word": "no measurable difference", "ratio": 1.0, "low": 0.9,
                                                "high": 1.1, "rounds": 8}, {"label": "bf16", "search_speedup": 1.31}))
    assert "Recommendation: keep PyTorch's defaults on this machine: nothing that could be recommended was confirmed " \
           "faster. The search's front-runner, bf16 (1.31x in the search), is unconfirmed: not recommended." in keep
    assert "code:" not in keep


# --- applying the winner ---------------------------------------------------------------------

def test_apply_lines() -> None:
    how = tune_report.apply_lines({"threads": 1, "channels_last": True, "compile": "max-autotune"}, "cpu")
    assert how["env"] == ["OMP_NUM_THREADS=1"]
    assert "torch.set_num_threads(1)" in how["code"]
    assert 'model = torch.compile(model, mode="max-autotune")' in how["code"]
    assert "model = model.to(memory_format=torch.channels_last)" in how["code"]
    cuda = tune_report.apply_lines({"autocast": "fp16"}, "cuda:0 (NVIDIA H100)")
    assert 'scaler = torch.amp.GradScaler("cuda")' in cuda["code"] and "scaler.update()" in cuda["code"]


def test_apply_lines_for_openmp_optimizer_and_batch(monkeypatch) -> None:
    import sys

    env = {"OMP_NUM_THREADS": "2", "LD_PRELOAD": f"{sys.prefix}/lib/libiomp5.so", "KMP_AFFINITY": "a b"}
    monkeypatch.setattr(tune_report.system, "openmp_env", lambda variant, threads: env if variant == "intel" else {})
    how = tune_report.apply_lines({"omp": "intel", "threads": 2, "autocast": "bf16",
                                   "optimizer": "fused", "batch": 4, "compile": "default"}, "cpu", optimizer="SGD")
    assert how["env"] == ["OMP_NUM_THREADS=2", "LD_PRELOAD=$VIRTUAL_ENV/lib/libiomp5.so", 'KMP_AFFINITY="a b"']
    assert how["code"] == [
        "torch.set_num_threads(2)",
        "loader = DataLoader(dataset, batch_size=4 * batch_size, ...)  # 4x fewer steps: re-check the learning "
        "rate and accuracy",
        "optimizer = torch.optim.SGD(model.parameters(), ..., fused=True)  # your settings, plus this flag",
        "model = torch.compile(model)",
        'with torch.autocast("cpu", dtype=torch.bfloat16):', "    loss = loss_fn(model(inputs), targets)",
        "loss.backward()", "optimizer.step()"]
    assert tune_report.apply_lines({}) == {"env": [], "code": []}


# --- rows, files, figure -------------------------------------------------------------------------

def test_result_rows_hold_every_successful_trial(monkeypatch, tmp_path, hand_report) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))  # the machine salt of the rows' fingerprint
    rows = tune_report.result_rows(hand_report(), chapter="07")
    assert [(r.variant, r.metric) for r in rows] == [
        (v, m) for m in ("planned_total_time", "step_time") for v in ("baseline", "bf16", "batch x2", "compile:default")]
    assert all(r.chapter == "07" and r.experiment == "tune m.py:build" and r.baseline == "baseline" for r in rows)
    total = {r.variant: r for r in rows if r.metric == "planned_total_time"}
    assert total["bf16"].unit == "s" and total["bf16"].median == pytest.approx(1.45)
    # paired blocks: the verdict's Hodges-Lehmann estimate, near the ratio of the medians
    assert total["bf16"].ratio == pytest.approx(1.9 / 1.45, rel=1e-3) and total["batch x2"].ratio == pytest.approx(1.9 / 1.72, rel=1e-3)
    assert total["bf16"].extra == {"levers": {"autocast": "bf16"}, "warmup_s": 1.0, "loss_diff": 0.0,
                                   "planned_steps": 100, "device": "cpu"}
    step = {r.variant: r for r in rows if r.metric == "step_time"}
    assert step["bf16"].unit == "ms" and step["bf16"].values == pytest.approx([4.75, 5.0, 5.25])
    assert {r.data for r in rows} == {"none"}


def test_write_outputs_writes_json_rows_and_figure(monkeypatch, tmp_path, hand_report) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    report = hand_report()
    path = tune_report.write_outputs(report, tmp_path / "out")
    assert path == tmp_path / "out" / "tune.json" and json.loads(path.read_text()) == report
    assert len(results.read_rows(tmp_path / "out" / results.ROWS_FILE)) == 8
    assert (tmp_path / "out" / "tune.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["rows.jsonl", "tune.json", "tune.png"]


def test_figure_draws_a_bar_per_trial_and_marks_failures(hand_report) -> None:
    import matplotlib.pyplot as plt

    fig = tune_report.figure(hand_report())
    try:
        ax = fig.axes[0]
        assert [t.get_text() for t in ax.get_yticklabels()] == ["baseline", "bf16", "fp16", "batch x2", "compile:default"]
        widths = [bar.get_width() for bar in ax.patches]
        assert widths == pytest.approx([1.0, 1.9 / 1.45, 0.02, 1.9 / 1.72, 1.9 / 5.72])  # failed: a red stub
        texts = [t.get_text() for t in ax.texts]
        assert " failed: RuntimeError: no fp16 kernel" in texts and " 1.31x" in texts
    finally:
        plt.close(fig)


# --- another run length, break-even, explanations ----------------------------------------------

def test_rescore_break_even_and_explain(model_file: Path, fake_runner) -> None:
    report = tune.tune(f"{model_file}:build", kinds=["optimizer"], planned_steps=100, budget=30, guard_steps=10,
                       runner=fake_runner({"baseline": 10.0, "opt:foreach": 8.0, "opt:fused": 20.0}), progress=False)
    base, foreach = report["trials"][0], report["trials"][1]
    assert tune_report.break_even_steps(base, foreach) == 0.0  # same warm-up, faster steps
    slow_start = dict(foreach, warmup_s=foreach["warmup_s"] + 2.0)
    assert math.isclose(tune_report.break_even_steps(base, slow_start), 2.0 / 0.002)
    assert tune_report.break_even_steps(base, report["trials"][2]) is None  # never catches up
    projected = tune_report.rescore(report, 10_000)
    assert projected.column("trial")[0] == "opt:foreach" and projected.column("speed-up (x)")[-1] < 1
    text = " ".join(tune_report.explain(report))
    assert "Recommended: opt:foreach" in text and "; it is the recommendation." in text
    assert "opt:fused: 0.61x in its one search trial" in text
    assert "not at least 2% faster in the search, nor near enough to be worth confirming" in text
    assert tune_report.short_name({"model": "/some/where/m.py:build"}) == "m.py:build"
    assert tune_report.busy_note({"best": {"confirmed": {"reruns": 2}}}).startswith("Note: 2")
    assert tune_report.busy_note({"best": {"confirmed": {"reruns": 0}}}) == ""


def test_rescore_counts_a_bigger_batch_as_fewer_steps(hand_report) -> None:
    t = tune_report.rescore(hand_report(), 1000)
    totals = dict(zip(t.column("trial"), t.column("total for 1000 steps (s)")))
    assert set(totals) == {"baseline", "bf16", "batch x2", "compile:default"}  # the failed trial has no projection
    assert totals["baseline"] == pytest.approx(1.0 + 0.010 * 990)
    assert totals["batch x2"] == pytest.approx(1.0 + 0.018 * 490)  # 500 doubled steps, 10 of them the guard's
    assert t.column("trial")[0] == "bf16" and t.title == "m.py:build projected to 1000 planned steps"
    # break-even per step of the planned batch: the batch trial saves 1 ms a step from the start
    assert tune_report.break_even_steps(hand_report()["baseline"], hand_report()["trials"][3]) == 0.0
    assert tune_report.break_even_steps(hand_report()["baseline"], hand_report()["trials"][2]) is None  # failed


