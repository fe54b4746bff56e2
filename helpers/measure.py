"""The measurement protocol: ``interleaved`` rounds in Williams designs with an A/A arm, ``Rounds``, ``time_fn``."""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import torch

from . import devices, run_sizes
from .cpu_meter import LIMIT as INTERFERENCE_LIMIT
from .cpu_meter import CpuMeter, Interference
from .tables import Table
from .verdict import (MIN_EFFECT, MIN_ROUNDS, NO_DIFFERENCE, ROUNDS, Verdict, detectable,  # noqa: F401
                      log_noise, verdict)

DISTURBED = "disturbed: no conclusion from this run"  # every arm's word when the A/A arm got a verdict
AA_PREFIX = "A/A: "
AA_ATTEMPTS = 3  # comparisons with an A/A arm measured at most this often (once at the smoke size)


@dataclass
class Rounds:
    """Per-round values of variants in interleaved rounds (``samples[name][i]``: round i) and how the rounds went."""

    names: list[str]
    samples: dict[str, list[float]]
    metrics: dict[str, list[dict[str, float]]]
    warmup: dict[str, list[float]] = field(default_factory=dict)
    interference: list[Interference] = field(default_factory=list)
    reruns: int = 0
    disturbed: int = 0
    unit: str = "s"
    orders: list[list[str]] = field(default_factory=list)
    attempts: int = 1
    aa_failed: bool = False

    def result(self, name: str) -> "Result":
        """One variant's values as a ``Result`` (metrics: the median over rounds)."""
        keys = sorted({k for m in self.metrics[name] for k in m})
        med = {k: statistics.median([m[k] for m in self.metrics[name] if k in m]) for k in keys}
        return Result(name, list(self.samples[name]), list(self.warmup.get(name, [])), med)

    def verdict(self, name: str, baseline: str | None = None, **kwargs: Any) -> Verdict:
        """``verdict`` of ``name`` against ``baseline`` (default: the first) at this run's noise, or DISTURBED."""
        base = baseline or self.names[0]
        if self.rounds > 1 and "noise" not in kwargs:
            kwargs["noise"] = self.noise()
        v = verdict(self.samples[base], self.samples[name], **kwargs)
        if self.aa_failed and not name.startswith(AA_PREFIX):
            return Verdict(v.ratio, v.low, v.high, DISTURBED, v.rounds, v.confidence, v.reason, v.min_effect)
        return v

    def noise(self) -> float:
        """SD of the A/A arm's log ratios, else of every arm's log ratios against the first, each centred."""
        arms = [(aa_baseline(self.aa), self.aa)] if self.aa else [(self.names[0], n) for n in self.names[1:]]
        ratios = [[b / v for b, v in zip(self.samples[base], self.samples[n])] for base, n in arms]
        return log_noise(*ratios) if arms else 0.0

    @property
    def aa(self) -> str | None:
        """The A/A arm's name, if the comparison has one."""
        return next((n for n in self.names if n.startswith(AA_PREFIX)), None)

    def aa_verdict(self) -> Verdict | None:
        """The A/A arm against the arm it repeats (None without an A/A arm)."""
        name = self.aa
        return None if name is None else verdict(self.samples[aa_baseline(name)], self.samples[name])

    @property
    def design(self) -> int:
        """The Williams design's length for these arms (n orders for even n, 2n for odd n)."""
        return len(williams_orders(len(self.names)))

    @property
    def rounds(self) -> int:
        return len(self.samples[self.names[0]]) if self.names else 0

    def note(self) -> str:
        """What the table's reader needs to know about how these rounds were taken."""
        k = self.rounds
        text = (f"{k} interleaved rounds, {design_text(k, self.design)}, every variant built afresh each round; "
                f"speed-up = baseline/variant (Hodges-Lehmann estimate) with its 95% interval, bounds rounded outward; "
                f"verdict by helpers.measure.verdict (> {1 + MIN_EFFECT:.2f}x or < {1 - MIN_EFFECT:.2f}x for the whole interval).")
        if k >= MIN_ROUNDS and k > 1:
            source = "the A/A arm's" if self.aa else "the arms'"
            text += (f" 'could see' is an estimate: the true speed-up this run would call faster 80% of the time, "
                     f"from {source} log-ratio noise ({100 * self.noise():.1f}%).")
        if self.reruns:
            text += f" {self.reruns} round(s) re-run: other processes took more than {INTERFERENCE_LIMIT:g} cores."
        if self.disturbed:
            text += f" {self.disturbed} kept round(s) still disturbed (re-run budget spent): read the result with care."
        if k < MIN_ROUNDS:
            text += f" Fewer than {MIN_ROUNDS} rounds: too few for any verdict."
        aa = self.aa_verdict()
        if aa is not None and k >= MIN_ROUNDS:
            if self.aa_failed:
                text += (f" Disturbed: the A/A arm (the baseline against itself) measured {aa.ratio:.2f}x [{aa.interval}], "
                         f"an interval without 1.0, in attempt {self.attempts} of {self.attempts}, so this run gives no verdict.")
            elif self.attempts > 1:
                text += (f" A/A passed in attempt {self.attempts} (the {self.attempts - 1} earlier attempt(s) failed it "
                         f"and were measured again as a whole, in new processes where arms have their own).")
            else:
                text += " A/A passed in the first attempt."
        return text

    def table(self, baseline: str | None = None, *, metrics: Sequence[str] = (), title: str = "",
              scale: float = 1.0, unit: str | None = None) -> Table:
        """Median, min, max (times ``scale``, in ``unit``), speed-up, interval and verdict per variant."""
        unit = unit or self.unit
        base = baseline or self.names[0]
        table = Table(["variant", f"median {unit}", f"min {unit}", f"max {unit}", "speed-up (x)",
                       "95% interval (x)", "verdict"] + list(metrics), title=title, note=self.note())
        values = {m: [self.result(n).metrics.get(m) for n in self.names] for m in metrics}
        for m, vs in values.items():  # a column of whole numbers prints as counts
            if all(isinstance(v, (int, float)) and float(v).is_integer() for v in vs if v is not None):
                values[m] = [None if v is None else int(v) for v in vs]
        for i, name in enumerate(self.names):
            s = Stats.of(self.samples[name])
            if name == base:
                cells: list[Any] = [1.0, "-", "baseline"]
            else:
                v = self.verdict(name, base)
                cells = [v.ratio, v.interval, reading(name, v)]
            table.add(name, s.median * scale, s.minimum * scale, s.maximum * scale, *cells,
                      *[values[m][i] for m in metrics])
        return table


def _value(got: Any) -> tuple[float, dict[str, float], list[float]]:
    if isinstance(got, Result):
        return statistics.median(got.samples), dict(got.metrics), list(got.warmup)
    if isinstance(got, tuple):
        return float(got[0]), dict(got[1]), []
    return float(got), {}, []


def williams_orders(n: int) -> list[list[int]]:
    """Orders of ``n`` arms (0..n-1) in which every arm follows every other equally often (a Williams design)."""
    if n < 1:
        raise ValueError("a design needs at least one arm")
    first = [((i + 1) // 2 if i % 2 else n - i // 2) % n for i in range(n)]  # 0, 1, n-1, 2, n-2, ...
    rows = [[(a + r) % n for a in first] for r in range(n)]
    return rows + [row[::-1] for row in rows] if n % 2 and n > 1 else rows


def sample_long_enough(steps: int, seconds: float) -> bool:
    """The course's rule for one timed sample: at least 20 steps or 0.5 s."""
    if steps < 1 or seconds < 0:
        raise ValueError("a timed sample has at least one step and a non-negative duration")
    return steps >= 20 or seconds >= 0.5


def aa_passes(v: Verdict) -> bool:
    """An A/A arm passes when its interval contains 1.0 (or too few rounds gave none)."""
    return bool(v.reason) or v.low <= 1.0 <= v.high


def aa_word(v: Verdict) -> str:
    """The A/A row's cell: whether the baseline measured against itself passed."""
    return "A/A passed (contains 1.0)" if aa_passes(v) else "A/A failed (excludes 1.0)"


def design_text(rounds: int, design: int) -> str:
    """How balanced ``rounds`` rounds of a Williams design of ``design`` orders are, in words for a table note."""
    if rounds % design == 0:
        return f"a complete Williams design ({rounds // design} x {design} orders)"
    if design > 12:
        return f"approximately balanced ({min(rounds, design)} of {design} orders)"
    if rounds < design:
        return f"incomplete design ({rounds} of {design} orders)"
    return f"incomplete design ({rounds} rounds, not a whole multiple of {design} orders)"


def reading(name: str, v: Verdict) -> str:
    """The verdict cell of arm ``name``: pass or fail for an A/A arm, else the word with what the run could see."""
    return aa_word(v) if name.startswith(AA_PREFIX) else v.label


def complete_rounds(arms: int, rounds: int = ROUNDS) -> int:
    """The smallest whole multiple of the Williams design's length >= ``rounds``; ``rounds`` itself when it is > 12."""
    m = len(williams_orders(arms))
    whole = -(-rounds // m) * m
    return whole if whole <= 12 or whole == rounds else rounds


def planned_rounds(arms: int, rounds: int) -> int:
    """The rounds ``interleaved`` runs when asked for ``rounds``: completed at workshop and full, as asked in smoke."""
    return rounds if run_sizes.current_profile() == "smoke" else complete_rounds(arms, rounds)


def aa_name(baseline: str) -> str:
    """The name of the A/A arm that repeats ``baseline``."""
    return f"{AA_PREFIX}{baseline} again"


def aa_baseline(name: str) -> str:
    """The arm an A/A arm repeats (``aa_name``'s inverse); ValueError for other names."""
    if not (name.startswith(AA_PREFIX) and name.endswith(" again")):
        raise ValueError(f"{name!r} is not an A/A arm's name (made by aa_name)")
    return name[len(AA_PREFIX):-len(" again")]


def with_aa(variants: Mapping[str, Callable[[], Any]], baseline: str | None = None,
            again: Callable[[], Any] | None = None) -> dict[str, Callable[[], Any]]:
    """``variants`` plus an A/A arm: the baseline (default: the first) measured again by ``again`` (default: itself)."""
    base = baseline or next(iter(variants))
    if base not in variants:
        raise ValueError(f"no variant {base!r} to repeat as the A/A arm")
    return {**variants, aa_name(base): again or variants[base]}


def interleaved(variants: Mapping[str, Callable[[], Any]], rounds: int | None = None, *,
                max_reruns: int | None = None, warmup_rounds: int = 0, progress: bool = True, desc: str = "rounds",
                unit: str = "s", attempts: int | None = None, before_round: Callable[[list[str]], Any] | None = None,
                after_round: Callable[[], Any] | None = None) -> Rounds:
    """Call every variant (a float, ``(value, metrics)`` or a ``Result``) once per round in Williams-design orders;
    re-run disturbed rounds (``max_reruns``), all after a failed A/A (``attempts``); ``before/after_round``: untimed."""
    names = list(variants)
    if not names:
        raise ValueError("interleaved needs at least one variant")
    rounds = ROUNDS if rounds is None else rounds
    attempts = run_sizes.pick(smoke=1, workshop=AA_ATTEMPTS, full=AA_ATTEMPTS) if attempts is None else attempts
    if rounds < 1 or warmup_rounds < 0 or attempts < 1:
        raise ValueError("rounds and attempts must be >= 1, warmup_rounds >= 0")
    rounds = planned_rounds(len(names), rounds)
    max_reruns = run_sizes.pick(smoke=0, workshop=rounds // 2, full=rounds // 2) if max_reruns is None else max_reruns
    aa = [n for n in names if n.startswith(AA_PREFIX)]
    if any(aa_baseline(name) not in variants for name in aa):
        raise ValueError(f"an A/A arm of {aa} repeats no variant of this comparison")
    for _ in range(warmup_rounds):
        for name in names:
            variants[name]()
    from tqdm.auto import tqdm

    off = run_sizes.bars_off(progress)  # CI and committed runs set TQDM_DISABLE
    design = [[names[i] for i in order] for order in williams_orders(len(names))]
    for attempt in range(1, attempts + 1):
        out = Rounds(names, {n: [] for n in names}, {n: [] for n in names}, {n: [] for n in names}, unit=unit,
                     attempts=attempt)
        with tqdm(total=rounds, desc=f"{desc} (attempt {attempt})" if attempt > 1 else desc, leave=False,
                  disable=off) as bar:
            while len(out.interference) < rounds:
                order = design[len(out.interference) % len(design)]  # a re-run round repeats its own order
                if before_round is not None:
                    before_round(list(order))
                try:
                    meter = CpuMeter().start()
                    got = {name: _value(variants[name]()) for name in order}
                    load = meter.stop()
                finally:
                    if after_round is not None:
                        after_round()
                if load.disturbed() and out.reruns < max_reruns:
                    out.reruns += 1
                    continue
                out.disturbed += load.disturbed()
                out.interference.append(load)
                out.orders.append(list(order))
                for name in names:
                    value, metrics, warm = got[name]
                    out.samples[name].append(value)
                    out.metrics[name].append(metrics)
                    out.warmup[name].extend(warm)
                bar.update(1)
        out.aa_failed = any(not aa_passes(verdict(out.samples[aa_baseline(n)], out.samples[n])) for n in aa)
        if not out.aa_failed:
            break
    return out


@dataclass(frozen=True)
class Stats:
    """Summary of repeated timings (seconds)."""

    median: float
    minimum: float
    maximum: float
    n: int

    @classmethod
    def of(cls, samples: Sequence[float]) -> "Stats":
        s = sorted(map(float, samples))  # none: statistics.median raises a ValueError (StatisticsError)
        return cls(statistics.median(s), s[0], s[-1], len(s))


@dataclass
class Result:
    """One variant's measurement: timed samples, warm-up samples and quality metrics."""

    name: str
    samples: list[float]
    warmup: list[float] = field(default_factory=list)
    metrics: dict[str, float] = field(default_factory=dict)
    settings: dict[str, Any] = field(default_factory=dict)

    @property
    def stats(self) -> Stats:
        return Stats.of(self.samples)


def time_fn(fn: Callable[[], Any], *, repeats: int = 5, warmup: int = 1,
            device: torch.device | str = "cpu", name: str = "fn") -> Result:
    """Call ``fn`` ``warmup`` times, then ``repeats`` timed times, synchronizing the device."""
    if repeats < 1 or warmup < 0:
        raise ValueError("repeats must be >= 1 and warmup >= 0")

    def once() -> float:
        devices.synchronize(device)
        start = time.perf_counter()
        fn()
        devices.synchronize(device)
        return time.perf_counter() - start

    warm = [once() for _ in range(warmup)]
    return Result(name=name, samples=[once() for _ in range(repeats)], warmup=warm)
