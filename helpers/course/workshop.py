"""The workshop kit: ``submit`` (``make submit``) packs one machine's result rows without user, host or path;
``pool`` (``make pool``) puts many machines' side by side in ``DIR/index.md``. Also make reproduce's row reports."""

from __future__ import annotations

import argparse
import contextlib
import getpass
import json
import os
import re
import socket
import statistics
import sys
from collections import Counter
from dataclasses import dataclass, field, fields
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterable, Sequence

from .. import files, results
from ..results import ResultsFormatError, Row
from ..system import machine_id
from ..tables import Table, fmt
from ..verdict import verdict

SUBMISSION_FORMAT = "accelerate-course-submission"
SUBMISSION_VERSION = 1
UNCLEAR = "~"
POOLED_FROM = "pooled_from"
# what becomes <path> in what leaves the machine: file URLs, POSIX and Windows absolute paths, ~ paths
_PATHS = [re.compile(r"file://[^\s'\",;]*"), re.compile(r"(?<![\w.~<>:/])(?:/[^\s/'\",;:()\[\]{}|]+)+/?"),
          re.compile(r"\b[A-Za-z]:\\[^\s'\",;]*"), re.compile(r"(?<![\w<>])~(?:/[^\s'\",;:()\[\]{}|]*)?(?![\w])")]
_NAMES = (("host", "<host>"), ("host_short", "<host>"), ("user", "<user>"))
_ISA = (("amx", "AMX"), ("native_bf16", "AVX512-BF16"), ("avx512", "AVX-512"), ("avx2", "AVX2"))
_PER = (("step", "per step"), ("phase", "per step"), ("epoch", "per epoch"), ("iteration", "per iteration"),
        ("batch", "per batch"))  # anything else: per run
_QUALITY = ("accuracy", "loss", "top1", "top5", "error", "diff")
_DATA = {"standin": "stand-in data", "real": "real data"}
_ROW_FIELDS = [f.name for f in fields(Row)]
_CSV_FIELDS = _ROW_FIELDS[:_ROW_FIELDS.index("fingerprint")]  # the row's own values; the machine's follow


def private_names() -> dict[str, str]:
    """This machine's names that must not leave it: user, host (and short host), home folder."""
    host = socket.gethostname()
    names = {"home": str(Path.home()), "host": host, "host_short": host.split(".")[0]}
    with contextlib.suppress(KeyError, OSError):  # a container's arbitrary uid has no user name
        names["user"] = getpass.getuser()
    return {k: v for k, v in names.items() if v}


def redact_text(text: str, names: dict[str, str] | None = None, *, all_paths: bool = True) -> str:
    """``text`` without user and host names and the home folder (``~``); ``all_paths``: paths too (``<path>``)."""
    names = private_names() if names is None else names
    home = names.get("home", "").rstrip("/")
    if home:
        text = re.sub(re.escape(home) + r"\b", "~", text)
    for pattern in _PATHS if all_paths else ():
        text = pattern.sub("<path>", text)
    for key, label in _NAMES:
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
    return next((label for key, label in _ISA if bf16.get(key)), "no AVX2" if bf16 else "unknown ISA")


def hardware_class(fingerprint: dict[str, Any]) -> str:
    """Machines that should give similar ratios: accelerator, else physical cores and ISA."""
    accel = fingerprint.get("accelerators") or []
    if accel:
        names = sorted(set(accel))
        return f"{len(accel)}x {names[0]}" if len(names) == 1 else " + ".join(names)
    return f"CPU {fingerprint.get('physical_cores', '?')} cores, {isa_class(fingerprint)}"


def machine_key(fingerprint: dict[str, Any]) -> str:
    """The fingerprint's ``machine_id`` (every row ``results.make_rows`` writes has one)."""
    return str(fingerprint.get("machine_id") or "unknown")


def metric_label(metric: str, unit: str) -> str:
    """A header naming the unit and what one value covers, e.g. ``s per epoch`` or ``% (accuracy)``."""
    if unit in ("s", "ms", "us", "min", "h"):
        return f"{unit} {next((per for key, per in _PER if key in metric.lower()), 'per run')}"
    return unit or "value"


def is_quality(row: Row) -> bool:
    """Rows that measure the model (accuracy, loss), not the speed."""
    return any(q in row.metric.lower() for q in _QUALITY)


def rows_table(rows: Sequence[Row]) -> Table:
    """One experiment's rows of one metric as a table, with units and scope in every numeric header."""
    first = rows[0]
    label = metric_label(first.metric, first.unit)
    cols = ["variant", f"{first.metric} median ({label})", f"min ({label})", f"max ({label})", "repeats",
            f"ratio vs {first.baseline} (x)" if first.baseline else "ratio (x)",
            f"published ({label})", "published ratio (x)", "data"]
    table = Table(cols, title=f"{first.chapter} / {first.experiment}: {first.metric}", note=_note(first))
    for r in rows:
        median = f"{fmt(r.median)} (stand-in)" if is_quality(first) and r.data == "standin" else r.median
        table.add(r.variant, median, r.min, r.max, r.repeats, r.ratio, r.published, r.published_ratio,
                  _DATA.get(r.data, "no data set"))
    return table


def _note(row: Row) -> str:
    parts = [f"{row.profile or '?'} profile", f"{'lower' if row.lower_is_better else 'higher'} is better"]
    if row.baseline:
        parts.append(f"ratio > 1: better than {row.baseline}, measured in the same run")
    if row.published_source:
        parts.append(f"published: {row.published_source}")
    if row.data == "standin":
        parts.append("stand-in data: these values say nothing about the real data set" if is_quality(row)
                     else "measured on stand-in data")
    return "; ".join(parts)


def render_markdown(rows: Sequence[Row], heading_level: int = 3) -> str:
    """Every experiment's tables as markdown, one per (chapter, experiment, metric, unit) in order of appearance."""
    groups: dict[tuple[str, str, str, str], list[Row]] = {}
    for r in rows:
        groups.setdefault((r.chapter, r.experiment, r.metric, r.unit), []).append(r)
    return "\n".join(line for group in groups.values() for line in _section(rows_table(group), heading_level))


def _section(table: Table, heading_level: int) -> list[str]:
    return [f"{'#' * heading_level} {table.title}", "", table.to_markdown(), "", f"*{table.note}*", ""]


def render_csv(rows: Sequence[Row], path: Path | str) -> Path:
    """Rows as a flat CSV at ``path`` (one line per row, fingerprint as the machine's id and hardware class)."""
    table = Table([*_CSV_FIELDS, "machine", "hardware", "torch", "time"])
    for r in rows:
        table.add(*(getattr(r, name) for name in _CSV_FIELDS), machine_key(r.fingerprint),
                  hardware_class(r.fingerprint), r.versions.get("torch", ""), r.time)
    return files.atomic_write_text(path, table.to_csv())


class SubmitError(ValueError):
    """Nothing to submit, or a submission that would leak a private name."""


def rows_file(source: Path | str | None, root: Path | str) -> Path:
    """``source`` (a rows file, a run folder's own rows), else the newest rows of a run under ``source`` or ``root``."""
    folder = Path(root if source is None else source)
    if source is not None and not folder.exists():
        raise SubmitError(f"{source} does not exist")
    if source is not None and (folder.is_file() or (folder / results.ROWS_FILE).exists()):
        return folder if folder.is_file() else folder / results.ROWS_FILE
    found = [p for p in folder.rglob(results.ROWS_FILE) if p.stat().st_size > 0]
    found = [p for p in found if p.parent != folder] or found
    if not found:
        raise SubmitError(f"no results under {folder}: run `make reproduce` (or `make bench`) first")
    return max(found, key=lambda p: (p.stat().st_mtime, str(p)))


def pack(rows: Sequence[Row], names: dict[str, str] | None = None) -> dict[str, Any]:
    """The submission payload: fingerprints stored once, every string redacted."""
    if not rows:
        raise SubmitError("the run has no result rows to submit")
    names = private_names() if names is None else names
    mine = machine_id()
    fingerprints: list[dict[str, Any]] = []
    packed = []
    for r in rows:
        fp = {"machine_id": mine, **r.fingerprint}
        if fp not in fingerprints:
            fingerprints.append(fp)
        row = {key: value for key, value in results.asdict(r).items() if key != "versions"}  # in the fingerprint
        packed.append({**row, "fingerprint": fingerprints.index(fp)})
    payload = {
        "format": SUBMISSION_FORMAT, "version": SUBMISSION_VERSION, "rows_version": results.SCHEMA_VERSION,
        "machine_id": ", ".join(sorted({fp["machine_id"] for fp in fingerprints})),
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "contents": describe(rows), "fingerprints": fingerprints, "rows": packed,
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
    fps = payload["fingerprints"]
    return [results.row_from_dict({"versions": dict(fps[d["fingerprint"]].get("versions", {})), **d,
                                   "fingerprint": fps[d["fingerprint"]]}) for d in payload.get("rows", [])]


def find_leaks(text: str, names: dict[str, str] | None = None) -> list[str]:
    """Which private things (user, host, home folder, an absolute path) occur in ``text``."""
    names = private_names() if names is None else names
    leaks = [key for key in ("user", "host", "host_short", "home")
             if redact_text(text, {key: names.get(key, "")}, all_paths=False) != text]
    return leaks + (["a path"] if redact_text(text, {}) != text else [])


def describe(rows: Sequence[Row]) -> str:
    """One paragraph saying what a submission contains."""
    experiments = sorted({f"{r.chapter}/{r.experiment}" for r in rows})
    listed = ", ".join(experiments[:12]) + (", ..." if len(experiments) > 12 else "")
    per_row = [name for name in results.asdict(rows[0]) if name not in ("fingerprint", "versions")]
    per_machine = sorted({key for r in rows for key in r.fingerprint} | {"machine_id"})
    return (f"{len(rows)} result rows ({len(experiments)} experiments: {listed}; profile "
            f"{', '.join(sorted({r.profile for r in rows}))}; data {', '.join(sorted({r.data for r in rows}))}). "
            f"Per row: {', '.join(per_row)}. Per machine, once: {', '.join(per_machine)} (the machine id is a salted "
            "hash). No user name, host name or path.")


def submit(source: Path | str | None = None, out: Path | str | None = None) -> tuple[Path, dict[str, Any]]:
    """Write the submission file (by default into ``results.results_dir()``); returns its path and payload."""
    root = results.results_dir()
    payload = pack(results.read_rows(rows_file(source, root)))
    name = f"submission-{payload['machine_id'][:8]}-{datetime.now():%Y%m%d-%H%M%S}.json"
    target = Path(out) if out is not None else root / name
    return files.atomic_write_text(target, json.dumps(payload, indent=1, sort_keys=True) + "\n"), payload


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
    rows: dict[str, Row] = {}
    for n, path in enumerate(sorted({p.resolve() for given in paths for p in find_inputs(given)})):
        for r in read_submission(path) if path.suffix == ".json" else results.read_rows(path):
            key = json.dumps([machine_key(r.fingerprint), r.chapter, r.experiment, r.variant, r.metric,
                              r.unit, r.time, r.median, r.min, r.max, r.repeats], default=str)
            if key not in rows:
                r.extra = {**r.extra, POOLED_FROM: n}  # which input it came from (counts runs per machine)
                rows[key] = r
    return list(rows.values())


@dataclass
class Cell:
    """One variant of one lever on one machine, merged over that machine's runs."""

    median: float
    min: float
    max: float
    values: list[float]
    ratio: float | None = None
    ratio_low: float | None = None
    ratio_high: float | None = None
    unclear: bool = False


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
    published_source: str | None
    variants: list[str] = field(default_factory=list)
    cells: dict[tuple[str, str], Cell] = field(default_factory=dict)  # (machine, variant) -> Cell
    published: dict[str, float] = field(default_factory=dict)  # variant -> published ratio (or value)
    data: set[str] = field(default_factory=set)

    def title(self) -> str:
        return f"{self.chapter} / {self.experiment}: {self.metric} ({self.profile} profile)"


@dataclass
class Machine:
    """One machine of the pool: its private key, fingerprint, hardware class, runs, rows, profiles, short label."""

    key: str
    fingerprint: dict[str, Any]
    hardware: str
    runs: set[str] = field(default_factory=set)
    rows: int = 0
    profiles: set[str] = field(default_factory=set)
    label: str = ""


def machines_of(rows: Sequence[Row]) -> dict[str, Machine]:
    """The machines the rows come from, keyed by their private id, ordered by hardware class."""
    out: dict[str, Machine] = {}
    for r in rows:
        key = machine_key(r.fingerprint)
        m = out.setdefault(key, Machine(key, r.fingerprint, hardware_class(r.fingerprint)))
        m.rows += 1
        m.runs.add(str(r.extra.get(POOLED_FROM, r.time[:10])))
        m.profiles.add(r.profile)
    short = Counter(key[:8] for key in out)
    for m in out.values():  # a short label unless two machines share it
        m.label = m.key if short[m.key[:8]] > 1 else m.key[:8]
    return dict(sorted(out.items(), key=lambda item: (item[1].hardware, item[0])))


def levers_of(rows: Sequence[Row]) -> list[Lever]:
    """Rows grouped into levers, merged per machine and variant, ratios recomputed from the merge."""
    groups: dict[tuple[str, str, str, str, str], list[Row]] = {}
    for r in sorted(rows, key=lambda r: (machine_key(r.fingerprint), r.time)):  # round i stays paired
        groups.setdefault((r.chapter, r.experiment, r.metric, r.unit, r.profile), []).append(r)
    levers = []
    for key, group in sorted(groups.items()):
        lever = Lever(*key, baseline=min((r.baseline for r in group if r.baseline), default=None),
                      lower_is_better=group[0].lower_is_better,
                      published_source=next((r.published_source for r in group if r.published_source), None),
                      data={r.data for r in group})
        lever.variants = sorted(dict.fromkeys(r.variant for r in group), key=lambda v: v != lever.baseline)
        lever.published = {r.variant: pub for r in reversed(group)  # the first row's published figure
                           if (pub := r.published_ratio if lever.baseline else r.published) is not None}
        per: dict[tuple[str, str], list[Row]] = {}
        for r in group:
            per.setdefault((machine_key(r.fingerprint), r.variant), []).append(r)
        for (machine, variant), rs in per.items():
            lever.cells[(machine, variant)] = Cell(statistics.median(r.median for r in rs), min(r.min for r in rs),
                                                   max(r.max for r in rs), [v for r in rs for v in r.values])
        for (machine, _), cell in lever.cells.items():
            base = lever.cells.get((machine, lever.baseline))
            if base is not None:  # a machine without the baseline gets no ratio
                _judge(cell, base, lever)
        levers.append(lever)
    return levers


def _judge(cell: Cell, base: Cell, lever: Lever) -> None:
    """``helpers.measure.verdict``'s ratio and interval over paired rounds; unpaired ratios are unclear."""
    if cell is base:
        cell.ratio = 1.0
    elif len(base.values) == len(cell.values) > 0 and min(base.values + cell.values) > 0:
        v = verdict(base.values, cell.values, higher_is_better=not lever.lower_is_better)
        cell.ratio, cell.ratio_low, cell.ratio_high, cell.unclear = v.ratio, v.low, v.high, not v.decided
    else:  # no paired rounds: the ratio of the medians
        top, bottom = (base.median, cell.median) if lever.lower_is_better else (cell.median, base.median)
        cell.ratio, cell.unclear = (top / bottom if bottom else None), True


def machines_table(machines: dict[str, Machine]) -> Table:
    """One line per machine: private id, hardware class, CPU, cores, ISA, GPU, torch, runs merged."""
    table = Table(["machine", "hardware class", "CPU", "cores (physical/logical)", "instruction sets", "GPU",
                   "torch", "profiles", "rows", "runs merged"])
    for m in machines.values():
        fp = m.fingerprint
        table.add(m.label, m.hardware, fp.get("cpu_model", "?"), f"{fp.get('physical_cores', '?')}/"
                  f"{fp.get('logical_cores', '?')}", isa_class(fp), ", ".join(fp.get("accelerators") or [])
                  or "none", (fp.get("versions") or {}).get("torch", "?"), ", ".join(sorted(m.profiles)), m.rows,
                  len(m.runs))
    return table


def lever_table(lever: Lever, machines: dict[str, Machine]) -> Table:
    """Variants down, machines across (grouped by hardware class), the published figure last."""
    order = [m for m in machines.values() if any(key == m.key for key, _ in lever.cells)]
    label = metric_label(lever.metric, lever.unit)
    what = f"ratio vs {lever.baseline} (x)" if lever.baseline else f"median ({label})"
    data = ", ".join(sorted({_DATA.get(d, "no data set") for d in lever.data}))
    source = f"; published: {lever.published_source}" if lever.published_source else ""
    table = Table(["variant", *(f"{m.label} [{m.hardware}] {what}" for m in order),
                   "published ratio (x)" if lever.baseline else f"published ({label})"], title=lever.title(),
                  note=f"{'lower' if lever.lower_is_better else 'higher'} is better; {data}{source}")
    for v in lever.variants:
        cells = [lever.cells.get((m.key, v)) for m in order]
        if lever.baseline:
            shown = [f"{fmt(c.ratio)}{' ' + UNCLEAR if c.unclear else ''}" if c and c.ratio is not None else None
                     for c in cells]
        else:
            shown = [f"{fmt(c.median)} ({fmt(c.min)} to {fmt(c.max)})" if c else None for c in cells]
        table.add(v, *shown, lever.published.get(v))
    return table


def lever_figure(lever: Lever, machines: dict[str, Machine], path: Path) -> Path:
    """Bars per variant and machine (colour = hardware class), spread as error bars, published as diamonds."""
    from matplotlib.figure import Figure

    order = [m for m in machines.values() if any(key == m.key for key, _ in lever.cells)]
    colour = {hardware: f"C{i % 10}" for i, hardware in enumerate(dict.fromkeys(m.hardware for m in order))}
    fig = Figure(figsize=(max(6.0, 1.2 * len(lever.variants) * max(1, len(order)) ** 0.5 + 2), 4.2))
    ax = fig.add_subplot()
    width = 0.8 / max(1, len(order))
    for j, m in enumerate(order):  # machines come sorted by hardware class: one legend entry per class
        shown = [(i, cell) for i, v in enumerate(lever.variants)
                 if (cell := lever.cells.get((m.key, v))) and (cell.ratio is not None or not lever.baseline)]
        spans = [(c.ratio, c.ratio_low, c.ratio_high) if lever.baseline else (c.median, c.min, c.max) for _, c in shown]
        errors = [[max(0.0, value - low) if low is not None else 0.0 for value, low, _ in spans],
                  [max(0.0, high - value) if high is not None else 0.0 for value, _, high in spans]]
        ax.bar([i - 0.4 + width * (j + 0.5) for i, _ in shown], [value for value, _, _ in spans],
               width=width * 0.9, color=colour[m.hardware], yerr=errors, capsize=2,
               hatch=["//" if cell.unclear else None for _, cell in shown],  # unclear: hatched, like "~"
               label=None if j and order[j - 1].hardware == m.hardware else m.hardware)
    pubs = [(i, lever.published[v]) for i, v in enumerate(lever.variants) if v in lever.published]
    if pubs:
        ax.scatter(*zip(*pubs), marker="D", color="black", zorder=3, label="published")
    if lever.baseline:
        ax.axhline(1.0, color="grey", linewidth=0.8)
        ax.set_ylabel(f"ratio vs {lever.baseline} (x, > 1 better)")
    else:
        ax.set_ylabel(f"{lever.metric} ({metric_label(lever.metric, lever.unit)})")
    many = len(lever.variants) > 4
    ax.set_xticks(range(len(lever.variants)), lever.variants, rotation=20 if many else 0,
                  ha="right" if many else "center")
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
             "## Machines", "", machines_table(machines).to_markdown(), "", "## Comparisons", "",
             "Ratios: > 1 means better than the baseline, over each machine's paired rounds (its runs merged). "
             f"`{UNCLEAR}` (hatched bars): helpers.measure.verdict does not call it, or there are no paired rounds. "
             "Published figures: the last column, the black diamonds. How to read it: docs/workshop.md.", ""]
    for old in (out / "figures").glob("*.png"):  # figures of an earlier pooling into this folder
        old.unlink()
    for n, lever in enumerate(levers, 1):
        name = re.sub(r"[^A-Za-z0-9]+", "-", f"{n:02d} {lever.title()}").strip("-").lower()[:80]
        figure = lever_figure(lever, machines, out / "figures" / f"{name}.png")
        lines += [*_section(lever_table(lever, machines), 3), f"![{lever.title()}](figures/{figure.name})", ""]
    return files.atomic_write_text(out / "index.md", "\n".join(lines))


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
    try:
        if args.command == "submit":
            target, payload = submit(args.source, args.out)
            shown = os.path.relpath(target) if target.resolve().is_relative_to(Path.cwd().resolve()) else target
            print(f"wrote {redact_text(str(shown), all_paths=False)} ({target.stat().st_size / 1024:.0f} KB) for "
                  f"machine {payload['machine_id']}\n{payload['contents']}\nSend this file to the workshop "
                  "organiser; they merge everyone's with `make pool IN=\"submission-*.json\" OUT=pooled`.")
        else:
            rows = load(args.paths)
            index = write_index(rows, args.out)
            figures = len(list((Path(args.out) / "figures").glob("*.png")))
            print(f"pooled {len(rows)} rows from {len(machines_of(rows))} machine(s): {index} and {figures} figure(s)")
    except (ValueError, FileNotFoundError) as exc:  # SubmitError, ResultsFormatError, no inputs: one line
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
