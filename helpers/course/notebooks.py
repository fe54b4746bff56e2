"""Student copies and chapter times: ``python -m helpers.course.notebooks student|time ...``.

``student`` (``make student``) writes notebooks/student/ (docs/running.md); ``time NB... [--readme GUIDE]`` rewrites
the chapters' **Time:** sentences from their cells' times, and the guides' minutes (docs/committed-outputs.md)."""

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
_CHECK_LINE = re.compile(r"^[ \t]*#[ \t]*NBVAL_CHECK_OUTPUT\b[^\n]*\n?", re.M)
_RUN_METADATA = ("execution", "collapsed", "scrolled", "jupyter")  # a run's timings, a solution's presentation


def strip_check_markers(source: str) -> str:
    """``source`` without ``# NBVAL_CHECK_OUTPUT`` markers; a line that held only the marker goes."""
    return _CHECK_MARKER.sub("", _CHECK_LINE.sub("", source))


def student_copy(notebook: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """The student version of one notebook (the argument is left unchanged)."""
    nb = copy.deepcopy(notebook)
    for cell in nb.cells:
        if SOLUTION_TAG in cell["metadata"].get("tags", []):  # an empty answer cell that keeps the solution's id
            cell["metadata"] = nbformat.NotebookNode({"tags": [ANSWER_TAG]})
            cell["source"] = MARKDOWN_PROMPT if cell["cell_type"] == "markdown" else ""
        for key in _RUN_METADATA:
            cell["metadata"].pop(key, None)
        if cell["cell_type"] == "code":
            cell["outputs"] = []
            cell["execution_count"] = None
            cell["source"] = strip_check_markers("".join(cell["source"]))
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
    return (datetime.fromisoformat(end) - datetime.fromisoformat(start)).total_seconds() if start and end else None


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
    code = [(cell, optional) for cell, _, optional in _walk(notebook) if cell.get("cell_type") == "code"]
    timed = [(seconds, optional) for cell, optional in code if (seconds := _seconds(cell)) is not None]
    if not timed:
        raise ValueError("no code cell has execution times: execute the notebook first "
                         "(make execute NB=...), then run this again")
    printed = [_output_text(out) for cell, _ in code for out in cell.get("outputs", [])]
    total = sum(seconds for seconds, _ in timed)
    optional = sum(seconds for seconds, in_optional_part in timed if in_optional_part)
    compute = max(1, math.ceil(round((total - optional) / 60, 1)))  # "about N min": rounded up, at least 1
    return ChapterTime(math.ceil(reading_minutes(notebook) - 1e-9), compute, total / 60, optional / 60,
                       sum(int(n) for text in printed for n in _RERUN_NOTE.findall(text)),
                       not any(_OPTIONAL_OFF in text for text in printed))


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
# a chapter's row in the guide (| NN | ... | READ | X (measured) |) or on the front page (| NN | ... | READ+COMPUTE |)
_ROW = re.compile(r"^\| (?P<nn>\d\d) \|(?P<mid>(?:[^|\n]*\|){2}) (?:(?P<front>\d+\+\d+)|\d+ \| [\d.]+ \(measured[^|]*) "
                  r"\|(?P<rest>.*)$", re.M)


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
    for item in filter(None, map(str.strip, spec.split(";"))):
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
        got = minutes.get(m["nn"])
        if got is None:
            return m[0]
        optional = f"; {got.optional:.1f} of it optional" if got.optional else ""
        said = (f"{got.reading}+{got.compute}" if m["front"]
                else f"{got.reading} | {got.measured:.1f} (measured{optional})")
        return f"| {m['nn']} |{m['mid']} {said} |{m['rest']}"

    def plan(m: re.Match) -> str:
        body = "".join(f"| {span} | {label} |\n" for span, label in plan_rows(m.group("spec"), minutes))
        return f"<!-- plan: {m.group('spec')} -->\n\n{m.group('head')}{body}"

    return _PLAN.sub(plan, _ROW.sub(row, text))


def _student(args: argparse.Namespace) -> int:
    try:
        written = write_student_copies(args.source, args.out)
    except FileNotFoundError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"{len(written)} student copies in {written[0].parent} (solutions replaced by empty answer cells)")
    return 0


def _time(args: argparse.Namespace) -> int:
    minutes: dict[str, ChapterTime] = {}
    try:
        for path in map(Path, args.notebooks):  # the chapters, then the guides: an error names the file
            time, changed = update(path)
            if path.name[:2].isdigit() and path.name[:2] != "00":
                minutes[path.name[:2]] = stated_minutes(nbformat.read(path, as_version=4))
            print(f"{path}: about {time.reading} min reading; {time.measured:.1f} min measured, "
                  f"{time.optional:.1f} optional, about {time.compute} min, {time.disturbed} -- "
                  f"{'updated' if changed else 'up to date'}")
        for path in args.readme:
            old = path.read_text()
            new = render_guide(old, minutes)
            if new != old:
                atomic_write_text(path, new)
            print(f"{path}: {'updated' if new != old else 'up to date'}")
    except (OSError, ValueError, KeyError, IndexError) as exc:  # nbformat's NotJSONError is a ValueError
        print(f"error: {path}: {exc}", file=sys.stderr)
        return 2
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
