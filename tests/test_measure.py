import time

import pytest

from helpers import measure


def test_stats():
    s = measure.Stats.of([3.0, 1.0, 2.0, 10.0])
    assert (s.median, s.minimum, s.maximum, s.n) == (2.5, 1.0, 10.0, 4)
    with pytest.raises(ValueError):
        measure.Stats.of([])


def test_time_fn_counts_and_separates_warmup():
    calls = []
    res = measure.time_fn(lambda: (calls.append(1), time.sleep(0.002)), repeats=4, warmup=2, name="sleep")
    assert len(calls) == 6 and len(res.samples) == 4 and len(res.warmup) == 2
    assert res.stats.minimum >= 0.002
    with pytest.raises(ValueError):
        measure.time_fn(lambda: None, repeats=0)


def test_interleaved_orders_follow_a_williams_design_and_pair_rounds():
    calls = []
    variants = {name: (lambda name=name: calls.append(name) or {"a": 2.0, "b": 1.0, "c": 1.0}[name])
                for name in "abc"}
    r = measure.interleaved(variants, rounds=6, progress=False, max_reruns=0)
    assert calls[:9] == list("abc" "bca" "cab")  # the design's first three orders, one per round
    assert [list(o) for o in r.orders] == [calls[i:i + 3] for i in range(0, 18, 3)]
    assert r.samples["a"] == [2.0] * 6 and r.rounds == 6
    assert r.verdict("b").word == "faster" and r.verdict("c", baseline="b").word == measure.NO_DIFFERENCE
    t = r.table(title="t")
    assert t.column("verdict") == ["baseline", "faster", "faster"] and "6 interleaved rounds" in t.note
    assert "a complete Williams design (1 x 6 orders)" in t.note and "balanced" not in t.note
    with pytest.raises(ValueError):
        measure.interleaved({}, rounds=2)


def _followers(r):
    """How often each arm came right after each other arm within a round: ``{(before, after): count}``."""
    out = {}
    for order in r.orders:
        for a, b in zip(order, order[1:]):
            out[(a, b)] = out.get((a, b), 0) + 1
    return out


@pytest.mark.parametrize("arms", [2, 3, 4, 5, 6, 7])
def test_williams_orders_balance_first_order_carry_over(arms):
    orders = measure.williams_orders(arms)
    assert len(orders) == (2 * arms if arms % 2 else arms)
    assert all(sorted(o) == list(range(arms)) for o in orders)
    pairs = [(a, b) for o in orders for a, b in zip(o, o[1:])]
    expected = 2 if arms % 2 else 1   # every arm right after every other, equally often
    assert {p: pairs.count(p) for p in set(pairs)} == {(a, b): expected for a in range(arms) for b in range(arms)
                                                       if a != b}


def test_interleaved_balances_predecessors_where_a_rotation_did_not():
    # four arms over the default rounds: in a plain rotation (A B C D, B C D A, ...) B always follows A
    names = ["eager", "default", "reduce-overhead", "max-autotune"]
    r = measure.interleaved({n: (lambda: 1.0) for n in names}, rounds=measure.ROUNDS, progress=False, max_reruns=0)
    followers = _followers(r)
    for arm in names:
        before = [followers.get((other, arm), 0) for other in names if other != arm]
        assert max(before) <= 2 * min(before) and min(before) >= 1, (arm, before)
    assert followers[("eager", "default")] <= measure.ROUNDS // 3


def test_a_disturbed_round_is_measured_again_in_its_own_order(monkeypatch):
    loads = iter([0.9, 0.0, 0.0])

    fake_meter(monkeypatch, loads)
    calls = []
    r = measure.interleaved({n: (lambda n=n: calls.append(n) or 1.0) for n in "ab"}, rounds=2, max_reruns=1,
                            progress=False)
    assert calls == list("ab" "ab" "ba") and r.reruns == 1


def test_aa_arm_passes_on_identical_arms_and_is_named():
    variants = measure.with_aa({"base": lambda: 1.0, "x": lambda: 0.5})
    assert list(variants) == ["base", "x", "A/A: base again"]
    assert measure.aa_baseline("A/A: base again") == "base"
    with pytest.raises(ValueError):
        measure.aa_baseline("base")
    r = measure.interleaved(variants, rounds=8, progress=False, max_reruns=0, attempts=3)
    assert r.attempts == 1 and not r.aa_failed and r.aa == "A/A: base again"
    assert r.verdict("x", "base").word == "faster" and r.verdict("A/A: base again", "base").word == measure.NO_DIFFERENCE
    assert "A/A passed in the first attempt" in r.note()


def test_a_failing_aa_arm_is_measured_again_then_blocks_every_verdict():
    # the A/A arm's values drift 20% away from the baseline's in every attempt: the run is disturbed
    values = {"base": 1.0, "x": 0.5}
    variants = {"base": lambda: values["base"], "x": lambda: values["x"], measure.aa_name("base"): lambda: 1.2}
    r = measure.interleaved(variants, rounds=8, progress=False, max_reruns=0, attempts=3)
    assert r.attempts == 3 and r.aa_failed
    assert r.verdict("x", "base").word == measure.DISTURBED and not r.verdict("x", "base").won
    assert r.aa_verdict().word == "slower"
    table = r.table("base")
    assert measure.DISTURBED in table.column("verdict") and "faster" not in table.column("verdict")
    assert "Disturbed" in r.note() and "attempt 3 of 3" in r.note()


def test_aa_arm_that_passes_in_a_later_attempt_is_counted():
    attempt = {"n": 0}

    def base():
        return 1.0

    def again():   # the first attempt's A/A values are off, the second attempt's are not
        return 1.3 if attempt["n"] < 8 else 1.0

    def counting_base():
        attempt["n"] += 1
        return base()

    r = measure.interleaved({"base": counting_base, "x": lambda: 0.9, measure.aa_name("base"): again}, rounds=8,
                            progress=False, max_reruns=0, attempts=3)
    assert r.attempts == 2 and not r.aa_failed and "A/A passed in attempt 2" in r.note()
    assert r.verdict("x", "base").word == "faster"


def test_aa_arm_must_repeat_a_variant_of_the_comparison():
    with pytest.raises(ValueError):
        measure.interleaved({"a": lambda: 1.0, measure.aa_name("b"): lambda: 1.0}, rounds=2, progress=False)
    with pytest.raises(ValueError):
        measure.with_aa({"a": lambda: 1.0}, baseline="b")


def fake_meter(monkeypatch, loads):
    """Stand in for helpers.cpu_meter: each measured round reports the next of ``loads`` (cores taken by others)."""
    class FakeMeter:
        def start(self):
            return self

        def stop(self):
            return measure.Interference(next(loads), 0.0, 1.0)

    monkeypatch.setattr(measure, "CpuMeter", FakeMeter)


def test_interleaved_reruns_disturbed_rounds_within_budget(monkeypatch):
    loads = iter([0.9, 0.0, 0.9, 0.9, 0.0])  # cores taken by others in each measured round
    monkeypatch.setenv("COURSE_PROFILE", "smoke")  # 3 rounds as asked (larger sizes complete the design)

    fake_meter(monkeypatch, loads)
    r = measure.interleaved({"a": lambda: (1.0, {"acc": 50.0}), "b": lambda: 1.0}, rounds=3, max_reruns=2,
                            progress=False)
    assert r.reruns == 2 and r.disturbed == 1 and r.rounds == 3  # the budget ran out on the third disturbed one
    assert "2 round(s) re-run" in r.note() and "still disturbed" in r.note()
    assert r.result("a").metrics == {"acc": 50.0}


def test_interval_text_never_prints_a_threshold_the_bound_misses():
    near = measure.Verdict(1.0, 0.9812, 1.0196, measure.NO_DIFFERENCE, 8)
    assert near.interval == "0.981-1.0196"  # outward: 1.020 would be rounded up onto the threshold
    exact = measure.Verdict(1.1, 1.02, 1.2, "no measurable difference", 8)
    assert exact.interval == "1.02-1.20"
    plain = measure.Verdict(1.3, 1.2345, 1.456, "faster", 8)
    assert plain.interval == "1.23-1.46"
    assert measure.Verdict(1.0, 0.9, 1.1, measure.NO_DIFFERENCE, 3, reason="few").interval == "none (3 rounds)"


def test_rounds_table_prints_whole_number_metrics_as_counts():
    rounds = measure.interleaved({"a": lambda: (0.01, {"steps": 96.0, "acc": 68.4}),
                                  "b": lambda: (0.01, {"steps": 48.0, "acc": 40.0})}, 2, progress=False,
                                 max_reruns=0)
    rows = rounds.table("a", metrics=["steps", "acc"]).as_dicts()
    assert rows[0]["steps"] == 96 and isinstance(rows[0]["steps"], int)
    assert isinstance(rows[1]["acc"], float)   # 40.0 alone is whole, but 68.4 is not: the column stays decimal


def test_sample_long_enough_rule():
    from helpers.measure import sample_long_enough
    assert sample_long_enough(20, 0.01) and sample_long_enough(2, 0.6)
    assert not sample_long_enough(5, 0.1)
    with pytest.raises(ValueError):
        sample_long_enough(0, 1.0)


@pytest.mark.parametrize("arms, rounds", [(2, 8), (3, 12), (4, 8), (5, 10), (6, 12), (8, 8), (7, 8), (11, 8)])
def test_complete_rounds_at_the_workshop_size(monkeypatch, arms, rounds):
    monkeypatch.setenv("COURSE_PROFILE", "workshop")
    assert measure.complete_rounds(arms) == rounds
    names = [f"arm{i}" for i in range(arms)]
    r = measure.interleaved({n: (lambda: 1.0) for n in names}, progress=False, max_reruns=0)
    assert r.rounds == rounds
    followers = _followers(r)
    if rounds % len(measure.williams_orders(arms)) == 0:  # every ordered pair adjacent equally often
        assert len(set(followers.values())) == 1 and len(followers) == arms * (arms - 1)
        assert "complete Williams design" in r.note() and "approximately" not in r.note()
    else:
        assert f"approximately balanced ({rounds} of {2 * arms if arms % 2 else arms} orders)" in r.note()


def test_smoke_keeps_the_rounds_asked_for_and_never_says_balanced(monkeypatch):
    monkeypatch.setenv("COURSE_PROFILE", "smoke")
    r = measure.interleaved({"a": lambda: 1.0, "b": lambda: 1.0, "c": lambda: 1.0}, rounds=1, progress=False)
    assert r.rounds == 1 and "incomplete design (1 of 6 orders)" in r.note() and "balanced" not in r.note()
    with pytest.raises(ValueError):
        measure.complete_rounds(0)


def test_an_aa_arm_passes_only_when_its_interval_contains_one():
    # an offset of 1.5% is inside the +-2% band but its interval excludes 1.0: the A/A fails
    shifted = [1.015 * (1 + 0.001 * (i % 3)) for i in range(8)]
    v = measure.verdict([1.0] * 8, shifted)
    assert v.word == measure.NO_DIFFERENCE and not measure.aa_passes(v)
    assert measure.aa_word(v).startswith("A/A failed")
    assert measure.aa_passes(measure.verdict([1.0] * 8, [1.0, 1.01, 0.99, 1.0, 1.02, 0.98, 1.0, 1.0]))
    assert measure.aa_passes(measure.verdict([1.0], [2.0]))  # no interval: nothing to fail on


def test_round_hooks_run_around_every_round_untimed():
    log = []
    r = measure.interleaved({"a": lambda: log.append("a") or 1.0, "b": lambda: log.append("b") or 1.0}, rounds=2,
                            progress=False, max_reruns=0, before_round=lambda order: log.append(("start", order)),
                            after_round=lambda: log.append("stop"))
    assert log == [("start", ["a", "b"]), "a", "b", "stop", ("start", ["b", "a"]), "b", "a", "stop"]
    assert r.rounds == 2


def test_no_measurable_difference_says_what_the_run_could_see():
    base = [1.0, 1.1, 0.9, 1.05, 0.95, 1.0, 1.02, 0.98]
    samples = {"a": base, "b": [x * 1.01 for x in reversed(base)], "A/A: a again": list(reversed(base))}
    r = measure.Rounds(list(samples), samples, {n: [{}] * 8 for n in samples},
                       orders=[list(samples)] * 8)
    t = r.table()
    assert t.column("verdict")[1].startswith("no measurable difference (could see ≥ ")
    assert t.column("verdict")[2] == "A/A passed (contains 1.0)"
    assert "from the A/A arm's log-ratio noise" in t.note
    assert r.noise() == pytest.approx(measure.log_noise([b / a for b, a in zip(base, reversed(base))]))


def test_design_text_says_how_balanced_the_rounds_are():
    assert measure.design_text(8, 4) == "a complete Williams design (2 x 4 orders)"
    assert measure.design_text(10, 10) == "a complete Williams design (1 x 10 orders)"
    assert measure.design_text(3, 4) == "incomplete design (3 of 4 orders)"
    assert measure.design_text(6, 4) == "incomplete design (6 rounds, not a whole multiple of 4 orders)"
    assert measure.design_text(12, 14) == "approximately balanced (12 of 14 orders)"


@pytest.mark.parametrize("profile, arms, asked, runs", [("workshop", 5, 8, 10), ("workshop", 4, 7, 8),
                                                         ("full", 2, 9, 10), ("smoke", 5, 8, 8),
                                                         ("workshop", 7, 13, 13)])  # > 12: as asked
def test_planned_rounds_are_what_interleaved_runs(monkeypatch, profile, arms, asked, runs):
    monkeypatch.setenv("COURSE_PROFILE", profile)
    assert measure.planned_rounds(arms, asked) == runs
    r = measure.interleaved({f"arm{i}": (lambda: 1.0) for i in range(arms)}, asked, progress=False, max_reruns=0)
    assert r.rounds == runs


def test_reading_is_the_aa_check_for_an_aa_arm_and_the_label_otherwise():
    v = measure.Verdict(1.01, 0.95, 1.08, measure.NO_DIFFERENCE, 8, detectable=1.27)
    assert measure.reading("b", v) == "no measurable difference (could see ≥ 27%)"
    assert measure.reading(measure.aa_name("b"), v) == "A/A passed (contains 1.0)"
    fast = measure.Verdict(1.2, 1.1, 1.3, "faster", 8, detectable=1.27)
    assert measure.reading("b", fast) == "faster"
    assert measure.reading(measure.aa_name("b"), fast).startswith("A/A failed")
