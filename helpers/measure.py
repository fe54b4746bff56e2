"""The course's measurement protocol, as code.

1. one change at a time, fresh seeded model per variant (the caller builds it);
2. warm-up kept apart from the timed repeats, and both reported;
3. the device synchronized before every clock read (perf_counter);
4. several repeats, reported as median with min-max and IQR;
5. speed-up = baseline / variant from the same run, next to accuracy;
6. results recorded as rows with the machine fingerprint (``helpers.results``).

``verdict`` is the course's one comparison rule (``helpers.verdict``, re-exported here): every
"faster" or "slower" that a chapter, the tuner or a report prints is its word. ``interleaved`` runs variants in rounds ordered by a
Williams design (``williams_orders``: every arm follows every other equally often, so what one
arm leaves in the process reaches each arm alike), each round building every variant afresh,
re-runs rounds that other processes disturbed (``helpers.cpu_meter``), and, when the variants
include an A/A arm (``with_aa``: the baseline again under another name), measures the whole
comparison again while that arm gets a verdict; if it still does, the run is marked disturbed and
no verdict is given for the other arms.

What a training step costs (FLOPs, the matmul peak, time per phase) is ``helpers.step_cost``.
"""

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

# ----------------------------------------------------------------------------------------
# The one comparison rule
# ----------------------------------------------------------------------------------------

from .verdict import (MIN_EFFECT, MIN_ROUNDS, NO_DIFFERENCE, ROUNDS, Verdict, _critical_rank,  # noqa: F401
                      verdict)

DISTURBED = "disturbed: no conclusion from this run"
"""The word for every arm when the A/A arm (the baseline against itself) got a verdict."""
AA_PREFIX = "A/A: "
AA_ATTEMPTS = 3
MIN_SAMPLE_STEPS = 20
MIN_SAMPLE_SECONDS = 0.5
"""A timed sample is long enough when it spans at least ``MIN_SAMPLE_STEPS`` steps or
``MIN_SAMPLE_SECONDS`` seconds: the clock reads and synchronizations around it (microseconds) and
the first step's start-up then weigh less than a few percent (``sample_long_enough``)."""
"""How many times ``interleaved`` measures a comparison with an A/A arm before it gives up (workshop and
full sizes; once at the smoke size)."""


# ----------------------------------------------------------------------------------------
# Interleaved rounds
# ----------------------------------------------------------------------------------------

@dataclass
class Rounds:
    """Per-round values of several variants measured in interleaved rounds (paired by round).

    ``samples[name][i]`` and ``metrics[name][i]`` come from round i; ``interference[i]`` is the
    CPU that others took during the kept round i; ``reruns`` counts the rounds measured again
    because others took more than ``limit`` cores, ``disturbed`` the kept rounds still above it.
    """

    names: list[str]
    samples: dict[str, list[float]]
    metrics: dict[str, list[dict[str, float]]]
    warmup: dict[str, list[float]] = field(default_factory=dict)
    interference: list[Interference] = field(default_factory=list)
    reruns: int = 0
    disturbed: int = 0
    limit: float = INTERFERENCE_LIMIT
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
        """``verdict`` of ``name`` against ``baseline`` (default: the first variant) over these rounds.

        When the A/A arm got a verdict (``aa_failed``), every other comparison's word is ``DISTURBED``
        (ratio and interval still given): a run whose baseline differs from itself supports no verdict.
        """
        base = baseline or self.names[0]
        v = verdict(self.samples[base], self.samples[name], **kwargs)
        if self.aa_failed and not name.startswith(AA_PREFIX):
            return Verdict(v.ratio, v.low, v.high, DISTURBED, v.rounds, v.confidence, v.reason, v.min_effect)
        return v

    @property
    def aa(self) -> str | None:
        """The A/A arm's name, if the comparison has one."""
        return next((n for n in self.names if n.startswith(AA_PREFIX)), None)

    def aa_verdict(self) -> Verdict | None:
        """The A/A arm against the arm it repeats (None without an A/A arm)."""
        name = self.aa
        return None if name is None else verdict(self.samples[aa_baseline(name)], self.samples[name])

    def followers(self) -> dict[tuple[str, str], int]:
        """How often each arm came right after each other arm within a round: ``{(before, after): count}``."""
        out: dict[tuple[str, str], int] = {}
        for order in self.orders:
            for a, b in zip(order, order[1:]):
                out[(a, b)] = out.get((a, b), 0) + 1
        return out

    @property
    def rounds(self) -> int:
        return len(self.samples[self.names[0]]) if self.names else 0

    def note(self) -> str:
        """What the table's reader needs to know about how these rounds were taken."""
        text = (f"{self.rounds} interleaved rounds (order balanced for carry-over, every variant built afresh each round); "
                f"speed-up = baseline/variant, median over rounds, with its 95% interval; "
                f"verdict by helpers.measure.verdict (> {1 + MIN_EFFECT:.2f}x or < {1 - MIN_EFFECT:.2f}x for the whole interval).")
        if self.reruns:
            text += f" {self.reruns} round(s) re-run: other processes took more than {self.limit:g} cores."
        if self.disturbed:
            text += f" {self.disturbed} kept round(s) still disturbed (re-run budget spent): read the result with care."
        if self.rounds < MIN_ROUNDS:
            text += f" Fewer than {MIN_ROUNDS} rounds: too few for any verdict."
        aa = self.aa_verdict()
        if aa is not None and self.rounds >= MIN_ROUNDS:
            if self.aa_failed:
                text += (f" Disturbed: the A/A arm (the baseline against itself) measured {aa.ratio:.2f}x [{aa.interval}] "
                         f"in attempt {self.attempts} of {self.attempts}, so this run gives no verdict.")
            elif self.attempts > 1:
                text += (f" A/A passed in attempt {self.attempts} (the {self.attempts - 1} earlier attempt(s) failed it "
                         f"and were measured again as a whole).")
            else:
                text += " A/A passed in the first attempt."
        return text

    def table(self, baseline: str | None = None, *, metrics: Sequence[str] = (), title: str = "",
              scale: float = 1.0, unit: str | None = None, higher_is_better: bool = False) -> Table:
        """Median, min, max (times ``scale``, in ``unit``), speed-up, interval and verdict per variant."""
        unit = unit or self.unit
        base = baseline or self.names[0]
        table = Table(["variant", f"median {unit}", f"min {unit}", f"max {unit}", "speed-up (x)",
                       "95% interval (x)", "verdict"] + list(metrics), title=title, note=self.note())
        values = {m: [self.result(n).metrics.get(m) for n in self.names] for m in metrics}
        # a metric that is a whole number for every variant (steps, a batch size) is printed as a count
        counts = {m for m, vs in values.items()
                  if all(isinstance(v, (int, float)) and float(v).is_integer() for v in vs if v is not None)}
        for name in self.names:
            s = Stats.of(self.samples[name])
            res = self.result(name)
            if name == base:
                cells: list[Any] = [1.0, "-", "baseline"]
            else:
                v = self.verdict(name, base, higher_is_better=higher_is_better)
                cells = [v.ratio, v.interval, v.word]
            table.add(name, s.median * scale, s.minimum * scale, s.maximum * scale, *cells,
                      *[int(res.metrics[m]) if m in counts and res.metrics.get(m) is not None else res.metrics.get(m)
                        for m in metrics])
        return table




def _value(got: Any) -> tuple[float, dict[str, float], list[float]]:
    if isinstance(got, Result):
        return statistics.median(got.samples), dict(got.metrics), list(got.warmup)
    if isinstance(got, tuple):
        return float(got[0]), dict(got[1]), []
    return float(got), {}, []


def williams_orders(n: int) -> list[list[int]]:
    """Orders of ``n`` arms (0..n-1) balanced for first-order carry-over (a Williams design).

    Within a round every arm comes right after every other arm equally often over the design:
    once over the ``n`` orders for even ``n``, twice over ``2n`` orders for odd ``n`` (the ``n``
    rows of a cyclic Latin square and their mirror images). Every arm is also first once per ``n``
    orders.
    """
    if n < 1:
        raise ValueError("a design needs at least one arm")
    first, low, high = [0], 1, n - 1
    while len(first) < n:  # 0, 1, n-1, 2, n-2, ...
        first.append(low if len(first) % 2 else high)
        low, high = (low + 1, high) if len(first) % 2 == 0 else (low, high - 1)
    rows = [[(a + r) % n for a in first] for r in range(n)]
    return rows + [row[::-1] for row in rows] if n % 2 and n > 1 else rows


def sample_long_enough(steps: int, seconds: float) -> bool:
    """The course's rule for one timed sample: at least ``MIN_SAMPLE_STEPS`` steps or ``MIN_SAMPLE_SECONDS``
    seconds (workshop and full sizes keep to it; the smoke size is a test of the code, not a measurement)."""
    if steps < 1 or seconds < 0:
        raise ValueError("a timed sample has at least one step and a non-negative duration")
    return steps >= MIN_SAMPLE_STEPS or seconds >= MIN_SAMPLE_SECONDS


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
    """``variants`` plus an A/A arm: the baseline (default: the first) measured a second time under its own
    name. ``again`` is the callable for it (default: the baseline's own; a fresh-process comparison passes a
    call to a second child of the same settings)."""
    base = baseline or next(iter(variants))
    if base not in variants:
        raise ValueError(f"no variant {base!r} to repeat as the A/A arm")
    return {**variants, aa_name(base): again or variants[base]}


def interleaved(variants: Mapping[str, Callable[[], Any]], rounds: int | None = None, *,
                max_reruns: int | None = None, limit: float = INTERFERENCE_LIMIT, warmup_rounds: int = 0,
                progress: bool = True, desc: str = "rounds", unit: str = "s",
                attempts: int | None = None) -> Rounds:
    """Measure every variant once per round, in orders of a Williams design (``williams_orders``).

    Each callable builds its variant afresh (a new seeded model, optimizer and inputs, its own
    warm-up untimed) and returns the timed value: a float, ``(value, metrics)`` or a ``Result``
    (its median sample, metrics and warm-up). ``rounds`` defaults to ``ROUNDS``
    (``run_sizes.pick`` a smaller number for the smoke size). Round i takes the design's order
    i (cycling); a round during which other processes or the hypervisor took more than ``limit``
    cores is measured again in the same order, at most ``max_reruns`` times in all (default: none
    at the smoke size, where the tests share the machine, else half the rounds); the table's note
    says how many were. ``warmup_rounds`` untimed rounds run first (lazy imports, caches).

    With an A/A arm among the variants (``with_aa``), a comparison whose A/A arm gets a verdict is
    measured again as a whole, up to ``attempts`` times (default ``AA_ATTEMPTS``, 1 at the smoke
    size); the result counts the attempts, and when the last one still fails, ``aa_failed`` is set
    and ``Rounds.verdict`` says ``DISTURBED`` for every other arm.
    """
    names = list(variants)
    if not names:
        raise ValueError("interleaved needs at least one variant")
    rounds = ROUNDS if rounds is None else rounds
    if rounds < 1 or warmup_rounds < 0:
        raise ValueError("rounds must be >= 1 and warmup_rounds >= 0")
    if max_reruns is None:
        max_reruns = run_sizes.pick(smoke=0, workshop=rounds // 2, full=rounds // 2)
    attempts = run_sizes.pick(smoke=1, workshop=AA_ATTEMPTS, full=AA_ATTEMPTS) if attempts is None else attempts
    if attempts < 1:
        raise ValueError("attempts must be >= 1")
    aa = [n for n in names if n.startswith(AA_PREFIX)]
    for name in aa:
        if aa_baseline(name) not in variants:
            raise ValueError(f"the A/A arm {name!r} repeats no variant of this comparison")
    for w in range(warmup_rounds):
        for name in names:
            variants[name]()
    design = [[names[i] for i in order] for order in williams_orders(len(names))]
    for attempt in range(1, attempts + 1):
        out = _measure_rounds(variants, names, design, rounds, max_reruns, limit, unit,
                              f"{desc} (attempt {attempt})" if attempt > 1 else desc, progress)
        out.attempts = attempt
        failed = [n for n in aa if verdict(out.samples[aa_baseline(n)], out.samples[n]).word != NO_DIFFERENCE]
        out.aa_failed = bool(failed)
        if not failed:
            break
    return out


def _measure_rounds(variants: Mapping[str, Callable[[], Any]], names: list[str], design: list[list[str]],
                    rounds: int, max_reruns: int, limit: float, unit: str, desc: str, progress: bool) -> Rounds:
    """One attempt of ``interleaved``: ``rounds`` kept rounds in the design's orders, disturbed ones re-run."""
    out = Rounds(names, {n: [] for n in names}, {n: [] for n in names}, {n: [] for n in names}, limit=limit, unit=unit)
    bar = _progress(rounds, desc) if progress else None
    try:
        while len(out.interference) < rounds:
            order = design[len(out.interference) % len(design)]  # a re-run round repeats its own order
            meter = CpuMeter().start()
            got = {name: _value(variants[name]()) for name in order}
            load = meter.stop()
            if load.disturbed(limit) and out.reruns < max_reruns:
                out.reruns += 1
                continue
            out.disturbed += load.disturbed(limit)
            out.interference.append(load)
            out.orders.append(list(order))
            for name in names:
                value, metrics, warm = got[name]
                out.samples[name].append(value)
                out.metrics[name].append(metrics)
                out.warmup[name].extend(warm)
            if bar is not None:
                bar.update(1)
    finally:
        if bar is not None:
            bar.close()
    return out


def _progress(total: int, desc: str) -> Any:
    """A tqdm bar; TQDM_DISABLE=1 (CI, committed runs) turns it off, also for the notebook widget."""
    import os

    from tqdm.auto import tqdm

    off = os.environ.get("TQDM_DISABLE", "").lower() in ("1", "true", "yes")
    return tqdm(total=total, desc=desc, leave=False, disable=off)


@dataclass(frozen=True)
class Stats:
    """Summary of repeated timings (seconds)."""

    median: float
    minimum: float
    maximum: float
    q1: float
    q3: float
    n: int

    @classmethod
    def of(cls, samples: Sequence[float]) -> "Stats":
        if not samples:
            raise ValueError("Stats.of needs at least one sample")
        s = sorted(float(x) for x in samples)
        if len(s) == 1:
            q1 = q3 = s[0]
        else:
            q1, _, q3 = statistics.quantiles(s, n=4, method="inclusive")
        return cls(statistics.median(s), s[0], s[-1], q1, q3, len(s))

    @property
    def spread(self) -> float:
        """Max minus min, as a fraction of the median."""
        return (self.maximum - self.minimum) / self.median if self.median else 0.0

    def __str__(self) -> str:
        return f"{self.median:.4g} s (min {self.minimum:.4g}, max {self.maximum:.4g}, n={self.n})"


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


def speedup_table(results: Sequence[Result], baseline: str | None = None,
                  metrics: Sequence[str] = (), title: str = "", unit: str = "s") -> Table:
    """Median, spread and speed-up (baseline/variant) of each result, with its metrics."""
    if not results:
        raise ValueError("no results to tabulate")
    base = next((r for r in results if r.name == baseline), results[0]) if baseline else results[0]
    if baseline and base.name != baseline:
        raise ValueError(f"baseline {baseline!r} is not among the results")
    cols = ["variant", f"median {unit}", f"min {unit}", f"max {unit}", "speed-up (x)", "95% interval (x)", "verdict"]
    if any(r.warmup for r in results):
        cols.insert(1, f"warm-up {unit}")
    table = Table(cols + list(metrics), title=title,
                  note="speed-up = baseline/variant per paired round, median over rounds; "
                       "verdict by helpers.measure.verdict")
    for r in results:
        st = r.stats
        row: list[Any] = [r.name]
        if "warm-up" in cols[1]:
            row.append(statistics.median(r.warmup) if r.warmup else None)
        row += [st.median, st.minimum, st.maximum]
        if r is base:
            row += [1.0, "-", "baseline"]
        elif len(r.samples) == len(base.samples):
            v = verdict(base.samples, r.samples)
            row += [v.ratio, v.interval, v.word]
        else:
            raise ValueError(f"{r.name!r} has {len(r.samples)} rounds and {base.name!r} {len(base.samples)}: "
                             "only variants measured in the same interleaved rounds can be compared")
        row += [r.metrics.get(m) for m in metrics]
        table.add(*row)
    return table


def loader_time(loader: Any, *, epochs: int = 3, warmup: int = 1, max_batches: int | None = None,
                name: str = "loader") -> Result:
    """Seconds to iterate a DataLoader once, data loading alone (no model).

    Each sample is one full pass, starting the iterator (and, without persistent workers,
    the worker processes) anew, as a training epoch would. ``metrics['images_per_s']`` is
    the median throughput.
    """
    if epochs < 1 or warmup < 0:
        raise ValueError("epochs must be >= 1 and warmup >= 0")
    count = 0

    def one_pass() -> None:
        nonlocal count
        count = 0
        for i, (inputs, _) in enumerate(loader):
            count += len(inputs)
            if max_batches is not None and i + 1 >= max_batches:
                break

    res = time_fn(one_pass, repeats=epochs, warmup=warmup, name=name)
    res.metrics["images_per_s"] = count / res.stats.median
    return res
