"""torch.profiler around a few calls (``profile_fn``), and which layer a profiled matrix multiply belongs to
(``matmul_owner``). Importing this module changes nothing; ``quiet_kineto`` applies only while profiling."""

from __future__ import annotations

import contextlib
import math
import os
from typing import Any, Callable, Iterator, Sequence

import torch
from torch.profiler import ProfilerActivity, profile


@contextlib.contextmanager
def quiet_kineto() -> Iterator[None]:
    """Set ``KINETO_LOG_LEVEL=6`` for the block (unless set): Kineto's harmless start-up lines stay out of the output."""
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
    """The layer of ``model`` (and the pass) that a matrix multiply with these input shapes belongs to, or None.

    ``shapes``: one operator's input shapes (``record_shapes=True``). Linear(in, out) on B rows: [B, in] x [in, out]
    forward; backward [B, out] x [out, in] (input gradient) and [out, B] x [B, in] (weight gradient)."""
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
