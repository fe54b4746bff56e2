"""Small result tables (``Table``) that print as aligned text and render as HTML, Markdown and CSV."""

from __future__ import annotations

import csv
import html
import io
from typing import Any, Iterable, Sequence


def fmt(value: Any, digits: int = 4) -> str:
    """Format a cell: floats to ``digits`` significant places, ints with thousands separators."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if value != value:  # NaN
            return "-"
        if value.is_integer() and 1e3 <= abs(value) < 1e15:  # counts stored as floats
            return f"{int(value):,}"
        if value == 0 or 1e-3 <= abs(value) < 1e6:
            return f"{value:.{digits}g}" if abs(value) < 1 else f"{value:,.{max(0, digits - len(str(int(abs(value)))))}f}"
        return f"{value:.{digits}e}"
    return str(value)


class Table:
    """Rows of values under named columns, with an optional title and footnote."""

    def __init__(self, columns: Sequence[str], rows: Iterable[Sequence[Any]] = (),
                 title: str = "", note: str = ""):
        self.columns = list(columns)
        self.rows: list[list[Any]] = []
        self.title, self.note = title, note
        for row in rows:
            self.add(*row)

    def add(self, *values: Any) -> None:
        if len(values) != len(self.columns):
            raise ValueError(f"row has {len(values)} values for {len(self.columns)} columns")
        self.rows.append(list(values))

    def column(self, name: str) -> list[Any]:
        i = self.columns.index(name)
        return [row[i] for row in self.rows]

    def as_dicts(self) -> list[dict[str, Any]]:
        return [dict(zip(self.columns, row)) for row in self.rows]

    def __len__(self) -> int:
        return len(self.rows)

    def __str__(self) -> str:
        cells = [self.columns] + [[fmt(v) for v in row] for row in self.rows]
        numeric = [all(isinstance(row[i], (int, float)) or row[i] is None for row in self.rows)
                   for i in range(len(self.columns))]
        widths = [max(len(r[i]) for r in cells) for i in range(len(self.columns))]
        lines = [self.title] if self.title else []
        for n, row in enumerate(cells):
            lines.append("  ".join(
                c.rjust(w) if numeric[i] else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths))
            ).rstrip())
            if n == 0:
                lines.append("  ".join("-" * w for w in widths))
        if self.note:
            lines.append(self.note)
        return "\n".join(lines)

    __repr__ = __str__

    def _repr_html_(self) -> str:
        head = "".join(f"<th>{html.escape(c)}</th>" for c in self.columns)
        body = "".join(
            "<tr>" + "".join(f"<td>{html.escape(fmt(v))}</td>" for v in row) + "</tr>" for row in self.rows
        )
        cap = f"<caption>{html.escape(self.title)}</caption>" if self.title else ""
        foot = f"<p><small>{html.escape(self.note)}</small></p>" if self.note else ""
        return f"<table>{cap}<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>{foot}"

    def _repr_markdown_(self) -> str:
        title = [f"**{self.title}**", ""] if self.title else []
        note = ["", f"*{self.note}*"] if self.note else []
        return "\n".join([*title, self.to_markdown(), *note])

    def to_markdown(self) -> str:
        def cell(text: str) -> str:  # a '|' inside a value would split the column
            return text.replace("|", "\\|")

        lines = ["| " + " | ".join(cell(c) for c in self.columns) + " |", "|" + "---|" * len(self.columns)]
        lines += ["| " + " | ".join(cell(fmt(v)) for v in row) + " |" for row in self.rows]
        return "\n".join(lines)

    def to_csv(self) -> str:
        buf = io.StringIO()
        csv.writer(buf).writerows([self.columns, *self.rows])
        return buf.getvalue()
