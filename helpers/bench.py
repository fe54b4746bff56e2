"""Training-step benchmark with the dlprimitives blog's method (chapter 12): ``python -m helpers.bench``.

The method (phases, median beside the blog's mean, the same-mode matmul peak) is in docs/tools.md."""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
from torch import nn

from . import devices, files, models, precision, published, results, system
from .measure import Result
from .roofs import MatmulPeak, math_mode, matmul_peak
from .step import train_step
from .tables import Table

BENCH_MODELS: tuple[str, ...] = ("alexnet", "resnet18", "resnet50", "vgg16", "mobilenet")
PHASES: tuple[str, ...] = ("zero_grad", "copy", "forward", "backward", "update")
PUBLISHED_REFERENCE = "pytorch/cuda | Nvidia rtx 2060s"  # the published row put into result rows


class BenchError(ValueError):
    """A bad benchmark option, with the valid choices."""


def _mean_ms(t: Result) -> float:
    """Mean step time in ms: the blog's statistic, shown beside the median, never compared."""
    return 1e3 * statistics.fmean(t.samples)


def check_options(model_names: Sequence[str], device: str, dtype: str) -> tuple[list[str], torch.device, torch.dtype | None]:
    """Validate model names, device and dtype; one clear message listing the choices."""
    unknown = [m for m in model_names if m not in BENCH_MODELS]
    if unknown:
        raise BenchError(f"Unknown model(s) {', '.join(unknown)}; choose from {', '.join(BENCH_MODELS)}.")
    try:
        return list(model_names), devices.get_device(device), precision.parse_dtype(dtype)
    except (devices.DeviceError, ValueError) as exc:
        raise BenchError(str(exc)) from None


class BenchStep:
    """One training step of the blog's benchmark on a model, optimizer and fixed host batch built once."""

    def __init__(self, model_name: str, *, device: torch.device, batch: int = 16, size: int = 224,
                 autocast: torch.dtype | None = None, seed: int = 0):
        if batch < 1 or size < 32:
            raise BenchError("batch >= 1 and size >= 32 are required")
        torch.manual_seed(seed)
        self.device, self.autocast = device, autocast
        self.net = models.torchvision_model(model_name, num_classes=1000).to(device).train()
        self.head, self.nll = nn.LogSoftmax(dim=1), nn.NLLLoss()
        self.opt = torch.optim.Adam(self.net.parameters())
        self.inputs = torch.randn(batch, 3, size, size)  # one fixed batch on the host, copied every step
        self.labels = torch.randint(1000, (batch,))

    def loss_fn(self, outputs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """The blog's loss: log-softmax then negative log-likelihood, in fp32."""
        return self.nll(self.head(outputs).float(), labels)

    def flops(self) -> int:
        """FLOPs of forward + loss + backward (torch.utils.flop_counter); gradients are cleared."""
        from torch.utils.flop_counter import FlopCounterMode

        counter = FlopCounterMode(display=False)
        with counter:
            self.run()
        self.opt.zero_grad(set_to_none=True)
        return int(counter.get_total_flops())

    def run(self, mark: Callable[[str], None] | None = None) -> None:
        """The copy to the device, then ``train_step``; ``mark(phase)`` at the start and after each phase."""
        mark = mark or (lambda phase: None)
        mark("start")
        x = self.inputs.to(self.device)
        y = self.labels.to(self.device)
        mark("copy")
        train_step(self.net, self.opt, self.loss_fn, x, y,
                   autocast_dtype=self.autocast, device_type=self.device.type, mark=mark)


def event_clock(device: torch.device) -> Callable[[], Any] | None:
    """A function that records a timing event on ``device``, or None where it has none (the CPU)."""
    def record() -> Any:
        event = torch.Event(device=device, enable_timing=True)
        event.record()
        return event

    if device.type == "cpu":
        return None
    try:
        record()  # a probe: not every device has timing events
    except (RuntimeError, TypeError, AttributeError):
        return None
    return record


def timed_steps(step: BenchStep, steps: int, warmup: int = 0,
                clock: Callable[[], Any] | None = None) -> tuple[list[float], dict[str, list[float]]]:
    """Run ``warmup`` then ``steps`` timed steps: per-step totals and per-phase times (s, the loss in forward). ``clock``:
    device events for the phases (``event_clock``); else the host clock, synchronizing after each phase (the blog's)."""
    totals: list[float] = []
    phases: dict[str, list[float]] = {p: [] for p in PHASES}

    def synced() -> float:  # the host clock once the device's queued work is done (the blog's way)
        devices.synchronize(step.device)
        return time.perf_counter()

    now = clock or synced
    for i in range(-warmup, steps):
        marks: list[tuple[str, Any]] = []
        devices.synchronize(step.device)
        start = time.perf_counter()
        step.run(lambda phase: marks.append((phase, now())))
        devices.synchronize(step.device)
        end = time.perf_counter()
        if i < 0:
            continue
        if clock is not None:
            totals.append(end - start)
            spans = {name: a.elapsed_time(b) / 1e3 for (_, a), (name, b) in zip(marks, marks[1:])}
        else:
            totals.append(marks[-1][1] - marks[0][1])
            spans = {name: b - a for (_, a), (name, b) in zip(marks, marks[1:])}
        spans["forward"] += spans.pop("loss", 0.0)
        for name in PHASES:
            phases[name].append(spans[name])
    return totals, phases


def time_steps(model_name: str, *, device: torch.device, batch: int = 16, size: int = 224, warmup: int = 5,
               steps: int = 20, autocast: torch.dtype | None = None, seed: int = 0) -> Result:
    """Time ``steps`` training steps of one torchvision model with the blog's method: step times (s) as samples,
    ``flops_per_step`` in metrics; ``device``, per-phase times (s) and ``phase_method`` in settings."""
    if steps < 1 or warmup < 0:
        raise BenchError("steps >= 1 and warmup >= 0 are required")
    step = BenchStep(model_name, device=device, batch=batch, size=size, autocast=autocast, seed=seed)
    flops = step.flops()
    clock = event_clock(device)
    totals, phases = timed_steps(step, steps, warmup, clock)
    method = "clock" if device.type == "cpu" else "device events" if clock is not None else "synchronized"
    return Result(model_name, totals, [], {"flops_per_step": flops},
                  {"device": str(device), "phases": phases, "phase_method": method})


def published_table(times: Sequence[Result], title: str = "") -> Table:
    """Every published row of the blog's table as ratios: published ms (the blog's mean) / your median ms."""
    rows = published.select(published.load("dlprimitives"), experiment="train_step_batch16_224")
    frameworks = list(dict.fromkeys(r.variant for r in rows))
    cols = ["published setup"] + [f"{t.name} (x)" for t in times]
    table = Table(cols, title=title or "Published ms per step / your median ms per step (> 1: yours is faster)",
                  note=f"Published: {rows[0].source}. Batch 16, 224x224, fp32, Adam; published figures are means "
                       "of 20 steps. Your step: "
                       + "; ".join(f"{t.name} median {1e3 * t.stats.median:.1f} ms (mean {_mean_ms(t):.1f} ms, "
                                   "the blog's statistic, not used in the ratio)" for t in times))
    for fw in frameworks:
        vals = {r.metric.removeprefix("step_time_"): r.value for r in rows if r.variant == fw}
        table.add(fw, *[vals[t.name] / (1e3 * t.stats.median) if t.name in vals else None for t in times])
    return table


def results_table(times: Sequence[Result], peak: MatmulPeak | None = None) -> Table:
    """Median, min, max and mean (the blog's, labelled) step time, per-phase medians, achieved FLOP/s and its share
    of the matmul ``peak`` measured in the same math mode."""
    cols = ["model", "median ms/step", "min ms/step", "max ms/step", "mean ms/step (blog's statistic)"]
    cols += [f"{p} median ms" for p in PHASES] + ["TFLOP/s"]
    if peak:
        cols.append(f"% of {peak.mode} matmul peak")
    method = times[0].settings["phase_method"] if times else "clock"
    note = {"clock": "phases timed by the clock (CPU work is synchronous)",
            "device events": "step: host clock between two synchronizations, nothing synchronized inside; "
                             "phases: device events (they need not add up to the step)",
            "synchronized": "no device events here: the device was synchronized after each phase"}[method]
    if peak:
        note += f"; peak {peak.flops / 1e12:.3g} TFLOP/s ({peak.mode} matmul, best of {peak.repeats})"
    note = ("median: the course's statistic; mean: the blog's, shown for reference (one slow step moves the "
            "mean, not the median); " + note)
    table = Table(cols, note=note)
    above = []
    for t in times:
        st, flops, phases = t.stats, t.metrics["flops_per_step"], t.settings["phases"]
        achieved = flops / st.median if flops else None
        row = [t.name, st.median * 1e3, st.minimum * 1e3, st.maximum * 1e3, _mean_ms(t)]
        row += [1e3 * statistics.median(phases[p]) if phases.get(p) else None for p in PHASES]
        row.append(achieved / 1e12 if achieved else None)
        if peak:
            share = 100 * achieved / peak.flops if achieved else None
            if share is not None and share > 100:
                above.append(t.name)
            row.append(share)
        table.add(*row)
    if above:
        table.note += (f". Above 100% ({', '.join(above)}): the step outran the matmul peak measured in its "
                       "math mode, so that peak was measured low (a busy machine, or a matrix too small for "
                       "this device) -- re-run on an idle machine before reading the share")
    return table


def bench_rows(times: Sequence[Result], *, batch: int, size: int, dtype: str, peak: MatmulPeak | None,
               **context: Any) -> list[results.Row]:
    """Result rows: step and per-phase times (ms per step), TFLOP/s and % of the same-mode matmul peak, per model."""
    setting = f"train_step b{batch} {size}x{size} {dtype}"
    pub: dict[str, float] = {}
    source = None
    if batch == 16 and size == 224 and dtype == "fp32":  # the blog's setting: its published row beside yours
        rows_pub = published.select(published.load("dlprimitives"), experiment="train_step_batch16_224")
        pub = {r.metric.removeprefix("step_time_"): r.value for r in rows_pub if r.variant == PUBLISHED_REFERENCE}
        source = f"{rows_pub[0].source} ({PUBLISHED_REFERENCE}, phases synchronized)"
    extra = {t.name: {"mean_ms": _mean_ms(t), "flops_per_step": t.metrics["flops_per_step"],
                      "phase_method": t.settings["phase_method"], "device": t.settings["device"]} for t in times}
    out = results.make_rows("bench", setting, {t.name: [1e3 * v for v in t.samples] for t in times},
                            metric="step_time", unit="ms", published={k: v for k, v in pub.items()
                                                                      if k in {t.name for t in times}} or None,
                            published_source=source, extra=extra, **context)
    ctx = {k: getattr(out[0], k) for k in ("fingerprint", "profile", "data")}
    for phase in PHASES:
        vals = {t.name: [1e3 * v for v in t.settings["phases"][phase]] for t in times if t.settings["phases"].get(phase)}
        if vals:
            out += results.make_rows("bench", setting, vals, metric=f"{phase}_step_time", unit="ms", **ctx)
    achieved = {t.name: [t.metrics["flops_per_step"] / t.stats.median / 1e12] for t in times if t.metrics["flops_per_step"]}
    if achieved:
        out += results.make_rows("bench", setting, achieved, metric="achieved_throughput", unit="TFLOP/s",
                                 lower_is_better=False, **ctx)
        if peak:
            out += results.make_rows("bench", setting, {m: [100 * v[0] * 1e12 / peak.flops] for m, v in achieved.items()},
                                     metric=f"share_of_{peak.mode}_matmul_peak", unit="%", lower_is_better=False,
                                     extra={m: {"peak_tflops": peak.flops / 1e12, "mode": peak.mode} for m in achieved},
                                     **ctx)
    return out


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m helpers.bench", description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="+", default=list(BENCH_MODELS), metavar="MODEL",
                   help=f"any of {', '.join(BENCH_MODELS)} (default: all)")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda, xpu or mps")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--size", type=int, default=224, help="image side in pixels (square)")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--dtype", default="fp32", help="fp32, bf16 or fp16 (autocast)")
    p.add_argument("--out", default="results/bench",
                   help="each run writes a new folder <out>/<time>-<device>/ with rows.jsonl, bench.csv, bench.md")
    return p


def main(argv: Sequence[str] | None = None) -> list[Result]:
    """Command line: time the models, print the tables, write the run's folder."""
    args = _parser().parse_args(argv)
    names, device, autocast = check_options(args.models, args.device, args.dtype)
    print(system.env_report())
    print(f"device {devices.describe(device)} | batch {args.batch} | {args.size}x{args.size} | {args.dtype}"
          f" | {args.warmup} warm-up + {args.steps} timed steps")
    from tqdm.auto import tqdm

    times = [time_steps(name, device=device, batch=args.batch, size=args.size, warmup=args.warmup, steps=args.steps,
                        autocast=autocast) for name in tqdm(names, desc="models", disable=None)]
    peak = matmul_peak(device, math_mode(device, autocast))
    tables = [results_table(times, peak), published_table(times)]
    print(f"{tables[0]}\n\n{tables[1]}")
    rows = bench_rows(times, batch=args.batch, size=args.size, dtype=args.dtype, peak=peak, data="none")
    folder = Path(args.out) / f"{datetime.now().strftime('%Y%m%d-%H%M%S')}-{device.type}"
    while folder.exists():
        folder = folder.with_name(folder.name + "x")
    results.write_rows(rows, folder / results.ROWS_FILE)
    files.atomic_write_text(folder / "bench.csv", tables[0].to_csv())
    files.atomic_write_text(folder / "bench.md", "\n\n".join(["# Training-step benchmark", system.env_report(),
                                                              *(t._repr_markdown_() for t in tables)]) + "\n")
    print(f"\nsaved {folder / results.ROWS_FILE}, bench.csv and bench.md beside it")
    return times


if __name__ == "__main__":
    try:
        main()
    except BenchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
