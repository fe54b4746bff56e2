"""Hygiene of the committed notebooks (their execution is tested by nbval in the same run)."""

import ast
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
MACHINE_PATH = re.compile(r"(/root/|/work/|/tmp/pytest|/home/\w+/|/Users/\w+/)")


def test_there_are_notebooks():
    assert len(NOTEBOOKS) >= 2


def pending_reexecution(nb):
    """Why a chapter's code is ahead of its committed outputs ('' when it is not): notebook metadata
    course.pending_reexecution, set when chapters are edited between two workshop passes."""
    return json.loads(nb.read_text()).get("metadata", {}).get("course", {}).get("pending_reexecution", "")


def code_cells(nb):
    return [c for c in json.loads(nb.read_text())["cells"] if c["cell_type"] == "code"]


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=lambda p: p.name)
def test_committed_from_one_clean_run(nb):
    cells = code_cells(nb)
    counts = [c["execution_count"] for c in cells]
    if pending_reexecution(nb):  # code ahead of its outputs, declared: the run's cells keep their order and
        ran = [n for n in counts if n is not None]  # the cells changed since show nothing they did not print
        assert ran == sorted(set(ran)), "the committed run's cells keep their execution order"
        assert all(not c["outputs"] for c in cells if c["execution_count"] is None), \
            "a cell that did not run shows no output (nbval refuses an unrun cell with outputs)"
        assert nb.name in (ROOT / "docs" / "committed-outputs.md").read_text(), \
            "docs/committed-outputs.md names every chapter awaiting its re-execution"
    else:
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


ROUNDS_NOTE = re.compile(r"\d+ interleaved rounds( \(order balanced for carry-over|, (a complete Williams design|"
                         r"approximately balanced|incomplete design))")
"""The note under every table of interleaved rounds (before and after 2026-11-29's format)."""


def comparison_tables(text):
    """Tables in a printed output whose note says they come from interleaved rounds: for each, the
    data rows as lists of cells (cut at the header's dash runs) and the column index of "verdict"."""
    lines = text.splitlines()
    for i, dashes in enumerate(lines):
        if i == 0 or not dashes.strip() or set(dashes) - {"-", " "}:
            continue
        spans = [m.span() for m in re.finditer(r"-+", dashes)]
        header = [lines[i - 1][a:b if k < len(spans) - 1 else None].strip() for k, (a, b) in enumerate(spans)]
        if "verdict" not in header:
            continue
        rows, end = [], i + 1
        while end < len(lines) and lines[end].strip() and not ROUNDS_NOTE.search(lines[end]):
            line = lines[end]
            rows.append([line[a:b if k < len(spans) - 1 else None].strip() for k, (a, b) in enumerate(spans)])
            end += 1
        if end < len(lines) and ROUNDS_NOTE.search(lines[end]):
            yield rows, header.index("verdict"), lines[end]


def test_comparison_tables_are_found_and_read():
    text = "\n".join(["title",
                      "variant          verdict   x",
                      "---------------  --------  --",
                      "base             baseline  1",
                      "A/A: base again  faster    2",
                      "8 interleaved rounds (order balanced for carry-over, ...)."])
    (rows, col, note), = comparison_tables(text)
    assert rows == [["base", "baseline", "1"], ["A/A: base again", "faster", "2"]] and col == 1
    assert note.startswith("8 interleaved")
    assert not list(comparison_tables("variant  verdict\n-------  -------\na  b\n(no rounds note)"))


def aa_problems(text):
    """What breaks the A/A rule in one printed output: a table of interleaved rounds with three or more
    measured arms and no A/A row, an A/A row with a verdict word, a note saying the A/A arm failed."""
    problems = []
    for rows, col, note in comparison_tables(text):
        measured = [r for r in rows if len(r) > col and r[col] not in ("-", "")]
        aa = [r for r in measured if r[0].startswith("A/A")]
        if len(measured) >= 3 and not aa:
            problems.append(f"{len(measured)} arms without an A/A row: {[r[0] for r in measured]}")
        problems += [f"the A/A row got a verdict: {r}" for r in aa if re.match(r"(faster|slower|disturbed)", r[col])]
        if "Disturbed:" in note or any("A/A failed" in r[col] for r in aa):
            problems.append("a run whose A/A arm failed (rerun it)")
        if "Hodges-Lehmann" in note:  # the statistics of 2026-11-29: checked wherever a table prints them
            problems += statistics_problems(rows, col, note)
    return problems


def statistics_problems(rows, col, note):
    """A table in the 2026-11-29 format: a complete design or "approximately balanced (k of m orders)" (never
    plain "balanced"), every ratio inside its printed interval, every "no measurable difference" with the
    effect the run could see, every passing A/A interval containing 1.0."""
    problems = []
    if "balanced" in note and "approximately balanced (" not in note:
        problems.append("a note says balanced without a complete design")
    if "interleaved rounds, incomplete design" in note and not note.startswith("1 interleaved"):
        problems.append("an incomplete design at the workshop size")
    for r in rows:
        at = next((i for i, c in enumerate(r) if re.fullmatch(r"\d+\.\d+-\d+\.\d+", c)), None)
        cells = [r[at]] if at else []
        ratio = r[at - 1] if at and re.fullmatch(r"\d+(\.\d+)?", r[at - 1].replace(",", "")) else None  # the estimate: just before its interval
        if cells and ratio is not None:
            low, high = (float(x) for x in cells[0].split("-"))
            if not low <= float(ratio) <= high:
                problems.append(f"{r[0]}: ratio {ratio} outside its interval {cells[0]}")
            if r[0].startswith("A/A") and not low <= 1.0 <= high:
                problems.append(f"{r[0]}: the A/A interval {cells[0]} excludes 1.0")
        if r[col].startswith("no measurable difference") and "could see" not in r[col] and "Fewer than" not in note:
            problems.append(f"{r[0]}: 'no measurable difference' without what the run could see")
    return problems


def test_aa_problems_are_caught():
    table = lambda rows, note="8 interleaved rounds (order balanced for carry-over, ...).": "\n".join(
        ["variant          verdict                   x", "---------------  ------------------------  --", *rows, note])
    base, b = "base             baseline                  1", "b                no measurable difference  2"
    assert aa_problems(table([base, b, "A/A: base again  no measurable difference  2"])) == []
    assert aa_problems(table([base, b, "c                faster                    3"])) != []          # no A/A row
    assert aa_problems(table([base, "A/A: base again  slower                    2"])) != []          # A/A verdict
    assert aa_problems(table([base, b, "A/A: base again  no measurable difference  2"],
                             "8 interleaved rounds (order balanced for carry-over). Disturbed: ...")) != []
    assert aa_problems(table([base, b, "c                -                         3"])) == []          # book-only row


def test_statistics_problems_are_caught():
    note = ("8 interleaved rounds, a complete Williams design (1 x 8 orders), every variant built afresh each round; "
            "speed-up = baseline/variant (Hodges-Lehmann estimate) with its 95% interval")
    good = [["base", "1.0", "-", "baseline"], ["b", "1.10", "1.04-1.17", "faster"],
            ["c", "1.01", "0.93-1.09", "no measurable difference (could see ≥ 14%)"],
            ["A/A: base again", "0.99", "0.95-1.03", "A/A passed (contains 1.0)"]]
    assert statistics_problems(good, 3, note) == []
    with_median = [["A again", "26.29", "1.053", "0.93-1.23", "no measurable difference (could see ≥ 21%)"]]
    assert statistics_problems(with_median, 4, note) == []  # the estimate sits just before its interval
    assert len(statistics_problems([["b", "26.29", "1.30", "0.93-1.23", "faster"]], 4, note)) == 1
    bad = [["b", "0.90", "0.72-0.89", "slower"], ["c", "1.01", "0.93-1.09", "no measurable difference"],
           ["A/A: base again", "1.09", "1.01-1.14", "A/A passed (contains 1.0)"]]
    assert len(statistics_problems(bad, 3, note)) == 3
    assert statistics_problems(good, 3, note.replace("a complete Williams design (1 x 8 orders)",
                                                     "order balanced for carry-over")) != []


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=lambda p: p.name)
def test_committed_comparisons_carry_a_passing_aa_arm(nb):
    """Every committed table of interleaved rounds with three or more arms has an A/A row, no A/A row
    carries a verdict word, and no committed run says its A/A arm failed (rerun it instead)."""
    for cell in code_cells(nb):
        for o in cell["outputs"]:
            problems = aa_problems("".join(o.get("text") or o.get("data", {}).get("text/plain", "")))
            assert not problems, f"{nb.name}: {problems}"


def unstated_power(text):
    """Lines of one printed output that read "no measurable difference" for a time without the effect the run
    could see (accuracy comparisons print their interval in points instead; runs with fewer than
    MIN_ROUNDS rounds have no estimate and say so)."""
    if "Fewer than" in text:
        return []
    found, lines, header = [], text.splitlines(), ""
    for i, ln in enumerate(lines):
        if i and ln.strip() and not set(ln) - {"-", " "}:
            header = lines[i - 1]  # a table's header: its rows follow until a blank line
        elif not ln.strip():
            header = ""
        elif ("no measurable difference" in ln and "could see" not in ln and "points" not in header
              and not re.search(r"points|paired seeds|\d+ seeds\)", ln)):
            found.append(ln.strip())
    return found


def test_unstated_power_is_caught():
    assert unstated_power("a vs b: 0.93x [0.82-1.11] no measurable difference") != []
    assert unstated_power("a vs b: 0.93x [0.82-1.11] no measurable difference (could see ≥ 27%)") == []
    assert unstated_power("bf16 vs fp32: +0.0 points (95% interval -1.9 to +1.9, 3 paired seeds): "
                          "no measurable difference") == []
    assert unstated_power("b  63.6% (sd 18.6, 44.8-81.9, 3 seeds)  -22.6  no measurable difference") == []
    table = ["model  against unpruned (points)  word", "-----  -------------------------  ----",
             "s50                       -2.183  no measurable difference"]
    assert unstated_power("\n".join(table)) == []  # an accuracy table: its interval is in points
    assert unstated_power("\n".join(table).replace("(points)", "(x)      ")) != []


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=lambda p: p.name)
def test_every_committed_no_difference_says_what_the_run_could_see(nb):
    """DESIGN.md, "The power the run had": a timing that found no difference prints the effect it could see."""
    for cell in code_cells(nb):
        for o in cell["outputs"]:
            problems = unstated_power("".join(o.get("text") or o.get("data", {}).get("text/plain", "")))
            assert not problems, f"{nb.name}: {problems}"


def test_the_aa_rule_reads_the_committed_tables():
    """Guards the test above against passing vacuously: if the tables' note or layout changed, the
    reader would find no table and every notebook would pass."""
    found = [t for nb in NOTEBOOKS for c in code_cells(nb) for o in c["outputs"]
             for t in comparison_tables("".join(o.get("text") or o.get("data", {}).get("text/plain", "")))]
    pending = [nb.name for nb in NOTEBOOKS if pending_reexecution(nb)]
    # between two workshop passes the cells that compare arms were changed and show no output; the pass of
    # 2026-11-29 committed 30 tables and 13 A/A rows (03 and 04 without their optional parts)
    assert len(found) >= (26 if len(pending) < 4 else 0), f"only {len(found)} tables of interleaved rounds found"
    assert sum(any(r[0].startswith("A/A") for r in rows) for rows, _, _ in found) >= (11 if len(pending) < 4 else 0)
    assert len(pending) < 4 or len(pending) == len(
        [n for n in pending if n in (ROOT / "docs" / "committed-outputs.md").read_text()])


def written_scripts(nb):
    """The Python files a notebook writes with %%writefile: {file name: source}."""
    out = {}
    for cell in code_cells(nb):
        first, _, body = "".join(cell["source"]).partition("\n")
        if first.startswith("%%writefile") and first.strip().endswith(".py"):
            out[first.split()[-1]] = body
    return out


def exit_problems(source):
    """What is wrong with how a script that joins a process group leaves it: it must end with
    ``dist.destroy_process_group()`` and then ``os._exit(0)`` (gloo can abort a rank in Python's
    teardown otherwise: PyTorch issue #190489, chapter 08's point 6)."""
    if "init_process_group" not in source:
        return []
    last = [ast.unparse(s) for s in ast.parse(source).body[-2:]]
    return [] if last == ["dist.destroy_process_group()", "os._exit(0)"] else [f"ends with {last}"]


def test_exit_problems_are_caught():
    good = "import os\nimport torch.distributed as dist\ndist.init_process_group('gloo')\ndist.destroy_process_group()\nos._exit(0)\n"
    assert exit_problems(good) == []
    assert exit_problems(good.replace("os._exit(0)\n", ""))                     # teardown left to Python
    assert exit_problems(good.replace("dist.destroy_process_group()\n", ""))   # group never left
    assert exit_problems("print('no process group')\n") == []


def test_scripts_that_join_a_process_group_leave_without_teardown():
    scripts = {f"{nb.name}: {name}": src for nb in NOTEBOOKS for name, src in written_scripts(nb).items()
               if "init_process_group" in src}
    assert len(scripts) >= 3, f"expected chapters 08-10's DDP scripts, found {sorted(scripts)}"
    problems = {name: p for name, src in scripts.items() for p in [exit_problems(src)] if p}
    assert not problems, problems
