"""Which levers the tuner tries on this machine and this model: threads and OpenMP binding, channels-last,
fused/foreach optimizers, autocast dtypes the device supports, bigger batches, torch.compile modes --
each with the reason when one is skipped -- which of them change the training itself (the batch size),
and the environment a trial's child process gets for its thread levers.

There is no IPEX lever: Intel Extension for PyTorch is retired, and its last release needs torch 2.8,
while the course's environment runs current PyTorch; chapter 04 compares it with PyTorch's own
replacements in an environment of its own.
"""

from __future__ import annotations

import shutil
from typing import Any, Callable, Sequence

import torch

from .. import devices, system
from .trial import TuneError, Workload


KINDS: tuple[str, ...] = ("threads", "omp", "channels_last", "optimizer", "autocast", "batch", "compile")
CHANGES_TRAINING: tuple[str, ...] = ("batch",)
"""Lever kinds that change the training itself, not only its speed: a k-times batch takes k times fewer
optimizer steps and changes the optimisation. The tuner reports them as throughput hints, never as the
recommendation."""
RETIRED = {"ipex": "IPEX is retired and needs torch 2.8, while this environment runs current PyTorch "
                   "(chapter 04 compares it with PyTorch's upstream replacements in an environment of its own)"}
DEFAULT_COMPILE_S = {"cpu": 45.0, "cuda": 60.0}


def changes_training(levers: dict[str, Any]) -> bool:
    """True when ``levers`` hold a lever that changes the training itself (see ``CHANGES_TRAINING``)."""
    return any(kind in levers for kind in CHANGES_TRAINING)


def label(levers: dict[str, Any]) -> str:
    """Short name of a set of levers, e.g. ``'bf16 + compile:default'`` (``'baseline'`` when empty)."""
    if not levers:
        return "baseline"
    parts = []
    for kind in KINDS:
        if kind not in levers:
            continue
        value = levers[kind]
        parts.append({"threads": f"threads={value}", "omp": f"omp:{value}", "channels_last": "channels_last",
                      "optimizer": f"opt:{value}", "autocast": str(value),
                      "batch": f"batch x{value}", "compile": f"compile:{value}"}[kind])
    return " + ".join(parts)


def plan_levers(work: Workload, device: torch.device, kinds: Sequence[str] | None = None,
                topo: system.Topology | None = None) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The single-lever trials worth trying for this model and device, and those skipped (with why).

    Returns ``(candidates, skipped)``: candidates are lever dicts, cheapest first (compilation
    last); skipped entries are ``{"levers", "label", "reason"}``.
    """
    retired = sorted(set(kinds or ()) & set(RETIRED))
    if retired:
        raise TuneError(f"no {retired[0]!r} lever: {RETIRED[retired[0]]}; choose from {', '.join(KINDS)}")
    unknown = set(kinds or ()) - set(KINDS)
    if unknown:
        raise TuneError(f"unknown lever kind(s) {sorted(unknown)}; choose from {', '.join(KINDS)}")
    wanted = set(kinds) if kinds else set(KINDS)
    cands: list[dict[str, Any]] = []
    skipped: list[dict[str, Any]] = []

    def skip(levers: dict[str, Any], reason: str) -> None:
        skipped.append({"levers": levers, "label": label(levers), "reason": reason})

    cpu = device.type == "cpu"
    if "threads" in wanted or "omp" in wanted:
        topo = topo or system.topology()
        if not cpu:
            skip({"threads": "n"}, f"thread count and OpenMP placement matter for CPU training; this run is on {device.type}")
        else:
            if "threads" in wanted:
                if topo.logical_cores > 1:
                    cands.append({"threads": 1})
                if 1 < topo.physical_cores < topo.logical_cores:
                    cands.append({"threads": topo.physical_cores})
            if "omp" in wanted:
                cands.append({"omp": "gnu-bound"})
                if system.intel_openmp_library() is not None:
                    cands.append({"omp": "intel"})
                else:
                    skip({"omp": "intel"}, "Intel OpenMP is not installed (pip install intel-openmp)")
    if "channels_last" in wanted:
        if work.input_dims == 4:
            cands.append({"channels_last": True})
        else:
            skip({"channels_last": True}, f"inputs are {work.input_dims}-D; channels-last applies to 4-D (N, C, H, W) batches")
    if "optimizer" in wanted:
        cands += [{"optimizer": "foreach"}, {"optimizer": "fused"}]
    if "autocast" in wanted:
        supported = devices.autocast_dtypes(device)
        for name, dtype in (("bf16", torch.bfloat16), ("fp16", torch.float16)):
            if dtype in supported:
                cands.append({"autocast": name})
            else:
                skip({"autocast": name}, f"torch.autocast on {device.type} does not support {name} here")
    if "batch" in wanted:
        if work.batch_size >= 1 and work.input_dims >= 1:
            cands += [{"batch": 2}, {"batch": 4}]
    if "compile" in wanted:
        _plan_compile(device, cands, skip)
    return cands, skipped


def _plan_compile(device: torch.device, cands: list[dict[str, Any]], skip: Callable[..., None]) -> None:
    if device.type == "cpu" and not (shutil.which("gcc") or shutil.which("g++") or shutil.which("cc")):
        skip({"compile": "default"}, "torch.compile on the CPU needs a C++ compiler (install gcc)")
        return
    cands.append({"compile": "default"})
    if device.type == "cuda":
        cands.append({"compile": "reduce-overhead"})
    else:
        skip({"compile": "reduce-overhead"}, "reduce-overhead adds CUDA graphs, which exist on CUDA only; elsewhere it equals default")
    cands.append({"compile": "max-autotune"})


def child_env(levers: dict[str, Any], topo: system.Topology | None = None) -> dict[str, str]:
    """Environment variables a trial's child process gets for its thread levers."""
    env: dict[str, str] = {}
    threads = levers.get("threads")
    if levers.get("omp"):
        topo = topo or system.topology()
        env.update(system.openmp_env(levers["omp"], int(threads or topo.physical_cores), topo))
    elif threads:
        env["OMP_NUM_THREADS"] = str(threads)
    return env
