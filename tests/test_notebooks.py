"""Hygiene of the committed notebooks (their execution is tested by nbval in the same run)."""

import json
import re
from pathlib import Path

import pytest

NOTEBOOKS = sorted((Path(__file__).resolve().parent.parent / "notebooks").glob("[0-9][0-9]_*.ipynb"))
MACHINE_PATH = re.compile(r"(/root/|/work/|/tmp/pytest|/home/\w+/|/Users/\w+/)")


def test_there_are_notebooks():
    assert len(NOTEBOOKS) >= 2


def code_cells(nb):
    return [c for c in json.loads(nb.read_text())["cells"] if c["cell_type"] == "code"]


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=lambda p: p.name)
def test_committed_from_one_clean_run(nb):
    cells = code_cells(nb)
    counts = [c["execution_count"] for c in cells]
    assert counts == list(range(1, len(cells) + 1)), "re-run the notebook top to bottom in a fresh kernel"
    outputs = [o for c in cells for o in c["outputs"]]
    assert outputs, "commit the outputs of a real run"
    assert not [o for o in outputs if o["output_type"] == "error"], "no error outputs"
    for o in outputs:
        assert not MACHINE_PATH.search(json.dumps(o)), f"machine path in an output of {nb.name}"


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=lambda p: p.name)
def test_conventions(nb):
    cells = code_cells(nb)
    first = "".join(cells[0]["source"])
    assert "from helpers import" in first or "import helpers" in first, "first cell imports helpers"
    sources = ["".join(c["source"]) for c in cells]
    assert any("NBVAL_CHECK_OUTPUT" in s for s in sources), "mark deterministic cells for nbval"
    assert not any("sys.path" in s for s in sources), "no sys.path hacks: helpers is installed"
    assert not any("nbval-skip" in c.get("metadata", {}).get("tags", []) or "NBVAL_SKIP" in s
                   for c, s in zip(cells, sources)), "cells detect missing hardware instead of being skipped"
    assert re.fullmatch(r"\d\d_[a-z0-9_]+\.ipynb", nb.name)


def _names(source):
    """(names bound, names read) by a code cell, IPython syntax (magics, !shell) included."""
    import ast

    from IPython.core.inputtransformer2 import TransformerManager

    try:
        tree = ast.parse(TransformerManager().transform_cell(source))
    except SyntaxError:
        return set(), set()
    bound, read = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            (bound if isinstance(node.ctx, (ast.Store, ast.Del)) else read).add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, ast.alias):
            bound.add((node.asname or node.name).split(".")[0])
    return bound, read


def solution_dependencies(cells):
    """Messages for code cells that read a name bound only in an earlier solution cell."""
    cells = [c for c in cells if c["cell_type"] == "code"]
    solution = ["solution" in c.get("metadata", {}).get("tags", []) for c in cells]
    names = [_names("".join(c["source"])) for c in cells]
    elsewhere = set().union(set(), *(b for (b, _), s in zip(names, solution) if not s))
    only_in_solutions: dict[str, int] = {}
    problems = []
    for i, ((bound, read), is_solution) in enumerate(zip(names, solution)):
        if is_solution:
            for name in bound - elsewhere:
                only_in_solutions.setdefault(name, i)
        else:
            used = sorted(n for n in read if n in only_in_solutions and only_in_solutions[n] < i)
            if used:
                problems.append(f"code cell {i} reads {used}, bound only in a solution cell (empty in student copies)")
    return problems


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=lambda p: p.name)
def test_no_cell_needs_a_solution(nb):
    assert solution_dependencies(json.loads(nb.read_text())["cells"]) == []


def test_solution_dependencies_are_found():
    def cell(src, solution=False):
        return {"cell_type": "code", "source": src, "metadata": {"tags": ["solution"]} if solution else {}}

    cells = [cell("import torch\nx = 1"), cell("y = x * 2\n!echo hi", solution=True), cell("print(y, x)"),
             cell("def f(): return x", solution=True), cell("f()")]
    assert solution_dependencies(cells) == [
        "code cell 2 reads ['y'], bound only in a solution cell (empty in student copies)",
        "code cell 4 reads ['f'], bound only in a solution cell (empty in student copies)"]
    assert solution_dependencies([cell("z = 3", solution=True), cell("z = 4"), cell("print(z)")]) == []
