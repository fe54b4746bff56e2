"""Place one training step on this device's roofs (``diagnose_step``); the input wait, exposed communication, FLOPs."""

from __future__ import annotations

import contextlib
import itertools
import statistics
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Sequence

import torch
from torch.autograd import DeviceType
from torch.profiler import record_function
from torch.utils._pytree import tree_leaves

from . import devices, roofs as R, run_sizes
from .cpu_meter import CpuMeter
from .measure import Stats, time_fn
from .profiling import profile_fn
from .step import PHASES, train_step
from .tables import Table

REGIMES: tuple[str, ...] = ("compute", "memory", "overhead", "input", "communication")
REGIME_LEVERS: dict[str, str] = {
    "compute": "bf16/AMP where the device has fast low-precision math, a bigger compute-efficient kernel, more cores",
    "memory": "channels-last, fusion via torch.compile, bf16 to halve the bytes",
    "overhead": "torch.compile or CUDA graphs to cut per-operator cost, a bigger batch to spread it",
    "input": "DataLoader workers, pinned memory, data decoded once (chapter 05)",
    "communication": "fewer, bigger all-reduces, no_sync over accumulation steps, more threads per rank "
                     "(chapters 08-09)",
}
SLOW = 0.25  # an operator bound by compute or memory below this fraction of its roof is a finding
STEP = "diagnose: one step"
LOWER_BOUNDS = ("byte counts are lower bounds (views, in-place operators and fused kernels hide traffic), "
                "so each % of a memory roof is one too")


@dataclass
class OpCost:
    """One kernel's share of a step: time, FLOPs and bytes per step, and its ideal seconds under each roof."""

    name: str
    calls: int = 0
    seconds: float = 0.0
    flops: float = 0.0
    bytes: float = 0.0
    level: str = ""
    largest: float = 0.0
    ideal: dict[str, float] = field(default_factory=lambda: dict.fromkeys(REGIMES[:3], 0.0))
    fixed: str = ""

    @property
    def regime(self) -> str:
        return self.fixed or (max(self.ideal, key=self.ideal.get) if any(self.ideal.values()) else "overhead")

    @property
    def roof_share(self) -> float | None:
        """Ideal time over measured time: how close the operator runs to its roof (None: no roof applies)."""
        return sum(self.ideal.values()) / self.seconds if self.seconds and any(self.ideal.values()) else None

    def split(self) -> dict[str, float]:
        """Its seconds per regime, apportioned by the ideal time of each call's binding roof."""
        total = sum(self.ideal.values())
        if self.fixed or not total:
            return {self.regime: self.seconds}
        return {r: self.seconds * s / total for r, s in self.ideal.items()}

    def add(self, roofs: R.Roofs, flops: float, read: int, written: int) -> None:
        """Count one call: its FLOPs and bytes, and its ideal time under the roof that binds it (the largest)."""
        kind = "read" if written * 8 < read else "write" if read * 8 < written else "triad"
        level, roof = roofs.memory_roof(read + written, kind)
        bound = {"compute": flops / roofs.matmul.best, "memory": (read + written) / roof.best,
                 "overhead": roofs.overhead.best}
        regime = max(bound, key=bound.get)
        self.ideal[regime] += bound[regime]
        self.flops, self.bytes = self.flops + flops, self.bytes + read + written
        if read + written >= self.largest:
            self.level, self.largest = level, read + written


@dataclass
class Diagnosis:
    """A step split over ``REGIMES`` (``shares`` sum to 1), its operators and what the split means."""

    shares: dict[str, float]
    findings: list[str]
    ops: list[OpCost] = field(default_factory=list)
    step_s: float = 0.0
    note: str = ""

    @property
    def top(self) -> str:
        return max(REGIMES, key=lambda r: self.shares.get(r, 0.0))

    def line(self) -> str:
        """One line for a chapter: "memory 44%, compute 37%, overhead 19%; top finding: ..."."""
        parts = [f"{r} {100 * s:.0f}%" for r, s in sorted(self.shares.items(), key=lambda kv: -kv[1]) if s >= 0.005]
        return f"{', '.join(parts)}; top finding: {self.findings[0]}"

    def table(self, min_share: float = 0.01) -> Table:
        """Every operator above ``min_share`` of the step, the rest summed, and the waits beside the step."""
        total = sum(op.seconds for op in self.ops) or 1.0
        table = Table(["operator", "calls/step", "ms/step", "share %", "GFLOP", "MB", "FLOP/B", "working set",
                       "% of roof", "regime"], title=self.line(), note=self.note)
        rest = [op for op in self.ops if op.seconds / total < min_share]
        for op in sorted((o for o in self.ops if o.seconds / total >= min_share), key=lambda o: -o.seconds):
            share = op.roof_share
            table.add(op.name, op.calls or None, 1e3 * op.seconds, 100 * op.seconds / total, op.flops / 1e9 or None,
                      op.bytes / 1e6 or None, op.flops / op.bytes if op.bytes else None, op.level or None,
                      None if share is None else 100 * share, op.regime)
        if rest:
            table.add(f"({len(rest)} more operators)", None, 1e3 * sum(o.seconds for o in rest),
                      100 * sum(o.seconds for o in rest) / total, None, None, None, None, None, "-")
        return table

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: shares, top regime, findings and the step's seconds."""
        return {"shares": {r: round(self.shares.get(r, 0.0), 4) for r in REGIMES}, "top": self.top,
                "findings": list(self.findings), "step_s": self.step_s}


def _nbytes(value: Any) -> int:
    """Bytes of the tensors in ``value`` (nested lists, tuples, dicts)."""
    return sum(t.numel() * t.element_size() for t in tree_leaves(value) if isinstance(t, torch.Tensor))


def count_calls(step: Callable[[], Any]) -> list[tuple[str, int, int, int]]:
    """(operator, FLOPs, input bytes, output bytes) of every aten call of ``step`` (docs/diagnosis.md)."""
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils.flop_counter import FlopCounterMode  # imported when used: it takes a while

    calls: list[tuple[str, int, int, int]] = []
    counter = FlopCounterMode(display=False)

    class Counting(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[override]
            kwargs = kwargs or {}
            before = counter.get_total_flops()
            out = func(*args, **kwargs)
            if func.namespace != "profiler":
                name, moved = func.name().split(".")[0], not func.is_view  # a view moves no bytes
                # an in-place operator that returns nothing (_foreach_add_, _fused_adam_) writes its first argument
                written = _nbytes(out) or (_nbytes(args[:1]) if name.endswith("_") else 0)
                calls.append((name, counter.get_total_flops() - before, moved * _nbytes((args, kwargs)),
                              moved * written))
            return out

    with counter, Counting():
        step()
    return calls


def kernel_times(prof: Any, dispatched: set[str], device_time: bool = False) -> tuple[dict, Counter, dict[str, str]]:
    """Self seconds per operator per profiled step (key: its ``STEP`` mark's start), calls, each operator's kernel."""
    spent: list[tuple[Any, str | None, str, float]] = []
    calls: Counter = Counter()
    below: dict[str, Counter] = defaultdict(Counter)  # the time under each dispatched operator, per kernel
    for event in prof.events():
        if event.device_type != DeviceType.CPU or event.name == STEP:
            continue
        top, root, parent = None, event, event
        while parent is not None:  # the topmost dispatcher-level operator above: the call the counting mode saw
            top = parent.name if parent.name in dispatched else top
            root, parent = parent, parent.cpu_parent
        seconds = (event.self_device_time_total if device_time else event.self_cpu_time_total) / 1e6
        spent.append((root.time_range.start if root.name == STEP else None, top, event.name, seconds))
        calls[event.name] += 1
        if top:
            below[top][event.name] += seconds
    kernel = {op: max(names, key=names.get) for op, names in below.items()}
    steps: dict[Any, Counter] = defaultdict(Counter)
    for step, top, name, seconds in spent:
        steps[step][kernel[top] if top else name] += seconds
    return dict(steps), calls, kernel


def diagnose_step(model: torch.nn.Module, inputs: Any, targets: torch.Tensor, loss_fn: Callable,
                  optimizer: torch.optim.Optimizer, *, device: torch.device | str = "cpu", input_wait_s: float = 0.0,
                  comm_s: float = 0.0, roofs: R.Roofs | None = None, steps: int | None = None,
                  autocast: torch.dtype | None = None) -> Diagnosis:
    """Place a few ``train_step`` runs on ``device``'s roofs and split them; ``input_wait_s``, ``comm_s``: beside."""
    device = torch.device(device)
    steps = steps or run_sizes.pick(smoke=3, workshop=10, full=20)
    roofs = roofs or R.cached_roofs(device, R.math_mode(device, autocast))
    step = lambda: train_step(model, optimizer, loss_fn, inputs, targets, autocast_dtype=autocast,  # noqa: E731
                              device_type=device.type)
    meter = CpuMeter().start()
    step_s = time_fn(step, repeats=steps, warmup=1, device=device).stats.median
    calls, walls = count_calls(step), []

    def timed() -> None:
        start = time.perf_counter()
        with record_function(STEP):
            step()
        devices.synchronize(device)
        walls.append(time.perf_counter() - start)

    per_step, counts, kernel = kernel_times(profile_fn(timed, warmup=0, steps=steps, device=device),
                                            {c[0] for c in calls}, device.type in ("cuda", "xpu"))
    loose = per_step.pop(None, Counter())  # other threads' events (a GPU's backward): spread over the steps
    marked = [per_step[k] for k in sorted(per_step)] or [Counter()]
    # each operator's least disturbed step, and the least time between operators: other processes only add time
    seconds = {n: min(s[n] for s in marked) + loose[n] / steps for n in set(loose).union(*marked)}
    gap = max(0.0, min(w - sum(s.values()) for w, s in zip(walls, marked)) - sum(loose.values()) / steps)
    scale = step_s / ((sum(seconds.values()) + gap) or 1.0)  # shares from the profile, seconds from the clock
    ops = {name: OpCost(name, round(counts[name] / steps), scale * s) for name, s in seconds.items()}
    for name, flops, read, written in calls:
        ops.setdefault(kernel.get(name, name), OpCost(kernel.get(name, name))).add(roofs, flops, read, written)
    rows = [op for op in ops.values() if op.seconds > 0]
    rows += [OpCost(label, seconds=s, fixed=regime) for label, s, regime in (
        ("(between operators: Python, autograd)", scale * gap, "overhead"),
        ("(waiting for input)", input_wait_s, "input"), ("(exposed communication)", comm_s, "communication")) if s > 0]
    others = meter.stop()
    caveat = [f"other processes took {others.cores:.1f} cores while the step was measured: its times are high and "
              "its % of roof low; measure again on a quiet machine"] if others.disturbed() else []
    return _diagnosis(rows, step_s, roofs, caveat)


def _diagnosis(rows: list[OpCost], step_s: float, roofs: R.Roofs, caveats: Sequence[str] = ()) -> Diagnosis:
    """Shares per regime and the findings from the operators' rows."""
    total = sum(op.seconds for op in rows) or 1.0
    shares = dict.fromkeys(REGIMES, 0.0)
    for op in rows:
        for regime, s in op.split().items():
            shares[regime] += s / total
    diagnosis = Diagnosis(shares, [], rows, step_s)
    slow = []
    for op in sorted(rows, key=lambda o: -o.seconds):
        share, roof = op.seconds / total, op.roof_share
        if op.regime in ("compute", "memory") and share >= 0.05 and roof is not None and roof < SLOW:
            where = "matmul" if op.regime == "compute" else f"{op.level} {'bandwidth' if op.level else ''}".strip()
            slow.append((share, f"{op.name} is {op.regime}-bound at {100 * roof:.0f}% of its {where} roof "
                                f"({100 * share:.0f}% of the step): the kernel or the layout is the limit"))
    top = diagnosis.top
    said = f"{top} bounds the step ({100 * shares[top]:.0f}%): {REGIME_LEVERS[top]}"
    diagnosis.findings = ([t for s, t in slow if s >= 0.1] + [said] + [t for s, t in slow if s < 0.1]
                          + [*caveats, LOWER_BOUNDS])
    triads = ", ".join(f"{lv} {k['triad'].best / 1e9:.3g}" for lv, k in roofs.bandwidth.items())
    diagnosis.note = (f"one step {1e3 * step_s:.3g} ms on {roofs.device} ({roofs.mode}); roofs (best round): matmul "
                      f"{roofs.matmul.best / 1e9:.3g} GFLOP/s, triad GB/s {triads}, per-op overhead "
                      f"{roofs.overhead.best * 1e6:.2g} µs; FLOPs and bytes go to the kernel that owns the profiler's "
                      f"self time; {LOWER_BOUNDS}")
    return diagnosis


def loader_wait(loader: Iterable, step: Callable[[Any], Any] | None = None, batches: int = 10) -> float:
    """Median seconds the loop waits for each batch, with ``step(batch)`` run between fetches as in training."""
    waits, start = [], time.perf_counter()
    for batch in itertools.islice(loader, batches):
        waits.append(time.perf_counter() - start)
        if step is not None:
            step(batch)
        start = time.perf_counter()
    if not waits:
        raise ValueError("the loader gave no batch")
    return statistics.median(waits)


def exposed_comm(ddp_model: Any, inputs: Any, targets: torch.Tensor, loss_fn: Callable,
                 optimizer: torch.optim.Optimizer, *, device: torch.device | str = "cpu",
                 steps: int | None = None) -> float:
    """Seconds per DDP step of communication not hidden: the median step minus one under ``no_sync`` (every rank)."""
    device = torch.device(device)
    steps = steps or run_sizes.pick(smoke=4, workshop=10, full=20)
    step = lambda: train_step(ddp_model, optimizer, loss_fn, inputs, targets, device_type=device.type)  # noqa: E731
    timed: dict[bool, list[float]] = {True: [], False: []}
    for _ in range(steps + 1):
        for synced in (True, False):
            with contextlib.nullcontext() if synced else ddp_model.no_sync():
                timed[synced].append(time_fn(step, repeats=1, warmup=0, device=device).samples[0])
    return max(0.0, statistics.median(timed[True][1:]) - statistics.median(timed[False][1:]))


def training_step_flops(model: torch.nn.Module, inputs: torch.Tensor, targets: torch.Tensor,
                        loss_fn: Callable) -> int:
    """FLOPs of one forward + loss + backward (``count_calls``; the update uncounted, gradients cleared)."""
    calls = count_calls(lambda: loss_fn(model(inputs), targets).backward())
    model.zero_grad(set_to_none=True)
    return int(sum(flops for _, flops, _, _ in calls))


def phase_times(model: torch.nn.Module, inputs: torch.Tensor, targets: torch.Tensor,
                loss_fn: Callable, optimizer: torch.optim.Optimizer, *, steps: int = 20,
                warmup: int = 3, device: torch.device | str = "cpu") -> dict[str, Stats]:
    """Time forward, loss, backward (with zero_grad) and update of ``train_step`` apart, synchronizing after each."""
    model.train()
    spans = dict(zip(PHASES[1:], zip(PHASES, PHASES[1:])))  # forward: (zero_grad, forward), ...
    times: dict[str, list[float]] = {k: [] for k in spans}
    device = torch.device(device)
    for step in range(warmup + steps):
        clock: dict[str, float] = {}

        def mark(phase: str) -> None:
            devices.synchronize(device)
            clock[phase] = time.perf_counter()

        mark("start")
        train_step(model, optimizer, loss_fn, inputs, targets, device_type=device.type, mark=mark)
        for k, (a, b) in spans.items() if step >= warmup else ():
            times[k].append(clock[b] - clock[a] + (clock["zero_grad"] - clock["start"] if k == "backward" else 0.0))
    return {k: Stats.of(v) for k, v in times.items()}
