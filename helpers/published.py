"""Published reference numbers (data/published/*.csv, shipped as ``helpers.published_data``), one per row."""

from __future__ import annotations

import csv
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

DATA_PACKAGE = "helpers.published_data"
CHECKOUT_DATA = Path(__file__).resolve().parent.parent / "data" / "published"  # a checkout used on PYTHONPATH


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


def _data_dir():
    try:
        return resources.files(DATA_PACKAGE)
    except ModuleNotFoundError:
        if CHECKOUT_DATA.is_dir():   # a checkout on PYTHONPATH: the package mapping exists only after an install
            return CHECKOUT_DATA
        raise FileNotFoundError(f"The published numbers ({DATA_PACKAGE}) are not installed with helpers. Reinstall the "
                                "course package from its repository: `make setup` (or `pip install .`).") from None


def load(name: str = "book") -> list[Number]:
    """All rows of ``data/published/<name>.csv`` ('book', 'arc_blog', 'dlprimitives')."""
    folder = _data_dir()
    path = folder / f"{name}.csv"
    if not path.is_file():
        names = sorted(p.name[:-4] for p in folder.iterdir() if p.name.endswith(".csv")) if folder.is_dir() else []
        raise FileNotFoundError(f"No published table {name!r} in {folder}; available: {', '.join(names) or 'none'}.")
    with path.open(newline="") as f:
        return [Number(**{**r, "chapter": int(r["chapter"]), "value": float(r["value"])}) for r in csv.DictReader(f)]


def select(rows: list[Number], **where: object) -> list[Number]:
    """Rows whose fields equal every keyword given, e.g. ``select(rows, chapter=2, metric='time')``."""
    return [r for r in rows if all(getattr(r, k) == v for k, v in where.items())]


def value(rows: list[Number], experiment: str, variant: str, metric: str) -> float:
    """The single published value for (experiment, variant, metric)."""
    found = select(rows, experiment=experiment, variant=variant, metric=metric)
    if len(found) != 1:
        raise KeyError(f"expected one published value for {experiment}/{variant}/{metric}, found {len(found)}")
    return found[0].value
