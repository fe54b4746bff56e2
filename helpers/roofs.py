"""This device's ceilings from torch operations alone (``measure_roofs``): matmul, bandwidth, overhead, copies."""

from __future__ import annotations

import functools
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from . import devices, run_sizes
from .cpu_meter import CpuMeter
from .measure import time_fn
from .tables import Table

MATH_MODES: dict[str, torch.dtype] = {"fp32": torch.float32, "tf32": torch.float32, "bf16": torch.bfloat16,
                                      "fp16": torch.float16}
MIB = 1 << 20


@dataclass(frozen=True)
class Roof:
    """One ceiling over rounds: median, min and max in ``unit``; ``size``: its working set in bytes (matmul: n)."""

    name: str
    unit: str
    median: float
    low: float
    high: float
    size: int = 0

    @classmethod
    def of(cls, name: str, unit: str, values: Sequence[float], size: int = 0) -> "Roof":
        return cls(name, unit, statistics.median(values), min(values), max(values), size)

    @property
    def best(self) -> float:
        """The best round (a ceiling: other processes only lower it): the highest rate, or the shortest time."""
        return self.low if self.unit == "s" else self.high


@dataclass(frozen=True)
class MatmulPeak:
    """The best n x n matmul throughput in one math mode (fp32, tf32, bf16, fp16), with every repeat's rate."""

    flops: float
    mode: str
    n: int = 0
    repeats: int = 0
    rates: tuple[float, ...] = ()


def math_mode(device: torch.device | str, autocast: torch.dtype | None = None) -> str:
    """The math mode a step runs in: the autocast dtype, else fp32 -- TF32 on CUDA when matmuls or cuDNN may use it."""
    if autocast is not None and autocast != torch.float32:
        return {torch.bfloat16: "bf16", torch.float16: "fp16"}.get(autocast, str(autocast).removeprefix("torch."))
    if torch.device(device).type == "cuda" and "tf32" in (torch.backends.cuda.matmul.fp32_precision,
                                                           torch.backends.cudnn.conv.fp32_precision):
        return "tf32"  # the API of torch >= 2.9; the old allow_tf32 flags can raise once it was used
    return "fp32"


def matmul_peak(device: torch.device | str = "cpu", mode: str = "fp32", n: int | None = None,
                repeats: int = 5) -> MatmulPeak:
    """The best (not median) n x n matmul FLOP/s in ``mode`` (n: 1024 on a CPU, else 8192); only ``tf32`` uses TF32."""
    if mode not in MATH_MODES:
        raise ValueError(f"unknown math mode {mode!r}; use one of {', '.join(MATH_MODES)}")
    device = torch.device(device)
    n = n or (1024 if device.type == "cpu" else 8192)
    before = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = mode == "tf32"
    try:
        a, b = (torch.randn(n, n, device=device, dtype=MATH_MODES[mode]) for _ in range(2))
        res = time_fn(lambda: a @ b, repeats=repeats, warmup=2, device=device)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before
    return MatmulPeak(2 * n**3 / res.stats.minimum, mode, n, repeats, tuple(2 * n**3 / s for s in res.samples))


def rates(fn: Callable[[], Any], work: float, device: torch.device | str, rounds: int, *,
          seconds: float = 0.01) -> list[float]:
    """``work`` per second of ``fn``, one value per round of as many calls as last ``seconds`` (doubled until)."""
    calls = 1
    batch = lambda: [fn() for _ in range(calls)]  # noqa: E731
    while time_fn(batch, repeats=1, warmup=0, device=device).samples[0] < seconds:
        calls *= 2
    res = time_fn(batch, repeats=rounds, warmup=0, device=device)
    return [work * calls / s for s in res.samples]


def cache_levels(device: torch.device | str = "cpu") -> dict[str, int]:
    """Bytes each cache level holds on ``device``, smallest first (CPU: Linux sysfs, L2 and up; CUDA: L2)."""
    device = torch.device(device)
    if device.type == "cuda":
        return {"L2": int(torch.cuda.get_device_properties(device).L2_cache_size)}
    if device.type != "cpu":
        return {}
    levels, cpus = {}, len(list(Path("/sys/devices/system/cpu").glob("cpu[0-9]*")))
    for index in sorted(Path("/sys/devices/system/cpu/cpu0/cache").glob("index*")):
        try:
            level, kind, size, shared = ((index / f).read_text().strip() for f in
                                         ("level", "type", "size", "shared_cpu_map"))
        except OSError:
            continue
        if int(level) < 2 or kind == "Instruction":  # one op's work on an L1-sized set is mostly its overhead
            continue
        sharing = bin(int(shared.replace(",", ""), 16)).count("1")  # the CPUs that share one instance
        kib = int(size.rstrip("KMG")) * {"K": 1, "M": 1024, "G": 1 << 20}.get(size[-1], 1 / 1024)
        levels[f"L{level}"] = int(kib * 1024 * max(1, cpus // max(1, sharing)))
    return levels or {"cache": MIB}


def bandwidth(device: torch.device | str, nbytes: int, dtype: torch.dtype = torch.float32, rounds: int = 3,
              seconds: float = 0.01) -> dict[str, Roof]:
    """Read (sum), write (fill) and triad (a = b + 2c) bandwidth in bytes/s on a working set of ``nbytes``."""
    size = dtype.itemsize
    n = max(3, nbytes // size // 3 * 3)
    buf = torch.ones(n, device=device, dtype=dtype)
    a, b, c = buf.chunk(3)
    ops = {"read": buf.sum, "write": lambda: buf.fill_(1.0), "triad": lambda: torch.add(b, c, alpha=2, out=a)}
    return {k: Roof.of(f"{k} {nbytes // 1024:,} KiB", "B/s", rates(fn, n * size, device, rounds, seconds=seconds),
                       n * size) for k, fn in ops.items()}


@dataclass
class Roofs:
    """This device's ceilings in one math mode; ``capacity[level]``: the bytes a working set may take to sit there."""

    device: str
    mode: str
    matmul: Roof
    bandwidth: dict[str, dict[str, Roof]]
    capacity: dict[str, int]
    overhead: Roof
    launch: Roof | None = None
    h2d: list[Roof] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def memory_roof(self, nbytes: float, kind: str = "triad") -> tuple[str, Roof]:
        """The smallest level holding ``nbytes``, and the best ``kind`` roof there or further out (never below DRAM)."""
        levels = list(self.bandwidth)
        i = next((n for n, lv in enumerate(levels) if nbytes <= self.capacity.get(lv, 0)), len(levels) - 1)
        return levels[i], max((self.bandwidth[lv][kind] for lv in levels[i:]), key=lambda r: r.best)

    def table(self) -> Table:
        """Every roof with its spread over rounds."""
        table = Table(["roof", "level", "median", "min", "max", "unit"], title=f"Roofs of {self.device} ({self.mode})",
                      note="; ".join(self.notes))
        scale = {"FLOP/s": (1e9, "GFLOP/s"), "B/s": (1e9, "GB/s"), "s": (1e-6, "µs")}
        levels = [(lv, r) for lv, kinds in self.bandwidth.items() for r in kinds.values()]
        others = [("", self.overhead), ("", self.launch), *(("", h) for h in self.h2d)]
        for level, r in [("", self.matmul), *levels, *others]:
            if r is not None:
                div, unit = scale[r.unit]
                table.add(r.name, level, r.median / div, r.low / div, r.high / div, unit)
        return table


def measure_roofs(device: torch.device | str = "cpu", mode: str = "fp32") -> Roofs:
    """Measure every roof of ``device`` in math ``mode`` (sizes and rounds from ``COURSE_PROFILE``)."""
    device, meter = torch.device(device), CpuMeter().start()
    rounds = run_sizes.pick(smoke=3, workshop=5, full=7)
    seconds = run_sizes.pick(smoke=0.005, workshop=0.03, full=0.1)
    cpu = device.type == "cpu"
    sizes = run_sizes.pick(smoke=[256, 512], workshop=[512, 1024], full=[1024, 2048, 4096]) if cpu else \
        run_sizes.pick(smoke=[1024, 2048], workshop=[2048, 4096, 8192], full=[4096, 8192, 16384])
    best = max((matmul_peak(device, mode, n, rounds) for n in sizes), key=lambda p: statistics.median(p.rates))
    matmul = Roof.of(f"matmul {mode}", "FLOP/s", best.rates, best.n)
    capacity = cache_levels(device)
    dram = max(run_sizes.pick(smoke=2, workshop=4, full=4) * max(capacity.values(), default=0),
               run_sizes.pick(smoke=64, workshop=256, full=1024) * MIB)
    sets = {lv: cap // 2 for lv, cap in capacity.items()} | {"DRAM": dram}
    bw = {lv: bandwidth(device, n, MATH_MODES[mode], rounds, seconds) for lv, n in sets.items()}
    one = [torch.ones(1, device=device) for _ in range(3)]
    tiny = lambda: torch.add(one[0], one[1], out=one[2])  # noqa: E731
    overhead = Roof.of("per-op overhead (1-element add)", "s",
                       [1 / r for r in rates(tiny, 1, device, rounds, seconds=seconds)])
    notes = [f"bandwidth levels hold {', '.join(f'{lv} {cap / MIB:g} MiB' for lv, cap in capacity.items())}; "
             f"each measured at half that, DRAM at {dram / MIB:g} MiB; triad a = b + 2c counts 3 arrays"]
    roofs = Roofs(str(device), mode, matmul, bw, capacity, overhead, notes=notes)
    if cpu:
        roofs.notes.append("no launch latency or host-to-device copy on the CPU: its data is already in its memory")
    else:
        synced = lambda: (tiny(), devices.synchronize(device))  # noqa: E731
        roofs.launch = Roof.of("launch latency (add + synchronize)", "s",
                               [1 / r for r in rates(synced, 1, device, rounds, seconds=seconds)])
        nbytes = run_sizes.pick(smoke=16, workshop=64, full=256) * MIB
        dest = torch.empty(nbytes, dtype=torch.uint8, device=device)
        for pinned in (False, True) if device.type in ("cuda", "xpu") else (False,):
            host = torch.ones(nbytes, dtype=torch.uint8, pin_memory=pinned)
            copy = lambda: dest.copy_(host, non_blocking=pinned)  # noqa: E731
            roofs.h2d.append(Roof.of(f"host-to-device copy, {'pinned' if pinned else 'pageable'}", "B/s",
                                     rates(copy, nbytes, device, rounds), nbytes))
    if (others := meter.stop()).disturbed():
        roofs.notes.append(f"other processes took {others.cores:.1f} cores meanwhile: read the best rounds")
    return roofs


@functools.lru_cache(maxsize=None)
def _cached(device: str, mode: str, profile: str) -> Roofs:
    return measure_roofs(device, mode)


def cached_roofs(device: torch.device | str = "cpu", mode: str = "fp32") -> Roofs:
    """``measure_roofs`` once per process, device, mode and profile."""
    return _cached(str(torch.device(device)), mode, run_sizes.current_profile())
