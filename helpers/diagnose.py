"""Place one training step on this device's roofs: which of five regimes bounds it, and which lever attacks that.

``diagnose_step`` counts each operator's FLOPs and bytes, times it with torch.profiler, sets it under the roof of its
working set (``helpers.roofs``) and splits the step over ``REGIMES``; ``loader_wait`` and ``exposed_comm`` measure the
other two. Also here: a step's FLOPs and phase times. docs/diagnosis.md explains the method.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import torch
from torch.autograd import DeviceType
from torch.utils.flop_counter import FlopCounterMode

from . import devices, roofs as R, run_sizes
from .measure import Stats, time_fn
from .profiling import profile_fn
from .step import train_step
from .tables import Table

REGIMES: tuple[str, ...] = ("compute", "memory", "overhead", "input", "communication")
REGIME_LEVERS: dict[str, str] = {
    "compute": "bf16/AMP where the device has fast low-precision math, a bigger compute-efficient kernel, more cores",
    "memory": "channels-last, fusion via torch.compile, bf16 to halve the bytes",
    "overhead": "torch.compile or CUDA graphs to cut per-operator cost, a bigger batch to spread it",
    "input": "DataLoader workers, pinned memory, data already decoded (chapter 05); the tuner has no input lever",
    "communication": "fewer, bigger all-reduces, no_sync over accumulation steps, more threads per rank "
                     "(chapters 08-09); the tuner has no communication lever",
}
SLOW = 0.25
"""An operator bound by compute or memory below this fraction of its roof is a finding (slow kernel or layout)."""
LOWER_BOUNDS = ("byte counts are lower bounds (views, in-place operators and fused kernels hide traffic), "
                "so each % of a memory roof is one too")


@dataclass
class OpCost:
    """One kernel's share of a step: time, FLOPs and bytes per step, and its ideal seconds under each roof."""

    name: str
    calls: float = 0.0
    seconds: float = 0.0
    flops: float = 0.0
    bytes: float = 0.0
    level: str = ""
    largest: float = 0.0
    ideal: dict[str, float] = field(default_factory=lambda: dict.fromkeys(REGIMES[:3], 0.0))
    fixed: str = ""

    @property
    def regime(self) -> str:
        if self.fixed:
            return self.fixed
        return max(self.ideal, key=self.ideal.get) if any(self.ideal.values()) else "overhead"

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
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, (list, tuple)):
        return sum(_nbytes(v) for v in value)
    return sum(_nbytes(v) for v in value.values()) if isinstance(value, dict) else 0


def count_calls(step: Callable[[], Any]) -> list[tuple[str, int, int, int]]:
    """(operator, FLOPs, input bytes, output bytes) of every aten call of ``step``, as the dispatcher sees it.

    The one use of torch.utils._python_dispatch (semi-private): no public mode sees aten operators with their
    tensors (``torch.overrides.TorchFunctionMode`` sees torch functions before autograd and decomposition)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    calls: list[tuple[str, int, int, int]] = []
    counter = FlopCounterMode(display=False)

    class Counting(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[override]
            kwargs = kwargs or {}
            before = counter.get_total_flops()
            out = func(*args, **kwargs)
            if func.namespace != "profiler":
                moved = not func.is_view  # a view moves no bytes
                calls.append((func.name().split(".")[0], counter.get_total_flops() - before,
                              moved * _nbytes((args, kwargs)), moved * _nbytes(out)))
            return out

    with counter, Counting():
        step()
    return calls


def kernel_times(prof: Any, dispatched: set[str], device_time: bool = False) -> tuple[Counter, Counter, dict[str, str]]:
    """Seconds and calls per operator, and the kernel of each ``dispatched`` operator: the one below it with the most
    self time (on the device, with ``device_time``). The kernel gets its whole subtree (a convolution's inner copies)."""
    below: dict[str, Counter] = defaultdict(Counter)
    seconds, calls = Counter(), Counter()
    for event in prof.events():
        if event.device_type != DeviceType.CPU or event.name.startswith("ProfilerStep"):
            continue
        top, parent = None, event
        while parent is not None:  # the topmost dispatcher-level operator above: the call the counting mode saw
            top = parent.name if parent.name in dispatched else top
            parent = parent.cpu_parent
        spent = (event.self_device_time_total if device_time else event.self_cpu_time_total) / 1e6
        (below[top] if top else seconds)[event.name] += spent
        calls[event.name] += 1
    kernel = {op: max(spent, key=spent.get) for op, spent in below.items()}
    for op, spent in below.items():
        seconds[kernel[op]] += sum(spent.values())
    return seconds, calls, kernel


def diagnose_step(model: torch.nn.Module, inputs: Any, targets: torch.Tensor, loss_fn: Callable,
                  optimizer: torch.optim.Optimizer, *, device: torch.device | str = "cpu", input_wait_s: float = 0.0,
                  comm_s: float = 0.0, roofs: R.Roofs | None = None, steps: int | None = None,
                  autocast: torch.dtype | None = None) -> Diagnosis:
    """Place one ``train_step`` on the roofs of ``device`` (``roofs=None``: measured once per process) and split it.

    ``input_wait_s`` (``loader_wait``) and ``comm_s`` (``exposed_comm``) are seconds per step beside it. The model
    trains for a few steps."""
    device = torch.device(device)
    steps = steps or run_sizes.pick(smoke=2, workshop=10, full=20)
    roofs = roofs or R.cached_roofs(device, R.math_mode(device, autocast))
    step = lambda: train_step(model, optimizer, loss_fn, inputs, targets, autocast_dtype=autocast,  # noqa: E731
                              device_type=device.type)
    step_s = time_fn(step, repeats=steps, warmup=1, device=device).stats.median
    per_op: dict[str, OpCost] = {}
    for name, flops, read, written in count_calls(step):
        op = per_op.setdefault(name, OpCost(name))
        kind = "read" if written * 8 < read else "write" if read * 8 < written else "triad"
        level, roof = roofs.memory_roof(read + written, kind)
        bound = {"compute": flops / roofs.matmul.best, "memory": (read + written) / roof.best,
                 "overhead": roofs.overhead.best}
        regime = max(bound, key=bound.get)
        op.ideal[regime] += bound[regime]
        op.flops, op.bytes = op.flops + flops, op.bytes + read + written
        if read + written >= op.largest:
            op.level, op.largest = level, read + written
    walls: list[float] = []

    def timed() -> None:
        start = time.perf_counter()
        step()
        devices.synchronize(device)
        walls.append(time.perf_counter() - start)

    seconds, calls, kernel = kernel_times(profile_fn(timed, warmup=0, steps=steps, device=device), set(per_op),
                                          device.type != "cpu")
    wall, measured = sum(walls) / steps, sum(seconds.values()) / steps
    scale = step_s / wall  # shares come from the profiled steps alone; this rescales them to unprofiled seconds
    ops = {name: OpCost(name, calls[name] / steps, scale * s / steps) for name, s in seconds.items() if s > 0}
    for name, counted in per_op.items():
        op = ops.setdefault(kernel.get(name, name), OpCost(kernel.get(name, name)))
        op.flops, op.bytes = op.flops + counted.flops, op.bytes + counted.bytes
        op.ideal = {r: op.ideal[r] + counted.ideal[r] for r in op.ideal}
        if counted.largest >= op.largest:
            op.level, op.largest = counted.level, counted.largest
    rows = [op for op in ops.values() if op.seconds > 0]
    rows += [OpCost(label, seconds=s, fixed=regime) for label, s, regime in (
        ("(between operators: Python, autograd)", scale * max(0.0, wall - measured), "overhead"),
        ("(waiting for input)", input_wait_s, "input"), ("(exposed communication)", comm_s, "communication")) if s > 0]
    return _diagnosis(rows, step_s, roofs)


def _diagnosis(rows: list[OpCost], step_s: float, roofs: R.Roofs) -> Diagnosis:
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
    diagnosis.findings = [t for s, t in slow if s >= 0.1] + [said] + [t for s, t in slow if s < 0.1] + [LOWER_BOUNDS]
    diagnosis.note = (f"one step {1e3 * step_s:.3g} ms on {roofs.device} ({roofs.mode}); roofs (best round): matmul "
                      f"{roofs.matmul.best / 1e9:.3g} GFLOP/s, triad " + ", ".join(
                          f"{lv} {k['triad'].best / 1e9:.3g} GB/s" for lv, k in roofs.bandwidth.items())
                      + f", per-op overhead {roofs.overhead.best * 1e6:.2g} µs; FLOPs and bytes belong to the kernel "
                      f"that owns the profiler's self time; {LOWER_BOUNDS}")
    return diagnosis


def loader_wait(loader: Iterable, step: Callable[[Any], Any] | None = None, batches: int = 10) -> float:
    """Median seconds the loop waits for each batch, with ``step(batch)`` run between fetches as in training."""
    waits, batches_seen = [], iter(loader)
    for _ in range(batches):
        start = time.perf_counter()
        batch = next(batches_seen, None)
        if batch is None:
            break
        waits.append(time.perf_counter() - start)
        if step is not None:
            step(batch)
    if not waits:
        raise ValueError("the loader gave no batch")
    return statistics.median(waits)


def exposed_comm(ddp_model: Any, inputs: Any, targets: torch.Tensor, loss_fn: Callable,
                 optimizer: torch.optim.Optimizer, *, device: torch.device | str = "cpu", steps: int | None = None) -> float:
    """Seconds per step of communication a DDP step does not hide: its median minus the same step's under ``no_sync``.

    Every rank must call it (the synced steps all-reduce); steps alternate so both arms share the machine's drift."""
    device = torch.device(device)
    steps = steps or run_sizes.pick(smoke=4, workshop=10, full=20)
    timed: dict[bool, list[float]] = {True: [], False: []}
    for _ in range(steps + 1):
        for synced in (True, False):
            with contextlib.nullcontext() if synced else ddp_model.no_sync():
                timed[synced].append(time_fn(lambda: train_step(ddp_model, optimizer, loss_fn, inputs, targets,
                                                                device_type=device.type),
                                             repeats=1, warmup=0, device=device).samples[0])
    return max(0.0, statistics.median(timed[True][1:]) - statistics.median(timed[False][1:]))


def training_step_flops(model: torch.nn.Module, inputs: torch.Tensor, targets: torch.Tensor,
                        loss_fn: Callable) -> int:
    """FLOPs of one forward + loss + backward pass (torch.utils.flop_counter; the update is not counted, grads cleared)."""
    counter = FlopCounterMode(display=False)
    with counter:
        loss_fn(model(inputs), targets).backward()
    model.zero_grad(set_to_none=True)
    return int(counter.get_total_flops())


def phase_times(model: torch.nn.Module, inputs: torch.Tensor, targets: torch.Tensor,
                loss_fn: Callable, optimizer: torch.optim.Optimizer, *, steps: int = 20,
                warmup: int = 3, device: torch.device | str = "cpu") -> dict[str, Stats]:
    """Time forward, loss, backward and update of ``train_step`` apart, synchronizing after each (zero_grad counts
    with backward); the synchronizations cost a little speed: read shares, not the total."""
    if steps < 1:
        raise ValueError("steps must be >= 1")
    model.train()
    times: dict[str, list[float]] = {k: [] for k in ("forward", "loss", "backward", "update")}
    device = torch.device(device)
    for step in range(warmup + steps):
        clock: dict[str, float] = {}

        def mark(phase: str) -> None:
            devices.synchronize(device)
            clock[phase] = time.perf_counter()

        mark("start")
        train_step(model, optimizer, loss_fn, inputs, targets, device_type=device.type, mark=mark)
        if step >= warmup:
            times["forward"].append(clock["forward"] - clock["zero_grad"])
            times["loss"].append(clock["loss"] - clock["forward"])
            times["backward"].append(clock["backward"] - clock["loss"] + clock["zero_grad"] - clock["start"])
            times["update"].append(clock["update"] - clock["backward"])
    return {k: Stats.of(v) for k, v in times.items()}
