"""A chapter's reading and compute minutes, computed from its last run, written into its opening's **Time:** sentence.

Every chapter's first cell says how long its compute took at the workshop profile
("about 4 min of compute ... (3.3 min measured for the committed run ...; the optional parts
took 0.9 min of it ...)"). The numbers come from the execution times Jupyter stores in each
code cell's metadata (``execution``: ``iopub.execute_input`` to ``shell.execute_reply``)
when the notebook was executed, never from a guess:

* ``total`` is the sum over all code cells;
* ``optional`` sums the cells of optional parts: those under a markdown cell whose first line
  says "(optional", and those gated by ``RUN_OPTIONAL`` in their first lines;
* "about N min" is the rest (what a workshop that skips the optional parts waits), rounded up;
* the rounds that other processes disturbed and that were measured again are counted from the
  outputs (each table's note says "N round(s) re-run"), so the sentence says how many there were.

The reading minutes ("about N min reading") follow the course's reading-time rule: (markdown
words + printed words) / 200 + non-blank code lines / 20, over the cells outside optional parts,
a word being a token with at least two letters (``reading_minutes``).

``python -m helpers.chapter_time notebooks/05_*.ipynb`` rewrites the sentence after
``make execute NB=...``; ``--check`` only reports the chapters whose sentence is out of date.
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Iterator, Sequence

import nbformat

from .files import atomic_write_text

OPTIONAL_HEADING = "(optional"
OPTIONAL_FLAG = "RUN_OPTIONAL"
_FLAG_WINDOW = 200  # characters at the top of a cell where the optional flag must appear
_ABOUT = re.compile(r"about \d+ min of compute")
_MEASURED = re.compile(r"\(\d+(?:\.\d+)? min measured for the committed run")
_OPTIONAL_PART = re.compile(r"the optional parts took \d+(?:\.\d+)? min of it")
_READING = re.compile(r"about \d+ min reading")
_RERUN_NOTE = re.compile(r"(\d+) round\(s\) re-run")
_DISTURBED = re.compile(r"no round was disturbed|\d+ round\(s\) that other processes disturbed were measured again, "
                        r"as the tables' notes say")
# one representation per output: a displayed table carries the same note as text, Markdown and HTML
_REPRESENTATIONS = ("text/plain", "text/markdown", "text/html")


@dataclass(frozen=True)
class ChapterTime:
    """Measured compute of one executed notebook, in seconds."""

    total_s: float
    optional_s: float
    timed_cells: int
    rerun_rounds: int = 0
    reading_min: int = 0

    @property
    def disturbed(self) -> str:
        """The sentence's clause on disturbed rounds."""
        if not self.rerun_rounds:
            return "no round was disturbed"
        return f"{self.rerun_rounds} round(s) that other processes disturbed were measured again, as the tables' notes say"

    @property
    def about_minutes(self) -> int:
        """Minutes without the optional parts, rounded up (at least 1): the sentence's "about N min"."""
        return max(1, math.ceil(round((self.total_s - self.optional_s) / 60, 1)))


def _seconds(cell: dict[str, Any]) -> float | None:
    execution = cell.get("metadata", {}).get("execution", {})
    start, end = execution.get("iopub.execute_input"), execution.get("shell.execute_reply")
    if not (start and end):
        return None
    parse = lambda stamp: datetime.fromisoformat(stamp.replace("Z", "+00:00"))  # noqa: E731
    return (parse(end) - parse(start)).total_seconds()


def _output_text(output: dict[str, Any]) -> str:
    if output.get("output_type") == "stream":
        return "".join(output.get("text", ""))
    data = output.get("data", {})
    for kind in _REPRESENTATIONS:
        if kind in data:
            return "".join(data[kind])
    return ""


def words(text: str) -> int:
    """Words as the reading-time rule counts them: tokens with at least two letters."""
    return sum(1 for token in text.split() if len(re.findall(r"[A-Za-z]", token)) >= 2)


def _printed_words(cell: dict[str, Any]) -> int:
    n = 0
    for out in cell.get("outputs", []):
        if out.get("output_type") == "stream":
            n += words("".join(out.get("text", "")))
        else:
            data = out.get("data", {})
            kind = next((k for k in ("text/markdown", "text/plain") if k in data), None)
            n += words("".join(data[kind])) if kind else 0
    return n


def reading_minutes(notebook: dict[str, Any]) -> float:
    """(markdown words + printed words) / 200 + non-blank code lines / 20, outside the optional parts."""
    text_words = code_lines = 0
    for cell, source, optional in _walk(notebook):
        if optional:
            continue
        if cell.get("cell_type") == "markdown":
            text_words += words(source)
        elif cell.get("cell_type") == "code":
            code_lines += sum(1 for line in source.splitlines() if line.strip())
            text_words += _printed_words(cell)
    return text_words / 200 + code_lines / 20


def _walk(notebook: dict[str, Any]) -> Iterator[tuple[dict[str, Any], str, bool]]:
    """Every cell with its source and whether it belongs to an optional part: a markdown cell whose first
    line says "(optional", the code cells after it up to the next markdown cell, and a code cell that
    names ``RUN_OPTIONAL`` near its top."""
    heading = ""
    for cell in notebook.get("cells", []):
        source = "".join(cell.get("source", ""))
        if cell.get("cell_type") == "markdown":
            heading = source.split("\n", 1)[0]
        flagged = cell.get("cell_type") == "code" and OPTIONAL_FLAG in source[:_FLAG_WINDOW]
        yield cell, source, OPTIONAL_HEADING in heading or flagged


def measure_notebook(notebook: dict[str, Any]) -> ChapterTime:
    """Sum the stored execution times of a notebook's code cells, the optional parts apart,
    and count the re-run rounds its outputs report.

    Raises ValueError when no code cell carries execution times (the notebook was not
    executed with timing metadata: run ``make execute NB=...`` first).
    """
    total = optional = 0.0
    timed = reruns = 0
    for cell, _, in_optional_part in _walk(notebook):
        if cell.get("cell_type") != "code":
            continue
        reruns += sum(int(n) for out in cell.get("outputs", []) for n in _RERUN_NOTE.findall(_output_text(out)))
        seconds = _seconds(cell)
        if seconds is None:
            continue
        timed += 1
        total += seconds
        if in_optional_part:
            optional += seconds
    if not timed:
        raise ValueError("no code cell has execution times: execute the notebook first "
                         "(make execute NB=...), then run this again")
    return ChapterTime(total, optional, timed, reruns, math.floor(reading_minutes(notebook) + 0.5))


def rewrite_sentence(text: str, time: ChapterTime) -> str:
    """``text`` (the opening cell) with its **Time:** numbers replaced by ``time``'s.

    Raises ValueError when the sentence's "about N min of compute" or "(X min measured for
    the committed run" is missing or appears more than once.
    """
    for pattern, what in ((_ABOUT, "about N min of compute"), (_MEASURED, "(X min measured for the committed run")):
        found = len(pattern.findall(text))
        if found != 1:
            raise ValueError(f"the opening cell should say '{what}' once, found {found}")
    text = _ABOUT.sub(f"about {time.about_minutes} min of compute", text)
    text = _MEASURED.sub(f"({time.total_s / 60:.1f} min measured for the committed run", text)
    text = _DISTURBED.sub(time.disturbed, text)
    text = _READING.sub(f"about {time.reading_min} min reading", text)
    return _OPTIONAL_PART.sub(f"the optional parts took {time.optional_s / 60:.1f} min of it", text)


def update(path: Path | str, *, check: bool = False) -> tuple[ChapterTime, bool]:
    """Measure the notebook at ``path`` and rewrite its opening cell (unless ``check``).

    Returns the measurement and whether the sentence was (or, with ``check``, would be) changed.
    """
    path = Path(path)
    notebook = nbformat.read(path, as_version=4)
    time = measure_notebook(notebook)
    opening = notebook["cells"][0]
    old = "".join(opening["source"])
    new = rewrite_sentence(old, time)
    if new != old and not check:
        opening["source"] = new.splitlines(keepends=True)
        atomic_write_text(path, nbformat.writes(notebook) + "\n")  # as helpers.student and nbconvert write
    return time, new != old


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m helpers.chapter_time", description=__doc__.split("\n\n")[0])
    parser.add_argument("notebooks", nargs="+", help="executed chapter notebooks")
    parser.add_argument("--check", action="store_true", help="only report sentences that are out of date")
    args = parser.parse_args(argv)
    stale = 0
    for name in args.notebooks:
        try:
            time, changed = update(name, check=args.check)
        except (OSError, ValueError, KeyError, IndexError, nbformat.reader.NotJSONError) as exc:
            print(f"error: {name}: {exc}", file=sys.stderr)
            return 2
        stale += changed
        state = ("out of date" if args.check else "updated") if changed else "up to date"
        print(f"{name}: about {time.reading_min} min reading; {time.total_s / 60:.1f} min measured, "
              f"{time.optional_s / 60:.1f} optional, "
              f"about {time.about_minutes} min, {time.disturbed} -- {state}")
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    sys.exit(main())
