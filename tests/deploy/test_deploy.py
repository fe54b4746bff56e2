"""helpers.deploy (the command): rows written by the command line, its default engines where OpenVINO does not
import, the published systems it cannot run, and an import that stays light."""

from __future__ import annotations

import subprocess
import sys

import pytest

from helpers import results
from helpers import deploy
from helpers.deploy import engines


def test_rows_and_cli(tmp_path, capsys):
    rows_path = tmp_path / "rows.jsonl"
    found = deploy.main(["--model", "book_cnn", "--batch", "2", "--engines", "eager,onnxruntime",
                         "--repeats", "2", "--warmup", "0", "--rows", str(rows_path), "--device", "cpu"])
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
    found = deploy.main(["--model", "book_cnn", "--batch", "2", "--repeats", "1", "--warmup", "0", "--rounds", "2",
                         "--rows", str(tmp_path / "rows.jsonl"), "--device", "cpu"])
    out = capsys.readouterr().out
    assert [r.name for r in found] == ["eager", "onnxruntime"]
    said = [line for line in out.splitlines() if line.startswith("OpenVINO")]
    assert said == [f"{engines.available_engines()[1]['openvino']}: left out of the default engines"]
    with pytest.raises(deploy.DeployError, match="OpenVINO is not installed"):  # asked for by name: the clear error
        deploy.main(["--model", "book_cnn", "--engines", "eager,openvino", "--rows", str(tmp_path / "x.jsonl")])
    assert not (tmp_path / "x.jsonl").exists()


def test_cli_table_has_an_aa_row_with_three_engines(tmp_path, capsys):
    pytest.importorskip("openvino")  # no wheel for Linux aarch64
    found = deploy.main(["--model", "book_cnn", "--batch", "2", "--engines", "eager,onnxruntime,openvino:f32",
                         "--repeats", "1", "--warmup", "0", "--rounds", "2", "--rows", str(tmp_path / "rows.jsonl"),
                         "--device", "cpu"])
    out = capsys.readouterr().out
    assert [r.name for r in found][-1] == "A/A: eager again"
    assert any(line.startswith("A/A: eager again ") for line in out.splitlines())  # its own row in the table


def test_cli_exporter_choice():
    assert deploy._parser().parse_args([]).exporter == "dynamo"
    assert deploy._parser().parse_args(["--exporter", "torchscript"]).exporter == "torchscript"
    with pytest.raises(SystemExit):
        deploy._parser().parse_args(["--exporter", "jit"])


def test_not_runnable_names_each_system_with_why_and_how():
    assert {"ONNX Runtime DirectML", "pytorch-directml", "dlprimitives OpenCL backend",
            "TensorFlow 2 / Keras"} == set(deploy.NOT_RUNNABLE)
    assert all(why and how for why, how in deploy.NOT_RUNNABLE.values())
    assert "train_on_batch" in deploy.NOT_RUNNABLE["TensorFlow 2 / Keras"][1]  # a training step, like the published row


def test_import_stays_light():
    code = "import helpers.deploy, sys; print(sorted(m for m in ('onnx', 'onnxruntime', 'openvino') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
