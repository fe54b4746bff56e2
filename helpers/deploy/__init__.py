"""Serve a trained model with other engines (chapter 14): ``python -m helpers.deploy --model resnet18 --size 64x64``.

One ONNX export (``engines``), then every engine on one fixed batch in interleaved rounds; the method is in
docs/tools.md."""

from __future__ import annotations

import argparse
import gc
import re
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import torch
from torch import nn

from .. import measure, models, results, system
from ..tables import Table
from .engines import (DEVICES, ENGINES, EXPORTERS, OPSET, PRECISIONS, DeployError, Runner, agreement,
                      available_engines, eager_devices, eager_runner, export_onnx, onnxruntime_providers,
                      onnxruntime_runner, openvino_devices, openvino_runner, parse_engines)

BLOG_MODEL = "blog"
BOOK_MODELS = {"book_cnn": "fashionmnist", "book_cnn_cifar10": "cifar10"}
AGREEMENT_INPUTS = 32  # agreement is judged on at least this many inputs, never on one sample
AA_FROM_ARMS = 3  # a comparison of this many engine variants or more carries an A/A arm


@dataclass
class ModelSpec:
    """A model ready for export, with the input shape (C, H, W) it expects and how it was made."""

    name: str
    model: nn.Module
    input_shape: tuple[int, int, int]
    label: str


def parse_size(text: str | int) -> tuple[int, int]:
    """``"64"`` -> (64, 64); ``"224x384"`` -> (224, 384), height first."""
    m = re.fullmatch(r"\s*(\d+)\s*(?:[xX]\s*(\d+))?\s*", str(text))
    if not m or int(m.group(1)) < 1 or (m.group(2) and int(m.group(2)) < 1):
        raise DeployError(f"--size must be N or HxW with positive integers (e.g. 224 or 224x384); got {text!r}.")
    h = int(m.group(1))
    return h, int(m.group(2) or h)


def build_model(name: str, *, size: tuple[int, int] | None = None, checkpoint: str | Path | None = None,
                num_classes: int = 10, seed: int = 0) -> ModelSpec:
    """The book's CNN, a torchvision model, or ``blog`` (the Arc blog's setting), in eval mode."""
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
    else:
        try:
            model = models.torchvision_model(name, num_classes=num_classes)
        except ValueError as exc:
            raise DeployError(f"{exc} Also: {', '.join(BOOK_MODELS)}, {BLOG_MODEL}.") from None
        shape, label = (3, *(size or (224, 224))), f"torchvision {name}"
    if checkpoint is None:
        return ModelSpec(name, model.eval(), shape, label + ", random weights")
    from ..checkpoints import load_checkpoint  # a helpers.checkpoints dict whose "model" is the state_dict

    try:
        model.load_state_dict(load_checkpoint(checkpoint)["model"])
    except RuntimeError as exc:
        first = str(exc).splitlines()[1:2] or [str(exc)[:200]]
        raise DeployError(f"Checkpoint {Path(checkpoint).name} does not fit this model ({first[0].strip()}); "
                          "pass the --model the checkpoint was trained with.") from None
    return ModelSpec(name, model.eval(), shape, label + f", trained weights from {Path(checkpoint).name}")


def fixed_batch(input_shape: tuple[int, ...], batch: int, seed: int = 0) -> np.ndarray:
    """A seeded random float32 batch (N, C, H, W): the same input for every engine."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn((batch, *input_shape), generator=g).numpy()


@dataclass
class EngineResult(measure.Result):
    """One engine's ``measure.Result`` (latency per round as samples, first calls as warm-up) and the shared rounds."""

    rounds: measure.Rounds | None = None

    @property
    def precision(self) -> str:
        return str(self.settings.get("precision", ""))

    @property
    def latency_ms(self) -> float:
        """Median over rounds of each round's median call latency, in ms."""
        return 1e3 * statistics.median(self.samples)

    @property
    def throughput(self) -> float:
        """Images per second at the median latency."""
        return self.settings["batch"] / statistics.median(self.samples)


def _targets(engines: list[tuple[str, str | None]], device: str) -> list[tuple[str, str, str | None]]:
    lookup = {"eager": eager_devices, "onnxruntime": onnxruntime_providers, "openvino": openvino_devices}
    return [(engine, target, hint) for engine, hint in engines for target in lookup[engine](device)]


def _variant(engine: str, target: str, hint: str | None) -> str:
    short = target.replace("ExecutionProvider", "")
    return f"{engine}{f':{hint}' if hint else ''}{'' if short.lower() == 'cpu' else f'@{short}'}"


def _agreement_set(x: np.ndarray, seed: int = 1) -> np.ndarray:
    """The timed batch plus seeded inputs: at least ``AGREEMENT_INPUTS`` rows, a multiple of the batch."""
    batch = x.shape[0]
    chunks = max(1, -(-AGREEMENT_INPUTS // batch))
    return np.concatenate([x, fixed_batch(x.shape[1:], batch * (chunks - 1), seed=seed) if chunks > 1 else x[:0]])


def _run_chunked(run: Runner, inputs: np.ndarray, batch: int) -> np.ndarray:
    return np.concatenate([run(inputs[i:i + batch]) for i in range(0, len(inputs), batch)])


def compare(spec: ModelSpec, *, batch: int = 1, engines: str | Sequence[str] = ENGINES, device: str = "cpu",
            precision: str | None = None, repeats: int = 5, warmup: int = 3, inputs: np.ndarray | None = None,
            rounds: int | None = None, also_dynamic: bool = False, progress: bool = True,
            exporter: str = "dynamo") -> list[EngineResult]:
    """Export ``spec.model`` once, then time every engine on one fixed batch in interleaved rounds (a fresh session
    each); ``also_dynamic`` adds a dynamic-batch export of every ONNX engine."""
    if device not in DEVICES:
        raise DeployError(f"Unknown --device {device!r}; choose from {', '.join(DEVICES)}.")
    if batch < 1 or repeats < 1 or warmup < 0 or (rounds is not None and rounds < 1):
        raise DeployError("batch, repeats and rounds must be >= 1 and warmup >= 0")
    chosen = [(e, h or (precision if e == "openvino" else None)) for e, h in parse_engines(engines)]
    targets = [(e, t, h, False) for e, t, h in _targets(chosen, device)]
    if also_dynamic:
        targets += [(e, t, h, True) for e, t, h, _ in targets if e != "eager"]
    x = inputs if inputs is not None else fixed_batch(spec.input_shape, batch)
    batch = x.shape[0]
    check = _agreement_set(x)
    reference = _run_chunked(eager_runner(spec.model, "cpu", None)[0], check, batch)
    exports: dict[bool, tuple[Path, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for dyn in sorted({d for e, _, _, d in targets if e != "eager"}):
            path = Path(tmp) / f"{spec.name}{'_dynamic' if dyn else ''}.onnx"
            exports[dyn] = (path, export_onnx(spec.model, torch.from_numpy(x), path, dynamic_batch=dyn,
                                                exporter=exporter))
        state: dict[str, dict[str, Any]] = {}

        def variant(name: str, engine: str, target: str, hint: str | None, dyn: bool) -> Callable[[], float]:
            st = state.setdefault(name, {"engine": engine, "target": target, "hint": hint, "dyn": dyn, "load": [],
                                         "first": []})

            def one_round() -> float:
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
                return statistics.median(timed.samples)
            return one_round

        calls = {}
        for engine, target, hint, dyn in targets:
            name = _variant(engine, target, hint) + (" (dynamic batch)" if also_dynamic and dyn else "")
            calls[name] = variant(name, engine, target, hint, dyn)
        if len(calls) >= AA_FROM_ARMS:  # the baseline again, as its own arm with its own sessions
            base = next(iter(calls))
            st = state[base]
            calls = measure.with_aa(calls, base, again=variant(measure.aa_name(base), st["engine"], st["target"],
                                                               st["hint"], st["dyn"]))
        got = measure.interleaved(calls, rounds, progress=progress, desc="engine rounds")
        spec.model.to("cpu")
    return [EngineResult(name, got.samples[name], st["first"],
                         {"export_s": 0.0 if st["engine"] == "eager" else exports[st["dyn"]][1],
                          "load_s": statistics.median(st["load"]), "max_abs_diff": st["diff"], "top1_agreement": st["top1"]},
                         {"engine": st["engine"], "device": st["target"], "precision": st["precision"], "batch": batch,
                          "agreement_n": len(check), "other_cores": [round(i.cores, 3) for i in got.interference],
                          "reruns": got.reruns, "dynamic_batch": st["dyn"],
                          "exporter": None if st["engine"] == "eager" else exporter}, rounds=got)
            for name, st in state.items()]


def verdict(found: Sequence[EngineResult], name: str, baseline: str | None = None) -> measure.Verdict:
    """The verdict of engine ``name`` against ``baseline`` (default: the first), from their shared rounds."""
    names = [r.name for r in found]
    for wanted in {baseline, name} - {None, *names}:
        raise DeployError(f"no engine {wanted!r} among {', '.join(names)}")
    return found[0].rounds.verdict(name, baseline or found[0].name)  # DISTURBED everywhere when the A/A arm failed


def _first_call(r: EngineResult) -> float | None:
    return statistics.median(r.warmup) if r.warmup else None


def results_table(found: Sequence[EngineResult], baseline: str | None = None, title: str = "") -> Table:
    """One row per engine (the A/A arm last): throughput, latency, speed-up with interval and verdict, set-up
    times, agreement and precision."""
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
            v = base.rounds.verdict(r.name, base.name)
            cells = [v.ratio, v.interval, measure.reading(r.name, v)]
        m = r.metrics
        table.add(r.name, r.precision, r.throughput, r.latency_ms, 1e3 * min(r.samples), 1e3 * max(r.samples),
                  *cells, m["export_s"], m["load_s"], _first_call(r), m["max_abs_diff"], 100 * m["top1_agreement"])
    table.note = (f"{found[0].rounds.note()} Latency: median of each round's timed calls (fresh session, first call "
                  f"apart). Agreement: with PyTorch eager fp32 on {found[0].settings.get('agreement_n', 0)} inputs.")
    return table


def to_rows(found: Sequence[EngineResult], *, experiment: str, data: str = "none",
            label: str = "") -> list[results.Row]:
    """Chapter 14's result rows: throughput (images/s) and latency (ms) per engine against the first."""
    chapter, base = "14", found[0].name
    extra = {r.name: {**r.settings, **r.metrics, "first_call_s": _first_call(r), "model": label} for r in found}
    rows = results.make_rows(chapter, experiment, {r.name: [r.settings["batch"] / t for t in r.samples] for r in found},
                             metric="throughput", unit="images/s", baseline=base, lower_is_better=False, data=data,
                             extra=extra)
    ctx = {"fingerprint": rows[0].fingerprint, "profile": rows[0].profile, "data": data}
    rows += results.make_rows(chapter, experiment, {r.name: [1e3 * t for t in r.samples] for r in found},
                              metric="latency", unit="ms", baseline=base, extra=extra, **ctx)
    return rows


def answers(engines: Mapping[str, Callable[[np.ndarray], np.ndarray]],
            loader: Any) -> tuple[dict[str, float], dict[str, float], int]:
    """Every batch of ``loader`` through every engine: accuracy %, % same class as the first engine, and the number
    of images."""
    names = list(engines)
    ref = names[0]
    correct, agree, n = dict.fromkeys(names, 0), dict.fromkeys(names, 0), 0
    for images, labels in loader:
        b, y = images.numpy(), np.asarray(labels)
        base = np.asarray(engines[ref](b)).argmax(1)
        for name in names:
            pred = base if name == ref else np.asarray(engines[name](b)).argmax(1)
            correct[name] += int((pred == y).sum())
            agree[name] += int((pred == base).sum())
        n += len(y)
    if n == 0:
        raise ValueError("the loader gave no images")
    return ({k: 100 * v / n for k, v in correct.items()}, {k: 100 * v / n for k, v in agree.items()}, n)


def answers_table(accuracy: Mapping[str, float], same: Mapping[str, float], n: int, title: str = "") -> Table:
    """The table of ``answers``."""
    return Table(["engine", "accuracy %", "same class as eager %"], [[k, accuracy[k], same[k]] for k in accuracy],
                 title=title or f"Answers on {n:,} test images")


def verdicts_line(runs: Sequence[EngineResult]) -> str:
    """Each engine against the first, then the largest difference from eager and the lowest top-1 agreement."""
    line = "; ".join(f"{r.name} {v.ratio:.2f}x [{v.interval}] {measure.reading(r.name, v)}"
                     for r, v in ((r, verdict(runs, r.name)) for r in runs[1:]))
    worst = max(runs, key=lambda r: r.metrics["max_abs_diff"])
    return (f"{line}\n  max |diff| {worst.metrics['max_abs_diff']:.1e} ({worst.name}); lowest top-1 agreement "
            f"{min(100 * r.metrics['top1_agreement'] for r in runs):.0f}% on {runs[0].settings['agreement_n']} inputs")


def batch_split(big: Sequence[EngineResult], one: Sequence[EngineResult], batch: int) -> Table:
    """Latency(b) ~ fixed + b * per image, from two separate runs at batch ``batch`` and 1 (described, no verdict)."""
    if batch < 2:
        raise ValueError("the larger batch must hold at least 2 images")
    by = {r.name: r for r in big}
    rows = []
    for r in one:
        b = by[r.name]
        per_image = (b.latency_ms - r.latency_ms) / (batch - 1)
        rows.append([r.name, b.throughput, r.throughput, b.throughput / r.throughput, per_image,
                     max(0.0, r.latency_ms - per_image)])  # a fixed cost below 0 is noise
    return Table(["engine", f"images/s b{batch}", "images/s b1", f"throughput b{batch}/b1 (x)", "per image ms",
                  "fixed ms per call"], rows,
                 title=f"Batch {batch} and batch 1: two separate runs, described, not given a verdict")


def published_vs_yours(runs: Sequence[EngineResult], published_rows: Sequence[Any], baseline: str) -> Table:
    """The Arc blog's frames per second (ratios to ``baseline``'s) beside ``runs`` (ratios to the first engine)."""
    pub = {r.variant: r for r in published_rows}
    base = pub[baseline]
    table = Table(["side", "variant", "frames/s", "ratio to own baseline", "baseline"],
                  title="Arc blog's setting: published vs yours",
                  note=f"Published: {base.source} ({base.note}: read off a demo that includes "
                       f"pre- and post-processing). Yours: the stand-in above, batch 1.")
    for name, r in pub.items():
        table.add("published", f"{name} ({r.hardware})", r.value, r.value / base.value, baseline)
    for r in runs:
        v = verdict(runs, r.name)
        table.add("yours", f"{r.name} ({r.precision})", r.throughput, v.ratio,
                  runs[0].name if r is runs[0] else f"{runs[0].name} ({v.interval}: {measure.reading(r.name, v)})")
    return table


def ratio_bars(ax: Any, runs: Sequence[EngineResult], title: str, published_ratios: Mapping[str, float] | None = None,
               published_label: str = "") -> None:
    """Bars of each engine's speed-up over the first (with its 95% interval), and published ratios beside them."""
    vs = [verdict(runs, r.name) for r in runs]
    names = [f"{r.name}\n({r.precision})\n{v.word if r is not runs[0] else 'baseline'}" for r, v in zip(runs, vs)]
    ax.bar(names, [v.ratio for v in vs], yerr=[[v.ratio - v.low for v in vs], [v.high - v.ratio for v in vs]],
           capsize=4, color="tab:blue", label=f"yours: speed-up over {runs[0].name} (estimate, 95% interval)")
    if published_ratios:
        ax.bar(list(published_ratios), list(published_ratios.values()), color="tab:orange", alpha=0.8,
               label=published_label)
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_ylabel("ratio to own baseline")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=7)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m helpers.deploy", description="Serve a trained model with other engines.")
    p.add_argument("--model", default="resnet18",
                   help=f"book_cnn, book_cnn_cifar10, {', '.join(models.TORCHVISION_MODELS)}, or "
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
    p.add_argument("--exporter", default="dynamo", choices=EXPORTERS,
                   help="torch.onnx.export's exporter: dynamo (the default since torch 2.9, needs onnxscript) or "
                        "torchscript (the older one, dynamo=False)")
    p.add_argument("--repeats", type=int, default=5, help="timed calls per engine per round")
    p.add_argument("--rounds", type=int, default=measure.ROUNDS, help="interleaved rounds (a fresh session each)")
    p.add_argument("--warmup", type=int, default=3)
    return p


def main(argv: Sequence[str] | None = None) -> list[EngineResult]:
    """Command line: compare the engines, print the table, append the result rows."""
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
                    repeats=args.repeats, warmup=args.warmup, rounds=args.rounds, progress=False,
                    exporter=args.exporter)
    print(results_table(found))
    h, w = spec.input_shape[1:]
    rows = to_rows(found, experiment=f"deploy_{spec.name}_{h}x{w}_b{args.batch}", label=spec.label)
    path = results.append_rows(rows)
    print(f"\n{len(rows)} result rows appended to {path.name} ({path.parent.name}/)")
    return found
