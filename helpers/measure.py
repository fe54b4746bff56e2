"""The course's measurement protocol, as code.

1. one change at a time, fresh seeded model per variant (the caller builds it);
2. warm-up kept apart from the timed repeats, and both reported;
3. the device synchronized before every clock read (perf_counter);
4. several repeats, reported as median with min-max and IQR;
5. speed-up = baseline / variant from the same run, next to accuracy;
6. results saved as JSON + CSV with the machine fingerprint.

It also measures the FLOPs of a training step (torch.utils.flop_counter) and the
machine's matmul throughput in a given math mode (``matmul_peak``: fp32, TF32, bf16, fp16),
so a step can be compared with what the hardware can do in the mode the step ran in.
"""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from . import devices, system
from .tables import Table


@dataclass(frozen=True)
class Stats:
    """Summary of repeated timings (seconds)."""

    median: float
    minimum: float
    maximum: float
    q1: float
    q3: float
    n: int

    @classmethod
    def of(cls, samples: Sequence[float]) -> "Stats":
        if not samples:
            raise ValueError("Stats.of needs at least one sample")
        s = sorted(float(x) for x in samples)
        if len(s) == 1:
            q1 = q3 = s[0]
        else:
            q1, _, q3 = statistics.quantiles(s, n=4, method="inclusive")
        return cls(statistics.median(s), s[0], s[-1], q1, q3, len(s))

    @property
    def spread(self) -> float:
        """Max minus min, as a fraction of the median."""
        return (self.maximum - self.minimum) / self.median if self.median else 0.0

    def __str__(self) -> str:
        return f"{self.median:.4g} s (min {self.minimum:.4g}, max {self.maximum:.4g}, n={self.n})"


@dataclass
class Result:
    """One variant's measurement: timed samples, warm-up samples and quality metrics."""

    name: str
    samples: list[float]
    warmup: list[float] = field(default_factory=list)
    metrics: dict[str, float] = field(default_factory=dict)
    settings: dict[str, Any] = field(default_factory=dict)

    @property
    def stats(self) -> Stats:
        return Stats.of(self.samples)


def time_fn(fn: Callable[[], Any], *, repeats: int = 5, warmup: int = 1,
            device: torch.device | str = "cpu", name: str = "fn") -> Result:
    """Call ``fn`` ``warmup`` times, then ``repeats`` timed times, synchronizing the device."""
    if repeats < 1 or warmup < 0:
        raise ValueError("repeats must be >= 1 and warmup >= 0")

    def once() -> float:
        devices.synchronize(device)
        start = time.perf_counter()
        fn()
        devices.synchronize(device)
        return time.perf_counter() - start

    warm = [once() for _ in range(warmup)]
    return Result(name=name, samples=[once() for _ in range(repeats)], warmup=warm)


def speedup_table(results: Sequence[Result], baseline: str | None = None,
                  metrics: Sequence[str] = (), title: str = "", unit: str = "s") -> Table:
    """Median, spread and speed-up (baseline/variant) of each result, with its metrics."""
    if not results:
        raise ValueError("no results to tabulate")
    base = next((r for r in results if r.name == baseline), results[0]) if baseline else results[0]
    if baseline and base.name != baseline:
        raise ValueError(f"baseline {baseline!r} is not among the results")
    cols = ["variant", f"median {unit}", f"min {unit}", f"max {unit}", "speed-up"]
    if any(r.warmup for r in results):
        cols.insert(1, f"warm-up {unit}")
    table = Table(cols + list(metrics), title=title,
                  note=f"speed-up = median({base.name}) / median(variant), measured in this run")
    for r in results:
        st = r.stats
        row: list[Any] = [r.name]
        if "warm-up" in cols[1]:
            row.append(statistics.median(r.warmup) if r.warmup else None)
        row += [st.median, st.minimum, st.maximum, base.stats.median / st.median if st.median else None]
        row += [r.metrics.get(m) for m in metrics]
        table.add(*row)
    return table


def save_results(results: Sequence[Result], path: Path | str, **context: Any) -> Path:
    """Write results with the machine fingerprint to ``path`` (.json) and a CSV beside it."""
    path = Path(path).with_suffix(".json")
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": system.fingerprint(),
        "context": context,
        "results": [dict(asdict(r), stats=asdict(r.stats)) for r in results],
    }
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(payload, indent=2, default=str))
    tmp.replace(path)
    metric_names = sorted({m for r in results for m in r.metrics})
    table = Table(["name", "median_s", "min_s", "max_s", "n", "warmup_median_s"] + metric_names)
    for r in results:
        st = r.stats
        table.add(r.name, st.median, st.minimum, st.maximum, st.n,
                  statistics.median(r.warmup) if r.warmup else None, *[r.metrics.get(m) for m in metric_names])
    table.to_csv(path.with_suffix(".csv"))
    return path


def load_results(path: Path | str) -> list[Result]:
    """Read results written by ``save_results``."""
    payload = json.loads(Path(path).with_suffix(".json").read_text())
    return [Result(r["name"], r["samples"], r["warmup"], r["metrics"], r["settings"]) for r in payload["results"]]


def loader_time(loader: Any, *, epochs: int = 3, warmup: int = 1, max_batches: int | None = None,
                name: str = "loader") -> Result:
    """Seconds to iterate a DataLoader once, data loading alone (no model).

    Each sample is one full pass, starting the iterator (and, without persistent workers,
    the worker processes) anew, as a training epoch would. ``metrics['images_per_s']`` is
    the median throughput.
    """
    if epochs < 1 or warmup < 0:
        raise ValueError("epochs must be >= 1 and warmup >= 0")
    count = 0

    def one_pass() -> None:
        nonlocal count
        count = 0
        for i, (inputs, _) in enumerate(loader):
            count += len(inputs)
            if max_batches is not None and i + 1 >= max_batches:
                break

    res = time_fn(one_pass, repeats=epochs, warmup=warmup, name=name)
    res.metrics["images_per_s"] = count / res.stats.median
    return res


def training_step_flops(model: torch.nn.Module, inputs: torch.Tensor, targets: torch.Tensor,
                        loss_fn: Callable) -> int:
    """FLOPs of one forward + loss + backward pass, counted by torch.utils.flop_counter.

    The optimizer update is elementwise and not counted; the model's gradients are cleared.
    """
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with counter:
        loss_fn(model(inputs), targets).backward()
    model.zero_grad(set_to_none=True)
    return int(counter.get_total_flops())


def matmul_flops_per_second(device: torch.device | str = "cpu", n: int = 1024, repeats: int = 5,
                            dtype: torch.dtype = torch.float32) -> float:
    """Measured throughput of an n x n matrix multiply, in FLOP/s (median of repeats)."""
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    res = time_fn(lambda: a @ b, repeats=repeats, warmup=2, device=device)
    return 2 * n**3 / res.stats.median


@dataclass(frozen=True)
class MatmulPeak:
    """The best matmul throughput measured on a device in one math mode (``fp32``, ``tf32``,
    ``bf16``, ``fp16``), the denominator of an honest "% of peak"."""

    flops: float
    mode: str
    n: int = 0
    repeats: int = 0

    def __bool__(self) -> bool:
        return self.flops > 0


MATH_MODES: dict[str, torch.dtype] = {"fp32": torch.float32, "tf32": torch.float32, "bf16": torch.bfloat16,
                                      "fp16": torch.float16}


def math_mode(device: torch.device | str, autocast: torch.dtype | None = None) -> str:
    """The math mode a training step runs in: the autocast dtype, else fp32 -- or TF32 on CUDA
    when matmuls or cuDNN convolutions may use it (``torch.backends.cudnn.allow_tf32`` is on by
    default, so an "fp32" CNN step on an NVIDIA GPU mostly runs TF32 convolutions)."""
    if autocast is not None and autocast != torch.float32:
        return {torch.bfloat16: "bf16", torch.float16: "fp16"}.get(autocast, str(autocast).removeprefix("torch."))
    if torch.device(device).type == "cuda" and (torch.backends.cuda.matmul.allow_tf32
                                                 or torch.backends.cudnn.allow_tf32):
        return "tf32"
    return "fp32"


def matmul_peak(device: torch.device | str = "cpu", mode: str = "fp32", n: int | None = None,
                repeats: int = 5) -> MatmulPeak:
    """The best (not median) n x n matmul throughput in ``mode``, in FLOP/s.

    ``tf32`` allows TF32 for the measurement only (the caller's setting is restored); ``fp32``
    forbids it. The default size is large enough to approach a GPU's peak (8192) and quick on
    a CPU (1024)."""
    if mode not in MATH_MODES:
        raise ValueError(f"unknown math mode {mode!r}; use one of {', '.join(MATH_MODES)}")
    device = torch.device(device)
    n = n or (1024 if device.type == "cpu" else 8192)
    before = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = mode == "tf32"
    try:
        dtype = MATH_MODES[mode]
        a = torch.randn(n, n, device=device, dtype=dtype)
        b = torch.randn(n, n, device=device, dtype=dtype)
        res = time_fn(lambda: a @ b, repeats=repeats, warmup=2, device=device)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before
    return MatmulPeak(2 * n**3 / res.stats.minimum, mode, n, repeats)


def phase_times(model: torch.nn.Module, inputs: torch.Tensor, targets: torch.Tensor,
                loss_fn: Callable, optimizer: torch.optim.Optimizer, *, steps: int = 20,
                warmup: int = 3, device: torch.device | str = "cpu") -> dict[str, Stats]:
    """Time the four phases of a training step (forward, loss, backward, update) separately.

    The device is synchronized after each phase, which is what makes the split honest on
    a GPU (and costs a little overall speed: use it to see shares, not the total).
    """
    if steps < 1:
        raise ValueError("steps must be >= 1")
    model.train()
    names = ("forward", "loss", "backward", "update")
    times: dict[str, list[float]] = {k: [] for k in names}

    for step in range(warmup + steps):
        marks = []
        devices.synchronize(device)
        marks.append(time.perf_counter())
        out = model(inputs)
        devices.synchronize(device)
        marks.append(time.perf_counter())
        loss = loss_fn(out, targets)
        devices.synchronize(device)
        marks.append(time.perf_counter())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        devices.synchronize(device)
        marks.append(time.perf_counter())
        optimizer.step()
        devices.synchronize(device)
        marks.append(time.perf_counter())
        if step >= warmup:
            for k, a, b in zip(names, marks, marks[1:]):
                times[k].append(b - a)
    return {k: Stats.of(v) for k, v in times.items()}
