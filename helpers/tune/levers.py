"""The tuner's levers: which apply here (each skipped one with its reason), which change the training (a bigger
batch), the ``helpers.diagnose`` regime each attacks, and a trial process's environment (docs/tools.md)."""

from __future__ import annotations

import shutil
from typing import Any, Sequence

import torch

from .. import devices, openmp, system
from .trial import AUTOCAST_DTYPES, TuneError, Workload


KINDS: tuple[str, ...] = ("threads", "omp", "channels_last", "optimizer", "autocast", "batch", "compile")
LABELS = {"threads": "threads={}", "omp": "omp:{}", "channels_last": "channels_last", "optimizer": "opt:{}",
          "autocast": "{}", "batch": "batch x{}", "compile": "compile:{}"}  # a lever's part of a label
RETIRED = {"ipex": "IPEX is retired and needs torch 2.8, while this environment runs current PyTorch "
                   "(chapter 04 compares it with PyTorch's upstream replacements in an environment of its own)"}
DEFAULT_COMPILE_S = {"cpu": 45.0, "cuda": 60.0}
REGIMES: tuple[str, ...] = ("compute", "memory", "overhead", "input", "communication")  # helpers.diagnose's
ATTACKS: dict[str, str] = {"threads": "compute", "omp": "compute", "autocast": "compute", "channels_last": "memory",
                           "compile": "memory", "optimizer": "overhead", "batch": "overhead"}  # docs/tools.md
# one thread removes the threads' fork/join per operator; CUDA graphs remove kernel launches
ATTACKS_BY_VALUE: dict[tuple[str, Any], str] = {("threads", 1): "overhead", ("compile", "reduce-overhead"): "overhead"}
NO_LEVER: dict[str, str] = {"input": "chapter 05 (DataLoader workers, pinned memory, the data on the device)",
                            "communication": "chapters 08-09 (DDP's buckets, overlap and gradient compression)"}
NO_LEVER_SHARE = 0.10  # such a regime's share from which the report names it with its share


def changes_training(levers: dict[str, Any]) -> bool:
    """True when ``levers`` change the training itself: a k-times batch takes k times fewer optimizer steps."""
    return "batch" in levers


def label(levers: dict[str, Any]) -> str:
    """Short name of a set of levers, e.g. ``'bf16 + compile:default'`` (``'baseline'`` when empty)."""
    return " + ".join(LABELS[kind].format(levers[kind]) for kind in KINDS if kind in levers) or "baseline"


def plan_levers(work: Workload, device: torch.device, kinds: Sequence[str] | None = None,
                topo: system.Topology | None = None) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """``(candidates, skipped)``: the single levers worth trying here, cheapest first (compilation last), and
    ``{"levers", "label", "reason"}`` for each one skipped."""
    unknown = sorted(set(kinds or ()) - set(KINDS), key=lambda k: (k not in RETIRED, k))  # a retired lever first
    if unknown:
        first = unknown[0]
        why = f"no {first!r} lever: {RETIRED[first]}" if first in RETIRED else f"unknown lever kind(s) {unknown}"
        raise TuneError(f"{why}; choose from {', '.join(KINDS)}")
    wanted = set(kinds) if kinds else set(KINDS)
    cands: list[dict[str, Any]] = []
    skipped: list[dict[str, Any]] = []

    def skip(levers: dict[str, Any], reason: str) -> None:
        skipped.append({"levers": levers, "label": label(levers), "reason": reason})

    cpu = device.type == "cpu"
    if ("threads" in wanted or "omp" in wanted) and not cpu:
        skip({"threads": "n"}, "thread count and OpenMP placement matter for CPU training; "
                               f"this run is on {device.type}")
    elif "threads" in wanted or "omp" in wanted:
        topo = topo or system.topology()
        if "threads" in wanted and topo.logical_cores > 1:
            cands.append({"threads": 1})
        if "threads" in wanted and 1 < topo.physical_cores < topo.logical_cores:
            cands.append({"threads": topo.physical_cores})
        if "omp" in wanted:
            cands.append({"omp": "gnu-bound"})
            if openmp.intel_openmp_library() is not None:
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
        for name, dtype in AUTOCAST_DTYPES.items():
            if dtype in supported:
                cands.append({"autocast": name})
            else:
                skip({"autocast": name}, f"torch.autocast on {device.type} does not support {name} here")
    if "batch" in wanted and work.input_dims >= 1 and work.batch_size >= 1:
        cands += [{"batch": 2}, {"batch": 4}]
    if "compile" in wanted and cpu and not (shutil.which("gcc") or shutil.which("g++") or shutil.which("cc")):
        skip({"compile": "default"}, "torch.compile on the CPU needs a C++ compiler (install gcc)")
    elif "compile" in wanted:
        cands.append({"compile": "default"})
        if device.type == "cuda":
            cands.append({"compile": "reduce-overhead"})
        else:
            skip({"compile": "reduce-overhead"}, "reduce-overhead adds CUDA graphs, which exist on CUDA only; "
                                                 "elsewhere it equals default")
        cands.append({"compile": "max-autotune"})
    return cands, skipped


def child_env(levers: dict[str, Any], topo: system.Topology | None = None) -> dict[str, str]:
    """Environment variables a trial's child process gets for its thread levers."""
    env: dict[str, str] = {}
    threads = levers.get("threads")
    if levers.get("omp"):
        topo = topo or system.topology()
        env.update(openmp.openmp_env(levers["omp"], int(threads or topo.physical_cores), topo))
    elif threads:
        env["OMP_NUM_THREADS"] = str(threads)
    return env


def attacks(levers: dict[str, Any]) -> set[str]:
    """The regimes a set of levers attacks (one per lever, see ``ATTACKS``)."""
    return {ATTACKS_BY_VALUE.get((kind, value), ATTACKS[kind]) for kind, value in levers.items()}


def regime_table() -> dict[str, list[str]]:
    """Regime -> the lever kinds that attack it (``[]`` for input and communication: see ``NO_LEVER``)."""
    pairs = [*ATTACKS.items(), *((f"{kind}={value}", r) for (kind, value), r in ATTACKS_BY_VALUE.items())]
    return {regime: [kind for kind, r in pairs if r == regime] for regime in REGIMES}


def by_diagnosis(cands: Sequence[dict[str, Any]], shares: dict[str, float] | None) -> list[dict[str, Any]]:
    """``cands`` ordered by the share of the regime each attacks, largest first (stable; unchanged without shares)."""
    if not shares:
        return list(cands)
    return sorted(cands, key=lambda c: -max(float(shares.get(r, 0.0)) for r in attacks(c)))


def diagnosis_record(found: dict[str, Any] | None, cands: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """tune.json's ``diagnosis``: the baseline's regime split (``found``), each lever's regime and the first trial."""
    found = dict(found or {"error": "the baseline trial gave no diagnosis"})
    shares = found.get("shares") or {}
    return {"shares": shares, "top": found.get("top"), "line": found.get("line"), "findings": found.get("findings", []),
            "error": found.get("error"), "attacks": {label(c): sorted(attacks(c))[0] for c in cands},
            "first_trial": label(by_diagnosis(cands, shares)[0]) if cands and shares else None,
            "no_lever": dict(NO_LEVER), "detail": found.get("detail")}
