"""Operator-share tables from torch.profiler: where does the time of a step go?

``operator_shares`` ranks operators by their own time; ``matmul_owner`` reads the input shapes
that a profile records (``record_shapes=True``) and names the layer -- and the pass, forward or
backward -- that a matrix multiply belongs to, so a slow ``aten::mm`` is traced to its layer.
Importing this module changes nothing; ``quiet_kineto`` is applied only while profiling.
"""

from __future__ import annotations

import contextlib
import math
import os
from typing import Any, Callable, Iterator, Sequence

import torch
from torch.profiler import ProfilerActivity, profile

from .tables import Table


@contextlib.contextmanager
def quiet_kineto() -> Iterator[None]:
    """Keep Kineto's start-up noise out of the output while the block profiles.

    PyPI's CUDA build of torch makes Kineto log "gpuGetDeviceCount failed" on machines
    without a GPU when profiling first starts, and torch 2.14's Kineto prints "USDT: ...
    profiler_start/stop" lines below level 6; both are harmless. Kineto reads
    ``KINETO_LOG_LEVEL`` then, so it is set for the block (unless you set it yourself)
    and removed afterwards.
    """
    if "KINETO_LOG_LEVEL" in os.environ:
        yield
        return
    os.environ["KINETO_LOG_LEVEL"] = "6"
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


def _weight_matrix(module: torch.nn.Module) -> tuple[str, int, int] | None:
    """(description, rows, columns) of a layer's weight as a matrix multiply sees it, or None."""
    if isinstance(module, torch.nn.Linear):
        return f"Linear({module.in_features}->{module.out_features})", module.out_features, module.in_features
    if isinstance(module, torch.nn.modules.conv._ConvNd):
        cols = module.in_channels // module.groups * math.prod(module.kernel_size)
        return (f"{type(module).__name__}({module.in_channels}->{module.out_channels}, "
                f"kernel {'x'.join(map(str, module.kernel_size))})"), module.out_channels, cols
    return None


def matmul_owner(model: torch.nn.Module, shapes: Sequence[Sequence[int]]) -> str | None:
    """The layer of ``model`` that a matrix multiply with these input shapes belongs to, and its pass.

    ``shapes`` are one operator's input shapes as ``torch.profiler`` records them with
    ``record_shapes=True`` (``aten::mm``: two matrices; ``aten::addmm``: the bias, then two
    matrices). A ``Linear(in, out)`` on B rows multiplies ``[B, in] x [in, out]`` forward, and
    backward ``[B, out] x [out, in]`` (the input's gradient) and ``[out, B] x [B, in]`` (the
    weight's gradient). A convolution unfolded into a matrix multiply shows its weight as a
    ``[C_out, C_in*kh*kw]`` matrix (or its transpose). Returns e.g.
    ``"fc1: Linear(4096->512), backward: input gradient"``, or None when no layer matches.
    """
    mats = [tuple(int(d) for d in s) for s in shapes if len(s) == 2]
    if len(mats) != 2 or mats[0][1] != mats[1][0]:
        return None
    (a, b), (_, d) = mats
    for name, module in model.named_modules():
        found = _weight_matrix(module)
        if found is None:
            continue
        what, rows, cols = found
        label = f"{name}: {what}"
        if isinstance(module, torch.nn.Linear):
            if (b, d) == (cols, rows):
                return f"{label}, forward"
            if (b, d) == (rows, cols):
                return f"{label}, backward: input gradient"
            if (a, d) == (rows, cols):
                return f"{label}, backward: weight gradient"
        elif {(rows, cols), (cols, rows)} & {mats[0], mats[1]}:
            return f"{label}, unfolded into a matrix multiply"
    return None
