"""helpers.course.notebooks: student copies (no outputs, solutions replaced by answer cells) and chapter times
(compute minutes from the cells' stored execution times, the Time sentence, the guides' minutes and plans)."""

import json
import math
from pathlib import Path

import nbformat
import pytest

from helpers.course import notebooks


def chapter():
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "course-venv", "display_name": "Course", "language": "python"}
    nb.metadata["widgets"] = {"state": {}}
    setup = nbformat.v4.new_code_cell("# NBVAL_CHECK_OUTPUT\nx = 2\nprint(x)  # NBVAL_CHECK_OUTPUT")
    setup.outputs = [nbformat.v4.new_output("stream", text="2\n")]
    setup.execution_count = 1
    setup.metadata["execution"] = {"iopub.execute_input": "2026-11-23T10:00:00Z"}
    exercise = nbformat.v4.new_markdown_cell("### Exercise 1.1 — predict, then run\nWhat is x squared?")
    hidden = {"tags": ["solution"], "jupyter": {"source_hidden": True}}
    code_solution = nbformat.v4.new_code_cell("print(x ** 2)", metadata=dict(hidden))
    code_solution.outputs = [nbformat.v4.new_output("stream", text="4\n")]
    text_solution = nbformat.v4.new_markdown_cell("Because 2 * 2 = 4.", metadata=dict(hidden))
    later = nbformat.v4.new_code_cell("y = x + 1", metadata={"tags": ["keep"]})
    nb.cells = [setup, exercise, code_solution, text_solution, later]
    return nb


def test_student_copy_removes_outputs_and_solutions():
    original = chapter()
    copy = notebooks.student_copy(original)
    setup, exercise, code_answer, text_answer, later = copy.cells
    assert setup.outputs == [] and setup.execution_count is None and "execution" not in setup.metadata
    assert setup.source == "x = 2\nprint(x)"
    assert exercise.source == original.cells[1].source
    assert (code_answer.cell_type, code_answer.source, code_answer.metadata) == ("code", "", {"tags": ["answer"]})
    assert code_answer.outputs == [] and code_answer.id == original.cells[2].id
    assert text_answer.cell_type == "markdown" and text_answer.source == notebooks.MARKDOWN_PROMPT
    assert later.source == "y = x + 1" and later.metadata == {"tags": ["keep"]}
    assert copy.metadata["kernelspec"]["name"] == "python3" and "widgets" not in copy.metadata
    assert original.cells[2].source == "print(x ** 2)" and original.cells[0].outputs  # input untouched
    nbformat.validate(copy)


@pytest.mark.parametrize("source,expected", [
    ("# NBVAL_CHECK_OUTPUT\nprint(1)", "print(1)"),
    ("print(1)  # NBVAL_CHECK_OUTPUT", "print(1)"),
    ("#NBVAL_CHECK_OUTPUT   \n\nprint(1)\n", "\nprint(1)\n"),
    ("a = 1\n# NBVAL_IGNORE_OUTPUT\nb = 2", "a = 1\n# NBVAL_IGNORE_OUTPUT\nb = 2"),
])
def test_strip_check_markers(source, expected):
    assert notebooks.strip_check_markers(source) == expected


def test_write_student_copies(tmp_path, capsys):
    src = tmp_path / "notebooks"
    src.mkdir()
    nbformat.write(chapter(), src / "01_first.ipynb")
    nbformat.write(chapter(), src / "02_second.ipynb")
    (src / "notes.ipynb").write_text("{}")  # not a chapter: ignored
    stale = src / "student" / "09_removed.ipynb"
    stale.parent.mkdir()
    stale.write_text("{}")
    written = notebooks.write_student_copies(src)
    assert [p.name for p in written] == ["01_first.ipynb", "02_second.ipynb"]
    assert sorted(p.name for p in (src / "student").iterdir()) == ["01_first.ipynb", "02_second.ipynb"]
    data = json.loads(written[0].read_text())
    assert not any(c.get("outputs") for c in data["cells"])
    assert not any("solution" in c["metadata"].get("tags", []) for c in data["cells"])
    assert written[0].read_bytes() == (notebooks.write_student_copies(src)[0]).read_bytes()  # deterministic
    assert notebooks.main(["student", "--source", str(src), "--out", str(tmp_path / "out")]) == 0
    assert "2 student copies" in capsys.readouterr().out and (tmp_path / "out" / "02_second.ipynb").exists()


def test_missing_notebooks_folder_is_a_clear_error(tmp_path, capsys):
    with pytest.raises(FileNotFoundError, match="--source"):
        notebooks.write_student_copies(tmp_path)
    assert notebooks.main(["student", "--source", str(tmp_path)]) == 2
    assert "No chapter notebooks" in capsys.readouterr().err

ROOT = Path(__file__).resolve().parents[2]
OPENING = ("**Time:** about 25 min reading and exercises + about 9 min of compute at the workshop profile "
           "(7.7 min measured for the committed run on a test machine; no round was disturbed).")


def code(seconds, source="x = 1", start="2026-01-01T10:00:00.000000Z"):
    cell = {"cell_type": "code", "source": source, "metadata": {}, "outputs": [], "execution_count": 1}
    if seconds is not None:
        end_s = 10 * 3600 + seconds
        end = f"2026-01-01T{int(end_s // 3600):02d}:{int(end_s % 3600 // 60):02d}:{end_s % 60:09.6f}Z"
        cell["metadata"]["execution"] = {"iopub.execute_input": start, "shell.execute_reply": end}
    return cell


def md(text):
    return {"cell_type": "markdown", "source": text, "metadata": {}}


def notebook(*cells, opening=OPENING):
    cells = [md(opening), *cells]
    for i, cell in enumerate(cells):
        cell["id"] = f"cell-{i}"  # nbformat 4.5 cells carry ids
    return {"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5}


def test_total_and_optional_parts_from_execution_times():
    nb = notebook(code(30), code(90.5),
                  md("## A heavier model (optional, about 2 min)\nmore text"), code(120),
                  md("## Back to the lesson"), code(15),
                  code(60, "if RUN_OPTIONAL:\n    heavy()"), code(None))
    t = notebooks.measure_notebook(nb)
    assert t.measured == pytest.approx(315.5 / 60)
    assert t.optional == pytest.approx(3.0)
    assert t.compute == 3  # 135.5 s = 2.3 min, rounded up


def test_optional_flag_counts_only_near_the_top_of_a_cell():
    late = "x = 1\n" * 60 + "if RUN_OPTIONAL:\n    pass"
    assert notebooks.measure_notebook(notebook(code(60, late))).optional == 0


@pytest.mark.parametrize("seconds,minutes", [(10.0, 1), (300.0, 5), (302.0, 5), (310.0, 6)])  # 5.03 min reads 5.0
def test_compute_minutes_are_rounded_up_and_at_least_one(seconds, minutes):
    assert notebooks.measure_notebook(notebook(code(seconds))).compute == minutes


def table_output(note):
    text = f"variant  median s\n-------  --------\na  1.0\n{note}"
    return {"output_type": "display_data", "metadata": {},
            "data": {"text/plain": text, "text/markdown": f"*{note}*", "text/html": f"<p>{note}</p>"}}


def test_re_run_rounds_are_counted_once_per_output():
    shown = code(10)
    shown["outputs"] = [table_output("8 rounds. 2 round(s) re-run: other processes took more than 0.25 cores."),
                        {"output_type": "stream", "name": "stdout", "text": "summary; 1 round(s) re-run\n"}]
    quiet = code(10)
    quiet["outputs"] = [table_output("8 rounds."), {"output_type": "stream", "name": "stdout", "text": "0 round(s) re-run\n"}]
    t = notebooks.measure_notebook(notebook(shown, quiet))
    assert t.rerun_rounds == 3
    assert t.disturbed.startswith("3 round(s) that other processes disturbed were measured again")
    assert notebooks.measure_notebook(notebook(quiet)).disturbed == "no round was disturbed"
    assert notebooks.rewrite_sentence(OPENING, t).endswith("as the tables' notes say).")
    back = notebooks.rewrite_sentence(notebooks.rewrite_sentence(OPENING, t), notebooks.ChapterTime(25, 8, 462 / 60))
    assert back == OPENING.replace("about 9 min", "about 8 min")


def test_a_notebook_never_executed_is_refused():
    with pytest.raises(ValueError, match="execute the notebook first"):
        notebooks.measure_notebook(notebook(code(None)))


def test_rewrite_sentence_replaces_the_numbers_only():
    t = notebooks.ChapterTime(25, 4, 200 / 60)
    out = notebooks.rewrite_sentence(OPENING, t)
    assert "about 4 min of compute" in out and "(3.3 min measured for the committed run" in out
    assert out.replace("about 4 min", "about 9 min").replace("3.3 min", "7.7 min") == OPENING
    with_optional = OPENING.replace("; no round", "; the optional parts took 1.0 min of it; no round")
    assert "the optional parts took 0.0 min of it" in notebooks.rewrite_sentence(with_optional, t)


@pytest.mark.parametrize("text", ["no sentence here", OPENING + " " + OPENING])
def test_rewrite_sentence_needs_exactly_one_sentence(text):
    with pytest.raises(ValueError, match="once"):
        notebooks.rewrite_sentence(text, notebooks.ChapterTime(0, 1, 1.0))


def test_reading_minutes_count_words_printed_words_and_code_lines_outside_optional_parts():
    printed = code(1, "print('x')")
    printed["outputs"] = [{"output_type": "stream", "name": "stdout", "text": "two words 42 | --- a"},
                          {"output_type": "display_data", "data": {"text/plain": "plain plain",
                                                                   "text/markdown": "| three good words |"}}]
    nb = notebook(md("lesson words here 1234"), printed, code(1, "a = 1\n\nb = 2\n"),
                  md("## Extra (optional, 1 min)\nmany many many words"), code(1, "c = 3\nd = 4"),
                  md("## Back"), code(1, "if RUN_OPTIONAL:\n    e = 5"),
                  md("### Exercise 1.1 (predict)\nguess"), md("## More (optional, 2 min)"),
                  md("### Exercise 1.2 (optional)\nnot core"))
    opening_words = notebooks.words(OPENING)
    # markdown: opening + 3 + 1 ("## Back": "Back" only) + 3 (the core exercise); printed: 2 + 3 (markdown before
    # plain); code: 1 + 2 lines; one core exercise (the one under an optional heading is not on the core path)
    expected = (opening_words + 3 + 1 + 3 + 2 + 3) / 130 + 3 / 10 + 4
    assert notebooks.reading_minutes(nb) == pytest.approx(expected)
    assert notebooks.words("a 42 ok |---| x1") == 1 and notebooks.words("don't e.g. T4 x1y2") == 3
    t = notebooks.measure_notebook(nb)
    assert t.reading == math.ceil(expected) and f"about {math.ceil(expected)} min reading" in notebooks.rewrite_sentence(OPENING, t)


def test_update_rewrites_the_file_and_check_only_reports(tmp_path, capsys):
    path = tmp_path / "01_x.ipynb"
    path.write_text(json.dumps(notebook(code(100), code(50))))
    assert notebooks.update(path, check=True)[1] and "about 9 min" in path.read_text()
    guide = tmp_path / "README.md"
    guide.write_text("| 01 | [x](01_x.ipynb) | does x | 99 | 9.9 (measured) | CPU |\n")
    assert notebooks.main(["time", str(path), "--readme", str(guide)]) == 0
    assert "about 3 min of compute" in path.read_text() and "(2.5 min measured" in path.read_text()
    assert guide.read_text() == "| 01 | [x](01_x.ipynb) | does x | 1 | 2.5 (measured) | CPU |\n"
    assert not notebooks.update(path, check=True)[1]
    assert notebooks.main(["time", str(path), "--readme", str(guide)]) == 0
    assert capsys.readouterr().out.count("up to date") == 2


def test_main_gives_one_line_for_a_bad_notebook(tmp_path, capsys):
    path = tmp_path / "02_x.ipynb"
    path.write_text(json.dumps(notebook(code(None))))
    assert notebooks.main(["time", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "make execute" in err


def test_committed_chapters_state_the_time_their_run_took():
    chapters = sorted(ROOT.glob("notebooks/[01][0-9]_*.ipynb"))[1:]  # 00 is the setup check, not a lesson
    assert len(chapters) == 14
    pending = {p.name for p in chapters if pending_reexecution(p)}
    stale = [p.name for p in chapters if p.name not in pending and notebooks.update(p, check=True)[1]]
    assert not stale, f"re-measure with: python -m helpers.course.notebooks time notebooks/NN_*.ipynb ({stale})"
    for p in chapters:  # a chapter awaiting its re-execution still states the reading time of its text
        if p.name in pending:
            nb = nbformat.read(p, as_version=4)
            assert notebooks.stated_minutes(nb).reading == math.ceil(notebooks.reading_minutes(nb) - 1e-9), p.name


def pending_reexecution(path):
    """The reason a chapter's code is ahead of its committed outputs ('' when it is not)."""
    return json.loads(path.read_text()).get("metadata", {}).get("course", {}).get("pending_reexecution", "")


GUIDE = """| # | chapter | after it | read min | compute min | hardware |
|---|---|---|---|---|---|
| 01 | [a](01_a.ipynb) | does a | 45 | 1.2 (measured) | CPU |
| 02 | [b](02_b.ipynb) | does b | 47 | 4.8 (measured) | CPU |

<!-- plan: welcome=20; 01 anatomy; break=15; 01+02 both -->

| time | block |
|---|---|
| 0:00 - 0:20 | stale |
"""


def test_stated_minutes_read_the_sentence():
    got = notebooks.stated_minutes(notebook(opening=OPENING + " the optional parts took 2.5 min of it"))
    assert (got.reading, got.compute, got.measured, got.optional) == (25, 9, 7.7, 2.5)
    with pytest.raises(ValueError, match="states no"):
        notebooks.stated_minutes(notebook(opening="**Time:** soon"))


def test_render_guide_rewrites_minutes_and_plans():
    minutes = {"01": notebooks.ChapterTime(26, 2, 1.6), "02": notebooks.ChapterTime(24, 5, 6.1, 1.5)}
    out = notebooks.render_guide(GUIDE, minutes)
    assert "| 01 | [a](01_a.ipynb) | does a | 26 | 1.6 (measured) | CPU |" in out
    assert "| 02 | [b](02_b.ipynb) | does b | 24 | 6.1 (measured; 1.5 of it optional) | CPU |" in out
    assert "| 0:00 - 0:20 | welcome |\n| 0:20 - 0:50 | 01 anatomy |\n| 0:50 - 1:05 | break |\n" \
           "| 1:05 - 2:05 | 01 and 02 both |\n" in out
    assert "stale" not in out
    assert notebooks.render_guide(out, minutes) == out  # a second run changes nothing


def test_render_guide_rewrites_a_front_page_minutes_column():
    front = "| 01 | [a](x.ipynb) | measures a | 45+2 | CPU |\n| 00 | [s](s.ipynb) | setup | <1 | any |\n"
    out = notebooks.render_guide(front, {"01": notebooks.ChapterTime(26, 3, 2.4)})
    assert out == "| 01 | [a](x.ipynb) | measures a | 26+3 | CPU |\n| 00 | [s](s.ipynb) | setup | <1 | any |\n"


def test_plan_rows_refuse_unknown_chapters_and_bad_blocks():
    with pytest.raises(ValueError, match="chapter"):
        notebooks.plan_rows("03 compile", {})
    with pytest.raises(ValueError, match="label=MINUTES"):
        notebooks.plan_rows("just words", {})


def test_committed_teacher_guide_follows_the_chapters():
    chapters = sorted(ROOT.glob("notebooks/[01][0-9]_*.ipynb"))[1:]
    minutes = {p.name[:2]: notebooks.stated_minutes(json.loads(p.read_text())) for p in chapters}
    for guide in (ROOT / "notebooks" / "README.md", ROOT / "README.md"):
        text = guide.read_text()
        assert notebooks.render_guide(text, minutes) == text, (
            f"rewrite {guide.name}: python -m helpers.course.notebooks time --readme notebooks/README.md --readme README.md "
            "notebooks/0[1-9]_*.ipynb notebooks/1?_*.ipynb")


def test_a_run_with_the_optional_parts_off_says_so():
    off = code(30)
    off["outputs"] = [{"output_type": "stream", "name": "stdout", "text": "profile=workshop data=x optional parts=off\n"}]
    t = notebooks.measure_notebook(notebook(off, md("## Extra (optional, 3 min)"), code(1)))
    assert not t.optional_ran
    with_optional = OPENING.replace("; no round", "; the optional parts took 1.0 min of it; no round")
    out = notebooks.rewrite_sentence(with_optional, t)
    assert "the optional parts did not run in it (COURSE_OPTIONAL=0)" in out and "took" not in out
    assert notebooks.rewrite_sentence(out, notebooks.ChapterTime(0, 1, 1.0, 0.1)).count("the optional parts took 0.1 min of it") == 1
    assert notebooks.measure_notebook(notebook(code(30))).optional_ran
