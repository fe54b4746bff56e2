"""The engines of ``helpers.deploy``: export to ONNX and one runner per engine (PyTorch eager, ONNX Runtime, OpenVINO),
each imported where it is used (``import_engine``), so that a missing one is one message saying how to install it."""

from __future__ import annotations

import contextlib
import importlib
import io
import os
import platform
import re
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import numpy as np
import torch
from torch import nn

from .. import devices, system


ENGINES: tuple[str, ...] = ("eager", "onnxruntime", "openvino")
PRECISIONS: tuple[str, ...] = ("f32", "bf16", "f16")
DEVICES: tuple[str, ...] = ("auto", "cpu", "gpu")
GPU_PROVIDERS: tuple[str, ...] = ("CUDAExecutionProvider", "ROCMExecutionProvider", "MIGraphXExecutionProvider",
                                  "DmlExecutionProvider", "OpenVINOExecutionProvider", "CoreMLExecutionProvider")
EXPORTERS: tuple[str, ...] = ("dynamo", "torchscript")  # torch.onnx.export(dynamo=True), the default; dynamo=False
OPSET = 20  # what both exporters of torch 2.14 write by default; ONNX Runtime 1.32 and OpenVINO 2026.4 read it
_PINS = {"onnx": "onnx==1.23.2", "onnxscript": "onnxscript==0.7.2", "onnxruntime": "onnxruntime==1.32.0",
         "openvino": "openvino==2026.4.1"}
_NAMES = {"onnx": "ONNX", "onnxscript": "onnxscript", "onnxruntime": "ONNX Runtime", "openvino": "OpenVINO"}


class DeployError(RuntimeError):
    """A deploy problem a user can fix: engine missing, export failure, device not supported."""


def parse_engines(text: str | Sequence[str]) -> list[tuple[str, str | None]]:
    """``"eager,openvino:f32"`` -> [("eager", None), ("openvino", "f32")]: engine and precision hint."""
    items = text.split(",") if isinstance(text, str) else list(text)
    out = []
    for item in (i.strip().lower() for i in items if i.strip()):
        engine, _, hint = item.partition(":")
        if engine not in ENGINES:
            raise DeployError(f"Unknown engine {engine!r}; choose from {', '.join(ENGINES)} "
                              f"(optionally with a precision hint, e.g. openvino:f32).")
        if hint and hint not in PRECISIONS:
            raise DeployError(f"Unknown precision {hint!r} in {item!r}; choose from {', '.join(PRECISIONS)}.")
        if engine == "onnxruntime" and hint not in ("", "f32"):
            raise DeployError("ONNX Runtime runs the model in the precision it was exported in (f32 here); "
                              "a lower precision needs a converted model (onnxconverter-common), not a hint.")
        out.append((engine, hint or None))
    if not out:
        raise DeployError(f"No engine given; choose from {', '.join(ENGINES)}.")
    return out


def import_engine(module: str) -> Any:
    """Import an engine's module; DeployError saying why it does not import and how to install it otherwise."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        here = available_engines()[0] if _no_wheel_here(module) else None
        rest = f": use the engines that import here ({', '.join(here)})" if here else ""
        raise DeployError(f"{_NAMES.get(module, module)} is {_why_not(module, exc)}{rest}.") from None


def available_engines() -> tuple[list[str], dict[str, str]]:
    """The engines of ``ENGINES`` that import here, and ``{engine: why not}`` for the others."""
    here, missing = [], {}
    for engine in ENGINES:
        try:
            if engine != "eager":  # the others import the module of their name
                importlib.import_module(engine)
            here.append(engine)
        except ImportError as exc:
            missing[engine] = f"{_NAMES[engine]}: {_why_not(engine, exc)}"
    return here, missing


def _why_not(module: str, exc: ImportError) -> str:
    """Why ``module`` did not import: no wheel for this platform, not installed, or broken."""
    label = _no_wheel_here(module)
    if label:
        return f"not installed on this platform (no wheel for {label})"
    if isinstance(exc, ModuleNotFoundError) and exc.name == module:
        return f"not installed in this environment (`make setup` installs it, or `pip install {_PINS[module]}`)"
    return f"installed but does not import ({type(exc).__name__}: {' '.join(str(exc).split())[:200]})"


def _no_wheel_here(module: str) -> str | None:
    """This platform's label (e.g. 'Linux aarch64') where the course's pin of ``module`` leaves it out, else None."""
    here = {"system": platform.system(), "machine": platform.machine()}
    return system.platform_label(here) if module in system.left_out_pins(**here) else None


def export_onnx(model: nn.Module, example: torch.Tensor, path: str | Path, *, dynamic_batch: bool = False,
                opset: int = OPSET, exporter: str = "dynamo") -> float:
    """``torch.onnx.export`` of ``model`` on ``example`` to one ``.onnx`` file (weights inside); seconds taken.
    ``exporter``: "dynamo" (the default since torch 2.9) or "torchscript" (``dynamo=False``)."""
    if exporter not in EXPORTERS:
        raise DeployError(f"Unknown exporter {exporter!r}; choose from {', '.join(EXPORTERS)} "
                          "(dynamo: torch.onnx.export's default; torchscript: the older one, dynamo=False).")
    import_engine("onnx")
    if exporter == "dynamo":
        import_engine("onnxscript")  # what the dynamo exporter needs (the TorchScript one does not)
        # dynamic_shapes: one entry per input of forward(); axis 0 of the first input varies, "batch" in the file
        how = {"dynamo": True, "dynamic_shapes": ({0: "batch"},) if dynamic_batch else None,
               "external_data": False, "verbose": False}
    else:
        how = {"dynamo": False,
               "dynamic_axes": {"images": {0: "batch"}, "logits": {0: "batch"}} if dynamic_batch else None}
    start = time.perf_counter()
    with warnings.catch_warnings(), _quiet():
        warnings.simplefilter("ignore")  # e.g. the TorchScript exporter's deprecation notice, when chosen
        try:
            torch.onnx.export(model, (example,), str(path), input_names=["images"], output_names=["logits"],
                              opset_version=opset, **how)
        except Exception as exc:  # the exporters raise several types; name the operator when they say one
            raise DeployError(_export_message(exc, opset, exporter)) from None
    return time.perf_counter() - start


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Silence Python and C-level stdout/stderr (the exporter dumps its whole graph on failure)."""
    with tempfile.TemporaryFile() as sink, contextlib.redirect_stdout(io.StringIO()), \
            contextlib.redirect_stderr(io.StringIO()):
        for stream in (sys.__stdout__, sys.__stderr__):
            if stream is not None:
                stream.flush()
        saved = [os.dup(1), os.dup(2)]
        os.dup2(sink.fileno(), 1)
        os.dup2(sink.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            for fd in saved:
                os.close(fd)


def _export_message(exc: Exception, opset: int, exporter: str = "dynamo") -> str:
    raw = re.sub(r"\x1b\[[0-9;]*m", "", str(exc))  # the dynamo exporter colours its messages
    # the dynamo exporter puts the cause under "## Exception summary": "<class 'X'>: message"
    cause = re.search(r"## Exception summary\s*<class '(?:[\w.]+\.)?(\w+)'>: ([^\n]+)", raw)
    text = " ".join((cause.group(2) if cause else raw).split())
    dynamo_op = re.search(r"No ONNX function found for <OpOverload\(op='(\w+)\.([\w.]+)'", text)
    op = dynamo_op or re.search(r"operator '?([\w:.]+?)'?[ ,]", text)
    name = f"{dynamo_op.group(1)}::{dynamo_op.group(2)}" if dynamo_op else op.group(1) if op else ""
    if dynamo_op:
        reason = "no ONNX function for it" + (f": {text.split('Failure message:')[1].strip()[:200]}"
                                               if "Failure message:" in text else "")
    else:
        reason = re.split(r"(?<=[a-z])\. |\[Caused by", text)[0][:240]
    kind = cause.group(1) if cause else type(exc).__name__
    what = f"operator {name} at opset {opset} ({reason})" if op else f"{kind}: {reason}"
    other = "torchscript (dynamo=False)" if exporter == "dynamo" else "dynamo (the default)"
    return (f"Export to ONNX failed ({exporter} exporter): {what}. Change that operation or its input size in the "
            f"model, try a higher opset or the other exporter ({other}: the two cover different operators), "
            "or keep this model in PyTorch (eager or torch.compile).")


def _targets_for(device: str, cpu: str, gpus: list[str], no_gpu: str) -> list[str]:
    """An engine's targets for ``device`` ('cpu', 'gpu' or 'auto': the CPU and its first GPU); ``no_gpu``: the error."""
    if device == "gpu" and not gpus:
        raise DeployError(no_gpu)
    return {"cpu": [cpu], "gpu": gpus[:1]}.get(device, [cpu] + gpus[:1])


def onnxruntime_providers(device: str) -> list[str]:
    """ONNX Runtime execution providers for ``device`` ('cpu', 'gpu' or 'auto')."""
    present = import_engine("onnxruntime").get_available_providers()
    return _targets_for(device, "CPUExecutionProvider", [p for p in GPU_PROVIDERS if p in present],
                        f"This ONNX Runtime build has no GPU execution provider (present: {', '.join(present)}). "
                        "Install onnxruntime-gpu (NVIDIA), onnxruntime-directml (Windows) or "
                        "onnxruntime-openvino (Intel), or use --device cpu.")


def openvino_devices(device: str) -> list[str]:
    """OpenVINO device names for ``device`` ('cpu', 'gpu' or 'auto'): GPU only where an Intel GPU is seen."""
    present = import_engine("openvino").Core().available_devices
    return _targets_for(device, "CPU", [d for d in present if d.startswith("GPU")],
                        f"OpenVINO sees no Intel GPU here (devices: {', '.join(present)}). Install Intel's GPU "
                        "driver (compute runtime) on a machine with an Intel GPU, or use --device cpu.")


def eager_devices(device: str) -> list[str]:
    """PyTorch devices for ``device`` ('cpu', 'gpu' or 'auto')."""
    return _targets_for(device, "cpu", [d for d in devices.available_devices() if d != "cpu"],
                        "PyTorch sees no GPU here (no cuda, xpu or mps); use --device cpu.")


Runner = Callable[[np.ndarray], np.ndarray]


def eager_runner(model: nn.Module, device: str, hint: str | None) -> tuple[Runner, str]:
    """A function running ``model`` under inference_mode on ``device``; fp32 unless hint is bf16/f16 (autocast)."""
    dev = torch.device(device)
    model = model.to(dev)
    dtype = {"bf16": torch.bfloat16, "f16": torch.float16}.get(hint or "f32")

    def run(x: np.ndarray) -> np.ndarray:
        cast = torch.autocast(dev.type, dtype=dtype) if dtype is not None else contextlib.nullcontext()
        with torch.inference_mode(), cast:
            out = model(torch.from_numpy(x).to(dev))
        return out.float().cpu().numpy()
    return run, hint or "f32"


def onnxruntime_runner(onnx_path: str | Path, provider: str) -> tuple[Runner, str]:
    """An ONNX Runtime session on one execution provider; it runs the exported fp32 graph."""
    ort = import_engine("onnxruntime")
    session = ort.InferenceSession(str(onnx_path), providers=[provider])
    used = session.get_providers()[0]
    if used != provider:
        raise DeployError(f"ONNX Runtime fell back from {provider} to {used}: this device is not supported here.")
    name = session.get_inputs()[0].name
    return (lambda x: session.run(None, {name: x})[0]), "f32"


def openvino_runner(onnx_path: str | Path, device: str, hint: str | None) -> tuple[Runner, str]:
    """An OpenVINO compiled model; returns it with the precision the plugin really uses."""
    ov = import_engine("openvino")
    core = ov.Core()
    config = {"INFERENCE_PRECISION_HINT": hint} if hint else {}
    try:
        compiled = core.compile_model(core.read_model(str(onnx_path)), device, config)
    except RuntimeError as exc:
        raise DeployError(f"OpenVINO could not compile the model for {device} with {config or 'defaults'}: "
                          f"{str(exc).strip().splitlines()[0][:300]}") from None
    precision = _ov_precision(compiled.get_property("INFERENCE_PRECISION_HINT"))
    return (lambda x: compiled(x)[0]), precision


def _ov_precision(value: Any) -> str:
    """'bf16', 'f16' or 'f32' from OpenVINO's precision property (its text otherwise)."""
    text = str(value).lower()
    found = re.search(r"bf16|bfloat16|f16|float16|f32|float32", text)  # the leftmost: bf16 before f16
    return {"bfloat16": "bf16", "float16": "f16", "float32": "f32"}.get(found[0], found[0]) if found else text


def agreement(output: np.ndarray, reference: np.ndarray) -> tuple[float, float]:
    """(largest absolute difference, share of rows whose argmax agrees) of two (N, classes) outputs."""
    output, reference = np.asarray(output, dtype=np.float32), np.asarray(reference, dtype=np.float32)
    if output.shape != reference.shape:
        raise DeployError(f"output shape {output.shape} differs from PyTorch's {reference.shape}")
    diff = float(np.max(np.abs(output - reference))) if output.size else 0.0
    top1 = float(np.mean(output.argmax(axis=1) == reference.argmax(axis=1))) if output.ndim == 2 else float("nan")
    return diff, top1
