"""helpers.deploy: the served models and sizes, every engine compared with eager in interleaved rounds (agreement,
static and dynamic exports, the A/A arm), the per-engine result, its table and rows, chapter 14's answers, batch
split, published-vs-yours table, figure and summary line, and the command line."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch

from helpers import deploy, measure, models, published, results
from helpers.checkpoints import save_checkpoint
from helpers.deploy import engines


def result(name, latencies, batch=4, diff=0.0, agree=1.0):
    return engine_result(name, latencies, batch=batch, warmup=[0.1], diff=diff, agree=agree)


def shared(*found):
    """``found`` given one ``measure.Rounds`` of their samples, as ``deploy.compare`` returns them."""
    got = measure.Rounds([r.name for r in found], {r.name: r.samples for r in found},
                         {r.name: [{}] * len(r.samples) for r in found})
    for r in found:
        r.rounds = got
    return list(found)


def test_parse_size():
    assert deploy.parse_size("64") == (64, 64)
    assert deploy.parse_size("224x384") == (224, 384)
    assert deploy.parse_size(32) == (32, 32)
    for bad in ("0", "64x", "axb", "-3", "64x0"):
        with pytest.raises(engines.DeployError, match="HxW"):
            deploy.parse_size(bad)


def test_build_model_shapes_labels_and_checkpoints(tmp_path):
    book = deploy.build_model("book_cnn")
    assert book.input_shape == (1, 28, 28) and "random weights" in book.label and not book.model.training
    with pytest.raises(engines.DeployError, match="28x28 images only"):
        deploy.build_model("book_cnn", size=(32, 32))
    blog = deploy.build_model("blog")
    assert blog.input_shape == (3, 224, 384) and "STAND-IN" in blog.label
    assert deploy.build_model("resnet18", size=(64, 48)).input_shape == (3, 64, 48)
    with pytest.raises(engines.DeployError, match="Unknown model"):
        deploy.build_model("yolo9000")

    trained = models.book_cnn("fashionmnist")
    torch.nn.init.constant_(trained.fc2.bias, 0.5)
    save_checkpoint(tmp_path / "ck.pt", {"model": trained.state_dict()})
    loaded = deploy.build_model("book_cnn", checkpoint=tmp_path / "ck.pt")
    assert "trained weights from ck.pt" in loaded.label
    assert torch.equal(loaded.model.fc2.bias, trained.fc2.bias)
    with pytest.raises(engines.DeployError, match="Checkpoint ck.pt does not fit this model"):
        deploy.build_model("book_cnn_cifar10", checkpoint=tmp_path / "ck.pt")


def test_every_engine_agrees_with_eager(monkeypatch, tiny_spec):
    monkeypatch.setenv("COURSE_PROFILE", "smoke")  # the rounds asked for (larger sizes complete the design)
    pytest.importorskip("openvino")  # no wheel for Linux aarch64: the next test runs the rest there
    found = deploy.compare(tiny_spec, batch=4, engines="eager,onnxruntime,openvino:f32,openvino",
                           device="cpu", repeats=2, warmup=1, rounds=3, progress=False)
    by = {r.name: r for r in found}
    assert list(by) == ["eager", "onnxruntime", "openvino:f32", "openvino", "A/A: eager again"]  # 3+ arms: an A/A arm
    assert by["eager"].metrics["max_abs_diff"] == 0 and by["eager"].metrics["export_s"] == 0
    assert by["onnxruntime"].metrics["max_abs_diff"] < 1e-4 and by["onnxruntime"].metrics["top1_agreement"] == 1.0
    assert by["openvino:f32"].precision == "f32" and by["openvino:f32"].metrics["max_abs_diff"] < 1e-4
    import openvino as ov

    default = engines._ov_precision(ov.Core().get_property("CPU", "INFERENCE_PRECISION_HINT"))
    assert by["openvino"].precision == default  # the plugin's own choice is reported, not assumed
    assert by["openvino"].metrics["max_abs_diff"] < 0.1
    for r in found:
        # one value per round (the median of its timed calls), one first call per round, agreement on >= 32 inputs
        assert isinstance(r, measure.Result)  # the one record
        assert r.settings["batch"] == 4 and len(r.samples) == 3 and r.settings["agreement_n"] == 32
        assert len(r.warmup) == 3 + r.settings["reruns"]  # a first call in every round measured, re-runs too
        assert r.throughput == pytest.approx(4 / np.median(r.samples))
        assert r.metrics["export_s"] > 0 or r.settings["engine"] == "eager"
        assert r.settings["exporter"] == (None if r.settings["engine"] == "eager" else "dynamo")  # the default
    table = deploy.results_table(found, baseline="eager")
    assert len(table) == 5 and table.rows[0][6] == pytest.approx(1.0) and table.column("verdict")[0] == "baseline"
    assert {v.split(" (")[0] for v in table.column("verdict")[1:-1]} == {"no measurable difference"}  # 3 rounds: no verdict
    assert table.column("verdict")[-1].startswith("A/A ")  # the A/A row says whether it passed, never a verdict word
    assert by["A/A: eager again"].settings["engine"] == "eager" and by["A/A: eager again"].metrics["max_abs_diff"] == 0
    assert "images/s" in table.columns and "3 interleaved rounds" in table.note
    assert deploy.verdict(found, "onnxruntime").rounds == 3
    with pytest.raises(engines.DeployError):
        deploy.verdict(found, "tensorrt")


def test_the_engines_that_import_run_without_openvino(monkeypatch, tiny_spec):
    monkeypatch.setitem(sys.modules, "openvino", None)  # as on Linux aarch64, where it has no wheel
    here, missing = engines.available_engines()
    found = deploy.compare(tiny_spec, batch=2, engines=here, repeats=1, warmup=0, rounds=2, progress=False)
    assert [r.name for r in found] == ["eager", "onnxruntime"] and "openvino" in missing
    assert found[1].metrics["max_abs_diff"] < 1e-4 and all(len(r.samples) == 2 for r in found)


def test_static_and_dynamic_exports_in_the_same_rounds(tiny_spec):
    found = deploy.compare(tiny_spec, batch=1, engines="onnxruntime", repeats=1, warmup=0, rounds=2,
                           also_dynamic=True, progress=False, exporter="torchscript")
    assert [r.name for r in found] == ["onnxruntime", "onnxruntime (dynamic batch)"]
    assert [r.settings["dynamic_batch"] for r in found] == [False, True]
    assert [r.settings["exporter"] for r in found] == ["torchscript", "torchscript"]
    assert all(r.metrics["max_abs_diff"] < 1e-4 for r in found)
    assert all(len(r.samples) == 2 for r in found) and found[0].rounds is found[1].rounds


def test_three_arms_carry_an_aa_arm_with_its_own_sessions(monkeypatch, tiny_spec):
    monkeypatch.setenv("COURSE_PROFILE", "smoke")
    built = []
    real = deploy.eager_runner

    def counting(model, target, hint):
        built.append(target)
        return real(model, target, hint)

    monkeypatch.setattr("helpers.deploy.eager_runner", counting)
    found = deploy.compare(tiny_spec, batch=1, engines="eager,onnxruntime", also_dynamic=True, repeats=1, warmup=0,
                           rounds=2, progress=False, exporter="torchscript")
    assert [r.name for r in found] == ["eager", "onnxruntime", "onnxruntime (dynamic batch)", "A/A: eager again"]
    aa = found[-1]
    assert aa.settings["engine"] == "eager" and len(aa.samples) == 2 and found[0].rounds.aa == "A/A: eager again"
    # the reference, then a fresh eager session per arm (baseline and A/A) in every round, re-run rounds too
    assert len(built) == 1 + 2 * (2 + aa.settings["reruns"])
    assert [r.name for r in deploy.compare(tiny_spec, batch=1, engines="eager,onnxruntime", repeats=1, warmup=0,
                                           rounds=2, progress=False)] == ["eager", "onnxruntime"]  # 2 arms: no A/A


def test_a_failed_aa_arm_turns_every_verdict_into_disturbed(monkeypatch, tiny_spec):
    real = measure.interleaved

    def failing(*args, **kwargs):
        got = real(*args, **kwargs)
        got.aa_failed = True  # as when the baseline measured against itself got a verdict in every attempt
        return got

    monkeypatch.setattr(measure, "interleaved", failing)
    found = deploy.compare(tiny_spec, batch=1, engines="eager,onnxruntime", also_dynamic=True, repeats=1, warmup=0,
                           rounds=2, progress=False, exporter="torchscript")
    table = deploy.results_table(found)
    assert table.column("verdict")[:3] == ["baseline", measure.DISTURBED, measure.DISTURBED]
    assert table.column("verdict")[3].startswith("A/A ")  # the A/A row (forced failed here) carries no verdict word
    assert deploy.verdict(found, "onnxruntime").word == measure.DISTURBED
    assert deploy.verdict(found, "onnxruntime (dynamic batch)", baseline="onnxruntime").word == measure.DISTURBED


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
    table = deploy.results_table(found)
    verdicts = dict(zip(table.column("engine"), table.column("verdict")))
    expected = measure.DISTURBED if aa_failed else "faster"
    assert verdicts["onnxruntime"] == expected == deploy.verdict(found, "onnxruntime").word
    assert verdicts["openvino"].startswith(measure.DISTURBED if aa_failed else "no measurable difference (could see")
    assert verdicts["A/A: eager again"] == "A/A passed (contains 1.0)"  # the A/A arm says whether it passed
    assert deploy.verdict(found, "onnxruntime").ratio == pytest.approx(1.25)  # ratio and interval still given
    with pytest.raises(engines.DeployError):
        deploy.verdict(found, "onnxruntime", baseline="tensorrt")


def engine_result(name="eager", latencies=(0.02, 0.01, 0.04), batch=4, warmup=(0.5, 0.4, 0.6), diff=0.0, agree=1.0,
                  rounds=None, **settings):
    return deploy.EngineResult(name, list(latencies), list(warmup),
                               {"export_s": 0.0, "load_s": 0.1, "max_abs_diff": diff, "top1_agreement": agree},
                               {"engine": name.split(":")[0], "device": "cpu", "precision": "f32", "batch": batch,
                                "agreement_n": 32, **settings}, rounds=rounds)


def test_engine_result_latency_and_throughput():
    r = engine_result()
    assert r.latency_ms == pytest.approx(20.0) and r.throughput == pytest.approx(4 / 0.02) and r.precision == "f32"
    assert r.stats.median == 0.02 and isinstance(r, measure.Result)


def test_to_rows_throughput_and_latency_per_engine():
    found = [engine_result(), engine_result("onnxruntime", (0.01, 0.005, 0.02), reruns=0)]
    rows = deploy.to_rows(found, experiment="deploy_x", data="none", label="tiny CNN")
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


def test_answers_count_accuracy_and_agreement_per_engine():
    x = torch.zeros(6, 2)
    labels = torch.tensor([0, 1, 0, 1, 0, 1])
    loader = [(x[:3], labels[:3]), (x[3:], labels[3:])]
    engines = {"eager": lambda b: np.tile([1.0, 0.0], (len(b), 1)),      # always class 0
               "other": lambda b: np.tile([0.0, 1.0], (len(b), 1))}      # always class 1
    acc, same, n = deploy.answers(engines, loader)
    assert n == 6 and acc == {"eager": 50.0, "other": 50.0} and same == {"eager": 100.0, "other": 0.0}
    table = deploy.answers_table(acc, same, n)
    assert "Answers on 6 test images" in str(table)
    with pytest.raises(ValueError):
        deploy.answers(engines, [])


def test_batch_split_recovers_fixed_and_per_image_cost():
    # latency = 1 ms fixed + 0.5 ms per image: batch 9 takes 5.5 ms, batch 1 takes 1.5 ms
    big, one = [result("eager", [5.5e-3] * 3, batch=9)], [result("eager", [1.5e-3] * 3, batch=1)]
    text = str(deploy.batch_split(big, one, 9))
    row = next(line for line in text.splitlines() if line.startswith("eager"))
    assert [float(v) for v in row.split()[-2:]] == pytest.approx([0.5, 1.0])
    with pytest.raises(ValueError):
        deploy.batch_split(big, one, 1)


def test_published_vs_yours_and_summary_line():
    runs = shared(result("eager", [1.0, 1.1, 0.9, 1.05, 0.95, 1.0]),
                  result("onnxruntime", [0.5, 0.55, 0.45, 0.5, 0.52, 0.48], diff=2e-6))
    pub = published.select(published.load("arc_blog"), experiment="yolox_tiny_inference_directml")
    text = str(deploy.published_vs_yours(runs, pub, "titan_rtx"))
    assert "published" in text and "yours" in text and "onnxruntime (f32)" in text and "faster" in text
    line = deploy.verdicts_line(runs)
    assert line.startswith("onnxruntime 2.") and "faster" in line and "max |diff| 2.0e-06 (onnxruntime)" in line


def test_ratio_bars_draws_one_bar_per_engine_and_published():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = shared(result("eager", [1.0, 1.1, 0.9, 1.05, 0.95, 1.0]), result("openvino", [0.5, 0.55, 0.45, 0.5, 0.52, 0.48]))
    fig, ax = plt.subplots()
    deploy.ratio_bars(ax, runs, "t", {"published\nx": 0.8}, "published")
    assert len(ax.patches) == 3
    plt.close(fig)


def test_rows_and_cli(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COURSE_RESULTS", str(tmp_path))
    rows_path = tmp_path / "rows.jsonl"
    found = deploy.main(["--model", "book_cnn", "--batch", "2", "--engines", "eager,onnxruntime",
                         "--repeats", "2", "--warmup", "0", "--device", "cpu"])
    out = capsys.readouterr().out
    assert "onnxruntime" in out and "top-1 agree %" in out and "4 result rows" in out
    assert "exporter: torch.onnx.export(dynamo=True), the default since torch 2.9, opset 20" in out
    rows = results.read_rows(rows_path)
    assert {(r.variant, r.metric, r.unit) for r in rows} == {
        ("eager", "throughput", "images/s"), ("onnxruntime", "throughput", "images/s"),
        ("eager", "latency", "ms"), ("onnxruntime", "latency", "ms")}
    assert all(r.chapter == "14" and r.experiment == "deploy_book_cnn_28x28_b2" for r in rows)
    thr = {r.variant: r for r in rows if r.metric == "throughput"}
    assert thr["eager"].ratio == pytest.approx(1.0) and not thr["eager"].lower_is_better
    assert thr["onnxruntime"].extra["precision"] == "f32" and thr["onnxruntime"].extra["max_abs_diff"] < 1e-4
    assert "reruns" in thr["eager"].extra
    assert thr["onnxruntime"].extra["exporter"] == "dynamo" and thr["eager"].extra["exporter"] is None
    assert len(found) == 2


def test_cli_default_engines_leave_out_openvino_where_it_does_not_import(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "openvino", None)  # as on Linux aarch64, where it has no wheel
    monkeypatch.setenv("COURSE_RESULTS", str(tmp_path))
    found = deploy.main(["--model", "book_cnn", "--batch", "2", "--repeats", "1", "--warmup", "0", "--rounds", "2",
                         "--device", "cpu"])
    out = capsys.readouterr().out
    assert [r.name for r in found] == ["eager", "onnxruntime"]
    said = [line for line in out.splitlines() if line.startswith("OpenVINO")]
    assert said == [f"{engines.available_engines()[1]['openvino']}: left out of the default engines"]
    with pytest.raises(deploy.DeployError, match="OpenVINO is not installed"):  # asked for by name: the clear error
        deploy.main(["--model", "book_cnn", "--engines", "eager,openvino"])
    assert len(results.read_rows(tmp_path / "rows.jsonl")) == 4  # the first run's rows only


def test_cli_table_has_an_aa_row_with_three_engines(tmp_path, capsys, monkeypatch):
    pytest.importorskip("openvino")  # no wheel for Linux aarch64
    monkeypatch.setenv("COURSE_RESULTS", str(tmp_path))
    found = deploy.main(["--model", "book_cnn", "--batch", "2", "--engines", "eager,onnxruntime,openvino:f32",
                         "--repeats", "1", "--warmup", "0", "--rounds", "2", "--device", "cpu"])
    out = capsys.readouterr().out
    assert [r.name for r in found][-1] == "A/A: eager again"
    assert any(line.startswith("A/A: eager again ") for line in out.splitlines())  # its own row in the table


def test_cli_exporter_choice():
    assert deploy._parser().parse_args([]).exporter == "dynamo"
    assert deploy._parser().parse_args(["--exporter", "torchscript"]).exporter == "torchscript"
    with pytest.raises(SystemExit):
        deploy._parser().parse_args(["--exporter", "jit"])


def test_import_stays_light():
    code = "import helpers.deploy, sys; print(sorted(m for m in ('onnx', 'onnxruntime', 'openvino') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
