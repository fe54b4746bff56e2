"""Training-step benchmark with the dlprimitives blog's method: ``python -m helpers.bench``.

The published table (A. Beilis, "Pytorch Training Benchmarks", 2021-10-26) times, per
torchvision model in train mode at batch 16 and 224x224, fp32: zero_grad, the host-to-device
copy of one fixed random batch made on the CPU, forward + LogSoftmax + NLLLoss, backward and
an Adam step, synchronizing the device after each phase; 5 warm-up steps, then the mean of
20 timed steps. This module does exactly that on cpu, cuda, xpu or mps, and adds what the
blog did not report: median and spread, per-phase times, achieved FLOP/s, ratios against
every published row, and a CSV/JSON with the machine fingerprint.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Sequence

import torch
from torch import nn

from . import devices, models, precision, published, system
from .measure import Result, Stats, save_results
from .tables import Table

BENCH_MODELS: tuple[str, ...] = ("alexnet", "resnet18", "resnet50", "vgg16", "mobilenet")
PHASES: tuple[str, ...] = ("zero_grad", "copy", "forward", "backward", "update")


class BenchError(ValueError):
    """A bad benchmark option, with the valid choices."""


@dataclass
class StepTimes:
    """Per-step wall times (seconds) of one model, split by phase."""

    model: str
    device: str
    total: list[float]
    phases: dict[str, list[float]] = field(default_factory=dict)
    flops_per_step: int = 0

    @property
    def mean_ms(self) -> float:
        return 1e3 * statistics.fmean(self.total)

    @property
    def stats(self) -> Stats:
        return Stats.of(self.total)


def check_options(model_names: Sequence[str], device: str, dtype: str) -> tuple[list[str], torch.device, torch.dtype | None]:
    """Validate model names, device and dtype; one clear message listing the choices."""
    unknown = [m for m in model_names if m not in BENCH_MODELS]
    if unknown:
        raise BenchError(f"Unknown model(s) {', '.join(unknown)}; choose from {', '.join(BENCH_MODELS)}.")
    try:
        dev = devices.get_device(device)
    except devices.DeviceError as exc:
        raise BenchError(str(exc)) from None
    try:
        autocast = precision.parse_dtype(dtype)
    except ValueError as exc:
        raise BenchError(str(exc)) from None
    return list(model_names), dev, autocast


class BenchStep:
    """One training step of the blog's benchmark, on a model, optimizer and fixed host batch
    built once. ``run(marks)`` performs the step; with a list it appends a clock reading
    after each phase, synchronizing the device first."""

    def __init__(self, model_name: str, *, device: torch.device, batch: int = 16, size: int = 224,
                 autocast: torch.dtype | None = None, channels_last: bool = False, optimizer: bool = True,
                 seed: int = 0):
        if batch < 1 or size < 32:
            raise BenchError("batch >= 1 and size >= 32 are required")
        torch.manual_seed(seed)
        self.device, self.autocast, self.use_optimizer = device, autocast, optimizer
        self.memory_format = torch.channels_last if channels_last else torch.contiguous_format
        self.net = models.torchvision_model(model_name, num_classes=1000).to(device).train()
        self.net = self.net.to(memory_format=self.memory_format)
        self.head, self.loss_fn = nn.LogSoftmax(dim=1), nn.NLLLoss()
        self.opt = torch.optim.Adam(self.net.parameters())
        self.inputs = torch.randn(batch, 3, size, size)  # one fixed batch on the host, copied every step
        self.labels = torch.randint(1000, (batch,))

    def flops(self) -> int:
        """FLOPs of forward + loss + backward (torch.utils.flop_counter); gradients are cleared."""
        from torch.utils.flop_counter import FlopCounterMode

        counter = FlopCounterMode(display=False)
        with counter:
            self.run()
        self.opt.zero_grad(set_to_none=True)
        return int(counter.get_total_flops())

    def run(self, marks: list[float] | None = None) -> None:
        def mark() -> None:
            if marks is not None:
                devices.synchronize(self.device)
                marks.append(time.perf_counter())

        if marks is not None:
            marks.append(time.perf_counter())
        self.opt.zero_grad(set_to_none=True)
        mark()
        x = self.inputs.to(self.device, memory_format=self.memory_format)
        y = self.labels.to(self.device)
        mark()
        if self.autocast is None:
            loss = self.loss_fn(self.head(self.net(x)), y)
        else:
            with torch.autocast(device_type=self.device.type, dtype=self.autocast):
                loss = self.loss_fn(self.head(self.net(x)).float(), y)
        mark()
        loss.backward()
        mark()
        if self.use_optimizer:
            self.opt.step()
        mark()


def timed_steps(step: BenchStep, steps: int, warmup: int = 0) -> tuple[list[float], dict[str, list[float]]]:
    """Run ``warmup`` then ``steps`` timed steps; per-step totals and per-phase times (seconds)."""
    totals: list[float] = []
    phases: dict[str, list[float]] = {p: [] for p in PHASES}
    for i in range(-warmup, steps):
        marks: list[float] = []
        step.run(marks)
        if i >= 0:
            totals.append(marks[-1] - marks[0])
            for name, a, b in zip(PHASES, marks, marks[1:]):
                phases[name].append(b - a)
    return totals, phases


def time_steps(model_name: str, *, device: torch.device, batch: int = 16, size: int = 224, warmup: int = 5,
               steps: int = 20, autocast: torch.dtype | None = None, channels_last: bool = False,
               optimizer: bool = True, seed: int = 0, count_flops: bool = True) -> StepTimes:
    """Time ``steps`` training steps of one torchvision model with the blog's method."""
    if steps < 1 or warmup < 0:
        raise BenchError("steps >= 1 and warmup >= 0 are required")
    step = BenchStep(model_name, device=device, batch=batch, size=size, autocast=autocast,
                     channels_last=channels_last, optimizer=optimizer, seed=seed)
    flops = step.flops() if count_flops else 0
    totals, phases = timed_steps(step, steps, warmup)
    return StepTimes(model_name, str(device), totals, phases, flops)


def published_table(times: Sequence[StepTimes], title: str = "") -> Table:
    """Every published row of the blog's table next to yours, as ratios (published ms / your ms)."""
    rows = published.select(published.load("dlprimitives"), experiment="train_step_batch16_224")
    frameworks = list(dict.fromkeys(r.variant for r in rows))
    cols = ["published setup"] + [t.model for t in times]
    table = Table(cols, title=title or "Published ms per step / your ms per step (> 1: yours is faster)",
                  note=f"Published: {rows[0].source}. Batch 16, 224x224, fp32, Adam. "
                       "Your step times: " + ", ".join(f"{t.model} {t.mean_ms:.1f} ms" for t in times))
    for fw in frameworks:
        vals = {r.metric.removeprefix("step_time_"): r.value for r in rows if r.variant == fw}
        table.add(fw, *[vals[t.model] / t.mean_ms if t.model in vals else None for t in times])
    return table


def results_table(times: Sequence[StepTimes], peak_flops: float | None = None) -> Table:
    """Mean (the blog's statistic), median, spread, per-phase means and achieved FLOP/s."""
    cols = ["model", "mean ms", "median ms", "min ms", "max ms"] + [f"{p} ms" for p in PHASES] + ["TFLOP/s"]
    if peak_flops:
        cols.append("% of matmul peak")
    table = Table(cols, note="mean over the timed steps, as published; phases synchronized one by one")
    for t in times:
        st = t.stats
        achieved = t.flops_per_step / st.median if t.flops_per_step else None
        row = [t.model, t.mean_ms, st.median * 1e3, st.minimum * 1e3, st.maximum * 1e3]
        row += [1e3 * statistics.fmean(t.phases[p]) for p in PHASES]
        row.append(achieved / 1e12 if achieved else None)
        if peak_flops:
            row.append(100 * achieved / peak_flops if achieved else None)
        table.add(*row)
    return table


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m helpers.bench", description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="+", default=list(BENCH_MODELS), metavar="MODEL",
                   help=f"any of {', '.join(BENCH_MODELS)} (default: all)")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda, xpu or mps")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--dtype", default="fp32", help="fp32, bf16 or fp16 (autocast)")
    p.add_argument("--channels-last", action="store_true")
    p.add_argument("--no-optimizer", action="store_true", help="forward+backward only (the blog's 2024 definition)")
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--out", default="results/bench", help="folder for the CSV/JSON (timestamped files)")
    return p


def main(argv: Sequence[str] | None = None) -> list[StepTimes]:
    args = _parser().parse_args(argv)
    names, device, autocast = check_options(args.models, args.device, args.dtype)
    if args.threads:
        torch.set_num_threads(args.threads)
    print(system.env_report())
    print(f"device {devices.describe(device)} | batch {args.batch} | {args.size}x{args.size} | {args.dtype}"
          f"{' | channels_last' if args.channels_last else ''} | {args.warmup} warm-up + {args.steps} timed steps")
    from tqdm.auto import tqdm

    times = []
    for name in tqdm(names, desc="models", disable=None):
        times.append(time_steps(name, device=device, batch=args.batch, size=args.size, warmup=args.warmup,
                                steps=args.steps, autocast=autocast, channels_last=args.channels_last,
                                optimizer=not args.no_optimizer))
    from .measure import matmul_flops_per_second

    peak = matmul_flops_per_second(device, n=2048 if device.type != "cpu" else 1024)
    print(results_table(times, peak))
    print()
    print(published_table(times))
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    path = save_results([Result(t.model, t.total, [], {"mean_ms": t.mean_ms, "flops_per_step": float(t.flops_per_step),
                                                       **{f"{p}_ms": 1e3 * statistics.fmean(t.phases[p]) for p in PHASES}},
                                {"batch": args.batch, "size": args.size, "dtype": args.dtype,
                                 "channels_last": args.channels_last, "optimizer": not args.no_optimizer,
                                 "device": str(device)}) for t in times],
                        Path(args.out) / f"bench-{stamp}", matmul_peak_flops=peak)
    print(f"\nsaved {path} and {path.with_suffix('.csv')}")
    return times


if __name__ == "__main__":
    try:
        main()
    except BenchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
