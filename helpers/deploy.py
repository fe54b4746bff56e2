"""Serve a trained model with other engines: ``python -m helpers.deploy``.

Exports a PyTorch model to ONNX with ``torch.onnx.export`` and runs the same fixed batch
in PyTorch eager, ONNX Runtime and OpenVINO, in interleaved rounds (``helpers.measure``):
every round builds each engine's session afresh, makes its first call (reported apart),
its warm-up calls, then its timed calls, the engines taking turns in rotated order. Per engine
it reports throughput (images/s) and latency (median over rounds, min-max), the speed-up over
the baseline with the interval and verdict of ``helpers.measure.verdict``, the export and
load/compile time, the output agreement with PyTorch eager in fp32 on a set of at least 32
inputs (largest absolute difference, share of equal top-1 classes) and the precision the
engine really ran in (OpenVINO's CPU plugin picks bf16 by itself on CPUs with AVX512-BF16 or AMX).

Engines are imported inside the functions that use them, so ``import helpers`` stays
light and a missing engine gives one message saying how to install it.

Example: ``python -m helpers.deploy --model resnet18 --size 64x64 --batch 2``.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib
import io
import os
import re
import statistics
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import numpy as np
import torch
from torch import nn

from . import devices, models, results, system
from . import measure
from .measure import Result
from .tables import Table

ENGINES: tuple[str, ...] = ("eager", "onnxruntime", "openvino")
PRECISIONS: tuple[str, ...] = ("f32", "bf16", "f16")
DEVICES: tuple[str, ...] = ("auto", "cpu", "gpu")
BLOG_MODEL = "blog"
BOOK_MODELS = {"book_cnn": "fashionmnist", "book_cnn_fashionmnist": "fashionmnist", "book_cnn_cifar10": "cifar10"}
GPU_PROVIDERS: tuple[str, ...] = ("CUDAExecutionProvider", "ROCMExecutionProvider", "DmlExecutionProvider",
                                  "OpenVINOExecutionProvider", "CoreMLExecutionProvider")
_PINS = {"onnx": "onnx==1.23.2", "onnxruntime": "onnxruntime==1.32.0", "openvino": "openvino==2026.4.1"}
_NAMES = {"onnx": "ONNX", "onnxruntime": "ONNX Runtime", "openvino": "OpenVINO"}

# Published systems this course cannot run on a Linux CPU machine: why, and how to measure there.
NOT_RUNNABLE: dict[str, tuple[str, str]] = {
    "ONNX Runtime DirectML": (
        "DirectML is a Windows (DirectX 12) API: the onnxruntime-directml wheel is Windows only.",
        "On Windows: pip install onnxruntime-directml, then python -m helpers.deploy --engines onnxruntime "
        "--device gpu (it picks DmlExecutionProvider)."),
    "pytorch-directml": (
        "Windows/WSL only and frozen at PyTorch 1.8 (successor torch-directml also needs DirectX 12).",
        "On Windows/WSL: pip install torch-directml, build the model on torch_directml.device() and time "
        "forward passes with the same warm-up + median protocol."),
    "dlprimitives OpenCL backend": (
        "pytorch_dlprim has no PyPI wheel: it is built from source against a matching torch and an "
        "OpenCL driver.",
        "Build pytorch_dlprim, load it, move the model to torch.device('ocl:0') and run "
        "python -m helpers.bench --device ocl:0 once bench accepts it (or the blog's validate_network.py)."),
    "TensorFlow 2 / Keras": (
        "A second framework with its own models: not a PyTorch engine, and not in the course's environment.",
        "In a separate TensorFlow environment: build the keras.applications model at the same input size and "
        "batch, compile it with an optimizer and loss, and time model.train_on_batch(x, y) (a full training "
        "step: forward, loss, gradients, update), warm-up apart, interleaved with the PyTorch step; compare ratios, not ms."),
}


class DeployError(RuntimeError):
    """A deploy problem a user can fix: engine missing, export failure, device not supported."""


@dataclass
class ModelSpec:
    """A model ready for export, with the input shape (C, H, W) it expects and how it was made."""

    name: str
    model: nn.Module
    input_shape: tuple[int, int, int]
    label: str


@dataclass
class EngineResult:
    """One engine's measurement on one fixed batch."""

    name: str
    engine: str
    device: str
    precision: str
    batch: int
    latencies: list[float]
    warmup: list[float]
    export_s: float
    load_s: float
    max_abs_diff: float
    top1_agreement: float
    note: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
    agreement_n: int = 0
    rounds: measure.Rounds | None = None

    @property
    def latency_ms(self) -> float:
        """Median over rounds of each round's median call latency, in ms."""
        return 1e3 * statistics.median(self.latencies)

    @property
    def throughput(self) -> float:
        """Images per second at the median latency."""
        return self.batch / statistics.median(self.latencies)

    def throughputs(self) -> list[float]:
        return [self.batch / t for t in self.latencies]

    def as_result(self) -> Result:
        """The latencies as a ``helpers.measure.Result`` (for speed-up tables and plots)."""
        return Result(self.name, list(self.latencies), list(self.warmup),
                      {"images_per_s": self.throughput, "max_abs_diff": self.max_abs_diff,
                       "top1_agreement": 100 * self.top1_agreement},
                      {"engine": self.engine, "device": self.device, "precision": self.precision})


def parse_size(text: str | int) -> tuple[int, int]:
    """``"64"`` -> (64, 64); ``"224x384"`` -> (224, 384), height first."""
    m = re.fullmatch(r"\s*(\d+)\s*(?:[xX]\s*(\d+))?\s*", str(text))
    if not m or int(m.group(1)) < 1 or (m.group(2) and int(m.group(2)) < 1):
        raise DeployError(f"--size must be N or HxW with positive integers (e.g. 224 or 224x384); got {text!r}.")
    h = int(m.group(1))
    return h, int(m.group(2) or h)


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
    """Import ``onnx``, ``onnxruntime`` or ``openvino``; a missing one raises DeployError saying how to install it."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise DeployError(
            f"{_NAMES.get(module, module)} is not installed in this environment. It is a pinned dependency of "
            f"the course: run `make setup`, or `pip install {_PINS.get(module, module)}` in this environment."
        ) from None


def build_model(name: str, *, size: tuple[int, int] | None = None, checkpoint: str | Path | None = None,
                num_classes: int = 10, seed: int = 0) -> ModelSpec:
    """The book's CNN, a torchvision model, ``timm:NAME``, or ``blog`` (the Arc blog's setting), in eval mode."""
    torch.manual_seed(seed)
    key = name.lower()
    if key in BOOK_MODELS:
        model = models.book_cnn(BOOK_MODELS[key], num_classes=num_classes)
        shape = (1, 28, 28) if BOOK_MODELS[key] == "fashionmnist" else (3, 32, 32)
        if size is not None and size != shape[1:]:
            raise DeployError(f"{name} takes {shape[1]}x{shape[2]} images only (its Linear layer fixes the size); "
                              f"drop --size or pass --size {shape[1]}x{shape[2]}.")
        label = f"the book's {BOOK_MODELS[key]} CNN"
    elif key == BLOG_MODEL:
        model = models.torchvision_model("resnet18", num_classes=num_classes)
        shape = (3, *(size or (224, 384)))
        label = ("STAND-IN for the blog's YOLOX-tiny (not a pinned dependency): torchvision resnet18, about 3.1 GMAC "
                 "per 384x224 image; YOLOX-tiny's published 6.45 GFLOPs (3.2 GMAC) are at 416x416, about 1.6 GMAC at "
                 "384x224, so the stand-in does about twice the work")
    elif key.startswith("timm:"):
        timm = import_engine("timm")
        model = timm.create_model(name[5:], pretrained=False, num_classes=num_classes)
        shape, label = (3, *(size or (224, 224))), f"timm {name[5:]}"
    else:
        try:
            model = models.torchvision_model(name, num_classes=num_classes)
        except ValueError as exc:
            raise DeployError(f"{exc} Also: {', '.join(BOOK_MODELS)}, {BLOG_MODEL}, timm:NAME.") from None
        shape, label = (3, *(size or (224, 224))), f"torchvision {name}"
    if checkpoint is not None:
        load_weights(model, checkpoint)
        label += f", trained weights from {Path(checkpoint).name}"
    else:
        label += ", random weights"
    return ModelSpec(name, model.eval(), shape, label)


def load_weights(model: nn.Module, path: str | Path) -> None:
    """Load a helpers.checkpoints checkpoint (a dict whose "model" is the state_dict) into ``model``."""
    from .checkpoints import load_checkpoint

    state = load_checkpoint(path)
    try:
        model.load_state_dict(state["model"])
    except RuntimeError as exc:
        first = str(exc).splitlines()[1:2] or [str(exc)[:200]]
        raise DeployError(f"Checkpoint {Path(path).name} does not fit this model ({first[0].strip()}); "
                          "pass the --model the checkpoint was trained with.") from None


def fixed_batch(input_shape: tuple[int, int, int], batch: int, seed: int = 0) -> np.ndarray:
    """A seeded random float32 batch (N, C, H, W): the same input for every engine."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn((batch, *input_shape), generator=g).numpy()


def export_onnx(model: nn.Module, example: torch.Tensor, path: str | Path, *, dynamic_batch: bool = False,
                opset: int = 17) -> float:
    """``torch.onnx.export`` with the TorchScript exporter; returns seconds taken.

    torch 2.8's default exporter is the TorchScript one (``dynamo=False``); the dynamo exporter
    needs ``onnxscript``, which the course does not pin. An unsupported operator raises DeployError
    naming it.
    """
    import_engine("onnx")
    dyn = {"images": {0: "batch"}, "logits": {0: "batch"}} if dynamic_batch else None
    start = time.perf_counter()
    with warnings.catch_warnings(), _quiet():
        warnings.simplefilter("ignore")  # the 'legacy exporter' notice: we choose it on purpose
        try:
            torch.onnx.export(model, (example,), str(path), input_names=["images"], output_names=["logits"],
                              dynamic_axes=dyn, opset_version=opset, dynamo=False)
        except Exception as exc:  # the exporter raises several types; name the operator when it says one
            raise DeployError(_export_message(exc, opset)) from None
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


def _export_message(exc: Exception, opset: int) -> str:
    text = " ".join(str(exc).split())
    op = re.search(r"operator '?([\w:.]+?)'?[ ,]", text)
    reason = re.split(r"(?<=[a-z])\. |\[Caused by", text)[0][:240]
    what = f"operator {op.group(1)} at opset {opset} ({reason})" if op else f"{type(exc).__name__}: {reason}"
    return (f"Export to ONNX failed: {what}. Change that operation or its input size in the model, try a "
            "higher opset, or keep this model in PyTorch (eager or torch.compile).")


def onnxruntime_providers(device: str) -> list[str]:
    """ONNX Runtime execution providers for ``device`` ('cpu', 'gpu' or 'auto')."""
    ort = import_engine("onnxruntime")
    present = ort.get_available_providers()
    gpus = [p for p in GPU_PROVIDERS if p in present]
    if device == "gpu" and not gpus:
        raise DeployError(f"This ONNX Runtime build has no GPU execution provider (present: {', '.join(present)}). "
                          "Install onnxruntime-gpu (NVIDIA), onnxruntime-directml (Windows) or "
                          "onnxruntime-openvino (Intel), or use --device cpu.")
    return {"cpu": ["CPUExecutionProvider"], "gpu": gpus[:1]}.get(device, ["CPUExecutionProvider"] + gpus[:1])


def openvino_devices(device: str) -> list[str]:
    """OpenVINO device names for ``device`` ('cpu', 'gpu' or 'auto'): GPU only where an Intel GPU is seen."""
    ov = import_engine("openvino")
    present = ov.Core().available_devices
    gpus = [d for d in present if d.startswith("GPU")]
    if device == "gpu" and not gpus:
        raise DeployError(f"OpenVINO sees no Intel GPU here (devices: {', '.join(present)}). Install Intel's GPU "
                          "driver (compute runtime) on a machine with an Intel GPU, or use --device cpu.")
    return {"cpu": ["CPU"], "gpu": gpus[:1]}.get(device, ["CPU"] + gpus[:1])


def eager_devices(device: str) -> list[str]:
    """PyTorch devices for ``device`` ('cpu', 'gpu' or 'auto')."""
    accel = [d for d in devices.available_devices() if d != "cpu"]
    if device == "gpu" and not accel:
        raise DeployError("PyTorch sees no GPU here (no cuda, xpu or mps); use --device cpu.")
    return {"cpu": ["cpu"], "gpu": accel[:1]}.get(device, ["cpu"] + accel[:1])


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
    text = str(value).lower()
    for token, short in (("bf16", "bf16"), ("bfloat16", "bf16"), ("f16", "f16"), ("float16", "f16"),
                         ("f32", "f32"), ("float32", "f32")):
        if token in text:
            return short
    return text


def agreement(output: np.ndarray, reference: np.ndarray) -> tuple[float, float]:
    """(largest absolute difference, share of rows whose argmax agrees) of two (N, classes) outputs."""
    output, reference = np.asarray(output, dtype=np.float32), np.asarray(reference, dtype=np.float32)
    if output.shape != reference.shape:
        raise DeployError(f"output shape {output.shape} differs from PyTorch's {reference.shape}")
    diff = float(np.max(np.abs(output - reference))) if output.size else 0.0
    top1 = float(np.mean(output.argmax(axis=1) == reference.argmax(axis=1))) if output.ndim == 2 else float("nan")
    return diff, top1


def _targets(engines: list[tuple[str, str | None]], device: str) -> list[tuple[str, str, str | None]]:
    lookup = {"eager": eager_devices, "onnxruntime": onnxruntime_providers, "openvino": openvino_devices}
    return [(engine, target, hint) for engine, hint in engines for target in lookup[engine](device)]


def _variant(engine: str, target: str, hint: str | None) -> str:
    short = target.replace("ExecutionProvider", "")
    suffix = "" if short.lower() == "cpu" else f"@{short}"
    return f"{engine}{f':{hint}' if hint else ''}{suffix}"


AGREEMENT_INPUTS = 32  # agreement is judged on at least this many inputs, never on one sample


def _agreement_set(x: np.ndarray, seed: int = 1) -> np.ndarray:
    """The timed batch plus seeded random inputs, at least ``AGREEMENT_INPUTS`` rows, a multiple of the batch
    (a static export accepts only its own batch size)."""
    batch = x.shape[0]
    chunks = max(1, -(-AGREEMENT_INPUTS // batch))
    extra = fixed_batch(x.shape[1:], batch * (chunks - 1), seed=seed) if chunks > 1 else x[:0]
    return np.concatenate([x, extra])


def _run_chunked(run: Runner, inputs: np.ndarray, batch: int) -> np.ndarray:
    return np.concatenate([run(inputs[i:i + batch]) for i in range(0, len(inputs), batch)])


def compare(spec: ModelSpec, *, batch: int = 1, engines: str | Sequence[str] = ENGINES, device: str = "cpu",
            precision: str | None = None, repeats: int = 5, warmup: int = 3, workdir: str | Path | None = None,
            dynamic_batch: bool = False, inputs: np.ndarray | None = None, rounds: int | None = None,
            also_dynamic: bool = False, progress: bool = True) -> list[EngineResult]:
    """Export ``spec.model`` once, then time every engine on the same fixed batch, in interleaved rounds.

    Each round (``rounds``, default ``measure.ROUNDS``) every engine, in rotated order, builds a
    fresh session, makes one first call (timed apart: lazy set-up), ``warmup`` untimed calls and
    ``repeats`` timed calls; the round's value is their median. Agreement with PyTorch eager fp32
    is measured once per engine on at least ``AGREEMENT_INPUTS`` inputs. ``also_dynamic`` adds,
    for every ONNX engine, a variant exported with a dynamic batch axis, in the same rounds.
    """
    if device not in DEVICES:
        raise DeployError(f"Unknown --device {device!r}; choose from {', '.join(DEVICES)}.")
    if batch < 1 or repeats < 1 or warmup < 0 or (rounds is not None and rounds < 1):
        raise DeployError("batch, repeats and rounds must be >= 1 and warmup >= 0")
    chosen = [(e, h or (precision if e == "openvino" else None)) for e, h in parse_engines(engines)]
    targets = [(e, t, h, dynamic_batch) for e, t, h in _targets(chosen, device)]
    if also_dynamic:
        targets += [(e, t, h, not dynamic_batch) for e, t, h, _ in targets if e != "eager"]
    x = inputs if inputs is not None else fixed_batch(spec.input_shape, batch)
    batch = x.shape[0]
    check = _agreement_set(x)
    reference = _run_chunked(eager_runner(spec.model, "cpu", None)[0], check, batch)
    exports: dict[bool, tuple[Path, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(workdir or tmp)
        folder.mkdir(parents=True, exist_ok=True)
        for dyn in sorted({d for e, _, _, d in targets if e != "eager"}):
            path = folder / f"{spec.name.replace(':', '_')}{'_dynamic' if dyn else ''}.onnx"
            exports[dyn] = (path, export_onnx(spec.model, torch.from_numpy(x), path, dynamic_batch=dyn))
        state: dict[str, dict[str, Any]] = {}

        def variant(name: str, engine: str, target: str, hint: str | None, dyn: bool) -> Callable[[], tuple[float, dict]]:
            st = state.setdefault(name, {"engine": engine, "target": target, "dyn": dyn, "load": [], "first": []})

            def one_round() -> tuple[float, dict]:
                start = time.perf_counter()
                if engine == "eager":
                    run, used = eager_runner(spec.model, target, hint)
                elif engine == "onnxruntime":
                    run, used = onnxruntime_runner(exports[dyn][0], target)
                else:
                    run, used = openvino_runner(exports[dyn][0], target, hint)
                st["load"].append(time.perf_counter() - start)
                sync = target if engine == "eager" else "cpu"
                st["first"].append(measure.time_fn(lambda: run(x), repeats=1, warmup=0, device=sync).samples[0])
                st["precision"] = used
                if "diff" not in st:
                    st["diff"], st["top1"] = agreement(_run_chunked(run, check, batch), reference)
                timed = measure.time_fn(lambda: run(x), repeats=repeats, warmup=warmup, device=sync)
                del run  # one engine's thread pool at a time: an idle pool can still compete for the cores
                gc.collect()
                return statistics.median(timed.samples), {}
            return one_round

        calls = {}
        for engine, target, hint, dyn in targets:
            name = _variant(engine, target, hint) + (" (dynamic batch)" if also_dynamic and dyn else "")
            calls[name] = variant(name, engine, target, hint, dyn)
        got = measure.interleaved(calls, rounds, progress=progress, desc="engine rounds")
        spec.model.to("cpu")
    out = []
    for name, st in state.items():
        export_s = 0.0 if st["engine"] == "eager" else exports[st["dyn"]][1]
        out.append(EngineResult(name, st["engine"], st["target"], st["precision"], batch, got.samples[name],
                                st["first"], export_s, statistics.median(st["load"]), st["diff"], st["top1"],
                                extra={"other_cores": [round(i.cores, 3) for i in got.interference],
                                       "reruns": got.reruns, "dynamic_batch": st["dyn"]},
                                agreement_n=len(check), rounds=got))
    return out


def verdict(found: Sequence[EngineResult], name: str, baseline: str | None = None) -> measure.Verdict:
    """``helpers.measure.verdict`` of engine ``name`` against ``baseline`` (default: the first), by latency."""
    by = {r.name: r for r in found}
    base = by[baseline] if baseline else found[0]
    if name not in by:
        raise DeployError(f"no engine {name!r} among {', '.join(by)}")
    return measure.verdict(base.latencies, by[name].latencies)


def results_table(found: Sequence[EngineResult], baseline: str | None = None, title: str = "") -> Table:
    """One row per engine: throughput, latency median/min/max over rounds, speed-up with interval and verdict,
    export/load/first-call times, agreement and precision."""
    if not found:
        raise DeployError("no engine results to tabulate")
    base = next((r for r in found if r.name == baseline), found[0])
    table = Table(["engine", "precision", "images/s", "latency ms", "min ms", "max ms", "speed-up vs " + base.name + " (x)",
                   "95% interval (x)", "verdict", "export s", "load/compile s", "first call s", "max |diff|",
                   "top-1 agree %"], title=title)
    for r in found:
        if r is base:
            cells: list[Any] = [1.0, "-", "baseline"]
        else:
            v = measure.verdict(base.latencies, r.latencies)
            cells = [v.ratio, v.interval, v.word]
        table.add(r.name, r.precision, r.throughput, r.latency_ms, 1e3 * min(r.latencies), 1e3 * max(r.latencies),
                  *cells, r.export_s, r.load_s, statistics.median(r.warmup) if r.warmup else None,
                  r.max_abs_diff, 100 * r.top1_agreement)
    rounds = found[0].rounds
    n = found[0].agreement_n
    table.note = ((rounds.note() + " " if rounds is not None else "")
                  + "Latency: per round, the median of the timed calls on a freshly built session (its first call "
                    f"and warm-up apart). Agreement: against PyTorch eager fp32 on {n} inputs.")
    return table


def to_rows(found: Sequence[EngineResult], *, chapter: str = "14", experiment: str, baseline: str | None = None,
            data: str = "none", label: str = "") -> list[results.Row]:
    """Result rows (helpers.results): throughput (images/s) and latency (ms) per engine, details in ``extra``."""
    base = baseline or found[0].name
    extra = {r.name: {"engine": r.engine, "device": r.device, "precision": r.precision, "batch": r.batch,
                      "export_s": r.export_s, "load_s": r.load_s,
                      "first_call_s": statistics.median(r.warmup) if r.warmup else None,
                      "max_abs_diff": r.max_abs_diff, "top1_agreement": r.top1_agreement, "model": label, **r.extra}
             for r in found}
    rows = results.make_rows(chapter, experiment, {r.name: r.throughputs() for r in found}, metric="throughput",
                             unit="images/s", baseline=base, lower_is_better=False, data=data, extra=extra)
    ctx = {"fingerprint": rows[0].fingerprint, "profile": rows[0].profile, "data": data}
    rows += results.make_rows(chapter, experiment, {r.name: [1e3 * t for t in r.latencies] for r in found},
                              metric="latency", unit="ms", baseline=base, extra=extra, **ctx)
    return rows


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m helpers.deploy", description=__doc__.splitlines()[0])
    p.add_argument("--model", default="resnet18",
                   help=f"book_cnn, book_cnn_cifar10, {', '.join(models.TORCHVISION_MODELS)}, timm:NAME, or "
                        f"'{BLOG_MODEL}' (the Arc blog's 384x224 setting, with a labelled stand-in model)")
    p.add_argument("--size", default=None, help="N or HxW (height first); default: the model's own size")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--engines", default=",".join(ENGINES),
                   help="comma list of eager, onnxruntime, openvino; a hint may follow, e.g. openvino:f32")
    p.add_argument("--device", default="auto", choices=DEVICES,
                   help="auto: CPU for every engine plus a GPU where the engine sees one")
    p.add_argument("--precision", default=None, choices=PRECISIONS,
                   help="OpenVINO's INFERENCE_PRECISION_HINT (default: the plugin's own choice)")
    p.add_argument("--checkpoint", default=None, help="a checkpoint written by helpers.checkpoints (dict with 'model')")
    p.add_argument("--dynamic-batch", action="store_true", help="export with a dynamic batch dimension")
    p.add_argument("--repeats", type=int, default=5, help="timed calls per engine per round")
    p.add_argument("--rounds", type=int, default=measure.ROUNDS, help="interleaved rounds (a fresh session each)")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--keep", default=None, help="folder to keep the .onnx file in")
    p.add_argument("--rows", default=None, help="rows file (default: results/rows.jsonl or $COURSE_RESULTS)")
    return p


def main(argv: Sequence[str] | None = None) -> list[EngineResult]:
    args = _parser().parse_args(argv)
    size = parse_size(args.size) if args.size else None
    _targets(parse_engines(args.engines), args.device)  # bad engine or device: one message before any work
    spec = build_model(args.model, size=size, checkpoint=args.checkpoint)
    print(system.env_report())
    print(f"model: {spec.label} | input {args.batch}x{'x'.join(map(str, spec.input_shape))} | "
          f"{args.rounds} rounds of {args.warmup} warm-up + {args.repeats} timed calls | exporter: torch.onnx.export (TorchScript, "
          "torch 2.8's default; the dynamo exporter needs onnxscript)")
    found = compare(spec, batch=args.batch, engines=args.engines, device=args.device, precision=args.precision,
                    repeats=args.repeats, warmup=args.warmup, workdir=args.keep, dynamic_batch=args.dynamic_batch,
                    rounds=args.rounds, progress=False)
    print(results_table(found))
    h, w = spec.input_shape[1:]
    rows = to_rows(found, experiment=f"deploy_{spec.name.replace(':', '_')}_{h}x{w}_b{args.batch}", label=spec.label)
    path = results.append_rows(rows, args.rows)
    print(f"\n{len(rows)} result rows appended to {path.name} ({path.parent.name}/)")
    return found


if __name__ == "__main__":
    try:
        main()
    except DeployError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
