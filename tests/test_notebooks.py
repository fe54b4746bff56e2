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
