"""helpers.tune.confirm: which of the search's winners go to confirmation (best first, as many as the
budget holds), the A/A arm that rides along with two or more of them, and what may be recommended:
only a setting of kept levers that the rounds call "faster", the fewest levers within noise, never a
bigger batch. Stand-in sessions and hand-made records keep every test fast and deterministic; the
whole search with a stand-in runner is tested in test_search.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers import measure
from helpers.tune import confirm
from helpers.tune import report as tune_report
from helpers.tune import search as tune


def t(label, levers, total, child_s=1.0):
    return {"label": label, "levers": levers, "total_s": total, "child_s": child_s}


KEPT = {"autocast": "bf16", "optimizer": "fused"}
WINNERS = [t("batch x2", {"batch": 2}, 5.0), t("opt:foreach", {"optimizer": "foreach"}, 8.5),
           t("opt:fused", {"optimizer": "fused"}, 8.0), t("bf16", {"autocast": "bf16"}, 7.0),
           t("opt:fused + bf16", KEPT, 6.0), t("bf16", {"autocast": "bf16"}, 7.0)]


def test_the_confirmation_takes_the_best_few_the_budget_holds() -> None:
    arms = confirm.order_arms(WINNERS, KEPT)
    # what may be recommended first (lowest projected total first), then the rest: hints and levers not kept
    assert [a["label"] for a in arms] == ["opt:fused + bf16", "bf16", "opt:fused", "batch x2", "opt:foreach"]
    assert [confirm.role(a["levers"], KEPT) for a in arms] == ["candidate"] * 3 + ["hint", "not kept"]
    # one arm: 2 s a round (the baseline and it); a second adds itself and the A/A arm
    chosen, left_out, rounds = confirm.fit_arms(arms, base_s=1.0, left_s=20.0, rounds=8)
    assert [a["label"] for a in chosen] == ["opt:fused + bf16"] and rounds == 8
    assert all(x["reason"].startswith("budget") for x in left_out) and len(left_out) == 4
    chosen, left_out, rounds = confirm.fit_arms(arms, base_s=1.0, left_s=1000.0, rounds=8)
    assert len(chosen) == confirm.MAX_ARMS and rounds == 8
    assert left_out == [{"label": "opt:foreach", "levers": {"optimizer": "foreach"},
                         "reason": f"a confirmation measures the best {confirm.MAX_ARMS} arms at most"}]
    assert confirm.fit_arms(arms, base_s=1.0, left_s=11.0, rounds=8)[0] == []  # 5 rounds: too few for a verdict
    assert confirm.round_s(arms[:2], 1.0) == 1.0 + 1.0 + 2.0  # baseline, A/A, two arms
    # starting the processes is paid from the same budget: 9 s of it leave 5 rounds, too few
    assert confirm.fit_arms(arms, base_s=1.0, left_s=20.0, rounds=8, startup=lambda n: 4.5 * n)[0] == []
    assert [confirm.processes(arms[:n]) for n in (1, 2, 3)] == [2, 4, 5]


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


class FakeSessions:
    """Confirmation processes that answer from a table of step times per name (the A/A arm included)."""

    def __init__(self, step_ms):
        self.step_ms, self.started, self.asked = step_ms, 0, []

    def __call__(self, requests, timeout):
        self.started += 1
        outer = self

        class Session:
            def ask(self, name):
                outer.asked.append(name)
                ms = outer.step_ms[name]
                return {"ok": True, "step_ms": ms, "spread_ms": 0.0, "samples_ms": [ms], "warmup_s": 0.5,
                        "first_loss": 2.0, "guard_loss": 1.0, "batch_factor": 1}

            def close(self):
                pass

        return Session()


def total(levers, raw):
    return raw["warmup_s"] + raw["step_ms"] / 1000 * 90


def test_measure_arms_adds_an_a_a_arm_and_measures_a_disturbed_run_again() -> None:
    arms = [t("opt:fused", {"optimizer": "fused"}, 1.0), t("opt:foreach", {"optimizer": "foreach"}, 1.1)]
    quiet = FakeSessions({"baseline": 10.0, confirm.AA: 10.0, "opt:fused": 7.0, "opt:foreach": 8.0})
    rec = confirm.measure_arms(arms, {"model": "m.py:build"}, rounds=6, kept={"optimizer": "fused"}, factory=quiet,
                               timeout=30, total=total)
    assert not rec["disturbed"] and rec["attempts"] == 1 and rec["aa"]["word"] == "no measurable difference"
    assert quiet.asked.count(confirm.AA) == rec["rounds"] + rec["reruns"]  # whole designs: rounds may grow
    assert [(a["label"], a["role"], a["word"]) for a in rec["arms"]] == [("opt:fused", "candidate", "faster"),
                                                                        ("opt:foreach", "not kept", "faster")]
    one = FakeSessions({"baseline": 10.0, "opt:fused": 7.0})
    rec = confirm.measure_arms(arms[:1], {}, rounds=6, kept=None, factory=one, timeout=30, total=total)
    assert rec["aa"] is None and confirm.AA not in one.asked  # one arm: a plain pair, no A/A arm
    noisy = FakeSessions({"baseline": 10.0, confirm.AA: 8.0, "opt:fused": 7.0, "opt:foreach": 8.0})
    rec = confirm.measure_arms(arms, {}, rounds=6, kept={"optimizer": "fused"}, factory=noisy, timeout=30, total=total,
                               attempts=2)
    assert rec["disturbed"] and rec["aa"]["word"] == "faster" and rec["attempts"] == 2
    assert noisy.asked.count("opt:fused") >= 2 * 6  # measured again as a whole (busy rounds re-run too)
    assert {a["word"] for a in rec["arms"]} == {measure.DISTURBED}  # no verdict words for the arms


def test_a_disturbed_a_a_arm_gives_no_conclusion_in_the_search(model_file: Path, fake_runner) -> None:
    """With two settings to confirm, the A/A arm (the baseline again) rides along; here it measures 25%
    faster than the baseline in every attempt, so nothing is concluded."""
    sessions = FakeSessions({"baseline": 10.0, confirm.AA: 8.0, "opt:fused": 7.0, "opt:foreach": 8.0})
    report = tune.tune(f"{model_file}:build", kinds=["optimizer"], planned_steps=100, budget=60, progress=False,
                       runner=fake_runner({"baseline": 10.0, "opt:fused": 7.0, "opt:foreach": 8.0}),
                       session_factory=sessions)
    conf, best = report["confirmation"], report["best"]
    assert conf["disturbed"] and conf["aa"]["word"] == "faster" and conf["attempts"] >= 1
    assert best["levers"] == {} and best["speedup"] == 1.0 and best["confirmed"]["word"] == measure.DISTURBED
    text = tune_report.summary(report)
    assert "no conclusion" in text and "confirmed faster" not in text


def test_a_failing_confirmation_trial_is_a_reason_not_a_crash() -> None:
    class Failing(FakeSessions):
        def __call__(self, requests, timeout):
            session = super().__call__(requests, timeout)
            session.ask = lambda name: {"ok": False, "error": "RuntimeError: boom"}
            return session

    rec = confirm.measure_arms([t("bf16", {"autocast": "bf16"}, 1.0)], {}, rounds=6, kept=None,
                               factory=Failing({}), timeout=30, total=total)
    assert rec["word"] == "not confirmed" and "boom" in rec["reason"]
    best = confirm.recommend(rec, 10.0, {"label": "bf16", "levers": {"autocast": "bf16"}, "speedup": 1.3})
    assert best["levers"] == {} and best["confirmed"] == {"word": "not confirmed", "rounds": 0, "reason": rec["reason"]}


@pytest.mark.parametrize("levers, expected", [({"batch": 2}, "hint"), ({"autocast": "bf16"}, "candidate"),
                                              ({"optimizer": "foreach"}, "not kept"), ({}, "not kept")])
def test_role(levers, expected) -> None:
    assert confirm.role(levers, KEPT) == expected


def test_a_near_miss_is_a_candidate_unless_it_changes_the_training() -> None:
    """A near miss (a single lever the combination step never judged) may be recommended alone; a
    combination or a batch lever never becomes a candidate by being marked as one."""
    assert confirm.role({"optimizer": "foreach"}, KEPT, near_miss=True) == "candidate"
    assert confirm.role({"batch": 2}, KEPT, near_miss=True) == "hint"
    assert confirm.role({"optimizer": "foreach", "channels_last": True}, KEPT, near_miss=True) == "not kept"
    trial = {"label": "opt:foreach", "levers": {"optimizer": "foreach"}, "near_miss": True}
    assert confirm.arm_role(trial, KEPT) == "candidate" and confirm.arm_role({**trial, "near_miss": False}, KEPT) == "not kept"


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
    assert "inconclusive (budget)" in tune_report.explain(report)[1]
