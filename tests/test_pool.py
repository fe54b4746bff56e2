"""Tests of helpers.pool: pooling submissions and rows files of many machines into one index. The
synthetic machines (fingerprint, synthetic_rows, write_submission) are fixtures in conftest.py."""

import json
import os

import nbformat
import pytest

from helpers import pool, reproduce, results, submit

def real_smoke_run(tmp_path, monkeypatch):
    """A real (tiny) make-reproduce run: a notebook that measures and appends rows via COURSE_RESULTS."""
    nbs = tmp_path / "nbs"
    nbs.mkdir()
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(
        "from helpers import measure, results\n"
        "res = [measure.time_fn(lambda: sum(range(20000)), repeats=3, name='sum'),\n"
        "       measure.time_fn(lambda: sum(range(10000)), repeats=3, name='half')]\n"
        "results.append_rows(results.rows_from_results('01', 'toy_sum', res, baseline='sum', metric='call_time'))")]
    nbformat.write(nb, nbs / "01_toy.ipynb")
    import threadpoolctl  # noqa: F401  -- sets KMP_DUPLICATE_LIB_OK when imported: not reproduce's doing

    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # the machine salt goes to a temporary cache
    (tmp_path / "home").mkdir()
    before = dict(os.environ)
    run = reproduce.run("smoke", root=tmp_path / "results", notebooks=nbs)
    assert dict(os.environ) == before  # the caller's environment is left alone
    assert (run / results.ROWS_FILE).exists(), (run / "report.md").read_text()
    return run


def test_pool_three_synthetic_submissions_and_a_real_smoke_run(tmp_path, monkeypatch, synthetic_rows,
                                                               write_submission):
    subs = [write_submission("submission-a.json", synthetic_rows(1, 2)),
            write_submission("submission-b.json", synthetic_rows(2, 8, amx=True, slow=0.5)),
            write_submission("submission-c.json", synthetic_rows(3, 16, gpu="NVIDIA H100", slow=1.9, noisy=True))]
    run = real_smoke_run(tmp_path, monkeypatch)
    real_sub, payload = submit.submit(run, out=tmp_path / "submission-real.json")
    assert payload["version"] == submit.SUBMISSION_VERSION and payload["rows"]
    rows = pool.load(subs + [real_sub])
    index = pool.write_index(rows, tmp_path / "P")
    text = index.read_text()
    assert "4 machine(s)" in text
    for label in ("CPU 2 cores, AVX512-BF16", "CPU 8 cores, AMX", "1x NVIDIA H100"):
        assert label in text
    assert "### 01 / toy_sum: call_time (smoke profile)" in text  # the real run's lever
    assert "### 02 / batch_size: epoch_time (workshop profile)" in text
    lever = next(lv for lv in pool.levers_of(rows) if lv.key == ("02", "batch_size", "epoch_time", "s", "workshop"))
    assert lever.published == {"b32": 1.0, "b256": 2.5}
    cells = {m: lever.cells[(m, "b256")] for m, _ in lever.cells if _ == "b256"}
    assert sorted(round(c.ratio, 3) for c in cells.values()) == [1.053, 2.0, 4.0]
    noisy = cells["3" * 16]
    assert noisy.unclear and noisy.verdict == "no measurable difference"  # the verdict does not call it
    assert not cells["1" * 16].unclear and cells["1" * 16].verdict == "faster"
    assert "1.053 ~" in text and "2.500" in text  # measured beside published
    assert len(list((tmp_path / "P" / "figures").glob("*.png"))) == 3
    # deterministic: the order of the inputs does not change a byte
    again = pool.write_index(pool.load([real_sub] + subs[::-1]), tmp_path / "Q").read_text()
    assert again == text


def test_repeated_submissions_from_one_machine_merge(tmp_path, synthetic_rows, write_submission):
    first = write_submission("submission-1.json", synthetic_rows(1, 2, slow=1.0))
    rows2 = synthetic_rows(1, 2, slow=0.8)
    for r in rows2:
        r.time = "2030-01-01T00:00:00+00:00"
    second = write_submission("submission-2.json", rows2)
    rows = pool.load([first, second, first])  # the same file twice counts once
    machines = pool.machines_of(rows)
    assert len(machines) == 1 and len(next(iter(machines.values())).runs) == 2
    lever = pool.levers_of(rows)[1]  # epoch_time sorts after accuracy
    cell = lever.cells[("1" * 16, "b256")]
    assert cell.runs == 2 and cell.repeats == 16 and cell.median == pytest.approx(0.9)
    assert cell.verdict == "faster" and len(cell.values) == 16  # two runs of 8 paired rounds, judged together
    assert cell.min == pytest.approx(0.8 * 0.98) and cell.max == pytest.approx(1.02)
    text = pool.write_index(rows, tmp_path / "P").read_text()
    assert "| 2 |" in text.split("## Comparisons")[0]  # runs merged column


def test_unknown_versions_and_bad_inputs(tmp_path, capsys, synthetic_rows, write_submission):
    sub = write_submission("submission-a.json", synthetic_rows(1, 2))
    payload = json.loads(sub.read_text())
    payload["version"] = 7
    (tmp_path / "future.json").write_text(json.dumps(payload))
    with pytest.raises(results.ResultsFormatError, match="format version 7.*git pull"):
        pool.load([tmp_path / "future.json"])
    (tmp_path / "other.json").write_text('{"results": []}')
    with pytest.raises(results.ResultsFormatError, match="not a course submission"):
        pool.load([tmp_path / "other.json"])
    (tmp_path / "empty").mkdir()
    assert pool.main([str(tmp_path / "empty"), "--out", str(tmp_path / "P")]) == 2
    assert "no results in" in capsys.readouterr().err
    assert pool.main([str(tmp_path / "future.json"), "--out", str(tmp_path / "P")]) == 2
    assert "format version 7" in capsys.readouterr().err
    with pytest.raises(ValueError, match="no result rows"):
        pool.write_index([], tmp_path / "P")


def test_find_inputs_takes_rows_files_and_submissions(tmp_path, synthetic_rows, write_submission):
    rows = synthetic_rows(1, 2)
    results.write_rows(rows, tmp_path / "run" / "deep" / results.ROWS_FILE)
    sub = write_submission("submission-a.json", rows)
    (tmp_path / "notes.json").write_text("{}")  # neither a rows file nor a submission: not read
    assert pool.find_inputs(tmp_path) == sorted([sub, tmp_path / "run" / "deep" / results.ROWS_FILE])
    assert pool.find_inputs(tmp_path / "notes.json") == [tmp_path / "notes.json"]  # a file named is taken as it is
    with pytest.raises(FileNotFoundError, match="missing does not exist"):
        pool.find_inputs(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="no results in .*submission-\\*.json files \\(make submit\\)"):
        pool.find_inputs(tmp_path / "empty")


def test_machine_and_lever_tables_and_the_lever_figure(tmp_path, fingerprint, synthetic_rows):
    rows = synthetic_rows(1, 2) + synthetic_rows(2, 8, amx=True, slow=0.5)
    machines = pool.machines_of(rows)
    table = pool.machines_table(machines)
    assert table.rows == [["11111111", "CPU 2 cores, AVX512-BF16", "Test CPU 1", "2/4", "AVX512-BF16", "none", "2.8.0",
                           "workshop", 4, 1],
                          ["22222222", "CPU 8 cores, AMX", "Test CPU 2", "8/16", "AMX", "none", "2.8.0", "workshop", 4, 1]]
    epoch = next(lv for lv in pool.levers_of(rows) if lv.metric == "epoch_time")
    assert epoch.has_ratios and epoch.title() == "02 / batch_size: epoch_time (workshop profile)"
    lever = pool.lever_table(epoch, machines)
    assert lever.columns == ["variant", "11111111 [CPU 2 cores, AVX512-BF16] ratio vs b32 (x)",
                             "22222222 [CPU 8 cores, AMX] ratio vs b32 (x)", "published ratio (x)"]
    # b256 takes half (machine 1) and a quarter (machine 2) of b32's time in every round; the book: 10 s -> 4 s
    assert lever.rows == [["b32", "1.000", "1.000", 1.0], ["b256", "2.000", "4.000", 2.5]]
    accuracy = next(lv for lv in pool.levers_of(rows) if lv.metric == "accuracy")
    assert pool.lever_table(accuracy, machines).rows[1] == ["b256", "0.975 ~", "0.975 ~", None]  # one round: unclear
    plain_rows = results.make_rows("03", "x", {"a": [1.0, 2.0, 4.0]}, metric="load_time", unit="s",
                                   fingerprint=fingerprint(1, 2), profile="smoke", data="none")
    plain = pool.levers_of(plain_rows)[0]
    assert not plain.has_ratios and plain.title() == "03 / x: load_time (smoke profile)"
    assert pool.lever_table(plain, pool.machines_of(plain_rows)).rows == [["a", "2.000 (1.000 to 4.000)", None]]
    path = pool.lever_figure(epoch, machines, tmp_path / "figs" / "epoch.png")
    assert path == tmp_path / "figs" / "epoch.png" and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    again = pool.lever_figure(epoch, machines, tmp_path / "again.png")
    assert again.read_bytes() == path.read_bytes()  # no date or version in the file: the same figure, the same bytes
