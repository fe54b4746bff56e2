"""Tests of helpers.submit: packing one machine's rows for a workshop organiser -- nothing private
reaches the file (user, host, paths), fingerprints are stored once, the latest run is found, and
the command line. Pooling submissions: test_pool.py. The synthetic machines (fake_names,
fingerprint, synthetic_rows, write_submission) are fixtures in conftest.py."""

import json
import os
import subprocess
import sys

import pytest

from helpers import privacy, results, submit

def test_submission_leaks_no_user_host_or_path(fake_names, synthetic_rows, write_submission):
    rows = synthetic_rows(1, 2)
    rows[0].fingerprint = {**rows[0].fingerprint, "note": "built by alice on alice-laptop in /home/alice/x",
                           "cwd": "/work/course"}
    payload = submit.pack(rows, fake_names)
    text = json.dumps(payload)
    for secret in ("alice", "alice-laptop", "/home", "/work/course", "x.log"):
        assert secret not in text, secret
    assert submit.find_leaks(text, fake_names) == []
    assert set(submit.find_leaks("alice was in /tmp/x", fake_names)) == {"user", "a path"}
    assert "No user name, host name or path" in payload["contents"]
    assert len(payload["fingerprints"]) == 2 and payload["rows"][0]["fingerprint"] == 0
    back = submit.read_submission(write_submission("submission-x.json", rows))
    assert [(r.variant, r.metric, r.median) for r in back] == [(r.variant, r.metric, r.median) for r in rows]
    with pytest.raises(submit.SubmitError, match="no result rows"):
        submit.pack([], fake_names)


def test_submit_real_machine_privacy_and_latest(tmp_path, monkeypatch, fingerprint):
    """On this machine, with its real user, host and paths: none of them reaches the file."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    root = tmp_path / "results"
    fp = {**fingerprint(5, 4), "cwd": str(tmp_path), "who": privacy.private_names().get("user", "")}
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
    names = privacy.private_names()
    assert submit.find_leaks(text, names) == [] and str(tmp_path) not in text
    assert [r["experiment"] for r in payload["rows"]] == ["b"]
    with pytest.raises(submit.SubmitError, match="make reproduce"):
        submit.submit(root=tmp_path / "nothing")
    proc = subprocess.run([sys.executable, "-m", "helpers.submit", str(root / "new")], capture_output=True, text=True,
                          cwd=tmp_path, env={**os.environ, "COURSE_RESULTS": str(root)})
    assert proc.returncode == 0 and "No user name, host name or path" in proc.stdout
    assert str(tmp_path) not in proc.stdout


def test_rows_file_takes_a_run_folder_a_rows_file_or_the_latest(tmp_path, synthetic_rows):
    root = tmp_path / "results"
    rows = synthetic_rows(1, 2)
    results.write_rows(rows, root / "run-a" / results.ROWS_FILE)
    results.write_rows(rows, root / "run-b" / "nested" / results.ROWS_FILE)
    os.utime(root / "run-a" / results.ROWS_FILE, (1, 1))  # run-b's file is the newer one
    assert submit.rows_file(None, root) == root / "run-b" / "nested" / results.ROWS_FILE
    assert submit.rows_file(root / "run-a", root) == root / "run-a" / results.ROWS_FILE  # its own rows.jsonl
    assert submit.rows_file(root / "run-b", root) == root / "run-b" / "nested" / results.ROWS_FILE  # latest inside
    mine = tmp_path / "elsewhere.jsonl"
    mine.write_text("")
    assert submit.rows_file(str(mine), root) == mine  # a file is taken as it is
    with pytest.raises(submit.SubmitError, match="missing.jsonl does not exist"):
        submit.rows_file(tmp_path / "missing.jsonl", root)
    (tmp_path / "empty").mkdir()
    with pytest.raises(submit.SubmitError, match="no results under"):
        submit.rows_file(tmp_path / "empty", root)


def test_describe_counts_rows_and_experiments(synthetic_rows):
    rows = synthetic_rows(1, 2)
    text = submit.describe(rows)
    assert text.startswith("4 result rows (1 experiments: 02/batch_size; profile workshop; data standin). ")
    assert text.endswith("No user name, host name or path.")
    many = [r for i in range(13) for r in results.make_rows(f"{i:02d}", "x", {"a": [1.0]}, metric="t", unit="s",
                                                               fingerprint={}, profile="smoke", data="none")]
    assert "(13 experiments: 00/x, 01/x," in submit.describe(many) and "11/x, ...;" in submit.describe(many)


def test_main_writes_the_file_and_reports_errors_in_one_line(tmp_path, monkeypatch, capsys, synthetic_rows):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # the machine salt goes to a temporary cache
    root = tmp_path / "results"
    monkeypatch.setenv("COURSE_RESULTS", str(root))
    results.write_rows(synthetic_rows(1, 2), root / "run" / results.ROWS_FILE)
    assert submit.main([]) == 0
    out = capsys.readouterr().out
    written = sorted(root.glob("submission-*.json"))
    assert len(written) == 1 and f"wrote {written[0].name} (" in out and "for machine 1111111111111111" in out
    assert json.loads(written[0].read_text())["rows"][0]["experiment"] == "batch_size"
    assert submit.main([str(tmp_path / "nothing-here")]) == 2
    assert capsys.readouterr().err == f"error: {tmp_path / 'nothing-here'} does not exist\n"
