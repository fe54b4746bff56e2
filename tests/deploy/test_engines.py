"""helpers.deploy.engines: engine names and hints, export (static and dynamic batch, a clear failure), each engine's
runner and devices, agreement, and the message for a missing engine."""

from __future__ import annotations

import sys

import numpy as np
import pytest
import torch

from helpers import models
from helpers.deploy import engines, rounds, served


def tiny_spec() -> served.ModelSpec:
    torch.manual_seed(0)
    return served.ModelSpec("tiny", models.small_cnn(3, 10).eval(), (3, 16, 16), "tiny test CNN")


def test_parse_engines():
    assert engines.parse_engines("eager, openvino:f32") == [("eager", None), ("openvino", "f32")]
    with pytest.raises(engines.DeployError, match="Unknown engine 'tensorrt'"):
        engines.parse_engines("eager,tensorrt")
    with pytest.raises(engines.DeployError, match="Unknown precision"):
        engines.parse_engines("openvino:int3")
    with pytest.raises(engines.DeployError, match="precision it was exported in"):
        engines.parse_engines("onnxruntime:bf16")
    with pytest.raises(engines.DeployError, match="No engine"):
        engines.parse_engines(" , ")


def test_dynamic_batch_export(tmp_path):
    spec = tiny_spec()
    x = served.fixed_batch(spec.input_shape, 2)
    path = tmp_path / "m.onnx"
    engines.export_onnx(spec.model, torch.from_numpy(x), path, dynamic_batch=True)
    run, precision = engines.onnxruntime_runner(path, "CPUExecutionProvider")
    assert precision == "f32" and run(served.fixed_batch(spec.input_shape, 5)).shape == (5, 10)
    static = tmp_path / "s.onnx"
    engines.export_onnx(spec.model, torch.from_numpy(x), static)
    run, _ = engines.onnxruntime_runner(static, "CPUExecutionProvider")
    with pytest.raises(Exception, match="(?i)dimension"):
        run(served.fixed_batch(spec.input_shape, 5))


def test_export_failure_names_the_operator(tmp_path):
    class FFT(torch.nn.Module):
        def forward(self, x):
            return torch.fft.fft(x).real

    with pytest.raises(engines.DeployError, match="operator aten::fft_fft at opset 17"):
        engines.export_onnx(FFT(), torch.randn(1, 4), tmp_path / "f.onnx")
    pool = torch.nn.AdaptiveAvgPool2d(3)  # 4x4 -> 3x3: supported by PyTorch, not by the exporter
    with pytest.raises(engines.DeployError, match="operator adaptive_avg_pool2d at opset 17"):
        engines.export_onnx(pool, torch.randn(1, 1, 4, 4), tmp_path / "p.onnx")


def test_missing_engine_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # makes `import onnxruntime` fail
    with pytest.raises(engines.DeployError, match=r"pip install onnxruntime==1\.32\.0"):
        engines.onnxruntime_providers("cpu")


def test_unsupported_device_is_named():
    import onnxruntime as ort
    import openvino as ov

    if not any(d.startswith("GPU") for d in ov.Core().available_devices):
        with pytest.raises(engines.DeployError, match="OpenVINO sees no Intel GPU"):
            engines.openvino_devices("gpu")
    assert engines.openvino_devices("cpu") == ["CPU"] and engines.openvino_devices("auto")[0] == "CPU"
    if not set(engines.GPU_PROVIDERS) & set(ort.get_available_providers()):
        with pytest.raises(engines.DeployError, match="no GPU execution provider"):
            engines.onnxruntime_providers("gpu")
    with pytest.raises(engines.DeployError, match="Unknown --device"):
        rounds.compare(tiny_spec(), device="tpu")


def test_agreement():
    ref = np.array([[0.0, 1.0], [2.0, 0.0]], dtype=np.float32)
    assert engines.agreement(ref + 0.25, ref) == (0.25, 1.0)
    assert engines.agreement(ref[:, ::-1], ref) == (2.0, 0.0)
    with pytest.raises(engines.DeployError, match="shape"):
        engines.agreement(ref[:1], ref)


def test_import_engine_returns_the_module_or_says_how_to_install(monkeypatch):
    import json

    assert engines.import_engine("json") is json
    monkeypatch.setitem(sys.modules, "openvino", None)
    with pytest.raises(engines.DeployError, match=r"OpenVINO is not installed .*pip install openvino==2026\.4\.1"):
        engines.import_engine("openvino")


def test_eager_devices_and_runner(monkeypatch):
    assert engines.eager_devices("cpu") == ["cpu"]
    monkeypatch.setattr(engines.devices, "available_devices", lambda: ["xpu", "cpu"])
    assert engines.eager_devices("gpu") == ["xpu"] and engines.eager_devices("auto") == ["cpu", "xpu"]
    monkeypatch.setattr(engines.devices, "available_devices", lambda: ["cpu"])
    with pytest.raises(engines.DeployError, match="PyTorch sees no GPU here"):
        engines.eager_devices("gpu")
    spec = tiny_spec()
    x = served.fixed_batch(spec.input_shape, 2)
    run, precision = engines.eager_runner(spec.model, "cpu", None)
    with torch.inference_mode():
        expected = spec.model(torch.from_numpy(x)).numpy()
    assert precision == "f32" and np.array_equal(run(x), expected)
    bf16, precision = engines.eager_runner(spec.model, "cpu", "bf16")
    out = bf16(x)
    assert precision == "bf16" and out.dtype == np.float32 and not np.array_equal(out, expected)  # autocast, fp32 out
    assert np.abs(out - expected).max() < 0.1


def test_openvino_runner_reports_the_precision_it_uses(tmp_path):
    spec = tiny_spec()
    x = served.fixed_batch(spec.input_shape, 2)
    path = tmp_path / "m.onnx"
    engines.export_onnx(spec.model, torch.from_numpy(x), path)
    run, precision = engines.openvino_runner(path, "CPU", "f32")
    with torch.inference_mode():
        expected = spec.model(torch.from_numpy(x)).numpy()
    assert precision == "f32" and np.abs(run(x) - expected).max() < 1e-4
    with pytest.raises(engines.DeployError, match="OpenVINO could not compile the model for NOSUCHDEVICE"):
        engines.openvino_runner(path, "NOSUCHDEVICE", None)
