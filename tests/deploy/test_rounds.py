"""helpers.deploy.rounds: every engine compared with eager in interleaved rounds (agreement, static and dynamic
exports), the per-engine result and its rows."""

from __future__ import annotations

import sys

import numpy as np
import pytest
import torch

from helpers import measure, models
from helpers.deploy import engines, rounds, served


def tiny_spec() -> served.ModelSpec:
    torch.manual_seed(0)
    return served.ModelSpec("tiny", models.small_cnn(3, 10).eval(), (3, 16, 16), "tiny test CNN")


def test_every_engine_agrees_with_eager(monkeypatch):
    monkeypatch.setenv("COURSE_PROFILE", "smoke")  # the rounds asked for (larger sizes complete the design)
    pytest.importorskip("openvino")  # no wheel for Linux aarch64: the next test runs the rest there
    found = rounds.compare(tiny_spec(), batch=4, engines="eager,onnxruntime,openvino:f32,openvino",
                           device="cpu", repeats=2, warmup=1, rounds=3, progress=False)
    by = {r.name: r for r in found}
    assert list(by) == ["eager", "onnxruntime", "openvino:f32", "openvino", "A/A: eager again"]  # 3+ arms: an A/A arm
    assert by["eager"].max_abs_diff == 0 and by["eager"].export_s == 0
    assert by["onnxruntime"].max_abs_diff < 1e-4 and by["onnxruntime"].top1_agreement == 1.0
    assert by["openvino:f32"].precision == "f32" and by["openvino:f32"].max_abs_diff < 1e-4
    import openvino as ov

    default = engines._ov_precision(ov.Core().get_property("CPU", "INFERENCE_PRECISION_HINT"))
    assert by["openvino"].precision == default  # the plugin's own choice is reported, not assumed
    assert by["openvino"].max_abs_diff < 0.1
    for r in found:
        # one value per round (the median of its timed calls), one first call per round, agreement on >= 32 inputs
        assert r.batch == 4 and len(r.latencies) == 3 and r.agreement_n == 32
        assert len(r.warmup) == 3 + r.extra["reruns"]  # a first call in every round measured, re-runs too
        assert r.throughput == pytest.approx(4 / np.median(r.latencies))
        assert r.export_s > 0 or r.engine == "eager"
        assert r.extra["exporter"] == (None if r.engine == "eager" else "dynamo")  # torch.onnx.export's default
    table = rounds.results_table(found, baseline="eager")
    assert len(table) == 5 and table.rows[0][6] == pytest.approx(1.0) and table.column("verdict")[0] == "baseline"
    assert {v.split(" (")[0] for v in table.column("verdict")[1:-1]} == {"no measurable difference"}  # 3 rounds: no verdict
    assert table.column("verdict")[-1].startswith("A/A ")  # the A/A row says whether it passed, never a verdict word
    assert by["A/A: eager again"].engine == "eager" and by["A/A: eager again"].max_abs_diff == 0
    assert "images/s" in table.columns and "3 interleaved rounds" in table.note
    assert rounds.verdict(found, "onnxruntime").rounds == 3
    with pytest.raises(engines.DeployError):
        rounds.verdict(found, "tensorrt")
    with pytest.raises(engines.DeployError, match="Unknown exporter 'jit'"):
        rounds.compare(tiny_spec(), exporter="jit")


def test_the_engines_that_import_run_without_openvino(monkeypatch):
    monkeypatch.setitem(sys.modules, "openvino", None)  # as on Linux aarch64, where it has no wheel
    here, missing = engines.available_engines()
    found = rounds.compare(tiny_spec(), batch=2, engines=here, repeats=1, warmup=0, rounds=2, progress=False)
    assert [r.name for r in found] == ["eager", "onnxruntime"] and "openvino" in missing
    assert found[1].max_abs_diff < 1e-4 and all(len(r.latencies) == 2 for r in found)


def test_static_and_dynamic_exports_in_the_same_rounds():
    found = rounds.compare(tiny_spec(), batch=1, engines="onnxruntime", repeats=1, warmup=0, rounds=2,
                           also_dynamic=True, progress=False, exporter="torchscript")
    assert [r.name for r in found] == ["onnxruntime", "onnxruntime (dynamic batch)"]
    assert [r.extra["dynamic_batch"] for r in found] == [False, True]
    assert [r.extra["exporter"] for r in found] == ["torchscript", "torchscript"]
    assert all(r.max_abs_diff < 1e-4 for r in found)
    assert all(len(r.latencies) == 2 for r in found) and found[0].rounds is found[1].rounds


def test_three_arms_carry_an_aa_arm_with_its_own_sessions(monkeypatch):
    monkeypatch.setenv("COURSE_PROFILE", "smoke")
    built = []
    real = rounds.eager_runner

    def counting(model, target, hint):
        built.append(target)
        return real(model, target, hint)

    monkeypatch.setattr(rounds, "eager_runner", counting)
    found = rounds.compare(tiny_spec(), batch=1, engines="eager,onnxruntime", also_dynamic=True, repeats=1, warmup=0,
                           rounds=2, progress=False, exporter="torchscript")
    assert [r.name for r in found] == ["eager", "onnxruntime", "onnxruntime (dynamic batch)", "A/A: eager again"]
    aa = found[-1]
    assert aa.engine == "eager" and len(aa.latencies) == 2 and found[0].rounds.aa == "A/A: eager again"
    # the reference, then a fresh eager session per arm (baseline and A/A) in every round, re-run rounds too
    assert len(built) == 1 + 2 * (2 + aa.extra["reruns"])
    assert [r.name for r in rounds.compare(tiny_spec(), batch=1, engines="eager,onnxruntime", repeats=1, warmup=0,
                                           rounds=2, progress=False)] == ["eager", "onnxruntime"]  # 2 arms: no A/A


def test_a_failed_aa_arm_turns_every_verdict_into_disturbed(monkeypatch):
    real = measure.interleaved

    def failing(*args, **kwargs):
        got = real(*args, **kwargs)
        got.aa_failed = True  # as when the baseline measured against itself got a verdict in every attempt
        return got

    monkeypatch.setattr(measure, "interleaved", failing)
    found = rounds.compare(tiny_spec(), batch=1, engines="eager,onnxruntime", also_dynamic=True, repeats=1, warmup=0,
                           rounds=2, progress=False, exporter="torchscript")
    table = rounds.results_table(found)
    assert table.column("verdict")[:3] == ["baseline", measure.DISTURBED, measure.DISTURBED]
    assert table.column("verdict")[3].startswith("A/A ")  # the A/A row (forced failed here) carries no verdict word
    assert rounds.verdict(found, "onnxruntime").word == measure.DISTURBED
    assert rounds.verdict(found, "onnxruntime (dynamic batch)", baseline="onnxruntime").word == measure.DISTURBED


def shared_rounds(aa_failed: bool) -> measure.Rounds:
    """Ten rounds: onnxruntime 20% faster than eager in every round, the A/A arm within 0.5% of eager."""
    eager = [0.010 * (1 + 0.03 * (i % 3)) for i in range(10)]
    samples = {"eager": eager, "onnxruntime": [t / 1.25 for t in eager], "openvino": [t * 1.001 for t in eager],
               "A/A: eager again": [t * (1.004 if i % 2 else 0.996) for i, t in enumerate(eager)]}
    return measure.Rounds(list(samples), samples, {n: [{}] * 10 for n in samples}, aa_failed=aa_failed)


@pytest.mark.parametrize("aa_failed", [False, True])
def test_verdict_and_table_follow_the_rounds_verdict(aa_failed):
    got = shared_rounds(aa_failed)
    found = [engine_result(n, got.samples[n], rounds=got) for n in got.names]
    table = rounds.results_table(found)
    verdicts = dict(zip(table.column("engine"), table.column("verdict")))
    expected = measure.DISTURBED if aa_failed else "faster"
    assert verdicts["onnxruntime"] == expected == rounds.verdict(found, "onnxruntime").word
    assert verdicts["openvino"].startswith(measure.DISTURBED if aa_failed else "no measurable difference (could see")
    assert verdicts["A/A: eager again"] == "A/A passed (contains 1.0)"  # the A/A arm says whether it passed
    assert rounds.verdict(found, "onnxruntime").ratio == pytest.approx(1.25)  # ratio and interval still given
    # results without shared rounds (built apart): the plain helpers.measure.verdict
    apart = [engine_result(n, got.samples[n]) for n in got.names]
    assert rounds.verdict(apart, "onnxruntime").word == "faster"
    with pytest.raises(engines.DeployError):
        rounds.verdict(found, "onnxruntime", baseline="tensorrt")


def engine_result(name="eager", latencies=(0.02, 0.01, 0.04), batch=4, **more):
    return rounds.EngineResult(name=name, engine=name.split(":")[0], device="cpu", precision="f32", batch=batch,
                               latencies=list(latencies), warmup=[0.5, 0.4, 0.6], export_s=0.0, load_s=0.1,
                               max_abs_diff=0.0, top1_agreement=1.0, agreement_n=32, **more)


def test_engine_result_latency_throughput_and_result():
    r = engine_result()
    assert r.latency_ms == pytest.approx(20.0) and r.throughput == pytest.approx(4 / 0.02)
    assert r.throughputs() == pytest.approx([200.0, 400.0, 100.0])  # one per round, in round order
    res = r.as_result()
    assert res.name == "eager" and res.samples == [0.02, 0.01, 0.04] and res.warmup == [0.5, 0.4, 0.6]
    assert res.metrics == {"images_per_s": pytest.approx(200.0), "max_abs_diff": 0.0, "top1_agreement": 100.0}
    assert res.settings == {"engine": "eager", "device": "cpu", "precision": "f32"}


def test_to_rows_throughput_and_latency_per_engine():
    found = [engine_result(), engine_result("onnxruntime", (0.01, 0.005, 0.02), extra={"reruns": 0})]
    rows = rounds.to_rows(found, experiment="deploy_x", data="none", label="tiny CNN")
    assert [(r.variant, r.metric, r.unit) for r in rows] == [
        ("eager", "throughput", "images/s"), ("onnxruntime", "throughput", "images/s"),
        ("eager", "latency", "ms"), ("onnxruntime", "latency", "ms")]
    thr = {r.variant: r for r in rows if r.metric == "throughput"}
    lat = {r.variant: r for r in rows if r.metric == "latency"}
    assert thr["onnxruntime"].values == pytest.approx([400.0, 800.0, 200.0]) and not thr["onnxruntime"].lower_is_better
    assert thr["onnxruntime"].ratio == pytest.approx(2.0) and lat["onnxruntime"].ratio == pytest.approx(2.0)
    assert lat["eager"].values == pytest.approx([20.0, 10.0, 40.0]) and lat["eager"].baseline == "eager"
    assert thr["eager"].chapter == "14" and thr["eager"].extra["first_call_s"] == 0.5
    assert thr["eager"].extra["model"] == "tiny CNN" and thr["onnxruntime"].extra["reruns"] == 0
