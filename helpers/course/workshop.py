"""The workshop kit: ``python -m helpers.course.workshop submit [RUN]`` and ``... pool PATHS... --out DIR``.

``submit`` (``make submit``) packs one machine's latest result rows for an organiser, with no user, host or
path in them; ``pool`` (``make pool``) puts many machines' rows side by side in ``DIR/index.md``, a figure
per lever. Also the row reports of ``make reproduce`` and the machine classes. What and why: docs/workshop.md."""

from __future__ import annotations

import argparse
import getpass
import hashlib
import json
import re
import socket
import statistics
import sys
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterable, Sequence

from .. import files, results
from ..results import ResultsFormatError, Row
from ..system import machine_id
from ..tables import Table, fmt
from ..verdict import NO_DIFFERENCE, verdict

SUBMISSION_FORMAT = "accelerate-course-submission"
SUBMISSION_VERSION = 1
UNCLEAR = "~"
POOLED_FROM = "pooled_from"
_ABS_PATH = re.compile(r"(?<![\w.~<>:/])(?:/[^\s/'\",;:()\[\]{}|]+)+/?")
_WIN_PATH = re.compile(r"\b[A-Za-z]:\\[^\s'\",;]*")
_PER = (("step", "per step"), ("phase", "per step"), ("epoch", "per epoch"), ("iteration", "per iteration"), ("batch", "per batch"),
        ("run", "per run"), ("total", "per run"), ("compile", "per run"), ("warmup", "per run"))
_QUALITY = ("accuracy", "loss", "top1", "top5", "error", "diff")


def private_names() -> dict[str, str]:
    """This machine's names that must not leave it: user, host (and short host), home folder."""
    names = {"home": str(Path.home())}
    try:
        names["user"] = getpass.getuser()
    except (KeyError, OSError):
        pass
    host = socket.gethostname()
    names["host"] = host
    names["host_short"] = host.split(".")[0]
    return {k: v for k, v in names.items() if v}


def redact_text(text: str, names: dict[str, str] | None = None, *, all_paths: bool = True) -> str:
    """``text`` without user and host names (whole words) and the home folder (``~``).

    ``all_paths``: every absolute path becomes ``<path>`` too (for what leaves the machine).
    """
    names = private_names() if names is None else names
    home = names.get("home", "")
    if home and home != "/":
        text = text.replace(home.rstrip("/") + "/", "~/")
        text = re.sub(re.escape(home.rstrip("/")) + r"\b", "~", text)
    if all_paths:
        text = re.sub(r"file://[^\s'\",;]*", "<path>", text)
        text = _ABS_PATH.sub("<path>", text)
        text = _WIN_PATH.sub("<path>", text)
        text = re.sub(r"(?<![\w<>])~(?:/[^\s'\",;:()\[\]{}|]*)?(?![\w])", "<path>", text)
    for key, label in (("host", "<host>"), ("host_short", "<host>"), ("user", "<user>")):
        value = names.get(key, "")
        if len(value) >= 2:
            text = re.sub(rf"(?<![\w-]){re.escape(value)}(?![\w-])", label, text)
    return text


def redact(obj: Any, names: dict[str, str] | None = None, *, all_paths: bool = True) -> Any:
    """``redact_text`` applied to every string (keys and values) inside dicts, lists and tuples."""
    names = private_names() if names is None else names
    if isinstance(obj, str):
        return redact_text(obj, names, all_paths=all_paths)
    if isinstance(obj, dict):
        return {redact(k, names, all_paths=all_paths): redact(v, names, all_paths=all_paths) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [redact(v, names, all_paths=all_paths) for v in obj]
    return obj


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
    """One experiment's rows of one metric as a table, with units and scope in every numeric header."""
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
            median = f"{fmt(r.median)} (stand-in)"
        table.add(r.variant, median, r.min, r.max, r.repeats, r.ratio, r.published, r.published_ratio,
                  _data_label(r))
    return table


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
        files.atomic_write_text(Path(path), text)
    return text


class SubmitError(ValueError):
    """Nothing to submit, or a submission that would leak a private name."""


def latest_rows_file(root: Path | str) -> Path:
    """The newest ``rows.jsonl`` of a run folder under ``root`` (``root``'s own only when there is no run)."""
    root = Path(root)
    found = [p for p in root.rglob(results.ROWS_FILE) if p.stat().st_size > 0] if root.is_dir() else []
    runs = [p for p in found if p.parent != root]
    found = runs or found
    if not found:
        raise SubmitError(f"no results under {root}: run `make reproduce` (or `make bench`) first")
    return max(found, key=lambda p: (p.stat().st_mtime, str(p)))


def rows_file(source: Path | str | None, root: Path | str) -> Path:
    """The rows to submit: ``source`` (a run folder or rows file) or the latest under ``root``."""
    if source is None:
        return latest_rows_file(root)
    source = Path(source)
    if source.is_dir():
        if (source / results.ROWS_FILE).exists():
            return source / results.ROWS_FILE
        return latest_rows_file(source)
    if not source.exists():
        raise SubmitError(f"{source} does not exist")
    return source


def pack(rows: Sequence[Row], names: dict[str, str] | None = None) -> dict[str, Any]:
    """The submission payload: fingerprints stored once, every string redacted."""
    if not rows:
        raise SubmitError("the run has no result rows to submit")
    names = private_names() if names is None else names
    fingerprints: list[dict[str, Any]] = []
    index: dict[str, int] = {}
    packed = []
    for r in rows:
        fp = dict(r.fingerprint)
        fp.setdefault("machine_id", machine_id())
        key = json.dumps(fp, sort_keys=True, default=str)
        if key not in index:
            index[key] = len(fingerprints)
            fingerprints.append(fp)
        d = results.asdict(r)
        d.pop("versions", None)  # inside the fingerprint already
        d["fingerprint"] = index[key]
        packed.append(d)
    machines = sorted({fp["machine_id"] for fp in fingerprints})
    chapters = Counter(r.chapter for r in rows)
    payload = {
        "format": SUBMISSION_FORMAT, "version": SUBMISSION_VERSION, "rows_version": results.SCHEMA_VERSION,
        "machine_id": machines[0] if len(machines) == 1 else machines,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "contents": describe(rows),
        "chapters": dict(sorted(chapters.items())),
        "fingerprints": fingerprints, "rows": packed,
    }
    payload = redact(payload, names, all_paths=True)
    leaks = find_leaks(json.dumps(payload), names)
    if leaks:  # redact() should have removed them: never write a file that still has one
        raise SubmitError(f"the submission would still contain {', '.join(leaks)}; not written")
    return payload


def read_submission(path: Path | str) -> list[Row]:
    """Rows of a ``make submit`` file (fingerprints stored once, referenced by index)."""
    path = Path(path)
    try:
        payload = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ResultsFormatError(f"{path.name} is not JSON ({exc.msg})") from None
    if not isinstance(payload, dict) or payload.get("format") != SUBMISSION_FORMAT:
        raise ResultsFormatError(f"{path.name} is not a course submission (made by `make submit`)")
    if payload.get("version") != SUBMISSION_VERSION:
        raise ResultsFormatError(
            f"{path.name} is a submission of format version {payload.get('version')!r}; this course reads "
            f"version {SUBMISSION_VERSION}. Update the course (git pull), or ask for a submission made with it.")
    fingerprints = payload.get("fingerprints", [])
    rows = []
    for d in payload.get("rows", []):
        d = dict(d)
        fp = fingerprints[d["fingerprint"]] if isinstance(d.get("fingerprint"), int) else d.get("fingerprint", {})
        d["fingerprint"] = fp
        d.setdefault("versions", dict(fp.get("versions", {})))
        rows.append(results.row_from_dict(d))
    return rows


def find_leaks(text: str, names: dict[str, str] | None = None) -> list[str]:
    """Which private things (user, host, home folder, an absolute path) occur in ``text``."""
    names = private_names() if names is None else names
    leaks = [k for k in ("user", "host", "host_short")
             if len(names.get(k, "")) >= 2 and redact_text(text, {k: names[k]}, all_paths=False) != text]
    home = names.get("home", "")
    if home and home != "/" and home in text:
        leaks.append("home")
    if redact_text(text, {}, all_paths=True) != text:
        leaks.append("a path")
    return leaks


def describe(rows: Sequence[Row]) -> str:
    """One paragraph saying what a submission contains."""
    experiments = sorted({f"{r.chapter}/{r.experiment}" for r in rows})
    profiles = sorted({r.profile for r in rows})
    data = sorted({r.data for r in rows})
    return (f"{len(rows)} result rows ({len(experiments)} experiments: {', '.join(experiments[:12])}"
            f"{', ...' if len(experiments) > 12 else ''}; profile {', '.join(profiles)}; data {', '.join(data)}). "
            "Per row: chapter, experiment, variant, metric, unit, median/min/max, repeats, ratio to the baseline, "
            "published value and ratio, profile, data source, time. Per machine, once: CPU model, sockets, cores, "
            "NUMA nodes, instruction sets, OpenMP runtime, GPU names, OS kernel, library versions, and a salted "
            "machine id. No user name, host name or path.")


def submit(source: Path | str | None = None, out: Path | str | None = None,
           root: Path | str | None = None) -> tuple[Path, dict[str, Any]]:
    """Write the submission file; returns its path and payload."""
    root = Path(root) if root is not None else results.results_dir()
    path = rows_file(source, root)
    payload = pack(results.read_rows(path))
    machine = payload["machine_id"] if isinstance(payload["machine_id"], str) else "several"
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    target = Path(out) if out is not None else root / f"submission-{machine[:8]}-{stamp}.json"
    files.atomic_write_text(target, json.dumps(payload, indent=1, sort_keys=True) + "\n")
    return target, payload


def find_inputs(path: Path | str) -> list[Path]:
    """The rows files and submissions under ``path`` (itself, when it is a file), sorted."""
    path = Path(path)
    if path.is_file():
        return [path]
    if not path.is_dir():
        raise FileNotFoundError(f"{path} does not exist")
    found = sorted(set(path.rglob(results.ROWS_FILE)) | set(path.rglob("submission-*.json")))
    if not found:
        raise FileNotFoundError(f"no results in {path}: expected {results.ROWS_FILE} files (make reproduce, make "
                                "bench, notebooks) or submission-*.json files (make submit)")
    return found


def load(paths: Iterable[Path | str]) -> list[Row]:
    """All rows from ``paths`` (files or folders); the same row read twice counts once."""
    rows: list[Row] = []
    seen: set[str] = set()
    files = sorted({p.resolve() for given in paths for p in find_inputs(given)})
    for n, path in enumerate(files):
        batch = read_submission(path) if path.suffix == ".json" else results.read_rows(path)
        for r in batch:
            key = json.dumps([machine_key(r.fingerprint), r.chapter, r.experiment, r.variant, r.metric,
                              r.unit, r.time, r.median, r.min, r.max, r.repeats], default=str)
            if key not in seen:
                seen.add(key)
                r.extra = {**r.extra, POOLED_FROM: n}  # which input it came from (counts runs per machine)
                rows.append(r)
    return rows


@dataclass
class Cell:
    """One variant of one lever on one machine, merged over that machine's runs."""

    median: float
    min: float
    max: float
    repeats: int
    runs: int
    ratio: float | None = None
    ratio_low: float | None = None
    ratio_high: float | None = None
    unclear: bool = False
    values: list[float] = field(default_factory=list)
    verdict: str = ""


@dataclass
class Lever:
    """One comparison (chapter, experiment, metric, unit, profile) across machines."""

    chapter: str
    experiment: str
    metric: str
    unit: str
    profile: str
    baseline: str | None
    lower_is_better: bool
    variants: list[str] = field(default_factory=list)
    cells: dict[tuple[str, str], Cell] = field(default_factory=dict)  # (machine, variant) -> Cell
    published: dict[str, float] = field(default_factory=dict)  # variant -> published ratio (or value)
    published_source: str | None = None
    data: set[str] = field(default_factory=set)

    @property
    def key(self) -> tuple[str, str, str, str, str]:
        return (self.chapter, self.experiment, self.metric, self.unit, self.profile)

    @property
    def has_ratios(self) -> bool:
        return self.baseline is not None

    def title(self) -> str:
        return f"{self.chapter} / {self.experiment}: {self.metric} ({self.profile} profile)"


@dataclass
class Machine:
    """One machine of the pool: its private key, fingerprint, runs, rows, profiles and short label."""

    key: str
    fingerprint: dict[str, Any]
    runs: set[str] = field(default_factory=set)
    rows: int = 0
    profiles: set[str] = field(default_factory=set)
    label: str = ""

    @property
    def hardware(self) -> str:
        return hardware_class(self.fingerprint)


def _ratio(base: float, value: float, lower_is_better: bool) -> float | None:
    if lower_is_better:
        return base / value if value else None
    return value / base if base else None


def _judge(cell: Cell, base: Cell, lower_is_better: bool, is_baseline: bool) -> None:
    """Ratio, interval and word of ``helpers.measure.verdict`` over paired rounds; else "not paired", unclear."""
    cell.ratio = _ratio(base.median, cell.median, lower_is_better)
    if is_baseline:
        cell.verdict = "baseline"
        return
    if base.values and len(base.values) == len(cell.values) and min(base.values + cell.values) > 0:
        v = verdict(base.values, cell.values, higher_is_better=not lower_is_better)
        cell.ratio, cell.ratio_low, cell.ratio_high, cell.verdict = v.ratio, v.low, v.high, v.word
        cell.unclear = v.word == NO_DIFFERENCE
    else:
        cell.verdict = "not paired"
        cell.unclear = True


def machines_of(rows: Sequence[Row]) -> dict[str, Machine]:
    """The machines the rows come from, keyed by their private id."""
    out: dict[str, Machine] = {}
    for r in rows:
        key = machine_key(r.fingerprint)
        m = out.setdefault(key, Machine(key, r.fingerprint))
        m.rows += 1
        m.runs.add(str(r.extra.get(POOLED_FROM, r.time[:10])))
        m.profiles.add(r.profile)
    short = Counter(m.key[:8] for m in out.values())
    for m in out.values():  # a short label unless two machines share it
        m.label = m.key if short[m.key[:8]] > 1 else m.key[:8]
    return out


def levers_of(rows: Sequence[Row]) -> list[Lever]:
    """Rows grouped into levers, merged per machine and variant, ratios recomputed from the merge."""
    groups: dict[tuple[str, str, str, str, str], list[Row]] = {}
    for r in rows:
        groups.setdefault((r.chapter, r.experiment, r.metric, r.unit, r.profile), []).append(r)
    levers = []
    for key in sorted(groups):
        group = sorted(groups[key], key=lambda r: (machine_key(r.fingerprint), r.time))
        first = group[0]
        baselines = sorted({r.baseline for r in group if r.baseline})
        lever = Lever(*key, baseline=baselines[0] if baselines else None, lower_is_better=first.lower_is_better,
                      published_source=next((r.published_source for r in group if r.published_source), None))
        per: dict[tuple[str, str], list[Row]] = {}
        for r in group:
            per.setdefault((machine_key(r.fingerprint), r.variant), []).append(r)
            if r.variant not in lever.variants:
                lever.variants.append(r.variant)
            lever.data.add(r.data)
            pub = r.published_ratio if lever.baseline else r.published
            if pub is not None:
                lever.published.setdefault(r.variant, pub)
        if lever.baseline in lever.variants:  # the baseline first, the others as first seen
            lever.variants.remove(lever.baseline)
            lever.variants.insert(0, lever.baseline)
        for (machine, variant), rs in per.items():
            lever.cells[(machine, variant)] = Cell(
                median=statistics.median(r.median for r in rs), min=min(r.min for r in rs),
                max=max(r.max for r in rs), repeats=sum(r.repeats for r in rs), runs=len(rs),
                values=[v for r in rs for v in r.values])  # runs in time order: round i stays paired
        for (machine, variant), cell in lever.cells.items():
            base = lever.cells.get((machine, lever.baseline)) if lever.baseline else None
            if base is None:
                ratios = [r.ratio for r in per[(machine, variant)] if r.ratio is not None]
                cell.ratio = statistics.median(ratios) if ratios else None
                continue
            _judge(cell, base, lever.lower_is_better, variant == lever.baseline)
        levers.append(lever)
    return levers


def _ordered_machines(machines: dict[str, Machine]) -> list[Machine]:
    return sorted(machines.values(), key=lambda m: (m.hardware, m.key))


def machines_table(machines: dict[str, Machine]) -> Table:
    """One line per machine: private id, hardware class, CPU, cores, ISA, GPU, torch, runs merged."""
    table = Table(["machine", "hardware class", "CPU", "cores (physical/logical)", "instruction sets", "GPU",
                   "torch", "profiles", "rows", "runs merged"])
    for m in _ordered_machines(machines):
        fp = m.fingerprint
        table.add(m.label, m.hardware, fp.get("cpu_model", "?"), f"{fp.get('physical_cores', '?')}/"
                  f"{fp.get('logical_cores', '?')}", isa_class(fp), ", ".join(fp.get("accelerators") or [])
                  or "none", (fp.get("versions") or {}).get("torch", "?"), ", ".join(sorted(m.profiles)), m.rows,
                  len(m.runs))
    return table


def lever_table(lever: Lever, machines: dict[str, Machine]) -> Table:
    """Variants down, machines across (grouped by hardware class), the published figure last."""
    order = [m for m in _ordered_machines(machines) if any((m.key, v) in lever.cells for v in lever.variants)]
    label = metric_label(lever.metric, lever.unit)
    what = f"ratio vs {lever.baseline} (x)" if lever.has_ratios else f"median ({label})"
    cols = ["variant"] + [f"{m.label} [{m.hardware}] {what}" for m in order]
    cols.append("published ratio (x)" if lever.has_ratios else f"published ({label})")
    table = Table(cols)
    for v in lever.variants:
        row: list[Any] = [v]
        for m in order:
            cell = lever.cells.get((m.key, v))
            if cell is None:
                row.append(None)
            elif lever.has_ratios:
                row.append(None if cell.ratio is None else f"{fmt(cell.ratio)}{' ' + UNCLEAR if cell.unclear else ''}")
            else:
                row.append(f"{fmt(cell.median)} ({fmt(cell.min)} to {fmt(cell.max)})")
        row.append(lever.published.get(v))
        table.add(*row)
    return table


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", text).strip("-").lower()[:80]


def lever_figure(lever: Lever, machines: dict[str, Machine], path: Path) -> Path:
    """Bars per variant and machine (colour = hardware class), spread as error bars, published as diamonds."""
    from matplotlib.figure import Figure

    order = [m for m in _ordered_machines(machines) if any((m.key, v) in lever.cells for v in lever.variants)]
    classes = sorted({m.hardware for m in order})
    palette = ["#4C72B0", "#DD8452", "#55A868", "#C44E52", "#8172B3", "#937860", "#DA8BC3", "#8C8C8C"]
    colour = {c: palette[i % len(palette)] for i, c in enumerate(classes)}
    fig = Figure(figsize=(max(6.0, 1.2 * len(lever.variants) * max(1, len(order)) ** 0.5 + 2), 4.2))
    ax = fig.add_subplot()
    width = 0.8 / max(1, len(order))
    seen_classes: set[str] = set()
    for j, m in enumerate(order):
        xs, ys, lo, hi, unclear = [], [], [], [], []
        for i, v in enumerate(lever.variants):
            cell = lever.cells.get((m.key, v))
            value = None if cell is None else (cell.ratio if lever.has_ratios else cell.median)
            if value is None:
                continue
            low = cell.ratio_low if lever.has_ratios else cell.min
            high = cell.ratio_high if lever.has_ratios else cell.max
            xs.append(i - 0.4 + width * (j + 0.5))
            ys.append(value)
            lo.append(max(0.0, value - low) if low is not None else 0.0)
            hi.append(max(0.0, high - value) if high is not None else 0.0)
            unclear.append(cell.unclear)
        label = m.hardware if m.hardware not in seen_classes else None
        seen_classes.add(m.hardware)
        bars = ax.bar(xs, ys, width=width * 0.9, color=colour[m.hardware], label=label, yerr=[lo, hi], capsize=2)
        for bar, vague in zip(bars, unclear):
            if vague:  # the verdict does not call it: hatched, like the "~" in the table
                bar.set_hatch("//")
    pubs = [(i, lever.published[v]) for i, v in enumerate(lever.variants) if v in lever.published]
    if pubs:
        ax.scatter([p[0] for p in pubs], [p[1] for p in pubs], marker="D", color="black", zorder=3,
                   label="published")
    if lever.has_ratios:
        ax.axhline(1.0, color="grey", linewidth=0.8)
        ax.set_ylabel(f"ratio vs {lever.baseline} (x, > 1 better)")
    else:
        ax.set_ylabel(f"{lever.metric} ({metric_label(lever.metric, lever.unit)})")
    ax.set_xticks(range(len(lever.variants)))
    ax.set_xticklabels(lever.variants, rotation=20 if len(lever.variants) > 4 else 0, ha="right"
                       if len(lever.variants) > 4 else "center")
    ax.set_title(lever.title(), fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100, metadata={"Software": None})
    return path


def write_index(rows: Sequence[Row], out: Path | str) -> Path:
    """``out/index.md`` and one PNG per lever; returns the index path."""
    out = Path(out)
    if not rows:
        raise ValueError("no result rows to pool")
    machines = machines_of(rows)
    levers = levers_of(rows)
    lines = ["# Pooled course results", "",
             f"{len(machines)} machine(s), {len(rows)} result rows, {len(levers)} comparison(s). Machines are named "
             "by a private id (a salted hash; no user, host or path); repeated runs of one machine are merged.", "",
             "## Machines", "", machines_table(machines).to_markdown(), ""]
    lines += ["## Comparisons", "",
              f"Ratios: baseline / variant for times, variant / baseline otherwise (> 1 means better): the median "
              f"over each machine's paired rounds (its runs merged). `{UNCLEAR}` marks a ratio that the course's one "
              "comparison rule, helpers.measure.verdict, does not call (its 95% interval reaches within 2% of 1.0, "
              "or the rows carry no paired rounds): the variant may be no better or worse. Columns are grouped by "
              "hardware class; the published figure is the last column and the black diamonds in the figures; error "
              f"bars span the verdict's interval (the repeats' range where there is none) and hatched bars are the "
              f"`{UNCLEAR}` ratios.", ""]
    for old in sorted((out / "figures").glob("*.png")):  # figures of an earlier pooling into this folder
        old.unlink()
    used: set[str] = set()
    for lever in levers:
        name = _slug(f"{lever.chapter}-{lever.experiment}-{lever.metric}-{lever.profile}") or "lever"
        while name in used:
            name += "-x"
        used.add(name)
        figure = lever_figure(lever, machines, out / "figures" / f"{name}.png")
        data = ", ".join(sorted({"standin": "stand-in data", "real": "real data"}.get(d, "no data set")
                                for d in lever.data))
        lines += [f"### {lever.title()}", "", lever_table(lever, machines).to_markdown(), "",
                  f"*{'lower' if lever.lower_is_better else 'higher'} is better; {data}"
                  + (f"; published: {lever.published_source}" if lever.published_source else "") + "*", "",
                  f"![{lever.title()}](figures/{figure.name})", ""]
    index = out / "index.md"
    files.atomic_write_text(index, "\n".join(lines))
    return index


def _submit(args: argparse.Namespace) -> int:
    try:
        target, payload = submit(args.source, args.out)
    except (SubmitError, results.ResultsFormatError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    size = target.stat().st_size
    shown = target.name if target.parent.resolve() == results.results_dir().resolve() else target
    print(f"wrote {redact_text(str(shown), all_paths=False)} ({size / 1024:.0f} KB) for machine "
          f"{payload['machine_id']}")
    print(payload["contents"])
    print("Send this file to the workshop organiser; they merge everyone's with "
          "`make pool IN=\"submission-*.json\" OUT=pooled`.")
    return 0


def _pool(args: argparse.Namespace) -> int:
    try:
        rows = load(args.paths)
        index = write_index(rows, args.out)
    except (ResultsFormatError, FileNotFoundError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    figures = sorted((Path(args.out) / "figures").glob("*.png"))
    print(f"pooled {len(rows)} rows from {len(machines_of(rows))} machine(s): {index} and {len(figures)} figure(s)")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m helpers.course.workshop", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    pack_ = sub.add_parser("submit", help="pack one run's rows for a workshop organiser (make submit)")
    pack_.add_argument("source", nargs="?", default=None,
                       help="a run folder or rows.jsonl (default: the newest rows.jsonl under results/)")
    pack_.add_argument("--out", default=None, help="file to write (default results/submission-<id>-<time>.json)")
    pool = sub.add_parser("pool", help="many machines' results side by side (make pool)")
    pool.add_argument("paths", nargs="+", help="submissions, make reproduce / make bench folders, rows.jsonl files")
    pool.add_argument("--out", required=True, help="folder for index.md and the figures")
    args = p.parse_args(argv)
    return _submit(args) if args.command == "submit" else _pool(args)


if __name__ == "__main__":
    sys.exit(main())
