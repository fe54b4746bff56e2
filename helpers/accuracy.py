"""The course's rule for accuracy: per-seed test accuracies of a baseline and a variant -> means,
spread and one word ("costs", "keeps", "gains" or "no measurable difference"). Pure arithmetic
on plain numbers, the counterpart for accuracy of ``helpers.verdict`` for time.

Two noises decide whether a difference in accuracy is real:

* the seeds: two runs that differ only in their seed score differently. Their spread is
  measured (the sample standard deviation over at least ``MIN_SEEDS`` seeds per arm);
* the test set: a finite test set of ``test_size`` images estimates the true accuracy ``p``
  with a standard error of sqrt(p (1 - p) / test_size). The seeds all meet the same test set,
  so their spread does not contain this part; it is added.

The two arms' test-set errors are added as if independent. Both arms meet the same test images,
so this overstates the test-set part (a comparison paired over images, which DESIGN.md prefers,
would be narrower): the margin is an upper bound, and the rule errs towards "no measurable
difference". The margin is ``Z`` (1.96) standard errors of the difference of the two means. The word is
"costs" when the whole interval (difference +- margin) lies below 0, "gains" when it lies above 0,
"keeps" when it lies inside +-``tolerance`` points (the variant is shown to be as accurate, within
the tolerance), and "no measurable difference" otherwise: the run cannot tell.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Sequence

MIN_SEEDS = 3
"""Fewest seeds per arm for a word; with fewer (but at least 2: the smoke profile's runs, which only
exercise the code), ``compare`` computes the difference and its margin and says ``TOO_FEW``."""

TOLERANCE = 1.0
"""Points of accuracy within which "keeps" may be said (the interval must lie inside +-1 point)."""

Z = 1.96
"""Standard errors in the margin (about 95% under a normal approximation)."""

NO_DIFFERENCE = "no measurable difference"
TOO_FEW = "too few seeds for a word"


@dataclass(frozen=True)
class Accuracies:
    """Per-seed accuracies (%) of one arm: mean, sample standard deviation, min and max."""

    values: tuple[float, ...]

    @property
    def mean(self) -> float:
        return statistics.fmean(self.values)

    @property
    def sd(self) -> float:
        return statistics.stdev(self.values) if len(self.values) > 1 else 0.0

    def __str__(self) -> str:
        return f"{self.mean:.1f}% (sd {self.sd:.1f}, {min(self.values):.1f}-{max(self.values):.1f}, {len(self.values)} seeds)"


@dataclass(frozen=True)
class AccuracyVerdict:
    """A variant's accuracy against its baseline's: the difference of means (points, variant -
    baseline), the margin around it, the word, and both arms."""

    baseline: Accuracies
    variant: Accuracies
    difference: float
    margin: float
    word: str
    tolerance: float = TOLERANCE

    @property
    def low(self) -> float:
        return self.difference - self.margin

    @property
    def high(self) -> float:
        return self.difference + self.margin

    @property
    def decided(self) -> bool:
        """Whether the word is a claim ("costs", "keeps" or "gains") rather than "cannot tell"."""
        return self.word not in (NO_DIFFERENCE, TOO_FEW)

    def __str__(self) -> str:
        return (f"{self.difference:+.1f} points (interval {self.low:+.1f} to {self.high:+.1f}, "
                f"{len(self.baseline.values)} vs {len(self.variant.values)} seeds): {self.word}")


def test_set_error(accuracy: float, test_size: int) -> float:
    """Standard error (points) of an accuracy (%) measured on ``test_size`` images."""
    if test_size <= 0:
        raise ValueError("test_size must be a positive number of test images")
    p = min(max(accuracy / 100.0, 0.0), 1.0)
    return 100.0 * math.sqrt(p * (1.0 - p) / test_size)


def _accuracies(values: Sequence[float], name: str) -> Accuracies:
    vals = tuple(float(v) for v in values)
    if len(vals) < 2:
        raise ValueError(f"{name}: {len(vals)} seed(s); an accuracy comparison needs at least 2 seeds per arm, "
                         f"and {MIN_SEEDS} for a word (train each arm with seeds 0, 1, 2)")
    if any(math.isnan(v) or not 0.0 <= v <= 100.0 for v in vals):
        raise ValueError(f"{name}: accuracies are percentages between 0 and 100, got {vals}")
    return Accuracies(vals)


def compare(baseline: Sequence[float], variant: Sequence[float], *, test_size: int,
            tolerance: float = TOLERANCE) -> AccuracyVerdict:
    """The variant's per-seed accuracies (%) against the baseline's, on a test set of ``test_size``
    images: difference of means, its margin (seed spread and test-set noise) and one word
    (``TOO_FEW`` when an arm has fewer than ``MIN_SEEDS`` seeds; fewer than 2 raise ValueError)."""
    if tolerance < 0:
        raise ValueError("tolerance must be >= 0 points")
    b, v = _accuracies(baseline, "baseline"), _accuracies(variant, "variant")
    seed_var = b.sd ** 2 / len(b.values) + v.sd ** 2 / len(v.values)
    test_var = test_set_error(b.mean, test_size) ** 2 + test_set_error(v.mean, test_size) ** 2
    margin = Z * math.sqrt(seed_var + test_var)
    d = v.mean - b.mean
    if min(len(b.values), len(v.values)) < MIN_SEEDS:
        word = TOO_FEW
    elif d + margin < 0:
        word = "costs"
    elif d - margin > 0:
        word = "gains"
    elif -tolerance <= d - margin and d + margin <= tolerance:
        word = "keeps"
    else:
        word = NO_DIFFERENCE
    return AccuracyVerdict(b, v, d, margin, word, tolerance)


def above_chance(accuracies: Sequence[float], classes: int, *, test_size: int) -> bool:
    """Whether the mean accuracy (%) lies clearly above chance (100 / classes): at least twice
    chance (COURSE_SPEC) and more than ``Z`` test-set standard errors above it."""
    if classes < 2:
        raise ValueError("classes must be >= 2")
    if not accuracies:
        raise ValueError("above_chance needs at least one accuracy")
    chance = 100.0 / classes
    mean = statistics.fmean(float(a) for a in accuracies)
    return mean >= 2 * chance and mean > chance + Z * test_set_error(chance, test_size)
