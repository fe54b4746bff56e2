from pathlib import Path

from helpers import privacy, results


def test_results_reexports_privacy():
    assert results.machine_id is privacy.machine_id and results.redact is privacy.redact


def test_private_names_and_cache_dir(monkeypatch, tmp_path):
    names = privacy.private_names()
    assert names["home"] == str(Path.home()) and names["host"]
    monkeypatch.setenv("HOME", str(tmp_path))
    assert privacy.cache_dir() == tmp_path / ".cache" / "accelerate-course"
    ident = privacy.machine_id()
    assert (privacy.cache_dir() / "machine-salt").exists() and privacy.machine_id() == ident


def test_redact_text_with_this_machines_names():
    names = privacy.private_names()
    text = f"{names['home']}/course ran on {names['host']}"
    out = privacy.redact_text(text)
    assert names["home"] not in out and "<path>" in out
    if len(names["host"]) >= 2:
        assert "<host>" in out
    assert privacy.redact_text(text, all_paths=False).startswith("~/course")
