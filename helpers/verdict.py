"""The course's one comparison rule: ``verdict`` turns paired per-round values of a baseline and a
variant into a ratio, its exact signed-rank interval and one word ("faster", "slower" or
"no measurable difference"). Pure arithmetic on plain numbers; ``helpers.measure`` re-exports it."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from functools import lru_cache
from typing import Sequence

ROUNDS = 8
"""The course's default number of interleaved rounds. With per-round noise of 6% per variant
(log SD) on top of an 8% drift shared by the round, ``verdict`` then calls identical variants
different about 1% of the time and finds a true 15% difference about 89% of the time
(tests/test_measure.py simulates both)."""

MIN_ROUNDS = 6
"""Below this many paired rounds no 95% signed-rank interval exists: every verdict is
"no measurable difference" (and says why)."""

MIN_EFFECT = 0.02
NO_DIFFERENCE = "no measurable difference"
@lru_cache(maxsize=None)
def _signed_rank_cdf(n: int) -> tuple[float, ...]:
    """P(T+ <= t) for t = 0..n(n+1)/2 under the null (exact, by counting sign patterns)."""
    counts = [1]
    for k in range(1, n + 1):
        grown = [0] * (len(counts) + k)
        for t, c in enumerate(counts):
            grown[t] += c
            grown[t + k] += c
        counts = grown
    acc, out = 0, []
    for c in counts:
        acc += c
        out.append(acc / 2 ** n)
    return tuple(out)


def _critical_rank(n: int, confidence: float) -> int:
    """The largest c with P(T+ <= c) <= (1 - confidence) / 2, or -1 when none exists."""
    c = -1
    for t, p in enumerate(_signed_rank_cdf(n)):
        if p > (1 - confidence) / 2:
            break
        c = t
    return c


@dataclass(frozen=True)
class Verdict:
    """The outcome of comparing a variant with its baseline over paired rounds.

    ``ratio`` is the median over rounds of baseline/variant for times (> 1: the variant is
    faster), ``low``-``high`` its interval, ``word`` one of "faster", "slower",
    "no measurable difference", and ``reason`` says why when no interval could be made.
    """

    ratio: float
    low: float
    high: float
    word: str
    rounds: int
    confidence: float = 0.95
    reason: str = ""
    min_effect: float = MIN_EFFECT

    @property
    def interval(self) -> str:
        """The interval as text; "none (N rounds)" when too few rounds gave none.

        Bounds get two decimals, three where two would print a threshold (1 +- ``min_effect``)
        the bound does not equal, so the printed interval never seems to contradict the word.
        """
        if self.reason:
            return f"none ({self.rounds} rounds)"
        edges = {round(1 + self.min_effect, 2), round(1 - self.min_effect, 2)}

        def text(bound: float) -> str:
            two = f"{bound:.2f}"
            return f"{bound:.3f}" if float(two) in edges and abs(bound - float(two)) > 1e-12 else two
        return f"{text(self.low)}-{text(self.high)}"

    @property
    def than(self) -> str:
        """"faster than" / "slower than" / "no measurable difference from": reads before a name."""
        return f"{self.word} than" if self.word in ("faster", "slower") else f"{NO_DIFFERENCE} from"

    @property
    def won(self) -> bool:
        return self.word == "faster"

    @property
    def decided(self) -> bool:
        """Whether the word is a verdict about the variant ("faster" or "slower")."""
        return self.word in ("faster", "slower")

    def __str__(self) -> str:
        if self.reason:
            return f"{self.ratio:.2f}x: {self.word} ({self.reason})"
        return f"{self.ratio:.2f}x ({self.confidence:.0%} interval {self.interval}, {self.rounds} rounds): {self.word}"


def verdict(baseline: Sequence[float], variant: Sequence[float], *, min_effect: float = MIN_EFFECT,
            higher_is_better: bool = False, confidence: float = 0.95) -> Verdict:
    """The course's one comparison rule.

    ``baseline`` and ``variant`` are per-round values in round order (round i of both ran back
    to back), lower is better unless ``higher_is_better``. The ratio is the median over rounds
    of baseline/variant (variant/baseline when higher is better), so > 1 always means the
    variant did better. Its interval is the exact Wilcoxon signed-rank (Hodges-Lehmann)
    interval of the log ratios: distribution-free, and one wild round moves it little.
    The word is "faster" when the whole interval lies above ``1 + min_effect``, "slower"
    when it lies below ``1 - min_effect``, else "no measurable difference" -- also when
    there are fewer than ``MIN_ROUNDS`` rounds, which the reason then says.
    """
    if len(baseline) != len(variant):
        raise ValueError(f"paired rounds needed: {len(baseline)} baseline values, {len(variant)} variant values")
    if not baseline:
        raise ValueError("verdict needs at least one round")
    if min_effect < 0 or not 0 < confidence < 1:
        raise ValueError("min_effect must be >= 0 and confidence between 0 and 1")
    pairs = [(float(b), float(v)) for b, v in zip(baseline, variant)]
    if any(b <= 0 or v <= 0 or math.isnan(b) or math.isnan(v) for b, v in pairs):
        raise ValueError("verdict compares positive values (times or rates)")
    ratios = [v / b if higher_is_better else b / v for b, v in pairs]
    n = len(ratios)
    ratio = statistics.median(ratios)
    c = _critical_rank(n, confidence)
    if c < 0:
        return Verdict(ratio, min(ratios), max(ratios), NO_DIFFERENCE, n, confidence,
                       f"{n} round{'s' if n != 1 else ''} cannot give a {confidence:.0%} interval; "
                       f"a verdict needs at least {MIN_ROUNDS}", min_effect)
    logs = [math.log(r) for r in ratios]
    walsh = sorted((logs[i] + logs[j]) / 2 for i in range(n) for j in range(i, n))
    low, high = math.exp(walsh[c]), math.exp(walsh[-c - 1])
    word = "faster" if low > 1 + min_effect else "slower" if high < 1 - min_effect else NO_DIFFERENCE
    return Verdict(ratio, low, high, word, n, confidence, min_effect=min_effect)
