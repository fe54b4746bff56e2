"""Student copies and chapter times: ``python -m helpers.course.notebooks student|time ...``.

``student`` (``make student``) writes ``notebooks/student/``: no outputs, solutions replaced by empty answer
cells (docs/running.md). ``time NB...`` (``make execute``) rewrites each chapter's **Time:** sentence from its
cells' stored execution times, and with ``--readme`` the guides' minutes and plans (docs/committed-outputs.md)."""

from __future__ import annotations

import argparse
import copy
import math
import re
import sys
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Iterator, Sequence

import nbformat

from ..files import atomic_write_text

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
    markdown = solution["cell_type"] == "markdown"
    cell = nbformat.v4.new_markdown_cell(MARKDOWN_PROMPT) if markdown else nbformat.v4.new_code_cell("")
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
    """Write the student copy of every chapter in ``source`` to ``out`` (``source/student``), drop stale ones."""
    source = Path(source)
    out = Path(out) if out is not None else source / "student"
    chapters = sorted(source.glob(CHAPTER_GLOB))
    if not chapters:
        raise FileNotFoundError(f"No chapter notebooks ({CHAPTER_GLOB}) in {source.resolve()}. Run from the course "
                                "repository's root folder, or pass the notebooks folder: "
                                "python -m helpers.course.notebooks student --source DIR")
    written = []
    for path in chapters:
        nb = student_copy(nbformat.read(path, as_version=4))
        nbformat.validate(nb)
        written.append(atomic_write_text(out / path.name, nbformat.writes(nb) + "\n"))
    for stale in set(out.glob(CHAPTER_GLOB)) - set(written):
        stale.unlink()
    return written


OPTIONAL_HEADING = "(optional"
OPTIONAL_FLAG = "RUN_OPTIONAL"
_FLAG_WINDOW = 200  # characters at the top of a cell where the optional flag must appear
_ABOUT = re.compile(r"about (\d+) min of compute")
_MEASURED = re.compile(r"\((\d+(?:\.\d+)?) min measured for the committed run")
_OPTIONAL_PART = re.compile(r"the optional parts (?:took (\d+(?:\.\d+)?) min of it"
                            r"|did not run in it \(COURSE_OPTIONAL=0\))")
_OPTIONAL_OFF = "optional parts=off"  # what run_sizes.describe() prints when COURSE_OPTIONAL=0
_READING = re.compile(r"about (\d+) min reading")
_RERUN_NOTE = re.compile(r"(\d+) round\(s\) re-run")
_DISTURBED = re.compile(r"no round was disturbed|\d+ round\(s\) that other processes disturbed were measured again, "
                        r"as the tables' notes say")
WORDS_PER_MIN, CODE_LINES_PER_MIN, MIN_PER_EXERCISE = 130, 10, 4


@dataclass(frozen=True)
class ChapterTime:
    """A chapter's minutes: reading, compute without the optional parts, measured in all, of it optional."""

    reading: int
    compute: int
    measured: float
    optional: float = 0.0
    rerun_rounds: int = 0
    optional_ran: bool = True

    @property
    def disturbed(self) -> str:
        """The sentence's clause on disturbed rounds."""
        if not self.rerun_rounds:
            return "no round was disturbed"
        return f"{self.rerun_rounds} round(s) that other processes disturbed were measured again, as the tables' notes say"


def _seconds(cell: dict[str, Any]) -> float | None:
    execution = cell.get("metadata", {}).get("execution", {})
    start, end = execution.get("iopub.execute_input"), execution.get("shell.execute_reply")
    if not (start and end):
        return None
    parse = lambda stamp: datetime.fromisoformat(stamp.replace("Z", "+00:00"))  # noqa: E731
    return (parse(end) - parse(start)).total_seconds()


def _output_text(output: dict[str, Any]) -> str:
    """A stream's text, else the output's Markdown, else its plain text (a table carries its note in both)."""
    if output.get("output_type") == "stream":
        return "".join(output.get("text", ""))
    data = output.get("data", {})
    return "".join(next((data[kind] for kind in ("text/markdown", "text/plain") if kind in data), ""))


def words(text: str) -> int:
    """Words as the reading-time rule counts them: tokens with at least two letters."""
    return sum(1 for token in text.split() if len(re.findall(r"[A-Za-z]", token)) >= 2)


def reading_minutes(notebook: dict[str, Any]) -> float:
    """(markdown + printed words) / 130 + code lines / 10 + 4 per core exercise, outside the optional parts."""
    text_words = code_lines = exercises = 0
    for cell, source, optional in _walk(notebook):
        if optional:
            continue
        if cell.get("cell_type") == "markdown":
            text_words += words(source)
            exercises += bool(re.match(r"#+ .*Exercise", source.split("\n", 1)[0]))
        elif cell.get("cell_type") == "code":
            code_lines += sum(1 for line in source.splitlines() if line.strip())
            text_words += sum(words(_output_text(out)) for out in cell.get("outputs", []))
    return text_words / WORDS_PER_MIN + code_lines / CODE_LINES_PER_MIN + MIN_PER_EXERCISE * exercises


def _walk(notebook: dict[str, Any]) -> Iterator[tuple[dict[str, Any], str, bool]]:
    """Every cell, its source, and whether it is optional (under an "(optional" heading, or ``RUN_OPTIONAL``)."""
    heading = ""
    for cell in notebook.get("cells", []):
        source = "".join(cell.get("source", ""))
        if cell.get("cell_type") == "markdown":
            heading = source.split("\n", 1)[0]
        flagged = cell.get("cell_type") == "code" and OPTIONAL_FLAG in source[:_FLAG_WINDOW]
        yield cell, source, OPTIONAL_HEADING in heading or flagged


def measure_notebook(notebook: dict[str, Any]) -> ChapterTime:
    """The stored execution times of the code cells (optional parts apart) and the re-run rounds the outputs report."""
    total = optional = 0.0
    timed = reruns = 0
    optional_ran = True
    for cell, _, in_optional_part in _walk(notebook):
        if cell.get("cell_type") != "code":
            continue
        printed = [_output_text(out) for out in cell.get("outputs", [])]
        optional_ran &= not any(_OPTIONAL_OFF in text for text in printed)
        reruns += sum(int(n) for text in printed for n in _RERUN_NOTE.findall(text))
        seconds = _seconds(cell)
        if seconds is None:
            continue
        timed += 1
        total += seconds
        optional += seconds if in_optional_part else 0.0
    if not timed:
        raise ValueError("no code cell has execution times: execute the notebook first "
                         "(make execute NB=...), then run this again")
    compute = max(1, math.ceil(round((total - optional) / 60, 1)))  # "about N min": rounded up, at least 1
    return ChapterTime(math.ceil(reading_minutes(notebook) - 1e-9), compute, total / 60, optional / 60, reruns,
                       optional_ran)


def rewrite_sentence(text: str, time: ChapterTime) -> str:
    """``text`` (the opening cell) with its **Time:** numbers replaced by ``time``'s (each must occur once)."""
    for pattern, what in ((_ABOUT, "about N min of compute"), (_MEASURED, "(X min measured for the committed run")):
        found = len(pattern.findall(text))
        if found != 1:
            raise ValueError(f"the opening cell should say '{what}' once, found {found}")
    text = _ABOUT.sub(f"about {time.compute} min of compute", text)
    text = _MEASURED.sub(f"({time.measured:.1f} min measured for the committed run", text)
    text = _DISTURBED.sub(time.disturbed, text)
    text = _READING.sub(f"about {time.reading} min reading", text)
    optional = (f"the optional parts took {time.optional:.1f} min of it" if time.optional_ran
                else "the optional parts did not run in it (COURSE_OPTIONAL=0)")
    return _OPTIONAL_PART.sub(optional, text)


def update(path: Path | str, *, check: bool = False) -> tuple[ChapterTime, bool]:
    """Measure the notebook at ``path``, rewrite its opening (unless ``check``); returns it and whether it changed."""
    path = Path(path)
    notebook = nbformat.read(path, as_version=4)
    time = measure_notebook(notebook)
    opening = notebook["cells"][0]
    old = "".join(opening["source"])
    new = rewrite_sentence(old, time)
    if new != old and not check:
        opening["source"] = new.splitlines(keepends=True)
        atomic_write_text(path, nbformat.writes(notebook) + "\n")  # as the student copies and nbconvert write
    return time, new != old


_PLAN = re.compile(r"<!-- plan: (?P<spec>[^\n]*?) -->\n\n(?P<head>\| time \| block \|\n\|---\|---\|\n)(?P<rows>(?:\|[^\n]*\|\n)*)")
_FRONT_ROW = re.compile(r"^\| (?P<nn>\d\d) \|(?P<mid>(?:[^|\n]*\|){2}) (?P<read>\d+)\+(?P<compute>\d+) \|(?P<rest>.*)$", re.M)
_CHAPTER_ROW = re.compile(r"^\| (?P<nn>\d\d) \|(?P<mid>(?:[^|\n]*\|){2}) (?P<read>\d+) \| (?P<compute>[\d.]+ \(measured[^|]*) \|(?P<rest>.*)$",
                          re.M)


def stated_minutes(notebook: dict[str, Any]) -> ChapterTime:
    """The minutes a chapter's opening states (ValueError when its **Time:** sentence lacks them)."""
    text = "".join(notebook["cells"][0]["source"]) if notebook.get("cells") else ""
    found = [p.search(text) for p in (_READING, _ABOUT, _MEASURED)]
    if not all(found):
        raise ValueError("the opening cell states no 'about N min reading ... about M min of compute "
                         "(X min measured for the committed run'")
    optional = _OPTIONAL_PART.search(text)
    return ChapterTime(int(found[0].group(1)), int(found[1].group(1)), float(found[2].group(1)),
                       float(optional.group(1) or 0) if optional else 0.0)


def _clock(minutes: int) -> str:
    return f"{minutes // 60}:{minutes % 60:02d}"


def plan_rows(spec: str, minutes: dict[str, ChapterTime]) -> list[tuple[str, str]]:
    """The rows (time span, block) of a workshop plan ``spec``: "label=MINUTES; NN label; NN+MM label; ..."."""
    rows, now = [], 0
    for item in (part.strip() for part in spec.split(";")):
        if not item:
            continue
        fixed = re.fullmatch(r"(.+?)=(\d+)", item)
        chapters = re.match(r"(\d\d(?:\+\d\d)*) (.+)", item)
        if fixed:
            label, length = fixed.group(1).strip(), int(fixed.group(2))
        elif chapters:
            numbers = chapters.group(1).split("+")
            missing = [n for n in numbers if n not in minutes]
            if missing:
                raise ValueError(f"plan block {item!r}: no minutes for chapter(s) {', '.join(missing)}")
            label = " and ".join(numbers) + " " + chapters.group(2)
            length = 5 * math.ceil(sum(minutes[n].reading + minutes[n].compute for n in numbers) / 5)
        else:
            raise ValueError(f"plan block {item!r}: write 'label=MINUTES' or 'NN label'")
        rows.append((f"{_clock(now)} - {_clock(now + length)}", label))
        now += length
    return rows


def render_guide(text: str, minutes: dict[str, ChapterTime]) -> str:
    """The guide (or front page) ``text`` with its chapter minutes and plans rewritten from ``minutes`` ({NN: ...})."""
    def row(m: re.Match) -> str:
        got = minutes.get(m.group("nn"))
        if got is None:
            return m.group(0)
        compute = f"{got.measured:.1f} (measured" + (f"; {got.optional:.1f} of it optional)" if got.optional else ")")
        return f"| {m.group('nn')} |{m.group('mid')} {got.reading} | {compute} |{m.group('rest')}"

    def plan(m: re.Match) -> str:
        body = "".join(f"| {span} | {label} |\n" for span, label in plan_rows(m.group("spec"), minutes))
        return f"<!-- plan: {m.group('spec')} -->\n\n{m.group('head')}{body}"

    def front(m: re.Match) -> str:
        got = minutes.get(m.group("nn"))
        if got is None:
            return m.group(0)
        return f"| {m.group('nn')} |{m.group('mid')} {got.reading}+{got.compute} |{m.group('rest')}"

    return _PLAN.sub(plan, _CHAPTER_ROW.sub(row, _FRONT_ROW.sub(front, text)))


def _student(args: argparse.Namespace) -> int:
    try:
        written = write_student_copies(args.source, args.out)
    except FileNotFoundError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    solutions = sum(sum(map(is_solution, nbformat.read(Path(args.source) / p.name, as_version=4).cells))
                    for p in written)
    print(f"{len(written)} student copies in {written[0].parent} ({solutions} solution cells replaced by answer cells)")
    return 0


def _time(args: argparse.Namespace) -> int:
    minutes: dict[str, ChapterTime] = {}
    for name in args.notebooks:
        try:
            time, changed = update(name)
            if Path(name).name[:2].isdigit() and Path(name).name[:2] != "00":
                minutes[Path(name).name[:2]] = stated_minutes(nbformat.read(name, as_version=4))
        except (OSError, ValueError, KeyError, IndexError, nbformat.reader.NotJSONError) as exc:
            print(f"error: {name}: {exc}", file=sys.stderr)
            return 2
        print(f"{name}: about {time.reading} min reading; {time.measured:.1f} min measured, "
              f"{time.optional:.1f} optional, about {time.compute} min, {time.disturbed} -- "
              f"{'updated' if changed else 'up to date'}")
    for guide in args.readme:
        try:
            old = guide.read_text()
            new = render_guide(old, minutes)
        except (OSError, ValueError) as exc:
            print(f"error: {guide}: {exc}", file=sys.stderr)
            return 2
        if new != old:
            atomic_write_text(guide, new)
        print(f"{guide}: {'updated' if new != old else 'up to date'}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m helpers.course.notebooks", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    student = sub.add_parser("student", help="write the student copies (no outputs, empty answer cells)")
    student.add_argument("--source", default="notebooks", help="folder with NN_*.ipynb (default: notebooks)")
    student.add_argument("--out", default=None, help="where the copies go (default: SOURCE/student)")
    time = sub.add_parser("time", help="rewrite each chapter's Time sentence from its last run")
    time.add_argument("notebooks", nargs="+", help="executed chapter notebooks")
    time.add_argument("--readme", type=Path, action="append", default=[],
                      help="also rewrite this guide's (or front page's) minutes and plans; may be repeated")
    args = p.parse_args(argv)
    return _student(args) if args.command == "student" else _time(args)


if __name__ == "__main__":
    sys.exit(main())
