"""Tests of helpers.tune.advice: what the tuner tells the reader -- the confirmation sentence and table,
the recommendation or PyTorch's defaults (and "nothing was confirmed faster" only after confirmation
rounds), the throughput hints of the batch lever, and a line per trial. Most tests use a report written
out by hand (``hand_report``, tests/tune/conftest.py); one builds one with helpers.tune and a stand-in runner."""

from __future__ import annotations

from helpers import measure
from helpers.tune import advice
from helpers.tune import confirm
from helpers.tune import report as tune_report


def test_confirmation_line_for_each_outcome(hand_report) -> None:
    assert advice.confirmation_line(hand_report()) == (
        "Confirmation: bf16 vs the baseline in 8 interleaved rounds, each a new process with an empty compile cache: "
        "1.31x (95% interval 1.20-1.40): faster.")
    unconfirmed = hand_report({}, {"ratio": 1.01, "low": 0.95, "high": 1.07, "word": "no measurable difference",
                                   "rounds": 8, "reruns": 0}, {"label": "bf16", "search_speedup": 1.31})
    assert advice.confirmation_line(unconfirmed).startswith("Confirmation: bf16 vs the baseline in 8")
    assert advice.confirmation_line(hand_report({}, {"word": "not confirmed", "reason": "give a larger budget"})) \
        == "Not confirmed: give a larger budget"
    for nothing in ({}, {"word": "no candidate"}):
        assert advice.confirmation_line(hand_report({}, nothing)) == (
            "No lever was at least 2% faster than the baseline in its search trial, or a near miss: nothing to confirm.")
    only_hints = hand_report({}, {"word": "no candidate", "reason": confirm.ONLY_HINTS_REASON})
    assert advice.confirmation_line(only_hints).startswith("No lever that leaves the training unchanged")


def test_short_name_and_busy_note(hand_report) -> None:
    assert advice.short_name(hand_report()) == "m.py:build"
    assert advice.short_name({"model": "C:\\Users\\me\\m.py:build"}) == "m.py:build"
    assert advice.busy_note(hand_report()) == ""
    assert advice.busy_note(hand_report(confirmed={"word": "faster", "reruns": 3})).startswith(
        "Note: 3 confirmation round(s) were measured again")


def test_the_batch_lever_is_a_hint_that_does_not_claim_the_planned_steps(hand_report, make_arm) -> None:
    text = tune_report.summary(hand_report())
    hints = [ln for ln in text.splitlines() if ln.startswith("Throughput hint")]
    assert hints == advice.hint_lines(hand_report()) and len(hints) == 1
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
    (hint,) = advice.hint_lines(left)
    assert "in its one search trial over 50 steps of batch 64" in hint and "not confirmed (budget: too little time)" in hint


def test_nothing_was_confirmed_is_said_only_when_a_confirmation_ran(hand_report, make_arm) -> None:
    ran = hand_report({}, {"word": "no measurable difference", "ratio": 1.0, "low": 0.9, "high": 1.1, "rounds": 8},
                      {"label": "bf16", "search_speedup": 1.31},
                      confirmation={"rounds": 8, "arms": [make_arm("bf16", {"autocast": "bf16"}, 1.0,
                                                              word="no measurable difference")]})
    assert "nothing that could be recommended was confirmed faster" in advice.recommendation_line(ran)
    assert "was confirmed faster" in advice.explain(ran)[1]
    for conf, why in [({"word": "no candidate", "rounds": 0, "arms": []}, "nothing went to confirmation"),
                      ({"word": "not confirmed", "rounds": 0, "reason": "give a larger budget"}, "no confirmation ran")]:
        report = hand_report({}, {"word": conf["word"], "rounds": 0, "reason": conf.get("reason", "")}, None,
                             confirmation=conf)
        text = tune_report.summary(report) + " ".join(advice.explain(report))
        assert "confirmed faster" not in text and "nothing was confirmed" not in text.lower()
        assert why in advice.explain(report)[1]
        assert advice.recommendation_line(report) == "Recommendation: keep PyTorch's defaults on this machine."
    word = measure.DISTURBED
    disturbed = hand_report({}, {"word": word, "ratio": 1.31, "low": 1.2, "high": 1.4, "rounds": 8},
                            {"label": "bf16", "search_speedup": 1.31},
                            confirmation={"rounds": 8, "disturbed": True, "attempts": 2,
                                          "aa": {"ratio": 1.2, "low": 1.1, "high": 1.3, "word": "faster", "reason": ""},
                                          "arms": [make_arm("bf16", {"autocast": "bf16"}, 1.31, word=word)]})
    assert "disturbed, so they give no conclusion" in advice.recommendation_line(disturbed)
    assert advice.confirmation_line(disturbed).endswith(f": {word}.")
    table = advice.confirmation_table(disturbed)
    assert table.column("verdict") == [word, "faster"] and "2 attempts" in table.note and "Disturbed" in table.note


def test_explain_each_kind_of_trial(monkeypatch, hand_report) -> None:
    monkeypatch.setattr(advice.system, "cpu_bf16_support", lambda: {"amx": False, "native_bf16": False})
    lines = advice.explain(hand_report())
    assert lines[1] == "Recommended: bf16, 1.31x over 100 planned steps (confirmed)."
    by = {ln.split(":")[0].split(" ")[0]: ln for ln in lines[2:]}
    assert by["bf16"].endswith("; confirmed alone: 1.31x (95% interval 1.21-1.41): faster; it is the recommendation. "
                               "(this CPU has no native bf16 instructions: a bf16 win here comes from moving half the "
                               "bytes.)")
    both = {ln.split(":")[0].split(" ")[0]: ln
            for ln in advice.explain(hand_report({"autocast": "bf16", "compile": "default"}))[2:]}
    # in a confirmed combination no hardware reason is given for one lever's share
    assert both["bf16"].endswith("; part of the confirmed recommendation.")
    assert by["fp16"] == "fp16 failed and was left out: RuntimeError: no fp16 kernel"
    assert by["batch"].endswith("; it changes the training: a throughput hint, not a recommendation. "
                                f"Accuracy guard: {advice.BATCH_NOTE}.")
    assert "confirmed alone: 1.10x" in by["batch"]
    assert "one step of 2x the samples 18 ms vs 10 ms, 2x fewer steps" in by["batch"]
    # compile: 4 s more warm-up, 2 ms (of 10) saved per step -> even after 2,000 steps
    assert "it pays for its compile after about 2,000 steps" in by["compile"]


def test_the_confirmation_line_gives_the_reason_when_there_is_no_interval_and_budget_skips_are_counted(hand_report) -> None:
    few = hand_report(confirmed={"ratio": 1.1, "low": 0.9, "high": 1.3, "word": "no measurable difference", "rounds": 2,
                                 "reason": "2 rounds cannot give a 95% interval; a verdict needs at least 6"})
    line = advice.confirmation_line(few)
    assert "no interval: 2 rounds cannot give" in line and "0.90-1.30" not in line
    assert "1 lever setting(s) skipped for lack of budget" in tune_report.summary(hand_report())


def test_a_batch_trial_that_was_not_faster_gives_no_hint(hand_report) -> None:
    report = hand_report(confirmation={"rounds": 0, "arms": []})
    report["trials"][3]["speedup"] = 0.9  # batch x2, slower than the baseline in its search trial
    assert advice.hint_lines(report) == []
    report["trials"][3]["speedup"] = 1.1
    (hint,) = advice.hint_lines(report)
    assert "1.10x in its one search trial" in hint and "not confirmed (no confirmation ran)" in hint
