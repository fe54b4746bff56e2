"""Many machines' results side by side: ``python -m helpers.pool PATHS... --out DIR``.

Reads any mix of submissions (``make submit`` files), ``make reproduce`` run folders, ``make
bench`` output folders and plain ``rows.jsonl`` files (a folder is searched for
``rows.jsonl`` and ``submission-*.json``), and writes ``DIR/index.md`` with a PNG figure per
lever:

* a table of machines (private id, hardware class, CPU, cores, instruction sets, GPU, torch);
* per lever (chapter, experiment, metric, profile): the measured ratio on every machine,
  machines grouped by hardware class, with the published ratio beside it; where an
  experiment has no baseline, the measured values with their unit;
* repeated runs of one machine merged (median of the runs' medians, the overall min-max,
  the repeats added up); a ratio whose verdict (``helpers.measure.verdict`` over the paired
  rounds) is "no measurable difference", or that has no paired rounds, so that the variant might be no
  better or worse than the baseline is marked with ``~``.

The output depends only on the rows read, not on the order of the paths or the time of the
run. A file of an unknown format version stops with a message saying what to do.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

from . import files, machine_class, report_rows, results
from .results import ResultsFormatError, Row
from .submit import read_submission
from .tables import Table, fmt

UNCLEAR = "~"
POOLED_FROM = "pooled_from"


# --- reading ---------------------------------------------------------------------------------

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
            key = json.dumps([machine_class.machine_key(r.fingerprint), r.chapter, r.experiment, r.variant, r.metric,
                              r.unit, r.time, r.median, r.min, r.max, r.repeats], default=str)
            if key not in seen:
                seen.add(key)
                r.extra = {**r.extra, POOLED_FROM: n}  # which input it came from (counts runs per machine)
                rows.append(r)
    return rows


# --- merging ---------------------------------------------------------------------------------

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
    key: str
    fingerprint: dict[str, Any]
    runs: set[str] = field(default_factory=set)
    rows: int = 0
    profiles: set[str] = field(default_factory=set)

    @property
    def hardware(self) -> str:
        return machine_class.hardware_class(self.fingerprint)

    label: str = ""

    def __post_init__(self) -> None:
        self.label = self.label or self.key[:8]


def _ratio(base: float, value: float, lower_is_better: bool) -> float | None:
    if lower_is_better:
        return base / value if value else None
    return value / base if base else None


def _judge(cell: Cell, base: Cell, lower_is_better: bool, is_baseline: bool) -> None:
    """Ratio, interval and word of ``helpers.measure.verdict`` for one machine's merged rounds.

    Only paired rounds (the same number of values, measured in the same interleaved rounds)
    can be judged; otherwise the ratio of the medians is shown and marked unclear."""
    from .measure import NO_DIFFERENCE, verdict  # noqa: PLC0415  (torch is imported only to judge)

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
        key = machine_class.machine_key(r.fingerprint)
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
        group = sorted(groups[key], key=lambda r: (machine_class.machine_key(r.fingerprint), r.time))
        first = group[0]
        baselines = sorted({r.baseline for r in group if r.baseline})
        lever = Lever(*key, baseline=baselines[0] if baselines else None, lower_is_better=first.lower_is_better,
                      published_source=next((r.published_source for r in group if r.published_source), None))
        per: dict[tuple[str, str], list[Row]] = {}
        for r in group:
            per.setdefault((machine_class.machine_key(r.fingerprint), r.variant), []).append(r)
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


# --- writing ---------------------------------------------------------------------------------

def _ordered_machines(machines: dict[str, Machine]) -> list[Machine]:
    return sorted(machines.values(), key=lambda m: (m.hardware, m.key))


def machines_table(machines: dict[str, Machine]) -> Table:
    """One line per machine: private id, hardware class, CPU, cores, ISA, GPU, torch, runs merged."""
    table = Table(["machine", "hardware class", "CPU", "cores (physical/logical)", "instruction sets", "GPU",
                   "torch", "profiles", "rows", "runs merged"])
    for m in _ordered_machines(machines):
        fp = m.fingerprint
        table.add(m.label, m.hardware, fp.get("cpu_model", "?"), f"{fp.get('physical_cores', '?')}/"
                  f"{fp.get('logical_cores', '?')}", machine_class.isa_class(fp), ", ".join(fp.get("accelerators") or [])
                  or "none", (fp.get("versions") or {}).get("torch", "?"), ", ".join(sorted(m.profiles)), m.rows,
                  len(m.runs))
    return table


def lever_table(lever: Lever, machines: dict[str, Machine]) -> Table:
    """Variants down, machines across (grouped by hardware class), the published figure last."""
    order = [m for m in _ordered_machines(machines) if any((m.key, v) in lever.cells for v in lever.variants)]
    label = report_rows.metric_label(lever.metric, lever.unit)
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
        ax.set_ylabel(f"{lever.metric} ({report_rows.metric_label(lever.metric, lever.unit)})")
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


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m helpers.pool", description=__doc__.splitlines()[0])
    p.add_argument("paths", nargs="+", help="submissions, make reproduce / make bench folders, rows.jsonl files")
    p.add_argument("--out", required=True, help="folder for index.md and the figures")
    args = p.parse_args(argv)
    try:
        rows = load(args.paths)
        index = write_index(rows, args.out)
    except (ResultsFormatError, FileNotFoundError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    figures = sorted((Path(args.out) / "figures").glob("*.png"))
    print(f"pooled {len(rows)} rows from {len(machines_of(rows))} machine(s): {index} and {len(figures)} figure(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
