"""Serve a trained model with other engines: ``python -m helpers.deploy``.

Exports a PyTorch model to ONNX with ``torch.onnx.export`` (its default, dynamo exporter, which needs
``onnxscript``; ``--exporter torchscript`` picks the older one, ``dynamo=False``) and runs the same fixed batch
in PyTorch eager, ONNX Runtime and OpenVINO, in interleaved rounds (``helpers.measure``):
every round builds each engine's session afresh, makes its first call (reported apart),
its warm-up calls, then its timed calls, the engines taking turns in balanced orders; with three or
more engines the first (the baseline) is timed a second time as an A/A arm (``A/A: eager again``), whose
verdict, if it gets one, marks the run as disturbed (``helpers.measure.DISTURBED``). Per engine
it reports throughput (images/s) and latency (median over rounds, min-max), the speed-up over
the baseline with the interval and verdict of ``helpers.measure.verdict``, the export and
load/compile time, the output agreement with PyTorch eager in fp32 on a set of at least 32
inputs (largest absolute difference, share of equal top-1 classes) and the precision the
engine really ran in (OpenVINO's CPU plugin picks bf16 by itself on CPUs with AVX512-BF16 or AMX).

The package: ``engines`` (export and one runner per engine), ``served`` (the model, its input
size, weights and fixed batch), ``rounds`` (the comparison in interleaved rounds, its verdict,
table and rows), ``report`` (chapter 14's answers table, published-vs-yours table and figure, batch split and
summary line); this module is the command line, and names the published systems the course
cannot run. Engines are imported inside the functions that use them, so ``import helpers``
stays light and a missing engine gives one message saying how to install it. By default the command
compares every engine that imports here (``engines.available_engines``) and says in one line why any
other is left out (OpenVINO has no wheel for Linux aarch64).

Example: ``python -m helpers.deploy --model resnet18 --size 64x64 --batch 2``.
"""

from __future__ import annotations

import argparse
from typing import Sequence

from .. import measure, models, results, system
from .engines import DEVICES, EXPORTERS, OPSET, PRECISIONS, DeployError, available_engines, parse_engines
from .summary import answers, answers_table, batch_split, published_vs_yours, ratio_bars, verdicts_line
from .rounds import EngineResult, _targets, compare, results_table, to_rows, verdict
from .served import BLOG_MODEL, ModelSpec, build_model, parse_size

# What chapter 14 and the command use; the rest lives in the submodules.
__all__ = ["NOT_RUNNABLE", "DeployError", "EngineResult", "ModelSpec", "answers", "answers_table", "available_engines",
           "batch_split", "build_model", "compare", "main", "published_vs_yours", "ratio_bars", "results_table", "to_rows",
           "verdict", "verdicts_line"]


# Published systems this course does not run: why, and how to measure them there.
NOT_RUNNABLE: dict[str, tuple[str, str]] = {
    "ONNX Runtime DirectML": (
        "DirectML is a Windows (DirectX 12) API: the onnxruntime-directml wheel is Windows only.",
        "On Windows, in the course environment: pip uninstall onnxruntime, then pip install onnxruntime-directml "
        "(both wheels provide the same onnxruntime module and cannot be installed together), then "
        "python -m helpers.deploy --model blog --engines onnxruntime --device gpu (it picks DmlExecutionProvider)."),
    "pytorch-directml": (
        "Windows/WSL only and frozen at PyTorch 1.8 (successor torch-directml also needs DirectX 12).",
        "On Windows/WSL, in a separate environment (torch-directml pins its own, older torch, which would replace "
        "the course's 2.14): pip install torch-directml, build the model on torch_directml.device() and time "
        "forward passes with the same warm-up + median protocol."),
    "dlprimitives OpenCL backend": (
        "pytorch_dlprim has no PyPI wheel: it is built from source against a matching torch and an "
        "OpenCL driver.",
        "Build pytorch_dlprim, load it, move the model to torch.device('ocl:0') and time the step with the "
        "blog's own validate_network.py (helpers.bench knows cuda, xpu, mps and cpu, not ocl)."),
    "TensorFlow 2 / Keras": (
        "A second framework with its own models: not a PyTorch engine, and not in the course's environment.",
        "In a separate TensorFlow environment: keras.applications has no ResNet-18, so build it by hand (basic "
        "blocks [2, 2, 2, 2]) or compare ResNet-50 on both sides; same input size and batch, compile it with an "
        "optimizer and loss, and time model.train_on_batch(x, y) (a full training step: forward, loss, gradients, "
        "update), warm-up apart, interleaved with the PyTorch step; compare ratios, not ms."),
}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m helpers.deploy", description=__doc__.splitlines()[0])
    p.add_argument("--model", default="resnet18",
                   help=f"book_cnn, book_cnn_cifar10, {', '.join(models.TORCHVISION_MODELS)}, timm:NAME, or "
                        f"'{BLOG_MODEL}' (the Arc blog's 384x224 setting, with a labelled stand-in model)")
    p.add_argument("--size", default=None, help="N or HxW (height first); default: the model's own size")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--engines", default=None,
                   help="comma list of eager, onnxruntime, openvino; a hint may follow, e.g. openvino:f32 "
                        "(default: every engine that imports here)")
    p.add_argument("--device", default="auto", choices=DEVICES,
                   help="auto: CPU for every engine plus a GPU where the engine sees one")
    p.add_argument("--precision", default=None, choices=PRECISIONS,
                   help="OpenVINO's INFERENCE_PRECISION_HINT (default: the plugin's own choice)")
    p.add_argument("--checkpoint", default=None, help="a checkpoint written by helpers.checkpoints (dict with 'model')")
    p.add_argument("--dynamic-batch", action="store_true", help="export with a dynamic batch dimension")
    p.add_argument("--exporter", default="dynamo", choices=EXPORTERS,
                   help="torch.onnx.export's exporter: dynamo (the default since torch 2.9, needs onnxscript) or "
                        "torchscript (the older one, dynamo=False)")
    p.add_argument("--repeats", type=int, default=5, help="timed calls per engine per round")
    p.add_argument("--rounds", type=int, default=measure.ROUNDS, help="interleaved rounds (a fresh session each)")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--keep", default=None, help="folder to keep the .onnx file in")
    p.add_argument("--rows", default=None, help="rows file (default: results/rows.jsonl or $COURSE_RESULTS)")
    return p


def main(argv: Sequence[str] | None = None) -> list[EngineResult]:
    args = _parser().parse_args(argv)
    size = parse_size(args.size) if args.size else None
    engines, left_out = (args.engines, {}) if args.engines is not None else available_engines()
    _targets(parse_engines(engines), args.device)  # bad engine or device: one message before any work
    spec = build_model(args.model, size=size, checkpoint=args.checkpoint)
    print(system.env_report())
    for why in left_out.values():
        print(f"{why}: left out of the default engines")
    exporter = ("torch.onnx.export(dynamo=True), the default since torch 2.9" if args.exporter == "dynamo" else
                "torch.onnx.export(dynamo=False), the older TorchScript exporter")
    print(f"model: {spec.label} | input {args.batch}x{'x'.join(map(str, spec.input_shape))} | "
          f"{args.rounds} rounds of {args.warmup} warm-up + {args.repeats} timed calls | exporter: {exporter}, "
          f"opset {OPSET}")
    found = compare(spec, batch=args.batch, engines=engines, device=args.device, precision=args.precision,
                    repeats=args.repeats, warmup=args.warmup, workdir=args.keep, dynamic_batch=args.dynamic_batch,
                    rounds=args.rounds, progress=False, exporter=args.exporter)
    print(results_table(found))
    h, w = spec.input_shape[1:]
    rows = to_rows(found, experiment=f"deploy_{spec.name.replace(':', '_')}_{h}x{w}_b{args.batch}", label=spec.label)
    path = results.append_rows(rows, args.rows)
    print(f"\n{len(rows)} result rows appended to {path.name} ({path.parent.name}/)")
    return found
