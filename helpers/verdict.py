"""The course's one comparison rule, ``verdict``: Hodges-Lehmann ratio, exact signed-rank interval, one word and
what the run could see (``detectable``). Pure arithmetic; see docs/measurement.md."""

from __future__ import annotations

import itertools
import math
import statistics
from dataclasses import dataclass
from functools import lru_cache
from typing import Sequence

ROUNDS = 8  # default interleaved rounds: at the reference VM's noise they can see about 27% (12 rounds: 20%)
MIN_ROUNDS = 6  # below this many paired rounds no 95% signed-rank interval exists
MIN_EFFECT = 0.02
POWER = 0.80
NO_DIFFERENCE = "no measurable difference"


@lru_cache(maxsize=None)
def _critical_rank(n: int, confidence: float) -> int:
    """The largest c with P(T+ <= c) <= (1 - confidence) / 2 under the null (exact), or -1 when none exists."""
    counts = [1]  # counts[t]: the sign patterns of ranks 1..k whose positive ranks add up to t
    for k in range(1, n + 1):
        counts = [a + b for a, b in zip(counts + [0] * k, [0] * k + counts)]
    return sum(acc / 2 ** n <= (1 - confidence) / 2 for acc in itertools.accumulate(counts)) - 1


def _walsh(logs: Sequence[float]) -> list[float]:
    return sorted((a + b) / 2 for a, b in itertools.combinations_with_replacement(logs, 2))


def hodges_lehmann(ratios: Sequence[float]) -> float:
    """The Hodges-Lehmann estimate of paired positive ratios: exp of the median of the log ratios' Walsh averages."""
    if not ratios or any(r <= 0 or math.isnan(r) for r in ratios):
        raise ValueError("hodges_lehmann needs at least one positive ratio")
    return math.exp(statistics.median(_walsh([math.log(r) for r in ratios])))


@lru_cache(maxsize=None)
def _low_quantile(n: int, confidence: float = 0.95, power: float = POWER) -> float:
    """The (1 - power) quantile of the interval's lower bound for unit-SD normal log-ratio noise (simulated)."""
    import numpy as np

    c = _critical_rank(n, confidence)
    z = np.random.default_rng(20261129).standard_normal((40_000, n))
    i, j = np.triu_indices(n)
    lows = np.sort((z[:, i] + z[:, j]) / 2, axis=1)[:, c]
    return float(np.quantile(lows, 1 - power))


def detectable(noise: float, rounds: int, *, min_effect: float = MIN_EFFECT, confidence: float = 0.95) -> float | None:
    """The smallest true ratio the rule calls "faster" ``POWER`` of the time over ``rounds`` paired rounds
    whose log ratios have SD ``noise`` (rounded to 0.5%); None below ``MIN_ROUNDS``. An estimate."""
    if noise < 0 or math.isnan(noise):
        raise ValueError("noise is a standard deviation of log ratios (>= 0)")
    if _critical_rank(rounds, confidence) < 0:
        return None
    grid = round(noise / 0.005) * 0.005
    return (1 + min_effect) * math.exp(-grid * _low_quantile(rounds, confidence))


def log_noise(*arms: Sequence[float]) -> float:
    """Pooled SD of log ratios around each arm's own mean (one sequence of ratios per arm)."""
    ss, df = 0.0, 0
    for ratios in arms:
        logs = [math.log(r) for r in ratios]
        if len(logs) > 1:
            m = statistics.fmean(logs)
            ss += sum((x - m) ** 2 for x in logs)
            df += len(logs) - 1
    if df == 0:
        raise ValueError("the noise needs at least two rounds of one arm")
    return math.sqrt(ss / df)


def _outward(bound: float, up: bool, edges: set[float]) -> str:
    """``bound`` rounded away from the estimate: 2 decimals, more where 2 would print a threshold it misses."""
    for digits in (2, 3, 4):
        scale = 10 ** digits
        value = (math.ceil(bound * scale - 1e-9) if up else math.floor(bound * scale + 1e-9)) / scale
        if round(value, digits) not in edges or abs(bound - value) < 1e-12:
            break
    return f"{value:.{digits}f}"


@dataclass(frozen=True)
class Verdict:
    """A variant against its baseline: Hodges-Lehmann ``ratio`` (> 1: the variant did better), interval and word."""

    ratio: float
    low: float
    high: float
    word: str
    rounds: int
    confidence: float = 0.95
    reason: str = ""
    min_effect: float = MIN_EFFECT
    detectable: float | None = None

    @property
    def interval(self) -> str:
        """The interval as text, bounds rounded outward; "none (N rounds)" when too few rounds gave none."""
        if self.reason:
            return f"none ({self.rounds} rounds)"
        edges = {round(1 + self.min_effect, 4), round(1 - self.min_effect, 4)}
        return f"{_outward(self.low, False, edges)}-{_outward(self.high, True, edges)}"

    @property
    def could_see(self) -> str:
        """"could see >= 27%": the effect this run would have called faster 80% of the time ('' if unknown)."""
        return "" if self.detectable is None else f"could see ≥ {100 * (self.detectable - 1):.0f}%"

    @property
    def label(self) -> str:
        """The word, with what the run could see after "no measurable difference"."""
        return f"{self.word} ({self.could_see})" if self.word == NO_DIFFERENCE and self.could_see else self.word

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
        return f"{self.ratio:.2f}x ({self.confidence:.0%} interval {self.interval}, {self.rounds} rounds): {self.label}"


def verdict(baseline: Sequence[float], variant: Sequence[float], *, min_effect: float = MIN_EFFECT,
            higher_is_better: bool = False, confidence: float = 0.95, noise: float | None = None) -> Verdict:
    """The rule over paired per-round values (lower is better unless ``higher_is_better``): "faster"/"slower" when the
    whole interval lies beyond ``min_effect``; ``noise`` (SD of log ratios, default: this pair's) sizes detectable."""
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
    walsh = _walsh([math.log(r) for r in ratios])
    ratio = hodges_lehmann(ratios)
    c = _critical_rank(n, confidence)
    if c < 0:
        return Verdict(ratio, min(ratio, *ratios), max(ratio, *ratios), NO_DIFFERENCE, n, confidence,
                       f"{n} round{'s' if n != 1 else ''} cannot give a {confidence:.0%} interval; "
                       f"a verdict needs at least {MIN_ROUNDS}", min_effect)
    low, high = math.exp(walsh[c]), math.exp(walsh[-c - 1])
    word = "faster" if low > 1 + min_effect else "slower" if high < 1 - min_effect else NO_DIFFERENCE
    seen = detectable(log_noise(ratios) if noise is None else noise, n, min_effect=min_effect, confidence=confidence)
    return Verdict(ratio, low, high, word, n, confidence, min_effect=min_effect, detectable=seen)
