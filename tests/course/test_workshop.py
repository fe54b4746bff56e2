"""helpers.course.workshop: packing one machine's rows for an organiser (nothing private reaches the file),
pooling many machines' submissions and runs into one index, the row reports, machine classes and redaction.
The synthetic machines (fake_names, fingerprint, synthetic_rows, write_submission) are in conftest.py."""

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import results
from helpers.course import workshop
from helpers.tables import fmt

def test_submission_leaks_no_user_host_or_path(fake_names, synthetic_rows, write_submission):
    rows = synthetic_rows(1, 2)
    rows[0].fingerprint = {**rows[0].fingerprint, "note": "built by alice on alice-laptop in /home/alice/x",
                           "cwd": "/work/course"}
    payload = workshop.pack(rows, fake_names)
    text = json.dumps(payload)
    for secret in ("alice", "alice-laptop", "/home", "/work/course", "x.log"):
        assert secret not in text, secret
    assert workshop.find_leaks(text, fake_names) == []
    assert set(workshop.find_leaks("alice was in /tmp/x", fake_names)) == {"user", "a path"}
    assert workshop.find_leaks("see ~ or /home/alice", {"home": "/home/alice"}) == ["home", "a path"]
    assert workshop.pack(rows + synthetic_rows(2, 8), fake_names)["machine_id"] == f"{'1' * 16}, {'2' * 16}"
    assert "No user name, host name or path" in payload["contents"]
    assert len(payload["fingerprints"]) == 2 and payload["rows"][0]["fingerprint"] == 0
    back = workshop.read_submission(write_submission("submission-x.json", rows))
    assert [(r.variant, r.metric, r.median) for r in back] == [(r.variant, r.metric, r.median) for r in rows]
    with pytest.raises(workshop.SubmitError, match="no result rows"):
        workshop.pack([], fake_names)


def test_submit_real_machine_privacy_and_latest(tmp_path, monkeypatch, fingerprint):
    """On this machine, with its real user, host and paths: none of them reaches the file."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    root = tmp_path / "results"
    monkeypatch.setenv("COURSE_RESULTS", str(root))
    fp = {**fingerprint(5, 4), "cwd": str(tmp_path), "who": workshop.private_names().get("user", "")}
    old = results.make_rows("01", "a", {"x": [1.0]}, metric="t", unit="s", fingerprint=fp, profile="smoke", data="none")
    results.write_rows(old, root / "old" / results.ROWS_FILE)
    os.utime(root / "old" / results.ROWS_FILE, (1, 1))
    new = results.make_rows("01", "b", {"y": [2.0]}, metric="t", unit="s", fingerprint=fp, profile="smoke",
                            data="none")
    results.write_rows(new, root / "new" / results.ROWS_FILE)
    results.write_rows(old, root / results.ROWS_FILE)  # notebooks' running file: newest, but not a run
    assert workshop.rows_file(None, root) == root / "new" / results.ROWS_FILE
    target, payload = workshop.submit()
    assert target.parent == root and target.name.startswith("submission-")
    text = target.read_text()
    names = workshop.private_names()
    assert workshop.find_leaks(text, names) == [] and str(tmp_path) not in text
    assert [r["experiment"] for r in payload["rows"]] == ["b"]
    monkeypatch.setenv("COURSE_RESULTS", str(tmp_path / "nothing"))
    with pytest.raises(workshop.SubmitError, match="make reproduce"):
        workshop.submit()
    proc = subprocess.run([sys.executable, "-m", "helpers.course.workshop", "submit", str(root / "new")], capture_output=True, text=True,
                          cwd=tmp_path, env={**os.environ, "COURSE_RESULTS": str(root)})
    assert proc.returncode == 0 and "No user name, host name or path" in proc.stdout
    assert str(tmp_path) not in proc.stdout


def test_rows_file_takes_a_run_folder_a_rows_file_or_the_latest(tmp_path, synthetic_rows):
    root = tmp_path / "results"
    rows = synthetic_rows(1, 2)
    results.write_rows(rows, root / "run-a" / results.ROWS_FILE)
    results.write_rows(rows, root / "run-b" / "nested" / results.ROWS_FILE)
    os.utime(root / "run-a" / results.ROWS_FILE, (1, 1))  # run-b's file is the newer one
    assert workshop.rows_file(None, root) == root / "run-b" / "nested" / results.ROWS_FILE
    assert workshop.rows_file(root / "run-a", root) == root / "run-a" / results.ROWS_FILE  # its own rows.jsonl
    assert workshop.rows_file(root / "run-b", root) == root / "run-b" / "nested" / results.ROWS_FILE  # latest inside
    mine = tmp_path / "elsewhere.jsonl"
    mine.write_text("")
    assert workshop.rows_file(str(mine), root) == mine  # a file is taken as it is
    with pytest.raises(workshop.SubmitError, match="missing.jsonl does not exist"):
        workshop.rows_file(tmp_path / "missing.jsonl", root)
    (tmp_path / "empty").mkdir()
    with pytest.raises(workshop.SubmitError, match="no results under"):
        workshop.rows_file(tmp_path / "empty", root)


def test_describe_counts_rows_and_experiments(synthetic_rows):
    rows = synthetic_rows(1, 2)
    text = workshop.describe(rows)
    assert text.startswith("4 result rows (1 experiments: 02/batch_size; profile workshop; data standin). ")
    assert text.endswith("No user name, host name or path.")
    assert "Per row: chapter, experiment, variant," in text and "Per machine, once: accelerators, bf16," in text
    many = [r for i in range(13) for r in results.make_rows(f"{i:02d}", "x", {"a": [1.0]}, metric="t", unit="s",
                                                               fingerprint={}, profile="smoke", data="none")]
    assert "(13 experiments: 00/x, 01/x," in workshop.describe(many) and "11/x, ...;" in workshop.describe(many)


def test_main_writes_the_file_and_reports_errors_in_one_line(tmp_path, monkeypatch, capsys, synthetic_rows):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # the machine salt goes to a temporary cache
    root = tmp_path / "results"
    monkeypatch.setenv("COURSE_RESULTS", str(root))
    results.write_rows(synthetic_rows(1, 2), root / "run" / results.ROWS_FILE)
    monkeypatch.chdir(tmp_path)  # the file is named relative to where make runs, so the pool line can find it
    assert workshop.main(["submit"]) == 0
    out = capsys.readouterr().out
    written = sorted(root.glob("submission-*.json"))
    assert len(written) == 1 and f"wrote results/{written[0].name} (" in out and "for machine 1111111111111111" in out
    assert json.loads(written[0].read_text())["rows"][0]["experiment"] == "batch_size"
    assert workshop.main(["submit", str(tmp_path / "nothing-here")]) == 2
    assert capsys.readouterr().err == f"error: {tmp_path / 'nothing-here'} does not exist\n"


def real_smoke_run(tmp_path, monkeypatch, reproduce_cell):
    """A real (tiny) make-reproduce run: a notebook that measures and appends rows via COURSE_RESULTS."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # the machine salt goes to a temporary cache
    (tmp_path / "home").mkdir()
    run = reproduce_cell(
        "from helpers import measure, results\n"
        "res = [measure.time_fn(lambda: sum(range(20000)), repeats=3, name='sum'),\n"
        "       measure.time_fn(lambda: sum(range(10000)), repeats=3, name='half')]\n"
        "results.append_rows(results.rows_from_results('01', 'toy_sum', res, baseline='sum', metric='call_time'))",
        "toy")
    assert (run / results.ROWS_FILE).exists(), (run / "report.md").read_text()
    return run


def test_pool_three_synthetic_submissions_and_a_real_smoke_run(tmp_path, monkeypatch, synthetic_rows,
                                                               write_submission, reproduce_cell):
    subs = [write_submission("submission-a.json", synthetic_rows(1, 2)),
            write_submission("submission-b.json", synthetic_rows(2, 8, amx=True, slow=0.5)),
            write_submission("submission-c.json", synthetic_rows(3, 16, gpu="NVIDIA H100", slow=1.9, noisy=True))]
    run = real_smoke_run(tmp_path, monkeypatch, reproduce_cell)
    real_sub, payload = workshop.submit(run, out=tmp_path / "submission-real.json")
    assert payload["version"] == workshop.SUBMISSION_VERSION and payload["rows"]
    rows = workshop.load(subs + [real_sub])
    index = workshop.write_index(rows, tmp_path / "P")
    text = index.read_text()
    assert "4 machine(s)" in text
    for label in ("CPU 2 cores, AVX512-BF16", "CPU 8 cores, AMX", "1x NVIDIA H100"):
        assert label in text
    assert "### 01 / toy_sum: call_time (smoke profile)" in text  # the real run's lever
    assert "### 02 / batch_size: epoch_time (workshop profile)" in text
    lever = next(lv for lv in workshop.levers_of(rows)
                 if lv.title() == "02 / batch_size: epoch_time (workshop profile)")
    assert lever.published == {"b32": 1.0, "b256": 2.5}
    cells = {m: lever.cells[(m, "b256")] for m, _ in lever.cells if _ == "b256"}
    assert sorted(round(c.ratio, 3) for c in cells.values()) == [1.053, 2.0, 4.0]
    noisy = cells["3" * 16]
    assert noisy.unclear and noisy.ratio_low < 1 < noisy.ratio_high  # the verdict does not call it
    assert not cells["1" * 16].unclear and cells["1" * 16].ratio_low > 1.02  # faster
    assert "1.053 ~" in text and "2.500" in text  # measured beside published
    assert len(list((tmp_path / "P" / "figures").glob("*.png"))) == 3
    # deterministic: the order of the inputs does not change a byte
    again = workshop.write_index(workshop.load([real_sub] + subs[::-1]), tmp_path / "Q").read_text()
    assert again == text


def test_repeated_submissions_from_one_machine_merge(tmp_path, synthetic_rows, write_submission):
    first = write_submission("submission-1.json", synthetic_rows(1, 2, slow=1.0))
    rows2 = synthetic_rows(1, 2, slow=0.8)
    for r in rows2:
        r.time = "2030-01-01T00:00:00+00:00"
    second = write_submission("submission-2.json", rows2)
    rows = workshop.load([first, second, first])  # the same file twice counts once
    machines = workshop.machines_of(rows)
    assert len(machines) == 1 and len(next(iter(machines.values())).runs) == 2
    lever = workshop.levers_of(rows)[1]  # epoch_time sorts after accuracy
    cell = lever.cells[("1" * 16, "b256")]
    assert cell.median == pytest.approx(0.9)  # the median of the two runs' medians
    assert not cell.unclear and len(cell.values) == 16  # two runs of 8 paired rounds, judged together
    assert cell.min == pytest.approx(0.8 * 0.98) and cell.max == pytest.approx(1.02)
    text = workshop.write_index(rows, tmp_path / "P").read_text()
    assert "| 2 |" in text.split("## Comparisons")[0]  # runs merged column


def test_unknown_versions_and_bad_inputs(tmp_path, capsys, synthetic_rows, write_submission):
    sub = write_submission("submission-a.json", synthetic_rows(1, 2))
    payload = json.loads(sub.read_text())
    payload["version"] = 7
    (tmp_path / "future.json").write_text(json.dumps(payload))
    with pytest.raises(results.ResultsFormatError, match="format version 7.*git pull"):
        workshop.load([tmp_path / "future.json"])
    (tmp_path / "other.json").write_text('{"results": []}')
    with pytest.raises(results.ResultsFormatError, match="not a course submission"):
        workshop.load([tmp_path / "other.json"])
    (tmp_path / "empty").mkdir()
    assert workshop.main(["pool", str(tmp_path / "empty"), "--out", str(tmp_path / "P")]) == 2
    assert "no results in" in capsys.readouterr().err
    assert workshop.main(["pool", str(tmp_path / "future.json"), "--out", str(tmp_path / "P")]) == 2
    assert "format version 7" in capsys.readouterr().err
    with pytest.raises(ValueError, match="no result rows"):
        workshop.write_index([], tmp_path / "P")


def test_find_inputs_takes_rows_files_and_submissions(tmp_path, synthetic_rows, write_submission):
    rows = synthetic_rows(1, 2)
    results.write_rows(rows, tmp_path / "run" / "deep" / results.ROWS_FILE)
    sub = write_submission("submission-a.json", rows)
    (tmp_path / "notes.json").write_text("{}")  # neither a rows file nor a submission: not read
    assert workshop.find_inputs(tmp_path) == sorted([sub, tmp_path / "run" / "deep" / results.ROWS_FILE])
    assert workshop.find_inputs(tmp_path / "notes.json") == [tmp_path / "notes.json"]  # a file named is taken as it is
    with pytest.raises(FileNotFoundError, match="missing does not exist"):
        workshop.find_inputs(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="no results in .*submission-\\*.json files \\(make submit\\)"):
        workshop.find_inputs(tmp_path / "empty")


def test_machine_and_lever_tables_and_the_lever_figure(tmp_path, fingerprint, synthetic_rows):
    rows = synthetic_rows(1, 2) + synthetic_rows(2, 8, amx=True, slow=0.5)
    machines = workshop.machines_of(rows)
    table = workshop.machines_table(machines)
    assert table.rows == [["11111111", "CPU 2 cores, AVX512-BF16", "Test CPU 1", "2/4", "AVX512-BF16", "none", "2.8.0",
                           "workshop", 4, 1],
                          ["22222222", "CPU 8 cores, AMX", "Test CPU 2", "8/16", "AMX", "none", "2.8.0", "workshop", 4, 1]]
    epoch = next(lv for lv in workshop.levers_of(rows) if lv.metric == "epoch_time")
    assert epoch.baseline == "b32" and epoch.title() == "02 / batch_size: epoch_time (workshop profile)"
    lever = workshop.lever_table(epoch, machines)
    assert lever.columns == ["variant", "11111111 [CPU 2 cores, AVX512-BF16] ratio vs b32 (x)",
                             "22222222 [CPU 8 cores, AMX] ratio vs b32 (x)", "published ratio (x)"]
    # b256 takes half (machine 1) and a quarter (machine 2) of b32's time in every round; the book: 10 s -> 4 s
    assert lever.rows == [["b32", "1.000", "1.000", 1.0], ["b256", "2.000", "4.000", 2.5]]
    accuracy = next(lv for lv in workshop.levers_of(rows) if lv.metric == "accuracy")
    assert workshop.lever_table(accuracy, machines).rows[1] == ["b256", "0.975 ~", "0.975 ~", None]  # one round: unclear
    lonely = rows + [r for r in synthetic_rows(3, 4) if r.variant == "b256"]  # a machine without the baseline
    lonely_lever = next(lv for lv in workshop.levers_of(lonely) if lv.metric == "epoch_time")
    lonely_table = workshop.lever_table(lonely_lever, workshop.machines_of(lonely))
    assert lonely_table.as_dicts()[1]["33333333 [CPU 4 cores, AVX512-BF16] ratio vs b32 (x)"] is None  # no ratio
    plain_rows = results.make_rows("03", "x", {"a": [1.0, 2.0, 4.0]}, metric="load_time", unit="s",
                                   fingerprint=fingerprint(1, 2), profile="smoke", data="none")
    plain = workshop.levers_of(plain_rows)[0]
    assert plain.baseline is None and plain.title() == "03 / x: load_time (smoke profile)"
    assert workshop.lever_table(plain, workshop.machines_of(plain_rows)).rows == [["a", "2.000 (1.000 to 4.000)", None]]
    path = workshop.lever_figure(epoch, machines, tmp_path / "figs" / "epoch.png")
    assert path == tmp_path / "figs" / "epoch.png" and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    again = workshop.lever_figure(epoch, machines, tmp_path / "again.png")
    assert again.read_bytes() == path.read_bytes()  # no date or version in the file: the same figure, the same bytes



def test_tables_rendered_from_rows_carry_units_scope_and_data(tmp_path, sample_rows):
    assert workshop.metric_label("epoch_time", "s") == "s per epoch"
    assert workshop.metric_label("step_time", "ms") == "ms per step"
    assert workshop.metric_label("compile_time", "s") == "s per run"
    assert workshop.metric_label("throughput", "images/s") == "images/s"
    r = sample_rows
    t = workshop.rows_table(r[:2])
    assert t.columns[1] == "epoch_time median (s per epoch)" and "min (s per epoch)" in t.columns
    assert all("(" in c for c in t.columns[1:4] + t.columns[5:8])
    acc = workshop.rows_table(r[2:])
    assert acc.column("accuracy median (%)") == ["80.00 (stand-in)", "70.00 (stand-in)"]
    assert "stand-in" in acc.note
    md = workshop.render_markdown(r)
    assert md.count("### 02 / batch") == 2 and "(stand-in)" in md
    assert workshop.render_csv(r, tmp_path / "rows.csv") == tmp_path / "rows.csv"
    lines = (tmp_path / "rows.csv").read_text().splitlines()
    assert lines[0].startswith("chapter,experiment,variant,metric,unit,median") and len(lines) == 5
    assert "CPU 4 cores" in lines[1]


def test_quality_rows_value_format_and_grouping(sample_rows, fake_fingerprint):
    r = sample_rows
    assert [workshop.is_quality(x) for x in r] == [False, False, True, True]
    for metric in ("val_loss", "Top1", "max_abs_diff", "error_rate"):
        assert workshop.is_quality(dataclasses.replace(r[0], metric=metric))
    assert [fmt(v) for v in (2.0, 0.975, 1234.0, 1.234e-4)] == ["2.000", "0.975", "1,234", "1.2340e-04"]
    other = results.make_rows("01", "loader", {"w0": [1.0]}, metric="epoch_time", unit="s", fingerprint=fake_fingerprint,
                              profile="smoke", data="none")
    md = workshop.render_markdown([r[0], other[0], r[2], r[1], r[3]], heading_level=2)
    assert [line for line in md.splitlines() if line.startswith("#")] == [
        "## 02 / batch: epoch_time", "## 01 / loader: epoch_time", "## 02 / batch: accuracy"]  # as they first appear
    assert md.index("| b32 |") < md.index("| b256 |") < md.index("## 01 / loader")

def test_hardware_class_and_machine_key(fake_fingerprint):
    FP = fake_fingerprint
    assert workshop.hardware_class(FP) == "CPU 4 cores, AVX-512"
    assert workshop.isa_class({"bf16": {"amx": True}}) == "AMX"
    assert workshop.isa_class({}) == "unknown ISA"
    assert workshop.hardware_class({"accelerators": ["NVIDIA H100", "NVIDIA H100"]}) == "2x NVIDIA H100"
    assert workshop.machine_key({**FP, "machine_id": "abc"}) == "abc"
    assert workshop.machine_key({"machine_id": ""}) == workshop.machine_key({}) == "unknown"

def test_private_names():
    names = workshop.private_names()
    assert names["home"] == str(Path.home()) and names["host"]


def test_redact_text_with_this_machines_names():
    names = workshop.private_names()
    text = f"{names['home']}/course ran on {names['host']}"
    out = workshop.redact_text(text)
    assert names["home"] not in out and "<path>" in out
    if len(names["host"]) >= 2:
        assert "<host>" in out
    assert workshop.redact_text(text, all_paths=False).startswith("~/course")


def test_redact_removes_user_host_home_and_paths():
    names = {"home": "/home/alice", "user": "alice", "host": "alice-laptop.lan", "host_short": "alice-laptop"}
    text = "alice ran /home/alice/course/x.py on alice-laptop in /tmp/run, 256 images/s, ratio 1/2, ~/data"
    red = workshop.redact_text(text, names)
    for secret in ("alice", "/home", "/tmp", "~/data"):
        assert secret not in red
    assert "images/s" in red and "1/2" in red and "<user> ran <path>" in red and "<host>" in red
    local = workshop.redact_text("/home/alice/.cache/x and /usr/lib/libjemalloc.so", names, all_paths=False)
    assert local == "~/.cache/x and /usr/lib/libjemalloc.so"
    nested = workshop.redact({"a": ["alice", ("/home/alice",)], "alice": 3}, names)
    assert nested == {"a": ["<user>", ["<path>"]], "<user>": 3}
    assert workshop.redact_text("malice and alices", names) == "malice and alices"  # whole words only


def test_private_names_without_a_user_name(monkeypatch):
    def no_user():
        raise KeyError("uid not in the password database")  # a container started with an arbitrary uid

    monkeypatch.setattr("helpers.course.workshop.getpass.getuser", no_user)
    monkeypatch.setattr("helpers.course.workshop.socket.gethostname", lambda: "gpu7.cluster.example.org")
    names = workshop.private_names()
    assert "user" not in names and names["host"] == "gpu7.cluster.example.org" and names["host_short"] == "gpu7"
