"""Operator-share tables from torch.profiler: where does the time of a step go?

Importing this module changes nothing; ``quiet_kineto`` is applied only while profiling.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any, Callable, Iterator

import torch
from torch.profiler import ProfilerActivity, profile

from .tables import Table


@contextlib.contextmanager
def quiet_kineto() -> Iterator[None]:
    """Keep Kineto's start-up noise out of the output while the block profiles.

    PyPI's CUDA build of torch makes Kineto log "gpuGetDeviceCount failed" on machines
    without a GPU when profiling first starts; it is harmless. Kineto reads
    ``KINETO_LOG_LEVEL`` then, so it is set for the block (unless you set it yourself)
    and removed afterwards.
    """
    if "KINETO_LOG_LEVEL" in os.environ:
        yield
        return
    os.environ["KINETO_LOG_LEVEL"] = "5"
    try:
        yield
    finally:
        os.environ.pop("KINETO_LOG_LEVEL", None)


def profile_fn(fn: Callable[[], Any], *, warmup: int = 2, steps: int = 3,
               device: torch.device | str = "cpu") -> "torch.profiler.profile":
    """Run ``fn`` ``warmup`` times unprofiled, then ``steps`` times under the profiler."""
    for _ in range(warmup):
        fn()
    activities = [ProfilerActivity.CPU]
    kind = torch.device(device).type
    if kind == "cuda":
        activities.append(ProfilerActivity.CUDA)
    elif kind == "xpu":
        activities.append(ProfilerActivity.XPU)
    with quiet_kineto(), profile(activities=activities) as prof:
        for _ in range(steps):
            fn()
    return prof


def operator_shares(prof: "torch.profiler.profile", top: int = 10, device: bool = False,
                    title: str = "") -> Table:
    """The ``top`` operators by self time, with their share of the total self time.

    ``device=True`` ranks by self time on the accelerator instead of the CPU.
    """
    events = [e for e in prof.key_averages() if not e.key.startswith("ProfilerStep")]
    attr = "self_device_time_total" if device else "self_cpu_time_total"
    total = sum(getattr(e, attr) for e in events) or 1.0
    events.sort(key=lambda e: getattr(e, attr), reverse=True)
    table = Table(["operator", "calls", "self time ms", "share %"], title=title,
                  note=f"share of total self {'device' if device else 'CPU'} time over the profiled steps")
    for e in events[:top]:
        table.add(e.key, int(e.count), getattr(e, attr) / 1000.0, 100.0 * getattr(e, attr) / total)
    return table


def share_of(table: Table, *needles: str) -> float:
    """Summed share (%) of the operators whose name contains any of ``needles``."""
    total = 0.0
    for row in table.as_dicts():
        if any(n in row["operator"] for n in needles):
            total += row["share %"]
    return total
