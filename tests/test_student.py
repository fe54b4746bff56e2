import json

import nbformat
import pytest

from helpers import student


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
    copy = student.student_copy(original)
    setup, exercise, code_answer, text_answer, later = copy.cells
    assert setup.outputs == [] and setup.execution_count is None and "execution" not in setup.metadata
    assert setup.source == "x = 2\nprint(x)"
    assert exercise.source == original.cells[1].source
    assert (code_answer.cell_type, code_answer.source, code_answer.metadata) == ("code", "", {"tags": ["answer"]})
    assert code_answer.outputs == [] and code_answer.id == original.cells[2].id
    assert text_answer.cell_type == "markdown" and text_answer.source == student.MARKDOWN_PROMPT
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
    assert student.strip_check_markers(source) == expected


def test_write_student_copies(tmp_path, capsys):
    src = tmp_path / "notebooks"
    src.mkdir()
    nbformat.write(chapter(), src / "01_first.ipynb")
    nbformat.write(chapter(), src / "02_second.ipynb")
    (src / "notes.ipynb").write_text("{}")  # not a chapter: ignored
    stale = src / "student" / "09_removed.ipynb"
    stale.parent.mkdir()
    stale.write_text("{}")
    written = student.write_student_copies(src)
    assert [p.name for p in written] == ["01_first.ipynb", "02_second.ipynb"]
    assert sorted(p.name for p in (src / "student").iterdir()) == ["01_first.ipynb", "02_second.ipynb"]
    data = json.loads(written[0].read_text())
    assert not any(c.get("outputs") for c in data["cells"])
    assert not any("solution" in c["metadata"].get("tags", []) for c in data["cells"])
    assert written[0].read_bytes() == (student.write_student_copies(src)[0]).read_bytes()  # deterministic
    assert student.main(["--source", str(src), "--out", str(tmp_path / "out")]) == 0
    assert "2 student copies" in capsys.readouterr().out and (tmp_path / "out" / "02_second.ipynb").exists()


def test_missing_notebooks_folder_is_a_clear_error(tmp_path, capsys):
    with pytest.raises(FileNotFoundError, match="--source"):
        student.write_student_copies(tmp_path)
    assert student.main(["--source", str(tmp_path)]) == 2
    assert "No chapter notebooks" in capsys.readouterr().err
