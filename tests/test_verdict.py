"""helpers.verdict, the one comparison rule: its error rates on synthetic rounds (shared drift and
independent noise as measured on the course's 2-core machine), its interval and its words."""

import math
import random

import pytest

from helpers import verdict as rule

# ---- the one comparison rule ----------------------------------------------------------



def synthetic_rounds(rng, n, true_ratio, drift=0.08, noise=0.06, outlier=False):
    """Per-round times of a baseline and a variant: a drift shared by the round, independent
    noise per variant, the variant true_ratio times faster; optionally one round 3x slower."""
    base, var = [], []
    for _ in range(n):
        shared = math.exp(rng.gauss(0, drift))
        base.append(shared * math.exp(rng.gauss(0, noise)))
        var.append(shared * math.exp(rng.gauss(0, noise)) / true_ratio)
    if outlier:
        k = rng.randrange(n)
        (base if rng.random() < 0.5 else var)[k] *= 3
    return base, var


def rate(true_ratio, *, outlier=False, trials=600, seed=1):
    rng = random.Random(seed)
    words = [rule.verdict(*synthetic_rounds(rng, rule.ROUNDS, true_ratio, outlier=outlier)).word
             for _ in range(trials)]
    return words


def test_verdict_false_positive_rate_on_identical_variants():
    words = rate(1.0)
    assert sum(w != rule.NO_DIFFERENCE for w in words) / len(words) <= 0.05


def test_verdict_finds_a_true_15_percent_difference():
    faster = rate(1.15)
    assert sum(w == "faster" for w in faster) / len(faster) >= 0.80
    slower = rate(1 / 1.15, seed=2)
    assert sum(w == "slower" for w in slower) / len(slower) >= 0.80


def test_one_disturbed_round_does_not_make_a_verdict():
    words = rate(1.0, outlier=True, seed=3)
    assert sum(w != rule.NO_DIFFERENCE for w in words) / len(words) <= 0.05
    # and a single 3x round among otherwise identical rounds: no verdict, ratio untouched
    v = rule.verdict([1.0] * 8, [1.0] * 7 + [3.0])
    assert v.word == rule.NO_DIFFERENCE and v.ratio == pytest.approx(1.0)


def test_verdict_values_and_words():
    v = rule.verdict([2.0] * 8, [1.0] * 8)
    assert (v.ratio, v.low, v.high, v.word, v.rounds) == (pytest.approx(2.0), pytest.approx(2.0), pytest.approx(2.0),
                                                          "faster", 8)
    assert v.won and v.than == "faster than" and "2.00x" in str(v)
    s = rule.verdict([1.0] * 8, [1.5] * 8)
    assert s.word == "slower" and s.ratio == pytest.approx(2 / 3)
    small = rule.verdict([1.0] * 8, [1 / 1.01] * 8)  # 1% better, inside min_effect
    assert small.word == rule.NO_DIFFERENCE and small.than.startswith("no measurable")
    rates = rule.verdict([100.0] * 8, [150.0] * 8, higher_is_better=True)
    assert rates.word == "faster" and rates.ratio == pytest.approx(1.5)


def test_too_few_rounds_say_so():
    v = rule.verdict([2.0] * 5, [1.0] * 5)
    assert v.word == rule.NO_DIFFERENCE and "at least 6" in v.reason and v.interval == "none (5 rounds)"
    assert rule.verdict([2.0] * 6, [1.0] * 6).word == "faster"
    with pytest.raises(ValueError, match="paired"):
        rule.verdict([1.0, 2.0], [1.0])
    with pytest.raises(ValueError, match="positive"):
        rule.verdict([1.0], [0.0])
    with pytest.raises(ValueError):
        rule.verdict([], [])


def test_signed_rank_interval_matches_the_exact_distribution():
    # n = 8: P(T+ <= 3) = 5/256 <= 0.025 < P(T+ <= 4) = 7/256, so the 4th smallest Walsh average
    assert rule._critical_rank(8, 0.95) == 3
    assert rule._critical_rank(5, 0.95) == -1
    d = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8]
    v = rule.verdict([math.exp(x) for x in d], [1.0] * 8)
    walsh = sorted((d[i] + d[j]) / 2 for i in range(8) for j in range(i, 8))
    assert v.low == pytest.approx(math.exp(walsh[3])) and v.high == pytest.approx(math.exp(walsh[-4]))
    # one estimand: the printed ratio is the Hodges-Lehmann estimate, the median of the Walsh averages
    assert v.ratio == pytest.approx(math.exp((walsh[17] + walsh[18]) / 2))


def test_the_estimate_lies_inside_its_printed_interval_in_every_case():
    rng = random.Random(7)
    for _ in range(3000):
        n = rng.randrange(6, 15)
        base, var = synthetic_rounds(rng, n, rng.choice([1.0, 1.03, 1.15, 0.9]), noise=rng.choice([0.01, 0.06, 0.2]))
        if rng.random() < 0.3:  # skewed rounds, where the median of ratios left the old interval
            var[rng.randrange(n)] *= rng.choice([0.5, 2.0])
        v = rule.verdict(base, var)
        low, high = (float(x) for x in v.interval.split("-"))
        assert low <= v.low <= v.ratio <= v.high <= high
        assert low <= float(f"{v.ratio:.2f}") <= high  # printed ratio inside the printed interval


def test_one_round_keeps_its_estimate_inside_its_range():
    for b, v in ((1 / 97, 4 / 89), (1 / 97, 9 / 89), (1 / 97, 11 / 89), (0.3, 0.7)):  # exp(log(r)) != r for the first three
        got = rule.verdict([b], [v])
        assert got.low <= got.ratio <= got.high


def test_interval_bounds_are_rounded_outward():
    v = rule.Verdict(1.0, 0.90499, 1.00001, rule.NO_DIFFERENCE, 8)
    assert v.interval == "0.90-1.01"
    w = rule.Verdict(1.1, 1.0201, 1.3, "faster", 8)  # two decimals would print the threshold it clears
    assert w.interval == "1.0201-1.30"


def test_detectable_effect_matches_brute_force_power():
    """At the reported minimum detectable effect the rule says "faster" 80% (+-2 points) of the time."""
    for rounds, noise in ((8, 0.175), (12, 0.06)):
        effect = rule.detectable(noise, rounds)
        rng = random.Random(rounds)
        trials = 20_000
        hits = 0
        for _ in range(trials):
            logs = [math.log(effect) + rng.gauss(0, noise) for _ in range(rounds)]
            hits += rule.verdict([math.exp(x) for x in logs], [1.0] * rounds).word == "faster"
        assert abs(hits / trials - rule.POWER) <= 0.02, (rounds, noise, effect, hits / trials)


def test_detectable_at_the_reference_noise_and_below_min_rounds():
    # chapter 01's A/A on the Zen 3 VM: 12.4% per variant and round, 17.5% for a log ratio
    assert rule.detectable(0.175, 8) == pytest.approx(1.27, abs=0.01)
    assert rule.detectable(0.175, 12) == pytest.approx(1.20, abs=0.01)
    assert rule.detectable(0.0, 8) == pytest.approx(1.02)
    assert rule.detectable(0.1, 5) is None
    with pytest.raises(ValueError):
        rule.detectable(-0.1, 8)
    v = rule.verdict([1.0] * 8, [1.0, 1.1, 0.9, 1.05, 0.95, 1.0, 1.02, 0.98])
    assert v.word == rule.NO_DIFFERENCE and v.could_see.startswith("could see ≥ ") and "could see" in str(v)
    assert rule.verdict([1.0, 2.0], [1.0, 2.0]).could_see == ""


def test_log_noise_pools_centred_arms():
    assert rule.log_noise([1.0, 1.0, 1.0]) == 0.0
    assert rule.log_noise([2.0, 2.0], [math.e, math.e ** 3]) == pytest.approx(1.0)  # ss 0 + 2 over df 1 + 1
    with pytest.raises(ValueError):
        rule.log_noise([1.0])
