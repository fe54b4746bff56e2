"""helpers.deploy.engines: engine names and hints, export with either exporter (dynamo, the default, and
TorchScript; static and dynamic batch, a clear failure), each engine's runner and devices, agreement, the
message for a missing engine or onnxscript, and the engines that import here (OpenVINO has no Linux aarch64 wheel)."""

from __future__ import annotations

import sys

import numpy as np
import pytest
import torch

from helpers import deploy
from helpers.deploy import engines


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


@pytest.mark.parametrize("exporter", engines.EXPORTERS)
def test_dynamic_batch_export(tmp_path, exporter, tiny_spec):
    import onnx

    spec = tiny_spec
    x = deploy.fixed_batch(spec.input_shape, 2)
    path = tmp_path / "m.onnx"
    assert engines.export_onnx(spec.model, torch.from_numpy(x), path, dynamic_batch=True, exporter=exporter) > 0
    graph = onnx.load(str(path))
    assert [d.dim_param or d.dim_value for d in graph.graph.input[0].type.tensor_type.shape.dim] == ["batch", 3, 16, 16]
    assert {o.version for o in graph.opset_import if o.domain in ("", "ai.onnx")} == {engines.OPSET}
    run, precision = engines.onnxruntime_runner(path, "CPUExecutionProvider")
    five = deploy.fixed_batch(spec.input_shape, 5)
    with torch.inference_mode():
        expected = spec.model(torch.from_numpy(five)).numpy()
    out = run(five)
    assert precision == "f32" and out.shape == (5, 10) and np.abs(out - expected).max() < 1e-4
    static = tmp_path / "s.onnx"
    engines.export_onnx(spec.model, torch.from_numpy(x), static, exporter=exporter)
    run, _ = engines.onnxruntime_runner(static, "CPUExecutionProvider")
    with pytest.raises(Exception, match="(?i)dimension"):
        run(five)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx", "s.onnx"]  # weights inside, no .data file


def test_the_default_exporter_is_dynamo(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(torch.onnx, "export", lambda *args, **kwargs: calls.append(kwargs))
    model, example = torch.nn.Linear(2, 2), torch.randn(1, 2)
    engines.export_onnx(model, example, tmp_path / "a.onnx")
    engines.export_onnx(model, example, tmp_path / "b.onnx", dynamic_batch=True)
    engines.export_onnx(model, example, tmp_path / "c.onnx", dynamic_batch=True, exporter="torchscript", opset=17)
    dynamo, dynamo_dyn, torchscript = calls
    assert dynamo["dynamo"] is True and dynamo["dynamic_shapes"] is None and dynamo["opset_version"] == 20
    assert dynamo["external_data"] is False and dynamo["input_names"] == ["images"] and "dynamic_axes" not in dynamo
    assert dynamo_dyn["dynamic_shapes"] == ({0: "batch"},)
    assert torchscript["dynamo"] is False and torchscript["opset_version"] == 17 and "dynamic_shapes" not in torchscript
    assert torchscript["dynamic_axes"] == {"images": {0: "batch"}, "logits": {0: "batch"}}
    with pytest.raises(engines.DeployError, match="Unknown exporter 'jit'; choose from dynamo, torchscript"):
        engines.export_onnx(model, example, tmp_path / "d.onnx", exporter="jit")
    assert len(calls) == 3


def test_missing_onnxscript_says_what_to_install(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "onnxscript", None)  # makes `import onnxscript` fail
    model, example = torch.nn.Linear(2, 2).eval(), torch.randn(1, 2)
    with pytest.raises(engines.DeployError, match=r"onnxscript is not installed.*pip install onnxscript==0\.7\.2"):
        engines.export_onnx(model, example, tmp_path / "m.onnx")
    assert not (tmp_path / "m.onnx").exists()
    engines.export_onnx(model, example, tmp_path / "m.onnx", exporter="torchscript")  # needs no onnxscript
    assert (tmp_path / "m.onnx").stat().st_size > 0


class SVD(torch.nn.Module):
    def forward(self, x):
        return torch.linalg.svd(x)[1]


class FFT(torch.nn.Module):
    def forward(self, x):
        return torch.fft.fft(x).real


def test_export_failure_names_the_operator(tmp_path):
    with pytest.raises(engines.DeployError, match=r"\(dynamo exporter\): operator aten::_linalg_svd at opset 20 "
                                                  r"\(no ONNX function for it.*torchscript \(dynamo=False\)"):
        engines.export_onnx(SVD(), torch.randn(3, 3), tmp_path / "s.onnx")
    with pytest.raises(engines.DeployError, match="operator aten::fft_fft at opset 17"):
        engines.export_onnx(FFT(), torch.randn(1, 4), tmp_path / "f.onnx", exporter="torchscript", opset=17)
    pool = torch.nn.AdaptiveAvgPool2d(3)  # 4x4 -> 3x3: supported by PyTorch, not by the TorchScript exporter
    with pytest.raises(engines.DeployError, match=
                       r"\(torchscript exporter\): operator adaptive_avg_pool2d at opset 20"):
        engines.export_onnx(pool, torch.randn(1, 1, 4, 4), tmp_path / "p.onnx", exporter="torchscript")
    engines.export_onnx(pool, torch.randn(1, 1, 4, 4), tmp_path / "p.onnx")  # ... but by the dynamo exporter
    x = deploy.fixed_batch((1, 4, 4), 1)
    run, _ = engines.onnxruntime_runner(tmp_path / "p.onnx", "CPUExecutionProvider")
    assert np.abs(run(x) - pool(torch.from_numpy(x)).numpy()).max() < 1e-6


def test_export_message_of_a_model_torch_export_cannot_capture(tmp_path):
    class Branch(torch.nn.Module):
        def forward(self, x):
            return x * 2 if x.sum() > 0 else x  # a Python branch on a value

    with pytest.raises(engines.DeployError, match="GuardOnDataDependentSymNode: Could not guard on data-dependent"):
        engines.export_onnx(Branch(), torch.randn(3), tmp_path / "b.onnx")


def test_missing_engine_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # makes `import onnxruntime` fail
    with pytest.raises(engines.DeployError, match=r"pip install onnxruntime==1\.32\.0"):
        engines.onnxruntime_providers("cpu")


def test_unsupported_device_is_named(tiny_spec):
    import onnxruntime as ort

    if not set(engines.GPU_PROVIDERS) & set(ort.get_available_providers()):
        with pytest.raises(engines.DeployError, match="no GPU execution provider"):
            engines.onnxruntime_providers("gpu")
    with pytest.raises(engines.DeployError, match="Unknown --device"):
        deploy.compare(tiny_spec, device="tpu")


def test_openvino_devices():
    ov = pytest.importorskip("openvino")  # no wheel for Linux aarch64: test_available_engines covers it there

    if not any(d.startswith("GPU") for d in ov.Core().available_devices):
        with pytest.raises(engines.DeployError, match="OpenVINO sees no Intel GPU"):
            engines.openvino_devices("gpu")
    assert engines.openvino_devices("cpu") == ["CPU"] and engines.openvino_devices("auto")[0] == "CPU"


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


def test_eager_devices_and_runner(monkeypatch, tiny_spec):
    assert engines.eager_devices("cpu") == ["cpu"]
    monkeypatch.setattr(engines.devices, "available_devices", lambda: ["xpu", "cpu"])
    assert engines.eager_devices("gpu") == ["xpu"] and engines.eager_devices("auto") == ["cpu", "xpu"]
    monkeypatch.setattr(engines.devices, "available_devices", lambda: ["cpu"])
    with pytest.raises(engines.DeployError, match="PyTorch sees no GPU here"):
        engines.eager_devices("gpu")
    spec = tiny_spec
    x = deploy.fixed_batch(spec.input_shape, 2)
    run, precision = engines.eager_runner(spec.model, "cpu", None)
    with torch.inference_mode():
        expected = spec.model(torch.from_numpy(x)).numpy()
    assert precision == "f32" and np.array_equal(run(x), expected)
    bf16, precision = engines.eager_runner(spec.model, "cpu", "bf16")
    out = bf16(x)
    assert precision == "bf16" and out.dtype == np.float32 and not np.array_equal(out, expected)  # autocast, fp32 out
    assert np.abs(out - expected).max() < 0.1


def test_openvino_runner_reports_the_precision_it_uses(tmp_path, tiny_spec):
    pytest.importorskip("openvino")
    spec = tiny_spec
    x = deploy.fixed_batch(spec.input_shape, 2)
    path = tmp_path / "m.onnx"
    engines.export_onnx(spec.model, torch.from_numpy(x), path)
    run, precision = engines.openvino_runner(path, "CPU", "f32")
    with torch.inference_mode():
        expected = spec.model(torch.from_numpy(x)).numpy()
    assert precision == "f32" and np.abs(run(x) - expected).max() < 1e-4
    with pytest.raises(engines.DeployError, match="OpenVINO could not compile the model for NOSUCHDEVICE"):
        engines.openvino_runner(path, "NOSUCHDEVICE", None)


def test_available_engines_without_openvino(monkeypatch):
    here, missing = engines.available_engines()
    assert here[:2] == ["eager", "onnxruntime"] and sorted(here + list(missing)) == sorted(engines.ENGINES)
    monkeypatch.setitem(sys.modules, "openvino", None)  # makes `import openvino` fail, as where it is absent
    here, missing = engines.available_engines()
    assert here == ["eager", "onnxruntime"] and list(missing) == ["openvino"]
    if not engines._no_wheel_here("openvino"):  # this platform has a wheel: not installed, or broken
        assert missing["openvino"] == ("OpenVINO: not installed in this environment "
                                       "(`make setup` installs it, or `pip install openvino==2026.4.1`)")
        broken = ImportError("libopenvino.so.2026: cannot open shared object file\n(more)")
        assert engines._why_not("openvino", broken) == (
            "installed but does not import (ImportError: libopenvino.so.2026: cannot open shared object file (more))")
    # where the pin's marker leaves it out, both the list and an explicit request say so
    monkeypatch.setattr(engines.platform, "system", lambda: "Linux")
    monkeypatch.setattr(engines.platform, "machine", lambda: "aarch64")
    assert engines.available_engines()[1] == {
        "openvino": "OpenVINO: not installed on this platform (no wheel for Linux aarch64)"}
    with pytest.raises(engines.DeployError, match=r"^OpenVINO is not installed on this platform \(no wheel for Linux "
                                                  r"aarch64.*: use the engines that import here \(eager, onnxruntime\)"):
        engines.import_engine("openvino")
