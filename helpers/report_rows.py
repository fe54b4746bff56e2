"""Rendering of result rows: tables, Markdown and CSV reports of ``helpers.results`` rows.

Tables are rendered from rows (``rows_table``, ``render_markdown``, ``render_csv``): units and
"per step / per epoch / per run" in every header (``metric_label``), stand-in data labelled on
every quality value (``is_quality``); ``group_rows`` groups rows by chapter, experiment, metric
and unit. The CSV names each row's machine and hardware class (``helpers.machine_class``).

Plain data: no torch.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable, Sequence

from .files import atomic_write_text
from .machine_class import hardware_class, machine_key
from .results import Row
from .tables import Table


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
