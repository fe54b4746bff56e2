"""Tests for helpers.accuracy: the accuracy rule's words, margin and input checks."""

import math

import pytest

from helpers import accuracy


def test_clear_loss_is_costs():
    v = accuracy.compare([90.0, 90.5, 89.5], [80.0, 80.4, 79.6], test_size=10_000)
    assert v.word == "costs"
    assert v.difference == pytest.approx(-10.0)
    assert v.high < 0


def test_clear_gain_is_gains():
    v = accuracy.compare([50.0, 51.0, 49.0], [70.0, 71.0, 69.0], test_size=10_000)
    assert v.word == "gains" and v.low > 0 and v.decided


def test_tiny_difference_on_a_large_test_set_is_keeps():
    v = accuracy.compare([90.0, 90.1, 89.9], [90.05, 90.0, 89.95], test_size=1_000_000)
    assert v.word == "keeps"
    assert -v.tolerance <= v.low and v.high <= v.tolerance


def test_same_means_on_a_small_test_set_cannot_tell():
    # 2,000 images: the test set alone gives ~0.8 points of standard error, more than the tolerance allows
    v = accuracy.compare([85.0, 85.0, 85.0], [85.0, 85.0, 85.0], test_size=2_000)
    assert v.word == accuracy.NO_DIFFERENCE and not v.decided
    assert v.margin == pytest.approx(1.96 * math.sqrt(2) * 100 * math.sqrt(0.85 * 0.15 / 2000))


def test_seed_spread_widens_the_margin():
    narrow = accuracy.compare([80, 80, 80], [78, 78, 78], test_size=100_000)
    wide = accuracy.compare([76, 80, 84], [74, 78, 82], test_size=100_000)
    assert narrow.word == "costs"
    assert wide.word == accuracy.NO_DIFFERENCE and wide.margin > narrow.margin


def test_needs_three_seeds_for_a_word_and_percentages():
    # two seeds (the smoke profile) compute the numbers but give no word, however clear the gap
    two = accuracy.compare([80, 81], [50, 51, 52], test_size=100_000)
    assert two.word == accuracy.TOO_FEW and not two.decided and two.difference == pytest.approx(-29.5)
    assert accuracy.compare([80, 81, 80.5], [50, 51, 52], test_size=100_000).word == "costs"
    with pytest.raises(ValueError, match="at least 2"):
        accuracy.compare([80], [80, 81, 82], test_size=1000)
    with pytest.raises(ValueError, match="percentages"):
        accuracy.compare([80, 81, 120], [80, 81, 82], test_size=1000)
    with pytest.raises(ValueError, match="test_size"):
        accuracy.compare([80, 81, 82], [80, 81, 82], test_size=0)


def test_accuracies_summary_text():
    a = accuracy.Accuracies((80.0, 82.0, 84.0))
    assert a.mean == pytest.approx(82.0) and a.sd == pytest.approx(2.0)
    assert str(a) == "82.0% (sd 2.0, 80.0-84.0, 3 seeds)"
    assert "seeds): costs" in str(accuracy.compare([90, 90.5, 89.5], [80, 80.4, 79.6], test_size=10_000))


def test_test_set_error():
    assert accuracy.test_set_error(50.0, 10_000) == pytest.approx(0.5)
    assert accuracy.test_set_error(100.0, 10) == 0.0


def test_above_chance():
    assert accuracy.above_chance([60, 62, 58], classes=10, test_size=1000)
    assert not accuracy.above_chance([12.0, 13.6, 11.6], classes=10, test_size=1000)
    assert not accuracy.above_chance([19, 19, 19], classes=10, test_size=1_000_000)  # not twice chance
    assert not accuracy.above_chance([25, 25, 25], classes=10, test_size=10)  # twice chance, but within the noise of 10 images
    with pytest.raises(ValueError):
        accuracy.above_chance([], classes=10, test_size=1000)
