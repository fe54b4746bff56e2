"""The course's one result format: versioned rows in JSON Lines.

Every measurement (a notebook's sweep, ``make reproduce``, ``make bench``, ``tune``,
``deploy``) is also written as rows of this shape, so that tools such as ``helpers.pool``
can put many machines side by side. One row is one variant's value of one metric:

=================  ==========================================================================
field              meaning
=================  ==========================================================================
``version``        schema version (``SCHEMA_VERSION``); readers refuse versions they do not know
``chapter``        ``"01"`` ... ``"14"``, or a tool name (``"bench"``, ``"tune"``, ``"deploy"``)
``experiment``     what was compared, e.g. ``"batch_size"``
``variant``        which setting this row is, e.g. ``"batch_256"``
``metric``         what was measured, e.g. ``"epoch_time"``, ``"step_time"``, ``"accuracy"``
``unit``           ``"s"``, ``"ms"``, ``"%"``, ``"images/s"`` ...
``median``         median over the repeats; ``min`` and ``max`` their range; ``repeats`` how many
``values``         the repeats themselves, in round order (round i of every variant of one
                   experiment ran in the same interleaved round), so that a reader can apply
                   ``helpers.measure.verdict`` to any pair; empty in rows written before it existed
``lower_is_better``  True for times, False for accuracy and throughput
``baseline``       the variant the ratio is taken against (same run), or null
``ratio``          speed-up against the baseline, measured in the same run: baseline/variant
                   when lower is better, variant/baseline otherwise (> 1 means better), the
                   median over paired rounds when both have the same rounds; null
                   for the baseline's own metric-less rows
``published``      the published value for this variant and metric, when one exists
``published_ratio``  the published speed-up for the same comparison, when one exists
``published_source``  where the published numbers come from
``profile``        ``smoke`` / ``workshop`` / ``full``
``data``           ``real``, ``standin`` or ``none`` (no data set involved)
``fingerprint``    ``helpers.system.fingerprint()`` of the machine that measured
``versions``       library versions (torch, ...), also inside the fingerprint
``time``           UTC time the row was made (ISO 8601)
``extra``          a dict of anything else worth keeping (settings, the warm-up time ...)
=================  ==========================================================================

The fingerprint carries ``machine_id`` (``helpers.privacy``): a salted hash, so one machine's
repeated runs merge while its identity stays private; ``redact`` (also from there) removes
user, host and path names before rows leave the machine (``helpers.submit``). Tables are
rendered from rows (``rows_table``, ``render_markdown``, ``render_csv``): units and "per
step / per epoch / per run" in every header, stand-in data labelled on every quality value.

This module is plain data: reading rows needs no torch.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass, field, fields
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterable, Sequence

from .files import atomic_write_text
from .privacy import cache_dir, machine_id, private_names, redact, redact_text  # noqa: F401  (part of this API)
from .tables import Table

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

    @property
    def spread(self) -> float:
        """(max - min) / median: how far apart the repeats were (0 for one repeat)."""
        return (self.max - self.min) / self.median if self.median else 0.0


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _context(fingerprint: dict[str, Any] | None, profile: str | None, data: str | None) -> dict[str, Any]:
    """Fill in the machine, profile and data source that every row carries."""
    if fingerprint is None:
        from . import system

        fingerprint = {**system.fingerprint(), "machine_id": machine_id()}
    if profile is None:
        from . import profiles

        profile = profiles.current_profile()
    if data is None:
        from . import profiles

        data = profiles.data_source()
    versions = dict(fingerprint.get("versions", {})) if isinstance(fingerprint.get("versions"), dict) else {}
    return {"fingerprint": fingerprint, "versions": versions, "profile": profile, "data": data}


def make_rows(chapter: str, experiment: str, values: dict[str, Sequence[float]], *, metric: str, unit: str,
              baseline: str | None = None, lower_is_better: bool = True,
              published: dict[str, float] | None = None, published_source: str | None = None,
              fingerprint: dict[str, Any] | None = None, profile: str | None = None, data: str | None = None,
              extra: dict[str, dict[str, Any]] | None = None) -> list[Row]:
    """Rows for one experiment: ``values`` maps each variant to its repeated measurements.

    ``ratio`` is the median over rounds of the per-round ratio against ``baseline`` when both
    have the same number of values (interleaved rounds, paired), else the ratio of the medians;
    ``published``
    maps variants to published values of the same metric, from which ``published_ratio``
    is computed against the published baseline when both exist.
    """
    if not values:
        raise ValueError("make_rows needs at least one variant")
    if baseline is not None and baseline not in values:
        raise ValueError(f"baseline {baseline!r} is not among the variants {sorted(values)}")
    empty = [k for k, v in values.items() if len(v) == 0]
    if empty:
        raise ValueError(f"no measurements for {empty}")
    ctx = _context(fingerprint, profile, data)
    medians = {k: _median(v) for k, v in values.items()}
    pub = published or {}
    rows = []
    for variant, vals in values.items():
        base_vals = values.get(baseline) if baseline else None
        if base_vals is not None and len(base_vals) == len(vals):
            ratio = _median([_ratio(b, v, lower_is_better) or 0.0 for b, v in zip(base_vals, vals)])
        else:
            ratio = _ratio(medians.get(baseline), medians[variant], lower_is_better) if baseline else None
        p = pub.get(variant)
        pub_ratio = (_ratio(pub.get(baseline), p, lower_is_better)
                     if baseline and p is not None and pub.get(baseline) is not None else None)
        rows.append(Row(chapter=str(chapter), experiment=experiment, variant=variant, metric=metric, unit=unit,
                        median=medians[variant], min=float(min(vals)), max=float(max(vals)), repeats=len(vals),
                        lower_is_better=lower_is_better, baseline=baseline, ratio=ratio, published=p,
                        published_ratio=pub_ratio, published_source=published_source if p is not None else None,
                        time=_now(), extra=dict((extra or {}).get(variant, {})), values=[float(v) for v in vals],
                        **ctx))
    return rows


def rows_from_results(chapter: str, experiment: str, results: Iterable[Any], *, baseline: str | None = None,
                      metric: str = "epoch_time", unit: str = "s", quality: Sequence[tuple[str, str]] = (),
                      published: dict[str, float] | None = None, published_source: str | None = None,
                      **context: Any) -> list[Row]:
    """Rows from ``helpers.measure.Result`` objects (anything with ``name``, ``samples``, ``metrics``).

    The timed samples become ``metric`` rows (lower is better); each ``(metric, unit)`` in
    ``quality`` (e.g. ``("accuracy", "%")``) becomes a row too, higher is better, taken from
    ``result.metrics`` where present.
    """
    results = list(results)
    rows = make_rows(chapter, experiment, {r.name: list(r.samples) for r in results}, metric=metric, unit=unit,
                     baseline=baseline, published=published, published_source=published_source, **context,
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
    s = sorted(float(v) for v in values)
    n = len(s)
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2


def _ratio(base: float | None, value: float | None, lower_is_better: bool) -> float | None:
    if base is None or value is None:
        return None
    if lower_is_better:
        return base / value if value else None
    return value / base if base else None


def results_dir() -> Path:
    """Where rows go by default: ``$COURSE_RESULTS`` if set, else ``results/`` in the project root.

    The project root is the nearest folder above the working directory holding
    ``pyproject.toml`` (notebooks run from ``notebooks/``); without one, the working directory.
    """
    env = os.environ.get("COURSE_RESULTS", "").strip()
    if env:
        return Path(env)
    here = Path.cwd().resolve()
    for folder in (here, *here.parents):
        if (folder / "pyproject.toml").exists():
            return folder / "results"
    return here / "results"


def append_rows(rows: Sequence[Row], path: Path | str | None = None) -> Path:
    """Add ``rows`` to a JSON Lines file (default ``results_dir()/rows.jsonl``).

    The file is opened for appending under an exclusive lock (``fcntl.flock``) and the rows are
    written in one call, so notebooks running side by side (``make test`` runs two) never lose
    each other's rows, and a crash can at worst leave one incomplete last line, which
    ``read_rows`` names.
    """
    import fcntl

    path = Path(path) if path is not None else results_dir() / ROWS_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    new = "".join(json.dumps(asdict(r), sort_keys=True, default=str) + "\n" for r in rows)
    with open(path, "a", encoding="utf-8") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            f.write(new)
            f.flush()
            os.fsync(f.fileno())
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)
    return path


def write_rows(rows: Sequence[Row], path: Path | str) -> Path:
    """Write ``rows`` to a JSON Lines file, replacing it, atomically."""
    return atomic_write_text(Path(path), "".join(json.dumps(asdict(r), sort_keys=True, default=str) + "\n"
                                                 for r in rows))


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
            d = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ResultsFormatError(f"{path.name} line {n} is not JSON ({exc.msg})") from None
        rows.append(row_from_dict(d))
    return rows


# --- describing a machine ---------------------------------------------------------------------

def isa_class(fingerprint: dict[str, Any]) -> str:
    """The instruction sets that decide the course's CPU results, as one label."""
    bf16 = fingerprint.get("bf16") or {}
    if bf16.get("amx"):
        return "AMX"
    if bf16.get("native_bf16"):
        return "AVX512-BF16"
    if bf16.get("avx512"):
        return "AVX-512"
    if bf16.get("avx2"):
        return "AVX2"
    return "no AVX2" if bf16 else "unknown ISA"


def hardware_class(fingerprint: dict[str, Any]) -> str:
    """Machines that should give similar ratios: accelerator, else physical cores and ISA."""
    accel = fingerprint.get("accelerators") or []
    if accel:
        names = sorted(set(accel))
        return f"{len(accel)}x {names[0]}" if len(names) == 1 else " + ".join(names)
    cores = fingerprint.get("physical_cores", "?")
    return f"CPU {cores} cores, {isa_class(fingerprint)}"


def machine_key(fingerprint: dict[str, Any]) -> str:
    """``machine_id`` when the fingerprint has one, else a hash of its hardware fields."""
    if fingerprint.get("machine_id"):
        return str(fingerprint["machine_id"])
    hardware = {k: fingerprint.get(k) for k in ("cpu_model", "sockets", "physical_cores", "logical_cores",
                                                 "numa_nodes", "bf16", "accelerators")}
    return "hw-" + hashlib.sha256(json.dumps(hardware, sort_keys=True, default=str).encode()).hexdigest()[:12]


# --- rendering --------------------------------------------------------------------------------

_PER = (("step", "per step"), ("phase", "per step"), ("epoch", "per epoch"), ("iteration", "per iteration"), ("batch", "per batch"),
        ("run", "per run"), ("total", "per run"), ("compile", "per run"), ("warmup", "per run"))
_QUALITY = ("accuracy", "loss", "top1", "top5", "error", "diff")


def metric_label(metric: str, unit: str) -> str:
    """A header naming the unit and what one value covers, e.g. ``s per epoch`` or ``% (accuracy)``."""
    if unit in ("s", "ms", "us", "min", "h"):
        per = next((p for key, p in _PER if key in metric.lower()), "per run")
        return f"{unit} {per}"
    return unit or "value"


def is_quality(row: Row) -> bool:
    """Rows that measure the model (accuracy, loss), not the speed."""
    return any(q in row.metric.lower() for q in _QUALITY)


def _data_label(row: Row) -> str:
    return {"standin": "stand-in data", "real": "real data"}.get(row.data, "no data set")


def rows_table(rows: Sequence[Row], title: str = "") -> Table:
    """One experiment's rows of one metric as a table: units and scope in every numeric header,
    ratio against the baseline, the published value and ratio; quality values say stand-in data."""
    if not rows:
        raise ValueError("no rows to tabulate")
    first = rows[0]
    label = metric_label(first.metric, first.unit)
    cols = ["variant", f"{first.metric} median ({label})", f"min ({label})", f"max ({label})", "repeats",
            f"ratio vs {first.baseline} (x)" if first.baseline else "ratio (x)",
            f"published ({label})", "published ratio (x)", "data"]
    quality = is_quality(first)
    table = Table(cols, title=title or f"{first.chapter} / {first.experiment}: {first.metric}",
                  note=_note(first))
    for r in rows:
        if (r.metric, r.unit) != (first.metric, first.unit):
            raise ValueError(f"rows_table takes one metric and unit; got {r.metric} {r.unit} and "
                             f"{first.metric} {first.unit}")
        median: Any = r.median
        if quality and r.data == "standin":
            median = f"{fmt_value(r.median)} (stand-in)"
        table.add(r.variant, median, r.min, r.max, r.repeats, r.ratio, r.published, r.published_ratio,
                  _data_label(r))
    return table


def fmt_value(value: float) -> str:
    from .tables import fmt

    return fmt(value)


def _note(row: Row) -> str:
    better = "lower is better" if row.lower_is_better else "higher is better"
    parts = [f"{row.profile or '?'} profile", better]
    if row.baseline:
        parts.append(f"ratio > 1: better than {row.baseline}, measured in the same run")
    if row.published_source:
        parts.append(f"published: {row.published_source}")
    if row.data == "standin":
        parts.append("stand-in data: these values say nothing about the real data set" if is_quality(row)
                     else "measured on stand-in data")
    return "; ".join(parts)


def group_rows(rows: Iterable[Row]) -> dict[tuple[str, str, str, str], list[Row]]:
    """Rows grouped by (chapter, experiment, metric, unit), in the order they first appear."""
    groups: dict[tuple[str, str, str, str], list[Row]] = {}
    for r in rows:
        groups.setdefault((r.chapter, r.experiment, r.metric, r.unit), []).append(r)
    return groups


def render_markdown(rows: Sequence[Row], heading_level: int = 3) -> str:
    """Every experiment's tables as markdown, grouped by chapter and experiment."""
    out = []
    for (chapter, experiment, metric, _unit), group in group_rows(rows).items():
        table = rows_table(group)
        out += [f"{'#' * heading_level} {chapter} / {experiment}: {metric}", "", table.to_markdown(), "",
                f"*{table.note}*", ""]
    return "\n".join(out)


def render_csv(rows: Sequence[Row], path: Path | str | None = None) -> str:
    """Rows as a flat CSV (one line per row, fingerprint as the machine's id and hardware class)."""
    cols = ["chapter", "experiment", "variant", "metric", "unit", "median", "min", "max", "repeats",
            "lower_is_better", "baseline", "ratio", "published", "published_ratio", "published_source",
            "profile", "data", "machine", "hardware", "torch", "time"]
    table = Table(cols)
    for r in rows:
        table.add(r.chapter, r.experiment, r.variant, r.metric, r.unit, r.median, r.min, r.max, r.repeats,
                  r.lower_is_better, r.baseline, r.ratio, r.published, r.published_ratio, r.published_source,
                  r.profile, r.data, machine_key(r.fingerprint), hardware_class(r.fingerprint),
                  r.versions.get("torch", ""), r.time)
    text = table.to_csv()
    if path is not None:
        atomic_write_text(Path(path), text)
    return text
