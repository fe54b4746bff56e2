"""Published reference numbers (data/published/*.csv) and "published vs yours" tables.

Each CSV row is one number with its source, chapter, experiment, variant, metric, unit and
hardware. Comparisons are made as ratios against a baseline, because the hardware differs.
The CSV files ship inside the package as ``helpers.published_data`` (pyproject.toml maps the
repository's data/published/ folder to it), so they are found after ``pip install .`` too.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Mapping

from .tables import Table

DATA_PACKAGE = "helpers.published_data"


@dataclass(frozen=True)
class Number:
    """One published number."""

    source: str
    chapter: int
    experiment: str
    variant: str
    metric: str
    value: float
    unit: str
    hardware: str
    note: str


def available() -> list[str]:
    """Names of the published tables shipped with the package ('arc_blog', 'book', ...)."""
    return sorted(p.name[:-4] for p in _data_dir().iterdir() if p.name.endswith(".csv"))


CHECKOUT_DATA = Path(__file__).resolve().parent.parent / "data" / "published"
"""The same files in a checkout, for a checkout used without installing it (only on ``PYTHONPATH``)."""


def _data_dir():
    try:
        return resources.files(DATA_PACKAGE)
    except ModuleNotFoundError:
        if CHECKOUT_DATA.is_dir():   # a checkout on PYTHONPATH: the package mapping exists only after an install
            return CHECKOUT_DATA
        raise FileNotFoundError(
            f"The published numbers ({DATA_PACKAGE}) are not installed with helpers. Reinstall the "
            "course package from its repository: `make setup` (or `pip install .`)."
        ) from None


def load(name: str = "book", directory: Path | None = None) -> list[Number]:
    """All rows of ``data/published/<name>.csv`` ('book', 'arc_blog', 'dlprimitives').

    ``directory`` reads the CSV from another folder instead of the installed package data.
    """
    folder = Path(directory) if directory is not None else _data_dir()
    path = folder / f"{name}.csv"
    if not path.is_file():
        names = sorted(p.name[:-4] for p in folder.iterdir() if p.name.endswith(".csv")) if folder.is_dir() else []
        raise FileNotFoundError(f"No published table {name!r} in {folder}; available: {', '.join(names) or 'none'}.")
    with path.open(newline="") as f:
        return [
            Number(r["source"], int(r["chapter"]), r["experiment"], r["variant"], r["metric"],
                   float(r["value"]), r["unit"], r["hardware"], r["note"])
            for r in csv.DictReader(f)
        ]


def select(rows: list[Number], **where: object) -> list[Number]:
    """Rows whose fields equal every keyword given, e.g. ``select(rows, chapter=2, metric='time')``."""
    return [r for r in rows if all(getattr(r, k) == v for k, v in where.items())]


def value(rows: list[Number], experiment: str, variant: str, metric: str) -> float:
    """The single published value for (experiment, variant, metric)."""
    found = select(rows, experiment=experiment, variant=variant, metric=metric)
    if len(found) != 1:
        raise KeyError(f"expected one published value for {experiment}/{variant}/{metric}, found {len(found)}")
    return found[0].value


def table(rows: list[Number], experiment: str) -> Table:
    """The published numbers of one experiment, one row per variant, one column per metric."""
    picked = select(rows, experiment=experiment)
    if not picked:
        raise KeyError(f"no published numbers for experiment {experiment!r}")
    metrics = list(dict.fromkeys(r.metric for r in picked))
    variants = list(dict.fromkeys(r.variant for r in picked))
    units = {r.metric: r.unit for r in picked}
    out = Table(["variant"] + [f"{m} ({units[m]})" for m in metrics],
                title=f"Published: {experiment}", note=f"Source: {picked[0].source}; hardware: {picked[0].hardware}")
    for v in variants:
        vals = {r.metric: r.value for r in picked if r.variant == v}
        out.add(v, *[vals.get(m) for m in metrics])
    return out


def compare(rows: list[Number], experiment: str, metric: str, baseline: str,
            yours: Mapping[str, float], mapping: Mapping[str, str] | None = None,
            lower_is_better: bool = True, title: str = "") -> Table:
    """Published vs yours, as ratios to each side's own baseline.

    ``yours`` maps your variant names to your measured values (same metric). ``mapping``
    maps your variant names to published variant names when they differ. For times the
    ratio is baseline/variant (a speed-up); for higher-is-better metrics variant/baseline.
    """
    mapping = dict(mapping or {})
    pub_base = value(rows, experiment, mapping.get(baseline, baseline), metric)
    if baseline not in yours:
        raise KeyError(f"your results have no baseline {baseline!r}")
    your_base = yours[baseline]
    src = select(rows, experiment=experiment)[0]
    kind = "speed-up" if lower_is_better else "ratio"
    out = Table(["variant", f"published {metric}", f"published {kind}", f"your {metric}", f"your {kind}"],
                title=title or f"Published vs yours: {experiment}",
                note=f"Published: {src.source} on {src.hardware}. Ratios are relative to each side's "
                     f"baseline ({baseline}); absolute values come from different hardware.")
    for name, mine in yours.items():
        pub_name = mapping.get(name, name)
        found = select(rows, experiment=experiment, variant=pub_name, metric=metric)
        pub = found[0].value if found else None

        def ratio(base: float, v: float | None) -> float | None:
            if v is None or not v or not base:
                return None
            return base / v if lower_is_better else v / base

        out.add(name, pub, ratio(pub_base, pub), mine, ratio(your_base, mine))
    return out
