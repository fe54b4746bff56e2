"""helpers.deploy: export a tiny model, run it in every engine, check agreement and messages."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch

from helpers import deploy, models, results
from helpers.checkpoints import save_checkpoint


def tiny_spec() -> deploy.ModelSpec:
    torch.manual_seed(0)
    return deploy.ModelSpec("tiny", models.small_cnn(3, 10).eval(), (3, 16, 16), "tiny test CNN")


def test_parse_size():
    assert deploy.parse_size("64") == (64, 64)
    assert deploy.parse_size("224x384") == (224, 384)
    assert deploy.parse_size(32) == (32, 32)
    for bad in ("0", "64x", "axb", "-3", "64x0"):
        with pytest.raises(deploy.DeployError, match="HxW"):
            deploy.parse_size(bad)


def test_parse_engines():
    assert deploy.parse_engines("eager, openvino:f32") == [("eager", None), ("openvino", "f32")]
    with pytest.raises(deploy.DeployError, match="Unknown engine 'tensorrt'"):
        deploy.parse_engines("eager,tensorrt")
    with pytest.raises(deploy.DeployError, match="Unknown precision"):
        deploy.parse_engines("openvino:int3")
    with pytest.raises(deploy.DeployError, match="precision it was exported in"):
        deploy.parse_engines("onnxruntime:bf16")
    with pytest.raises(deploy.DeployError, match="No engine"):
        deploy.parse_engines(" , ")


def test_every_engine_agrees_with_eager():
    found = deploy.compare(tiny_spec(), batch=4, engines="eager,onnxruntime,openvino:f32,openvino",
                           device="cpu", repeats=2, warmup=1, rounds=3, progress=False)
    by = {r.name: r for r in found}
    assert list(by) == ["eager", "onnxruntime", "openvino:f32", "openvino"]
    assert by["eager"].max_abs_diff == 0 and by["eager"].export_s == 0
    assert by["onnxruntime"].max_abs_diff < 1e-4 and by["onnxruntime"].top1_agreement == 1.0
    assert by["openvino:f32"].precision == "f32" and by["openvino:f32"].max_abs_diff < 1e-4
    import openvino as ov

    default = deploy._ov_precision(ov.Core().get_property("CPU", "INFERENCE_PRECISION_HINT"))
    assert by["openvino"].precision == default  # the plugin's own choice is reported, not assumed
    assert by["openvino"].max_abs_diff < 0.1
    for r in found:
        # one value per round (the median of its timed calls), one first call per round, agreement on >= 32 inputs
        assert r.batch == 4 and len(r.latencies) == 3 and r.agreement_n == 32
        assert len(r.warmup) == 3 + r.extra["reruns"]  # a first call in every round measured, re-runs too
        assert r.throughput == pytest.approx(4 / np.median(r.latencies))
        assert r.export_s > 0 or r.engine == "eager"
    table = deploy.results_table(found, baseline="eager")
    assert len(table) == 4 and table.rows[0][6] == pytest.approx(1.0) and table.column("verdict")[0] == "baseline"
    assert set(table.column("verdict")[1:]) == {"no measurable difference"}  # 3 rounds: too few for a verdict
    assert "images/s" in table.columns and "3 interleaved rounds" in table.note
    assert deploy.verdict(found, "onnxruntime").rounds == 3
    with pytest.raises(deploy.DeployError):
        deploy.verdict(found, "tensorrt")


def test_static_and_dynamic_exports_in_the_same_rounds():
    found = deploy.compare(tiny_spec(), batch=1, engines="onnxruntime", repeats=1, warmup=0, rounds=2,
                           also_dynamic=True, progress=False)
    assert [r.name for r in found] == ["onnxruntime", "onnxruntime (dynamic batch)"]
    assert [r.extra["dynamic_batch"] for r in found] == [False, True]
    assert all(len(r.latencies) == 2 for r in found) and found[0].rounds is found[1].rounds


def test_dynamic_batch_export(tmp_path):
    spec = tiny_spec()
    x = deploy.fixed_batch(spec.input_shape, 2)
    path = tmp_path / "m.onnx"
    deploy.export_onnx(spec.model, torch.from_numpy(x), path, dynamic_batch=True)
    run, precision = deploy.onnxruntime_runner(path, "CPUExecutionProvider")
    assert precision == "f32" and run(deploy.fixed_batch(spec.input_shape, 5)).shape == (5, 10)
    static = tmp_path / "s.onnx"
    deploy.export_onnx(spec.model, torch.from_numpy(x), static)
    run, _ = deploy.onnxruntime_runner(static, "CPUExecutionProvider")
    with pytest.raises(Exception, match="(?i)dimension"):
        run(deploy.fixed_batch(spec.input_shape, 5))


def test_export_failure_names_the_operator(tmp_path):
    class FFT(torch.nn.Module):
        def forward(self, x):
            return torch.fft.fft(x).real

    with pytest.raises(deploy.DeployError, match="operator aten::fft_fft at opset 17"):
        deploy.export_onnx(FFT(), torch.randn(1, 4), tmp_path / "f.onnx")
    pool = torch.nn.AdaptiveAvgPool2d(3)  # 4x4 -> 3x3: supported by PyTorch, not by the exporter
    with pytest.raises(deploy.DeployError, match="operator adaptive_avg_pool2d at opset 17"):
        deploy.export_onnx(pool, torch.randn(1, 1, 4, 4), tmp_path / "p.onnx")


def test_missing_engine_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # makes `import onnxruntime` fail
    with pytest.raises(deploy.DeployError, match=r"pip install onnxruntime==1\.32\.0"):
        deploy.onnxruntime_providers("cpu")


def test_unsupported_device_is_named():
    import onnxruntime as ort
    import openvino as ov

    if not any(d.startswith("GPU") for d in ov.Core().available_devices):
        with pytest.raises(deploy.DeployError, match="OpenVINO sees no Intel GPU"):
            deploy.openvino_devices("gpu")
    assert deploy.openvino_devices("cpu") == ["CPU"] and deploy.openvino_devices("auto")[0] == "CPU"
    if not set(deploy.GPU_PROVIDERS) & set(ort.get_available_providers()):
        with pytest.raises(deploy.DeployError, match="no GPU execution provider"):
            deploy.onnxruntime_providers("gpu")
    with pytest.raises(deploy.DeployError, match="Unknown --device"):
        deploy.compare(tiny_spec(), device="tpu")


def test_build_model_shapes_labels_and_checkpoints(tmp_path):
    book = deploy.build_model("book_cnn")
    assert book.input_shape == (1, 28, 28) and "random weights" in book.label and not book.model.training
    with pytest.raises(deploy.DeployError, match="28x28 images only"):
        deploy.build_model("book_cnn", size=(32, 32))
    blog = deploy.build_model("blog")
    assert blog.input_shape == (3, 224, 384) and "STAND-IN" in blog.label
    assert deploy.build_model("resnet18", size=(64, 48)).input_shape == (3, 64, 48)
    with pytest.raises(deploy.DeployError, match="Unknown model"):
        deploy.build_model("yolo9000")

    trained = models.book_cnn("fashionmnist")
    torch.nn.init.constant_(trained.fc2.bias, 0.5)
    save_checkpoint(tmp_path / "ck.pt", {"model": trained.state_dict()})
    loaded = deploy.build_model("book_cnn", checkpoint=tmp_path / "ck.pt")
    assert "trained weights from ck.pt" in loaded.label
    assert torch.equal(loaded.model.fc2.bias, trained.fc2.bias)
    with pytest.raises(deploy.DeployError, match="does not fit this model"):
        deploy.build_model("book_cnn_cifar10", checkpoint=tmp_path / "ck.pt")


def test_agreement():
    ref = np.array([[0.0, 1.0], [2.0, 0.0]], dtype=np.float32)
    assert deploy.agreement(ref + 0.25, ref) == (0.25, 1.0)
    assert deploy.agreement(ref[:, ::-1], ref) == (2.0, 0.0)
    with pytest.raises(deploy.DeployError, match="shape"):
        deploy.agreement(ref[:1], ref)


def test_rows_and_cli(tmp_path, capsys):
    rows_path = tmp_path / "rows.jsonl"
    found = deploy.main(["--model", "book_cnn", "--batch", "2", "--engines", "eager,onnxruntime",
                         "--repeats", "2", "--warmup", "0", "--rows", str(rows_path), "--device", "cpu"])
    out = capsys.readouterr().out
    assert "onnxruntime" in out and "top-1 agree %" in out and "4 result rows" in out
    rows = results.read_rows(rows_path)
    assert {(r.variant, r.metric, r.unit) for r in rows} == {
        ("eager", "throughput", "images/s"), ("onnxruntime", "throughput", "images/s"),
        ("eager", "latency", "ms"), ("onnxruntime", "latency", "ms")}
    assert all(r.chapter == "14" and r.experiment == "deploy_book_cnn_28x28_b2" for r in rows)
    thr = {r.variant: r for r in rows if r.metric == "throughput"}
    assert thr["eager"].ratio == pytest.approx(1.0) and not thr["eager"].lower_is_better
    assert thr["onnxruntime"].extra["precision"] == "f32" and thr["onnxruntime"].extra["max_abs_diff"] < 1e-4
    assert "reruns" in thr["eager"].extra
    assert len(found) == 2


def test_not_runnable_names_each_system_with_why_and_how():
    assert {"ONNX Runtime DirectML", "pytorch-directml", "dlprimitives OpenCL backend",
            "TensorFlow 2 / Keras"} == set(deploy.NOT_RUNNABLE)
    assert all(why and how for why, how in deploy.NOT_RUNNABLE.values())
    assert "train_on_batch" in deploy.NOT_RUNNABLE["TensorFlow 2 / Keras"][1]  # a training step, like the published row


def test_import_stays_light():
    code = "import helpers.deploy, sys; print(sorted(m for m in ('onnx', 'onnxruntime', 'openvino') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def engine_result(name="eager", latencies=(0.02, 0.01, 0.04), batch=4, **more):
    return deploy.EngineResult(name=name, engine=name.split(":")[0], device="cpu", precision="f32", batch=batch,
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


def test_import_engine_returns_the_module_or_says_how_to_install(monkeypatch):
    import json

    assert deploy.import_engine("json") is json
    monkeypatch.setitem(sys.modules, "openvino", None)
    with pytest.raises(deploy.DeployError, match=r"OpenVINO is not installed .*pip install openvino==2026\.4\.1"):
        deploy.import_engine("openvino")


def test_load_weights_fills_the_model_or_names_the_mismatch(tmp_path):
    trained = models.small_cnn(3, 10)
    torch.nn.init.constant_(trained[0].weight, 0.25)
    save_checkpoint(tmp_path / "w.pt", {"model": trained.state_dict()})
    fresh = models.small_cnn(3, 10)
    deploy.load_weights(fresh, tmp_path / "w.pt")
    assert all(torch.equal(a, b) for a, b in zip(fresh.state_dict().values(), trained.state_dict().values()))
    with pytest.raises(deploy.DeployError, match="Checkpoint w.pt does not fit this model"):
        deploy.load_weights(models.small_cnn(3, 5), tmp_path / "w.pt")


def test_eager_devices_and_runner(monkeypatch):
    assert deploy.eager_devices("cpu") == ["cpu"]
    monkeypatch.setattr(deploy.devices, "available_devices", lambda: ["xpu", "cpu"])
    assert deploy.eager_devices("gpu") == ["xpu"] and deploy.eager_devices("auto") == ["cpu", "xpu"]
    monkeypatch.setattr(deploy.devices, "available_devices", lambda: ["cpu"])
    with pytest.raises(deploy.DeployError, match="PyTorch sees no GPU here"):
        deploy.eager_devices("gpu")
    spec = tiny_spec()
    x = deploy.fixed_batch(spec.input_shape, 2)
    run, precision = deploy.eager_runner(spec.model, "cpu", None)
    with torch.inference_mode():
        expected = spec.model(torch.from_numpy(x)).numpy()
    assert precision == "f32" and np.array_equal(run(x), expected)
    bf16, precision = deploy.eager_runner(spec.model, "cpu", "bf16")
    out = bf16(x)
    assert precision == "bf16" and out.dtype == np.float32 and not np.array_equal(out, expected)  # autocast, fp32 out
    assert np.abs(out - expected).max() < 0.1


def test_openvino_runner_reports_the_precision_it_uses(tmp_path):
    spec = tiny_spec()
    x = deploy.fixed_batch(spec.input_shape, 2)
    path = tmp_path / "m.onnx"
    deploy.export_onnx(spec.model, torch.from_numpy(x), path)
    run, precision = deploy.openvino_runner(path, "CPU", "f32")
    with torch.inference_mode():
        expected = spec.model(torch.from_numpy(x)).numpy()
    assert precision == "f32" and np.abs(run(x) - expected).max() < 1e-4
    with pytest.raises(deploy.DeployError, match="OpenVINO could not compile the model for NOSUCHDEVICE"):
        deploy.openvino_runner(path, "NOSUCHDEVICE", None)
