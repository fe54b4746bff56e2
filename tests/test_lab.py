import ast
import importlib
import time
from pathlib import Path

import pytest

from helpers import lab, measure, results, run_sizes, system

LAB = Path(lab.__file__)


def reexports() -> dict[str, tuple[str, str]]:
    """lab's name -> (core module, name there), read from lab.py's imports."""
    out = {}
    for node in ast.parse(LAB.read_text()).body:
        if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module:
            out.update({a.asname or a.name: (f"helpers.{node.module}", a.name) for a in node.names})
    return out


def test_every_name_resolves_to_its_core_module():
    assert callable(lab.start) and callable(lab.record) and len(reexports()) > 70
    for name, (module, attr) in reexports().items():
        assert getattr(lab, name) is getattr(importlib.import_module(module), attr), name


def test_the_flat_names_resolve_clashes():
    assert lab.describe_device is importlib.import_module("helpers.devices").describe
    assert lab.compare_accuracy.__module__ == "helpers.accuracy"


def test_start_prints_what_the_chapters_printed_and_starts_the_clock(monkeypatch, capsys):
    monkeypatch.setattr(system, "env_report", lambda: "torch x | cpu y")
    monkeypatch.setenv("COURSE_PROFILE", "smoke")
    before = time.perf_counter()
    clock = lab.start()
    assert before <= clock <= time.perf_counter()
    assert capsys.readouterr().out == f"torch x | cpu y\n{run_sizes.describe()}\n"


def rows_of(path: Path) -> list[tuple[str, str, str, float]]:
    return [(r.experiment, r.variant, r.metric, r.median) for r in results.read_rows(path)]


CONTEXT = dict(fingerprint={}, profile="smoke", data="none")


def test_record_takes_rounds_results_or_values(monkeypatch, tmp_path):
    monkeypatch.setenv("COURSE_RESULTS", str(tmp_path))
    rounds = measure.Rounds(["a", "b"], {"a": [2.0, 2.0], "b": [1.0, 1.0]}, {"a": [{}, {}], "b": [{}, {}]})
    path = lab.record(rounds, "01", "rounds", baseline="a", **CONTEXT)
    assert path == tmp_path / results.ROWS_FILE
    lab.record([measure.Result("c", [3.0], metrics={"accuracy": 50.0})], "01", "results",
               quality=[("accuracy", "%")], **CONTEXT)
    lab.record({"d": [4.0, 6.0]}, "01", "values", metric="step_time", unit="ms", **CONTEXT)
    assert rows_of(path) == [("rounds", "a", "epoch_time", 2.0), ("rounds", "b", "epoch_time", 1.0),
                             ("results", "c", "epoch_time", 3.0), ("results", "c", "accuracy", 50.0),
                             ("values", "d", "step_time", 5.0)]
    assert results.read_rows(path)[1].ratio == 2.0


def test_record_of_values_needs_a_metric(tmp_path, monkeypatch):
    monkeypatch.setenv("COURSE_RESULTS", str(tmp_path))
    with pytest.raises(TypeError):
        lab.record({"d": [1.0]}, "01", "values", **CONTEXT)
