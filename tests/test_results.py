import json
import statistics

import pytest

from helpers import results, system
from helpers.measure import Result



def test_make_rows_ratios_and_published(sample_rows, fake_fingerprint):
    r = {(x.variant, x.metric): x for x in sample_rows}
    fast = r[("b256", "epoch_time")]
    assert fast.median == 1.0 and fast.min == 0.9 and fast.max == 1.1 and fast.repeats == 3
    assert fast.ratio == pytest.approx(2.0) and fast.published_ratio == pytest.approx(2.5)
    assert fast.published_source == "book" and fast.version == results.SCHEMA_VERSION
    assert r[("b256", "accuracy")].ratio == pytest.approx(70 / 80) and not r[("b256", "accuracy")].lower_is_better
    with pytest.raises(ValueError, match="baseline"):
        results.make_rows("02", "x", {"a": [1.0]}, metric="t", unit="s", baseline="b", fingerprint=fake_fingerprint, profile="smoke",
                          data="none")
    with pytest.raises(ValueError, match="no measurements"):
        results.make_rows("02", "x", {"a": []}, metric="t", unit="s", fingerprint=fake_fingerprint, profile="smoke", data="none")


def test_rows_from_results_adds_quality_rows(sample_rows, fake_fingerprint):
    res = [Result("eager", [1.0, 1.2, 1.1], [3.0], {"accuracy": 81.0}), Result("compiled", [0.5, 0.6, 0.55], [30.0],
                                                                              {"accuracy": 80.0})]
    out = results.rows_from_results("03", "compile", res, baseline="eager", quality=[("accuracy", "%")],
                                    fingerprint=fake_fingerprint, profile="smoke", data="standin")
    assert [(r.variant, r.metric) for r in out] == [("eager", "epoch_time"), ("compiled", "epoch_time"),
                                                    ("eager", "accuracy"), ("compiled", "accuracy")]
    assert out[1].extra == {"warmup_median": 30.0} and out[1].ratio == pytest.approx(2.0)


def test_default_context_has_private_machine_id(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("COURSE_PROFILE", "smoke")
    row = results.make_rows("01", "x", {"a": [1.0]}, metric="t", unit="s")[0]
    assert row.profile == "smoke" and row.data == "standin" and row.versions.get("torch")
    assert row.fingerprint["machine_id"] == system.machine_id()
    assert (tmp_path / ".cache" / "accelerate-course" / "machine-salt").exists()


def test_append_read_write_roundtrip(tmp_path, monkeypatch, sample_rows):
    monkeypatch.setenv("COURSE_RESULTS", str(tmp_path / "run"))
    held, real_hold = [], results.hold
    monkeypatch.setattr("helpers.results.hold", lambda lock, **kw: held.append(lock) or real_hold(lock, **kw))
    path = results.append_rows(sample_rows[:2])
    results.append_rows(sample_rows[2:])
    assert path == tmp_path / "run" / results.ROWS_FILE
    assert held == [f"{path}.lock"] * 2  # every append under helpers.locks' lock beside the file
    back = results.read_rows(path)
    assert [r.variant for r in back] == ["b32", "b256", "b32", "b256"] and back[1].ratio == pytest.approx(2.0)
    results.write_rows(back[:1], tmp_path / "one.jsonl")
    assert len(results.read_rows(tmp_path / "one.jsonl")) == 1


def test_unknown_version_and_bad_lines(tmp_path, sample_rows):
    d = json.loads(json.dumps(results.asdict(sample_rows[0])))
    d["version"] = 99
    (tmp_path / "v.jsonl").write_text(json.dumps(d) + "\n")
    with pytest.raises(results.ResultsFormatError, match="version 99.*reads version 1"):
        results.read_rows(tmp_path / "v.jsonl")
    (tmp_path / "bad.jsonl").write_text("{not json\n")
    with pytest.raises(results.ResultsFormatError, match="line 1 is not JSON"):
        results.read_rows(tmp_path / "bad.jsonl")
    with pytest.raises(results.ResultsFormatError, match="lacks"):
        results.row_from_dict({"version": results.SCHEMA_VERSION, "chapter": "01"})






def test_append_rows_from_parallel_processes_keeps_every_row(tmp_path):
    import multiprocessing as mp

    path = tmp_path / "rows.jsonl"
    ctx = mp.get_context("fork")
    procs = [ctx.Process(target=_append_many, args=(path, i)) for i in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(30)
    rows = results.read_rows(path)
    assert sorted(r.variant for r in rows) == sorted(f"p{i}-{k}" for i in range(4) for k in range(25))


def _append_many(path, i):
    for k in range(25):
        row = results.make_rows("01", "x", {f"p{i}-{k}": [1.0]}, metric="t", unit="s",
                                fingerprint={"versions": {}}, profile="smoke", data="none")
        results.append_rows(row, path)


def test_results_dir_is_the_env_or_the_projects_results_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("COURSE_RESULTS", str(tmp_path / "mine"))
    assert results.results_dir() == tmp_path / "mine"
    monkeypatch.setenv("COURSE_RESULTS", "  ")  # blank: not set
    project = tmp_path / "course"
    (project / "notebooks").mkdir(parents=True)
    (project / "pyproject.toml").write_text("")
    monkeypatch.chdir(project / "notebooks")  # where notebooks run
    assert results.results_dir() == project.resolve() / "results"
    (tmp_path / "loose").mkdir()
    monkeypatch.chdir(tmp_path / "loose")  # a chapter's scratch folder, no project above it
    assert results.results_dir() == results.CHECKOUT / "results"  # the checkout helpers comes from
    monkeypatch.setattr(results, "CHECKOUT", tmp_path / "site-packages")  # helpers installed without a checkout
    assert results.results_dir() == (tmp_path / "loose").resolve() / "results"


def test_paired_rows_carry_the_verdicts_estimate():
    from helpers.verdict import hodges_lehmann, verdict

    base, var = [10.0, 12.0, 9.0, 11.0, 30.0, 10.5], [5.0, 7.0, 4.0, 6.0, 5.0, 5.5]
    row = next(r for r in results.make_rows("01", "x", {"a": base, "b": var}, metric="t", unit="s", baseline="a")
               if r.variant == "b")
    assert row.ratio == pytest.approx(verdict(base, var).ratio) == pytest.approx(hodges_lehmann([b / v for b, v in zip(base, var)]))
    assert row.ratio != pytest.approx(statistics.median(b / v for b, v in zip(base, var)))
    with pytest.raises(ValueError):
        hodges_lehmann([1.0, 0.0])
