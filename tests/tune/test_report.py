"""helpers.tune.report: what the tuner tells the reader and writes -- the confirmation sentence and table, the
recommendation or PyTorch's defaults, the throughput hints, the trial table and figure, the lines that apply the
recommendation, the result rows and files, and the projection to another run length. Most tests use a report
written out by hand (``hand_report``, tests/tune/conftest.py: its numbers are known exactly)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from helpers import measure, results
from helpers.tune import search as tune
from helpers.tune import report as tune_report


def test_hand_report_numbers_are_what_helpers_tune_computes(hand_report) -> None:
    """The report above follows tune.make_trial's arithmetic, so the tests below test real numbers."""
    raw = {"ok": True, "step_ms": 18.0, "spread_ms": 1.8, "samples_ms": [17.1, 18.0, 18.9], "warmup_s": 1.0,
           "first_loss": 2.0, "guard_loss": 1.0, "batch_factor": 2}
    made = tune.make_trial({"batch": 2}, raw, planned_steps=100, guard_steps=10, base_raw=raw,
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
    monkeypatch.setattr("helpers.openmp.openmp_env", lambda variant, threads: env if variant == "intel" else {})
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
    written = {p.name for p in (tmp_path / "out").iterdir()} - {"rows.jsonl.lock"}  # helpers.results' lock
    assert written == {"rows.jsonl", "tune.json", "tune.png"}


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


# --- another run length, break-even ----------------------------------------------

def test_rescore_and_break_even(model_file: Path, fake_runner) -> None:
    report = tune.tune(f"{model_file}:build", kinds=["optimizer"], planned_steps=100, budget=30, guard_steps=10,
                       runner=fake_runner({"baseline": 10.0, "opt:foreach": 8.0, "opt:fused": 20.0}), progress=False)
    base, foreach = report["trials"][0], report["trials"][1]
    assert tune_report.break_even_steps(base, foreach) == 0.0  # same warm-up, faster steps
    slow_start = dict(foreach, warmup_s=foreach["warmup_s"] + 2.0)
    assert math.isclose(tune_report.break_even_steps(base, slow_start), 2.0 / 0.002)
    assert tune_report.break_even_steps(base, report["trials"][2]) is None  # never catches up
    projected = tune_report.rescore(report, 10_000)
    assert projected.column("trial")[0] == "opt:foreach" and projected.column("speed-up (x)")[-1] < 1
    assert report["best"]["levers"] == {"optimizer": "foreach"}
    assert tune_report.short_name({"model": "/some/where/m.py:build"}) == "m.py:build"


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


# --- the sentences ---------------------------------------------------------------------------

def test_confirmation_line_for_each_outcome(hand_report) -> None:
    assert tune_report.confirmation_line(hand_report()) == (
        "Confirmation: bf16 vs the baseline in 8 interleaved rounds, each a new process with an empty compile cache: "
        "1.31x (95% interval 1.20-1.40): faster.")
    unconfirmed = hand_report({}, {"ratio": 1.01, "low": 0.95, "high": 1.07, "word": "no measurable difference",
                                   "rounds": 8, "reruns": 0}, {"label": "bf16", "search_speedup": 1.31})
    assert tune_report.confirmation_line(unconfirmed).startswith("Confirmation: bf16 vs the baseline in 8")
    assert tune_report.confirmation_line(hand_report({}, {"word": "not confirmed", "reason": "give a larger budget"})) \
        == "Not confirmed: give a larger budget"
    for nothing in ({}, {"word": "no candidate"}):
        assert tune_report.confirmation_line(hand_report({}, nothing)) == (
            "No lever was at least 2% faster than the baseline in its search trial, or a near miss: nothing to confirm.")
    only_hints = hand_report({}, {"word": "no candidate", "reason": tune_report.ONLY_HINTS_REASON})
    assert tune_report.confirmation_line(only_hints).startswith("No lever that leaves the training unchanged")


def test_short_name_and_busy_note(hand_report) -> None:
    assert tune_report.short_name(hand_report()) == "m.py:build"
    assert tune_report.short_name({"model": "C:\\Users\\me\\m.py:build"}) == "m.py:build"
    assert "measured again" not in tune_report.summary(hand_report())
    assert "\nNote: 3 confirmation round(s) were measured again" in tune_report.summary(
        hand_report(confirmed={"ratio": 1.31, "low": 1.2, "high": 1.4, "word": "faster", "rounds": 8, "reruns": 3}))


def test_the_batch_lever_is_a_hint_that_does_not_claim_the_planned_steps(hand_report, make_arm) -> None:
    text = tune_report.summary(hand_report())
    hints = [ln for ln in text.splitlines() if ln.startswith("Throughput hint")]
    assert hints == tune_report.hint_lines(hand_report()) and len(hints) == 1
    hint = hints[0]
    assert hint.startswith("Throughput hint, not a recommendation: batch x2: 1.10x (95% interval 1.05-1.15): faster")
    # measured over the batch's own steps (50 of 2x the batch), never "over 100 planned steps"
    assert "over 50 steps of batch 64 (the samples of 100 steps of batch 32)" in hint and "planned steps" not in hint
    assert "changes the optimisation" in hint and "fewer optimizer steps" in hint
    assert "Recommendation: bf16" in text and "Recommendation: batch" not in text
    # a batch hint the budget left out is described by its one search trial, not confirmed
    left = hand_report(confirmation={"rounds": 8, "arms": [make_arm("bf16", {"autocast": "bf16"}, 1.31)],
                                     "left_out": [{"label": "batch x2", "levers": {"batch": 2}, "role": "hint",
                                                   "reason": "budget: too little time"}]})
    (hint,) = tune_report.hint_lines(left)
    assert "in its one search trial over 50 steps of batch 64" in hint and "not confirmed (budget: too little time)" in hint


def test_nothing_was_confirmed_is_said_only_when_a_confirmation_ran(hand_report, make_arm) -> None:
    ran = hand_report({}, {"word": "no measurable difference", "ratio": 1.0, "low": 0.9, "high": 1.1, "rounds": 8},
                      {"label": "bf16", "search_speedup": 1.31},
                      confirmation={"rounds": 8, "arms": [make_arm("bf16", {"autocast": "bf16"}, 1.0,
                                                              word="no measurable difference")]})
    assert "nothing that could be recommended was confirmed faster" in tune_report.recommendation_line(ran)
    for conf in [{"word": "no candidate", "rounds": 0, "arms": []},
                 {"word": "not confirmed", "rounds": 0, "reason": "give a larger budget"}]:
        report = hand_report({}, {"word": conf["word"], "rounds": 0, "reason": conf.get("reason", "")}, None,
                             confirmation=conf)
        text = tune_report.summary(report)
        assert "confirmed faster" not in text and "nothing was confirmed" not in text.lower()
        assert tune_report.recommendation_line(report) == "Recommendation: keep PyTorch's defaults on this machine."
    word = measure.DISTURBED
    disturbed = hand_report({}, {"word": word, "ratio": 1.31, "low": 1.2, "high": 1.4, "rounds": 8},
                            {"label": "bf16", "search_speedup": 1.31},
                            confirmation={"rounds": 8, "disturbed": True, "attempts": 2,
                                          "aa": {"ratio": 1.2, "low": 1.1, "high": 1.3, "word": "faster", "rounds": 8,
                                                 "reason": ""},
                                          "arms": [make_arm("bf16", {"autocast": "bf16"}, 1.31, word=word)]})
    assert "disturbed, so they give no conclusion" in tune_report.recommendation_line(disturbed)
    assert tune_report.confirmation_line(disturbed).endswith(f": {word}.")
    table = tune_report.confirmation_table(disturbed)
    assert table.column("verdict") == [word, "A/A failed (excludes 1.0)"]  # the A/A row says whether it passed
    assert "2 attempts" in table.note and "Disturbed" in table.note


def test_the_confirmation_line_gives_the_reason_when_there_is_no_interval_and_budget_skips_are_counted(hand_report) -> None:
    few = hand_report(confirmed={"ratio": 1.1, "low": 0.9, "high": 1.3, "word": "no measurable difference", "rounds": 2,
                                 "reason": "2 rounds cannot give a 95% interval; a verdict needs at least 6"})
    line = tune_report.confirmation_line(few)
    assert "no interval: 2 rounds cannot give" in line and "0.90-1.30" not in line
    assert "1 lever setting(s) skipped for lack of budget" in tune_report.summary(hand_report())


def test_a_batch_trial_that_was_not_faster_gives_no_hint(hand_report) -> None:
    report = hand_report(confirmation={"rounds": 0, "arms": []})
    report["trials"][3]["speedup"] = 0.9  # batch x2, slower than the baseline in its search trial
    assert tune_report.hint_lines(report) == []
    report["trials"][3]["speedup"] = 1.1
    (hint,) = tune_report.hint_lines(report)
    assert "1.10x in its one search trial" in hint and "not confirmed (no confirmation ran)" in hint


def test_the_confirmation_table_names_its_design_and_what_no_difference_could_see(hand_report, make_arm) -> None:
    arm = {**make_arm("bf16", {"autocast": "bf16"}, 1.01, word=measure.NO_DIFFERENCE, low=0.93, high=1.1,
                      rounds=10), "detectable": 1.27}
    aa = {"ratio": 0.99, "low": 0.92, "high": 1.07, "word": measure.NO_DIFFERENCE, "rounds": 10, "reason": ""}
    report = hand_report({}, None, {"label": "bf16", "search_speedup": 1.31},
                         confirmation={"rounds": 10, "design": 10, "attempts": 1, "disturbed": False, "aa": aa,
                                       "arms": [arm, make_arm("x", {"batch": 2}, 1.0, word=measure.NO_DIFFERENCE,
                                                              rounds=10)]})
    table = tune_report.confirmation_table(report)
    assert table.column("verdict") == ["no measurable difference (could see ≥ 27%)", "no measurable difference",
                                       "A/A passed (contains 1.0)"]  # no estimate stored: no claim
    assert table.note.startswith("10 interleaved rounds, a complete Williams design (1 x 10 orders), each setting")
    report["best"]["confirmed"] = {**arm, "reruns": 0, "attempts": 1}
    assert tune_report.confirmation_line(report).endswith("0.93-1.10): no measurable difference (could see ≥ 27%).")
