import json
import os
import subprocess
import sys

import nbformat
import pytest

from helpers import pool, reproduce, results, submit

NAMES = {"home": "/home/alice", "user": "alice", "host": "alice-laptop.example.org", "host_short": "alice-laptop"}


def fingerprint(i, cores, amx=False, gpu=None):
    return {"cpu_model": f"Test CPU {i}", "sockets": 1, "physical_cores": cores, "logical_cores": 2 * cores,
            "numa_nodes": 1, "bf16": {"avx2": True, "avx512": i > 0, "native_bf16": i > 0, "amx": amx},
            "accelerators": [gpu] if gpu else [], "openmp": ["libgomp.so.1"],
            "versions": {"torch": "2.8.0"}, "machine_id": f"{i:x}" * 16}


def synthetic_rows(i, cores, amx=False, gpu=None, slow=1.0, noisy=False):
    fp = fingerprint(i, cores, amx, gpu)
    # 8 interleaved rounds: a steady machine scales both variants alike in every round; on the noisy
    # one the rounds disturb the two variants in opposite directions (the verdict cannot call it)
    drift = [1.0, 0.98, 1.02, 1.0, 0.98, 1.02, 1.0, 1.0]
    if noisy:
        b32 = [2.0 + d for d in (0, -0.9, 0.9, 0, -0.9, 0.9, 0, 0)]
        b256 = [slow + d for d in (0, 0.9, -0.9, 0, 0.9, -0.9, 0, 0)]
    else:
        b32, b256 = [2.0 * d for d in drift], [slow * d for d in drift]
    rows = results.make_rows("02", "batch_size", {"b32": b32, "b256": b256},
                             metric="epoch_time", unit="s", baseline="b32", published={"b32": 10.0, "b256": 4.0},
                             published_source="book ch. 2", fingerprint=fp, profile="workshop", data="standin")
    rows += results.make_rows("02", "batch_size", {"b32": [80.0], "b256": [78.0]}, metric="accuracy", unit="%",
                              baseline="b32", lower_is_better=False, fingerprint=fp, profile="workshop",
                              data="standin")
    for r in rows:  # what a careless notebook might leave in a row
        r.extra = {"log": f"{NAMES['home']}/course/results/x.log", "who": NAMES["user"]}
    return rows


def write_submission(tmp_path, name, rows):
    payload = submit.pack(rows, NAMES)
    path = tmp_path / name
    path.write_text(json.dumps(payload))
    return path


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


def test_pool_three_synthetic_submissions_and_a_real_smoke_run(tmp_path, monkeypatch):
    subs = [write_submission(tmp_path, "submission-a.json", synthetic_rows(1, 2)),
            write_submission(tmp_path, "submission-b.json", synthetic_rows(2, 8, amx=True, slow=0.5)),
            write_submission(tmp_path, "submission-c.json", synthetic_rows(3, 16, gpu="NVIDIA H100", slow=1.9,
                                                                           noisy=True))]
    run = real_smoke_run(tmp_path, monkeypatch)
    real_sub, payload = submit.submit(run, out=tmp_path / "submission-real.json")
    assert payload["version"] == pool.SUBMISSION_VERSION and payload["rows"]
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


def test_repeated_submissions_from_one_machine_merge(tmp_path):
    first = write_submission(tmp_path, "submission-1.json", synthetic_rows(1, 2, slow=1.0))
    rows2 = synthetic_rows(1, 2, slow=0.8)
    for r in rows2:
        r.time = "2030-01-01T00:00:00+00:00"
    second = write_submission(tmp_path, "submission-2.json", rows2)
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


def test_unknown_versions_and_bad_inputs(tmp_path, capsys):
    sub = write_submission(tmp_path, "submission-a.json", synthetic_rows(1, 2))
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


def test_submission_leaks_no_user_host_or_path(tmp_path):
    rows = synthetic_rows(1, 2)
    rows[0].fingerprint = {**rows[0].fingerprint, "note": "built by alice on alice-laptop in /home/alice/x",
                           "cwd": "/work/course"}
    payload = submit.pack(rows, NAMES)
    text = json.dumps(payload)
    for secret in ("alice", "alice-laptop", "/home", "/work/course", "x.log"):
        assert secret not in text, secret
    assert submit.find_leaks(text, NAMES) == []
    assert set(submit.find_leaks("alice was in /tmp/x", NAMES)) == {"user", "a path"}
    assert "No user name, host name or path" in payload["contents"]
    assert len(payload["fingerprints"]) == 2 and payload["rows"][0]["fingerprint"] == 0
    back = pool.read_submission(write_submission(tmp_path, "submission-x.json", rows))
    assert [(r.variant, r.metric, r.median) for r in back] == [(r.variant, r.metric, r.median) for r in rows]
    with pytest.raises(submit.SubmitError, match="no result rows"):
        submit.pack([], NAMES)


def test_submit_real_machine_privacy_and_latest(tmp_path, monkeypatch):
    """On this machine, with its real user, host and paths: none of them reaches the file."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    root = tmp_path / "results"
    fp = {**fingerprint(5, 4), "cwd": str(tmp_path), "who": results.private_names().get("user", "")}
    old = results.make_rows("01", "a", {"x": [1.0]}, metric="t", unit="s", fingerprint=fp, profile="smoke", data="none")
    results.write_rows(old, root / "old" / results.ROWS_FILE)
    os.utime(root / "old" / results.ROWS_FILE, (1, 1))
    new = results.make_rows("01", "b", {"y": [2.0]}, metric="t", unit="s", fingerprint=fp, profile="smoke",
                            data="none")
    results.write_rows(new, root / "new" / results.ROWS_FILE)
    results.write_rows(old, root / results.ROWS_FILE)  # notebooks' running file: newest, but not a run
    assert submit.latest_rows_file(root) == root / "new" / results.ROWS_FILE
    target, payload = submit.submit(root=root)
    assert target.parent == root and target.name.startswith("submission-")
    text = target.read_text()
    names = results.private_names()
    assert submit.find_leaks(text, names) == [] and str(tmp_path) not in text
    assert [r["experiment"] for r in payload["rows"]] == ["b"]
    with pytest.raises(submit.SubmitError, match="make reproduce"):
        submit.submit(root=tmp_path / "nothing")
    proc = subprocess.run([sys.executable, "-m", "helpers.submit", str(root / "new")], capture_output=True, text=True,
                          cwd=tmp_path, env={**os.environ, "COURSE_RESULTS": str(root)})
    assert proc.returncode == 0 and "No user name, host name or path" in proc.stdout
    assert str(tmp_path) not in proc.stdout
