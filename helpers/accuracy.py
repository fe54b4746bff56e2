"""The course's rule for accuracy, paired by seed and by image: the difference, its t interval and one word.
Pure arithmetic; the reasoning is in docs/measurement.md ("Accuracy is paired")."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Sequence

MIN_SEEDS = 3  # fewest seeds for a word; with 2 (the smoke size) ``compare`` gives the interval and ``TOO_FEW``
TOLERANCE = 1.0  # points within which "keeps" may be said (the whole interval inside +-1 point)
Z = 1.96
NO_DIFFERENCE = "no measurable difference"
TOO_FEW = "too few seeds for a word"
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145,
         2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)


def t_quantile(df: int) -> float:
    """The 97.5% quantile of Student's t with ``df`` degrees of freedom (two-sided 95%)."""
    if df < 1:
        raise ValueError("a t quantile needs at least 1 degree of freedom")
    return _T975[df - 1] if df <= len(_T975) else Z + 2.4 / df


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
    """The variant minus the baseline in points: paired ``difference``, ``margin`` (t x SE), word, both arms."""

    baseline: Accuracies
    variant: Accuracies
    difference: float
    margin: float
    word: str

    @property
    def low(self) -> float:
        """The interval's lower bound, never below -100 points (a difference of accuracies cannot be)."""
        return max(-100.0, self.difference - self.margin)

    @property
    def high(self) -> float:
        """The interval's upper bound, never above +100 points."""
        return min(100.0, self.difference + self.margin)

    def __str__(self) -> str:
        return (f"{self.difference:+.1f} points (95% interval {self.low:+.1f} to {self.high:+.1f}, "
                f"{len(self.baseline.values)} paired seeds): {self.word}")


def accuracy_of(correct: Sequence[bool]) -> float:
    """Accuracy (%) of one run from its per-image correctness."""
    if not len(correct):
        raise ValueError("no test images: correctness is one True/False per image")
    return 100.0 * sum(bool(c) for c in correct) / len(correct)


def _paired_error(x: list[list[float]]) -> tuple[float, float]:
    """Variance of a seeds x images table's grand mean (two-way random effects) and its Satterthwaite df."""
    n, big_n = len(x), len(x[0])
    rows = [statistics.fmean(r) for r in x]
    cols = [statistics.fmean(r[i] for r in x) for i in range(big_n)]
    grand = statistics.fmean(rows)
    ms_s = big_n * sum((r - grand) ** 2 for r in rows) / (n - 1)
    ms_i = n * sum((c - grand) ** 2 for c in cols) / (big_n - 1) if big_n > 1 else 0.0
    ss_r = sum((x[s][i] - rows[s] - cols[i] + grand) ** 2 for s in range(n) for i in range(big_n))
    ms_r = ss_r / ((n - 1) * (big_n - 1)) if big_n > 1 else 0.0
    total = max(ms_s + ms_i - ms_r, 0.0)
    if total == 0.0:
        return 0.0, float(n - 1)
    parts = ms_s ** 2 / (n - 1) + (ms_i ** 2 / (big_n - 1) + ms_r ** 2 / ((n - 1) * (big_n - 1)) if big_n > 1 else 0.0)
    return total / (n * big_n), max(1.0, total ** 2 / parts)


def compare(baseline: Sequence[Sequence[bool]], variant: Sequence[Sequence[bool]], *,
            tolerance: float = TOLERANCE) -> AccuracyVerdict:
    """The paired difference in expected accuracy on new images, its 95% t interval and the word.
    ``baseline``, ``variant``: per seed (same seeds, same order), per-image correctness on the same images."""
    if tolerance < 0:
        raise ValueError("tolerance must be >= 0 points")
    n = len(baseline)
    if n != len(variant):
        raise ValueError(f"paired seeds needed: {n} baseline runs, {len(variant)} variant runs (same seeds, same order)")
    if n < 2:
        raise ValueError(f"{n} seed(s); a comparison needs at least 2 seeds per arm, and {MIN_SEEDS} for a word")
    sizes = {len(run) for run in (*baseline, *variant)}
    if len(sizes) != 1 or 0 in sizes:
        raise ValueError("every run must be scored on the same, non-empty test images (one True/False per image)")
    b = Accuracies(tuple(accuracy_of(run) for run in baseline))
    v = Accuracies(tuple(accuracy_of(run) for run in variant))
    table = [[100.0 * (bool(y) - bool(x)) for x, y in zip(br, vr)] for br, vr in zip(baseline, variant)]
    var, df = _paired_error(table)
    d, margin = statistics.fmean(v.values) - statistics.fmean(b.values), t_quantile(int(df)) * math.sqrt(var)
    if n < MIN_SEEDS:
        word = TOO_FEW
    elif d + margin < 0:
        word = "costs"
    elif d - margin > 0:
        word = "gains"
    elif -tolerance <= d - margin and d + margin <= tolerance:
        word = "keeps"
    else:
        word = NO_DIFFERENCE
    return AccuracyVerdict(b, v, d, margin, word)


def above_chance(accuracies: Sequence[float], classes: int, *, test_size: int) -> bool:
    """Whether the mean accuracy (%) is at least twice chance and ``Z`` test-set errors (at chance) above it."""
    if classes < 2:
        raise ValueError("classes must be >= 2")
    if not accuracies:
        raise ValueError("above_chance needs at least one accuracy")
    if test_size <= 0:
        raise ValueError("test_size must be a positive number of test images")
    chance = 100.0 / classes
    error = 100.0 * math.sqrt(chance / 100.0 * (1.0 - chance / 100.0) / test_size)  # the test-set error at chance
    mean = statistics.fmean(float(a) for a in accuracies)
    return mean >= 2 * chance and mean > chance + Z * error
