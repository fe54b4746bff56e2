"""Student copies of the chapter notebooks: no outputs, solutions replaced by answer cells.

``python -m helpers.student`` (``make student``) reads every ``notebooks/NN_*.ipynb`` and
writes ``notebooks/student/NN_*.ipynb`` (git-ignored, regenerated every time) where

* every output and execution count is gone;
* every cell tagged ``solution`` becomes an empty cell for the reader's answer (a markdown
  solution becomes a short prompt), tagged ``answer``;
* ``# NBVAL_CHECK_OUTPUT`` markers are removed (a copy has no outputs to compare);
* the kernel is ``python3``.

CI runs the copies top to bottom too, which proves that no later cell needs a solution.
"""

from __future__ import annotations

import argparse
import copy
import re
import sys
from pathlib import Path
from typing import Any, Sequence

import nbformat

from .files import atomic_write_text

SOLUTION_TAG = "solution"
ANSWER_TAG = "answer"
MARKDOWN_PROMPT = "**Your answer:** _(write it here; the instructor's copy of this notebook has a worked solution)_"
KERNELSPEC = {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}
CHAPTER_GLOB = "[0-9][0-9]_*.ipynb"
_CHECK_MARKER = re.compile(r"[ \t]*#[ \t]*NBVAL_CHECK_OUTPUT\b[^\n]*")
# Cell metadata that belongs to a run (timings) or to the solution's presentation.
_RUN_METADATA = ("execution", "collapsed", "scrolled", "jupyter")


def is_solution(cell: dict[str, Any]) -> bool:
    """True when the cell carries the ``solution`` tag."""
    return SOLUTION_TAG in cell.get("metadata", {}).get("tags", [])


def strip_check_markers(source: str) -> str:
    """``source`` without ``# NBVAL_CHECK_OUTPUT`` markers; a line that held only the marker goes."""
    lines = []
    for line in source.split("\n"):
        cleaned = _CHECK_MARKER.sub("", line)
        if cleaned.strip() or not _CHECK_MARKER.search(line):
            lines.append(cleaned.rstrip() if cleaned != line else line)
    return "\n".join(lines)


def _answer_cell(solution: dict[str, Any]) -> nbformat.NotebookNode:
    if solution["cell_type"] == "markdown":
        cell = nbformat.v4.new_markdown_cell(MARKDOWN_PROMPT)
    else:
        cell = nbformat.v4.new_code_cell("")
    cell["metadata"] = nbformat.NotebookNode({"tags": [ANSWER_TAG]})
    if "id" in solution:
        cell["id"] = solution["id"]  # keep ids unique and the copy deterministic
    else:
        cell.pop("id", None)
    return cell


def student_copy(notebook: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """The student version of one notebook (the argument is left unchanged)."""
    nb = copy.deepcopy(notebook)
    cells = []
    for cell in nb.cells:
        if is_solution(cell):
            cells.append(_answer_cell(cell))
            continue
        for key in _RUN_METADATA:
            cell.get("metadata", {}).pop(key, None)
        if cell["cell_type"] == "code":
            cell["outputs"] = []
            cell["execution_count"] = None
            cell["source"] = strip_check_markers("".join(cell["source"]))
        cells.append(cell)
    nb.cells = cells
    nb.metadata.pop("widgets", None)
    nb.metadata["kernelspec"] = nbformat.NotebookNode(dict(KERNELSPEC))
    return nb


def write_student_copies(source: Path | str = "notebooks", out: Path | str | None = None) -> list[Path]:
    """Write the student copy of every chapter notebook in ``source`` to ``out``.

    ``out`` defaults to ``source/student``. Copies of chapters that no longer exist are
    removed. Returns the written paths, sorted.
    """
    source = Path(source)
    out = Path(out) if out is not None else source / "student"
    chapters = sorted(source.glob(CHAPTER_GLOB))
    if not chapters:
        raise FileNotFoundError(
            f"No chapter notebooks ({CHAPTER_GLOB}) in {source.resolve()}. Run from the course "
            "repository's root folder, or pass the notebooks folder: python -m helpers.student --source DIR"
        )
    written = []
    for path in chapters:
        nb = student_copy(nbformat.read(path, as_version=4))
        nbformat.validate(nb)
        written.append(atomic_write_text(out / path.name, nbformat.writes(nb) + "\n"))
    names = {p.name for p in chapters}
    for stale in out.glob(CHAPTER_GLOB):
        if stale.name not in names:
            stale.unlink()
    return written


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m helpers.student", description=__doc__.split("\n\n")[0])
    parser.add_argument("--source", default="notebooks", help="folder with NN_*.ipynb (default: notebooks)")
    parser.add_argument("--out", default=None, help="where the copies go (default: SOURCE/student)")
    args = parser.parse_args(argv)
    try:
        written = write_student_copies(args.source, args.out)
    except FileNotFoundError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    solutions = sum(sum(map(is_solution, nbformat.read(Path(args.source) / p.name, as_version=4).cells))
                    for p in written)
    where = written[0].parent if written else args.out
    print(f"{len(written)} student copies in {where} ({solutions} solution cells replaced by answer cells)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
