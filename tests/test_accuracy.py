"""helpers.accuracy: the paired accuracy rule (by seed and by image), its words, its coverage in
simulation (new test set and new seed effects per replicate) and the chance check."""

import math
import random
import statistics

import pytest

from helpers import accuracy


def test_identical_predictions_give_a_zero_width_interval_at_zero():
    rng = random.Random(0)
    base = [[rng.random() < 0.7 for _ in range(200)] for _ in range(3)]
    v = accuracy.compare(base, [list(r) for r in base])
    assert (v.difference, v.margin, v.low, v.high, v.word) == (0.0, 0.0, 0.0, 0.0, "keeps")
    assert "3 paired seeds" in str(v) and "+0.0 points" in str(v)


def test_clear_gain_and_cost():
    better = [[True] * 90 + [False] * 10 for _ in range(3)]
    worse = [[True] * 60 + [False] * 40, [True] * 61 + [False] * 39, [True] * 59 + [False] * 41]
    assert accuracy.compare(worse, better).word == "gains"
    assert accuracy.compare(better, worse).word == "costs"


def test_seed_spread_on_the_same_difference_cannot_tell():
    base = [[True] * 70 + [False] * 30 for _ in range(3)]
    var = [[True] * 90 + [False] * 10, [True] * 50 + [False] * 50, [True] * 72 + [False] * 28]
    v = accuracy.compare(base, var)
    assert v.word == accuracy.NO_DIFFERENCE and v.low < 0 < v.high
    # the seeds disagree (+20, -20, +2 points): the seed term dominates, about 2 degrees of freedom
    se = math.sqrt(statistics.variance([20.0, -20.0, 2.0]) / 3)
    assert v.difference == pytest.approx(2 / 3) and v.margin == pytest.approx(accuracy.t_quantile(2) * se, rel=0.1)


def test_too_few_seeds_and_bad_input():
    two = [[True, False], [False, True]]
    assert accuracy.compare(two, two).word == accuracy.TOO_FEW
    with pytest.raises(ValueError, match="paired seeds"):
        accuracy.compare(two, two[:1])
    with pytest.raises(ValueError, match="at least 2 seeds"):
        accuracy.compare(two[:1], two[:1])
    with pytest.raises(ValueError, match="same, non-empty test images"):
        accuracy.compare(two, [[True], [False]])
    with pytest.raises(ValueError, match="tolerance"):
        accuracy.compare(two, two, tolerance=-1)


@pytest.mark.parametrize("seeds", [3, 5])
def test_coverage_of_the_95_percent_interval(seeds):
    """A new test set (per-image difficulty) and new seed effects in every replicate; the two arms of a seed
    share its effect and most of its per-image luck (same initial weights and data order). The interval
    covers the true difference in expected accuracy on new images 93-97% of the time."""
    import numpy as np

    rng = np.random.default_rng(seeds)
    images, replicates, effect, paired = 400, 1000, 0.3, 0.8
    sig = lambda x: 1 / (1 + np.exp(-x))  # noqa: E731
    b, u, e = rng.normal(0, 1.5, 400_000), rng.normal(0, 0.3, 400_000), rng.normal(0, 0.2, (2, 400_000))
    truth = 100 * float(np.mean(sig(0.8 + effect + b + u + e[1]) - sig(0.8 + b + u + e[0])))
    covered = 0
    for _ in range(replicates):
        diff = rng.normal(0, 1.5, images)                       # this replicate's test set
        seed = rng.normal(0, 0.3, seeds)[:, None]               # shared by both arms of a seed
        arm = rng.normal(0, 0.2, (2, seeds, 1))                 # each arm's own luck with the seed
        shared, own = rng.random((seeds, images)), rng.random((2, seeds, images))
        same = rng.random((seeds, images)) < paired
        base = np.where(same, shared, own[0]) < sig(0.8 + diff + seed + arm[0])
        var = np.where(same, shared, own[1]) < sig(0.8 + effect + diff + seed + arm[1])
        v = accuracy.compare(base.tolist(), var.tolist())
        covered += v.low <= truth <= v.high
    assert 0.93 <= covered / replicates <= 0.97, covered / replicates


def test_t_quantile():
    assert accuracy.t_quantile(2) == pytest.approx(4.303) and accuracy.t_quantile(4) == pytest.approx(2.776)
    assert 1.96 < accuracy.t_quantile(200) < 1.98
    with pytest.raises(ValueError):
        accuracy.t_quantile(0)


def test_accuracy_of_and_summary_text():
    assert accuracy.accuracy_of([True, False, True, True]) == 75.0
    with pytest.raises(ValueError):
        accuracy.accuracy_of([])
    a = accuracy.Accuracies((80.0, 82.0, 84.0))
    assert str(a) == "82.0% (sd 2.0, 80.0-84.0, 3 seeds)"


def test_above_chance():
    assert accuracy.above_chance([40.0, 42.0], 10, test_size=500)
    assert not accuracy.above_chance([15.0], 10, test_size=500)
    with pytest.raises(ValueError):
        accuracy.above_chance([], 10, test_size=500)
    with pytest.raises(ValueError):
        accuracy.above_chance([50.0], 1, test_size=500)
    with pytest.raises(ValueError, match="test_size"):
        accuracy.above_chance([50.0], 10, test_size=0)
    # twice chance (10%), but within Z test-set errors of it on 20 images (6.7 points), not on 500 (1.3 points)
    assert not accuracy.above_chance([22.0], 10, test_size=20) and accuracy.above_chance([22.0], 10, test_size=500)


def test_the_interval_stays_inside_the_possible_range():
    base = [[True] * 10 + [False] * 90, [True] * 90 + [False] * 10, [True] * 50 + [False] * 50]
    var = [[True] * 95 + [False] * 5, [True] * 5 + [False] * 95, [True] * 60 + [False] * 40]
    v = accuracy.compare(base, var)
    assert v.margin > 100 and v.low == -100.0 and v.high == 100.0 and v.word == accuracy.NO_DIFFERENCE
    assert "-100.0 to +100.0" in str(v)
