"""The course's one result format: versioned JSON Lines rows, one variant's value of one metric each (docs/tools.md)."""

from __future__ import annotations

import json
import os
import statistics
from dataclasses import asdict, dataclass, field, fields
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterable, Sequence

from . import run_sizes, system
from .files import atomic_write_text
from .locks import hold
from .verdict import hodges_lehmann


SCHEMA_VERSION = 1
ROWS_FILE = "rows.jsonl"


class ResultsFormatError(ValueError):
    """A rows file this version of the course cannot read."""


@dataclass
class Row:
    """One variant's value of one metric, with everything needed to compare it elsewhere."""

    chapter: str
    experiment: str
    variant: str
    metric: str
    unit: str
    median: float
    min: float
    max: float
    repeats: int
    lower_is_better: bool = True
    baseline: str | None = None
    ratio: float | None = None
    published: float | None = None
    published_ratio: float | None = None
    published_source: str | None = None
    profile: str = ""
    data: str = "none"
    fingerprint: dict[str, Any] = field(default_factory=dict)
    versions: dict[str, Any] = field(default_factory=dict)
    time: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
    values: list[float] = field(default_factory=list)
    version: int = SCHEMA_VERSION


def make_rows(chapter: str, experiment: str, values: dict[str, Sequence[float]], *, metric: str, unit: str,
              baseline: str | None = None, lower_is_better: bool = True,
              published: dict[str, float] | None = None, published_source: str | None = None,
              fingerprint: dict[str, Any] | None = None, profile: str | None = None, data: str | None = None,
              extra: dict[str, dict[str, Any]] | None = None) -> list[Row]:
    """Rows for one experiment, ``values``: each variant's repeated measurements; ``ratio``: the Hodges-Lehmann
    estimate of the paired per-round ratios against ``baseline`` (unpaired: the ratio of the medians)."""
    if not values:
        raise ValueError("make_rows needs at least one variant")
    if baseline is not None and baseline not in values:
        raise ValueError(f"baseline {baseline!r} is not among the variants {sorted(values)}")
    empty = [k for k, v in values.items() if len(v) == 0]
    if empty:
        raise ValueError(f"no measurements for {empty}")
    if fingerprint is None:
        fingerprint = {**system.fingerprint(), "machine_id": system.machine_id()}
    versions = fingerprint.get("versions")
    ctx = {"fingerprint": fingerprint, "versions": dict(versions) if isinstance(versions, dict) else {},
           "profile": run_sizes.current_profile() if profile is None else profile,
           "data": run_sizes.data_source() if data is None else data,
           "time": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    medians = {k: _median(v) for k, v in values.items()}
    pub, rows = published or {}, []
    base_vals = values.get(baseline) if baseline else None
    for variant, vals in values.items():
        if base_vals is not None and len(base_vals) == len(vals):
            per_round = [_ratio(b, v, lower_is_better) for b, v in zip(base_vals, vals)]
            ratio = (hodges_lehmann(per_round) if all(r and r > 0 for r in per_round)
                     else _median([r or 0.0 for r in per_round]))
        else:
            ratio = _ratio(medians.get(baseline), medians[variant], lower_is_better) if baseline else None
        p = pub.get(variant)
        pub_ratio = (_ratio(pub.get(baseline), p, lower_is_better)
                     if baseline and p is not None and pub.get(baseline) is not None else None)
        rows.append(Row(chapter=str(chapter), experiment=experiment, variant=variant, metric=metric, unit=unit,
                        median=medians[variant], min=float(min(vals)), max=float(max(vals)), repeats=len(vals),
                        lower_is_better=lower_is_better, baseline=baseline, ratio=ratio, published=p,
                        published_ratio=pub_ratio, published_source=published_source if p is not None else None,
                        extra=dict((extra or {}).get(variant, {})), values=[float(v) for v in vals], **ctx))
    return rows


def rows_from_results(chapter: str, experiment: str, results: Iterable[Any], *, baseline: str | None = None,
                      metric: str = "epoch_time", unit: str = "s", quality: Sequence[tuple[str, str]] = (),
                      **context: Any) -> list[Row]:
    """Rows from ``helpers.measure.Result`` objects: the samples as ``metric`` rows (lower is better), each ``(metric,
    unit)`` of ``quality`` from ``result.metrics`` (higher is better); ``context``: ``make_rows``'s other options."""
    results = list(results)
    rows = make_rows(chapter, experiment, {r.name: list(r.samples) for r in results}, metric=metric, unit=unit,
                     baseline=baseline, **context,
                     extra={r.name: {"warmup_median": _median(r.warmup)} if getattr(r, "warmup", None) else {}
                            for r in results})
    ctx = {k: rows[0].__dict__[k] for k in ("fingerprint", "profile", "data")}
    for name, unit_q in quality:
        vals = {r.name: [float(r.metrics[name])] for r in results if name in r.metrics}
        if vals:
            base = baseline if baseline in vals else None
            rows += make_rows(chapter, experiment, vals, metric=name, unit=unit_q, baseline=base,
                              lower_is_better=False, **ctx)
    return rows


def _median(values: Sequence[float]) -> float:
    return statistics.median(float(v) for v in values)


def _ratio(base: float | None, value: float | None, lower_is_better: bool) -> float | None:
    if base is None or value is None:
        return None
    if lower_is_better:
        return base / value if value else None
    return value / base if base else None


CHECKOUT = Path(__file__).resolve().parent.parent  # the course's checkout when helpers is installed from one


def results_dir() -> Path:
    """Where rows go: ``$COURSE_RESULTS``, else ``results/`` of the project we are in, or helpers' checkout, or here."""
    env = os.environ.get("COURSE_RESULTS", "").strip()
    if env:
        return Path(env)
    here = Path.cwd().resolve()
    checkout = CHECKOUT if (CHECKOUT / "pyproject.toml").exists() and (CHECKOUT / "notebooks").is_dir() else here
    return next((f for f in (here, *here.parents) if (f / "pyproject.toml").exists()), checkout) / "results"


def append_rows(rows: Sequence[Row], path: Path | str | None = None) -> Path:
    """Add ``rows`` to a JSON Lines file (default ``results_dir()/rows.jsonl``) in one write, under ``<file>.lock``."""
    path = Path(path) if path is not None else results_dir() / ROWS_FILE
    with hold(f"{path}.lock", wait=None, what=f"the results file {path}"), open(path, "a", encoding="utf-8") as f:
        f.write(_lines(rows))
        f.flush()
        os.fsync(f.fileno())
    return path


def write_rows(rows: Sequence[Row], path: Path | str) -> Path:
    """Write ``rows`` to a JSON Lines file, replacing it, atomically."""
    return atomic_write_text(Path(path), _lines(rows))


def _lines(rows: Sequence[Row]) -> str:
    return "".join(json.dumps(asdict(r), sort_keys=True, default=str) + "\n" for r in rows)


def row_from_dict(d: dict[str, Any]) -> Row:
    """A Row from its JSON form; an unknown or missing version raises ResultsFormatError."""
    version = d.get("version")
    if version != SCHEMA_VERSION:
        raise ResultsFormatError(
            f"result rows of format version {version!r}; this course reads version {SCHEMA_VERSION}. "
            "Update the course (git pull) or re-run the measurement with this version.")
    names = {f.name for f in fields(Row)}
    missing = {"chapter", "experiment", "variant", "metric", "unit", "median", "min", "max", "repeats"} - set(d)
    if missing:
        raise ResultsFormatError(f"a result row lacks {sorted(missing)}")
    return Row(**{k: v for k, v in d.items() if k in names})


def read_rows(path: Path | str) -> list[Row]:
    """Read a JSON Lines rows file (blank lines ignored)."""
    path = Path(path)
    rows = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            rows.append(row_from_dict(json.loads(line)))
        except json.JSONDecodeError as exc:
            raise ResultsFormatError(f"{path.name} line {n} is not JSON ({exc.msg})") from None
    return rows
