"""torch.profiler around a few calls (``profile_fn``), and which layer a profiled matrix multiply belongs to."""

from __future__ import annotations

import contextlib
import math
import os
from typing import Any, Callable, Sequence
from unittest import mock

import torch
from torch.profiler import ProfilerActivity, profile


def quiet_kineto() -> contextlib.AbstractContextManager:
    """``KINETO_LOG_LEVEL=6`` for the block (unless set): Kineto's harmless start-up lines stay out of the output."""
    return mock.patch.dict(os.environ, {"KINETO_LOG_LEVEL": os.environ.get("KINETO_LOG_LEVEL", "6")})


def profile_fn(fn: Callable[[], Any], *, warmup: int = 2, steps: int = 3,
               device: torch.device | str = "cpu") -> "torch.profiler.profile":
    """Run ``fn`` ``warmup`` times unprofiled, then ``steps`` times under the profiler."""
    for _ in range(warmup):
        fn()
    kind = torch.device(device).type
    device_activity = [getattr(ProfilerActivity, kind.upper())] if kind in ("cuda", "xpu") else []
    with quiet_kineto(), profile(activities=[ProfilerActivity.CPU, *device_activity]) as prof:
        for _ in range(steps):
            fn()
    return prof


def matmul_owner(model: torch.nn.Module, shapes: Sequence[Sequence[int]]) -> str | None:
    """The layer of ``model`` (and the pass: Linear forward, input or weight gradient; a convolution unfolded) that
    a matrix multiply with these input shapes (``record_shapes``) belongs to."""
    mats = [tuple(int(d) for d in s) for s in shapes if len(s) == 2]
    if len(mats) != 2 or mats[0][1] != mats[1][0]:
        return None
    (a, b), (_, d) = mats
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear):
            rows, cols = module.out_features, module.in_features
            label = f"{name}: Linear({cols}->{rows})"
            if (b, d) == (cols, rows):
                return f"{label}, forward"
            if (b, d) == (rows, cols):
                return f"{label}, backward: input gradient"
            if (a, d) == (rows, cols):
                return f"{label}, backward: weight gradient"
        elif isinstance(module, torch.nn.modules.conv._ConvNd):
            rows, cols = module.out_channels, module.in_channels // module.groups * math.prod(module.kernel_size)
            if {(rows, cols), (cols, rows)} & set(mats):
                return (f"{name}: {type(module).__name__}({module.in_channels}->{rows}, kernel "
                        f"{'x'.join(map(str, module.kernel_size))}), unfolded into a matrix multiply")
    return None
