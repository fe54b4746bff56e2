"""Guarded access to the retired Intel Extension for PyTorch (IPEX), and chapter 04's IPEX-vs-stock variants.

IPEX lives in an environment of its own (``make setup-ipex``); ``python -m helpers.ipex --serve VARIANT`` serves one
variant in a process of its own, so only IPEX variants import it (docs/environments.md says why).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import resource
import subprocess
import sys
import time
import warnings
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from types import ModuleType
from typing import Any, Callable, Iterable, Mapping, Sequence

if __name__ == "__main__":  # a variant's own process: torch imported frozen, then helpers.ipex.worker serves
    from .processes import worker_main

    worker_main("helpers.ipex")

import torch  # noqa: E402

from . import envs, models, system  # noqa: E402
from .seeds import set_seed  # noqa: E402
from .step import train_step  # noqa: E402

RETIREMENT_NOTE = (
    "Intel Extension for PyTorch is retired: 2.8 is its last release (it needs torch 2.8.*), its repository "
    "is archived and flagged as having known security issues. Use it to reproduce the book; for new work use "
    "current PyTorch's channels_last, fused optimizers, torch.autocast, torch.compile and native torch.xpu. "
    "The course's own environment never imports it: chapter 04 runs its IPEX arms in the IPEX environment "
    "(make setup-ipex) and skips them, saying so, where that environment is absent."
)
SETUP_COMMAND = "make setup-ipex"
IPEX_PYTHON_ENV = "COURSE_IPEX_PYTHON"  # the Makefile names the IPEX environment's Python here


class IPEXUnavailable(RuntimeError):
    """IPEX is missing or incompatible with this torch."""


def _minor(version: str) -> list[str]:
    return version.split("+")[0].split(".")[:2]


def ipex_python() -> str | None:
    """The IPEX environment's Python: ``$COURSE_IPEX_PYTHON``, else the one keyed by this clone's pins; None if absent."""
    wanted = os.environ.get(IPEX_PYTHON_ENV)
    if wanted:
        return wanted if os.path.exists(wanted) else None
    try:
        candidate = envs.ipex_venv() / "bin" / "python"
    except (OSError, KeyError):  # an installed package has no pyproject.toml
        return None
    return str(candidate) if candidate.exists() else None


_PROBE = ("import importlib.metadata as m, importlib.util, json\n"
          "v = {(d.metadata['Name'] or '').lower().replace('_', '-'): d.version for d in m.distributions()}\n"
          "print(json.dumps({'torch': v.get('torch'), 'torchvision': v.get('torchvision'), "
          "'ipex': v.get('intel-extension-for-pytorch'), 'helpers': v.get('accelerate-course-helpers'), "
          "'helpers_at': getattr(importlib.util.find_spec('helpers'), 'origin', None)}))")


def environment(python: str | None = None) -> dict[str, Any]:
    """The IPEX environment's versions, from package metadata in its own Python: ``{"python", "ok", "torch",
    "torchvision", "ipex", "message"}`` (``message`` says what to do when not ``ok``)."""
    python = python or ipex_python()
    out = {"python": python, "ok": False, "torch": None, "torchvision": None, "ipex": None}
    if python is None:
        message = f"the IPEX environment is not installed: {SETUP_COMMAND} (Linux x86-64, about 2 minutes)"
        return {**out, "message": message}
    try:
        proc = subprocess.run([python, "-c", _PROBE], capture_output=True, text=True, timeout=120)
        found = json.loads(proc.stdout.strip().splitlines()[-1])
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError):
        return {**out, "message": f"{python} does not answer; rebuild the IPEX environment: {SETUP_COMMAND}"}
    out.update(torch=found.get("torch"), torchvision=found.get("torchvision"), ipex=found.get("ipex"))
    here = Path(__file__).resolve().parent
    if not (out["ipex"] and out["torch"] and found.get("helpers") and _minor(out["ipex"]) == _minor(out["torch"])):
        return {**out, "message": f"the IPEX environment at {python} is incomplete (torch {out['torch']}, IPEX "
                                  f"{out['ipex']}, course package {found.get('helpers')}): {SETUP_COMMAND}"}
    if not found.get("helpers_at") or Path(found["helpers_at"]).resolve().parent != here:
        at = found.get("helpers_at") or "not importable"
        return {**out, "message": f"the IPEX environment's course package is {at}, not this clone's {here}: "
                                  f"{SETUP_COMMAND} (it re-links it in seconds)"}
    return {**out, "ok": True, "message": "ok"}


def load() -> ModuleType:
    """Import IPEX once package metadata says it fits this torch (a mismatched import would end this Python process);
    else IPEXUnavailable says what to do."""
    try:
        version = metadata.version("intel-extension-for-pytorch")
    except metadata.PackageNotFoundError:
        raise IPEXUnavailable("IPEX is not installed in this environment; it lives in the IPEX environment "
                              f"({SETUP_COMMAND}).") from None
    if _minor(version) != _minor(torch.__version__):
        raise IPEXUnavailable(f"IPEX {version} needs torch {'.'.join(_minor(version))}.* but torch {torch.__version__} "
                              f"is installed; importing it would end this Python process. Use the IPEX environment "
                              f"({SETUP_COMMAND}: torch 2.8.0).")
    # quiet its deprecation notice per optimize() and, on CUDA builds without a GPU, "No CUDA runtime"
    logging.getLogger("IPEX").setLevel(logging.ERROR)
    logging.getLogger("torch.utils.cpp_extension").setLevel(logging.ERROR)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import intel_extension_for_pytorch as ipex  # noqa: PLC0415
    return ipex


def bf16_prepack_supported() -> bool:
    """Whether this CPU can run IPEX's bf16 weight prepacking (AVX-512 BW/VL/DQ or AVX-NE-CONVERT)."""
    return bool(system.cpu_bf16_support()["ipex_bf16_prepack"])


@dataclass(frozen=True)
class Variant:
    """What one variant changes on top of stock fp32 eager training."""

    channels_last: bool = False   # model and inputs in channels-last memory format
    bf16: bool = False            # forward and loss under torch.autocast("cpu", dtype=torch.bfloat16), never with ipex
    ipex: bool = False            # model and optimizer through ipex.optimize in fp32 (IPEX imported in its process)
    compile: str | None = None    # a torch.compile backend ("inductor", "ipex"), None = eager
    fused: bool = False           # torch.optim.Adam(..., fused=True): one kernel updates every parameter


VARIANTS: dict[str, Variant] = {  # "upstream": stock_cl_fused compiled, so against it it isolates the compile
    "stock_fp32": Variant(),
    "stock_fused": Variant(fused=True),  # the fair control for IPEX's fused optimizer
    "stock_fp32_cl": Variant(channels_last=True),
    "stock_cl_fused": Variant(channels_last=True, fused=True),  # stock PyTorch's replacements, eager
    "ipex_fp32": Variant(ipex=True),
    "stock_bf16_cl": Variant(channels_last=True, bf16=True),
    "inductor": Variant(compile="inductor"),
    "ipex_backend": Variant(ipex=True, compile="ipex"),
    "upstream": Variant(channels_last=True, fused=True, compile="inductor"),
}


def variant(name: str) -> Variant:
    """The ``Variant`` called ``name``; a ValueError lists the known names."""
    if name not in VARIANTS:
        raise ValueError(f"unknown variant {name!r}; known: {', '.join(VARIANTS)}")
    return VARIANTS[name]


def prepare(name: str, dataset: str = "cifar10", lr: float = 1e-3, seed: int = 0
            ) -> tuple[torch.nn.Module, torch.optim.Optimizer, torch.dtype | None, bool]:
    """A fresh seeded book CNN (train mode) and Adam with variant ``name`` applied: ``(model, optimizer, autocast dtype
    or None, channels_last inputs)``."""
    v = variant(name)
    set_seed(seed)
    model = models.book_cnn(dataset).train()
    if v.channels_last:
        model = model.to(memory_format=torch.channels_last)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr, **({"fused": True} if v.fused else {}))
    if v.ipex and v.compile is None:
        model, optimizer = load().optimize(model, optimizer=optimizer)
    elif v.ipex:
        load()  # registers the "ipex" backend of torch.compile
    return model, optimizer, torch.bfloat16 if v.bf16 else None, v.channels_last


def _step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor,
          dtype: torch.dtype | None, channels_last: bool) -> torch.Tensor:
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    return train_step(model, optimizer, torch.nn.functional.cross_entropy, x, y, autocast_dtype=dtype)


def train_round(name: str, batches: Sequence[tuple[torch.Tensor, torch.Tensor]],
                test_batches: Sequence[tuple[torch.Tensor, torch.Tensor]], *, dataset: str = "cifar10",
                lr: float = 1e-3, warmup_steps: int = 4, seed: int = 0) -> dict[str, Any]:
    """One round of variant ``name`` (a fresh seeded model, ``warmup_steps`` untimed steps, one timed pass, accuracy):
    ``{"value": s per step, "metrics": {accuracy, loss, warmup_s, prepare_s, steps, page_faults_per_step}}``."""
    if not batches:
        raise ValueError("train_round needs at least one batch")
    v = variant(name)
    started = time.perf_counter()
    model, optimizer, dtype, cl = prepare(name, dataset, lr, seed)
    step_model = model if v.compile is None else torch.compile(model, backend=v.compile)
    prepared = time.perf_counter()
    for i in range(warmup_steps):  # the first step of a compiled variant compiles it
        _step(step_model, optimizer, *batches[i % len(batches)], dtype, cl)
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    warm = time.perf_counter()
    for x, y in batches:
        loss = _step(step_model, optimizer, x, y, dtype, cl)
    done = time.perf_counter()
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
    correct = total = 0
    model.eval()  # evaluated eagerly: a compiled model shares these weights (and would compile again)
    with torch.no_grad(), torch.autocast("cpu", dtype=dtype or torch.bfloat16, enabled=dtype is not None):
        for x, y in test_batches:
            x = x.contiguous(memory_format=torch.channels_last) if cl else x
            correct += int((model(x).argmax(1) == y).sum())
            total += len(y)
    return {"value": (done - warm) / len(batches),
            "metrics": {"accuracy": 100.0 * correct / max(total, 1), "loss": float(loss.detach()),
                        "warmup_s": warm - prepared, "prepare_s": prepared - started, "steps": float(len(batches)),
                        "page_faults_per_step": faults / len(batches)}}


def profile_ops(name: str, x: torch.Tensor, y: torch.Tensor, *, dataset: str = "cifar10", steps: int = 3,
                warmup: int = 5, seed: int = 0) -> list[dict[str, Any]]:
    """Profile ``steps`` training steps of a fresh model of variant ``name``: rows of ``key``, ``calls``, ``self_ms``."""
    from torch.profiler import ProfilerActivity, profile

    from .profiling import quiet_kineto

    model, optimizer, dtype, cl = prepare(name, dataset, seed=seed)
    for _ in range(warmup):
        _step(model, optimizer, x, y, dtype, cl)
    with quiet_kineto(), profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            _step(model, optimizer, x, y, dtype, cl)
    return [{"key": e.key, "calls": int(e.count), "self_ms": e.self_cpu_time_total / 1000.0}
            for e in prof.key_averages() if e.self_cpu_time_total > 0]


OP_GROUPS: dict[str, tuple[str, ...]] = {  # the first group with a needle in the name wins; the rest is "other"
    "max-pool": ("max_pool",),
    "convolution": ("conv",),
    "linear (mm, addmm)": ("aten::mm", "aten::addmm", "linear"),
    "optimizer update": ("adam", "_foreach", "lerp", "addcdiv", "addcmul", "sqrt"),
    "layout / dtype copies": ("copy_", "contiguous", "to_dense", "reorder", "aten::to", "_to_copy", "clone"),
}


def op_groups(ops: Iterable[Mapping[str, Any]]) -> dict[str, float]:
    """Self time in ms per kind of operator (``OP_GROUPS``, then "other") of ``profile_ops`` rows."""
    out = {group: 0.0 for group in [*OP_GROUPS, "other"]}
    for op in ops:
        key = str(op["key"]).lower()
        group = next((g for g, needles in OP_GROUPS.items() if any(n.lower() in key for n in needles)), "other")
        out[group] += float(op["self_ms"])
    return out


def serve_argv(name: str, *, dataset: str = "cifar10", train_size: int = 1024, test_size: int = 256,
               batch_size: int = 64, lr: float = 1e-3, warmup_steps: int = 4, seed: int = 0,
               python: str | None = None) -> list[str]:
    """The command line of the child that serves variant ``name``, run by ``python`` (default: this one)."""
    variant(name)
    return [python or sys.executable, "-m", "helpers.ipex", "--serve", name, "--dataset", dataset,
            "--train-size", str(train_size), "--test-size", str(test_size), "--batch-size", str(batch_size),
            "--lr", repr(lr), "--warmup-steps", str(warmup_steps), "--seed", str(seed)]


def round_commands(arms: Mapping[str, tuple[str, str | None]], env: Mapping[str, str] | None = None,
                   **options: Any) -> dict[str, tuple[list[str], dict[str, str] | None]]:
    """``{arm: (variant, python or None)}`` -> ``{arm: (argv, env)}`` for ``variants.fresh_process_rounds``;
    ``options`` go to ``serve_argv``."""
    return {arm: (serve_argv(name, python=python, **options), dict(env) if env else None)
            for arm, (name, python) in arms.items()}


def round_value(payload: Mapping[str, Any]) -> tuple[float, dict[str, Any]]:
    """One round's answer of a ``--serve`` child as ``(seconds per step, metrics)``."""
    return float(payload["value"]), dict(payload["metrics"])


def worker(argv: Sequence[str]) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """The child's handler (data and IPEX loaded first): ``{}`` trains one round, ``{"profile": true}`` profiles."""
    from . import data

    p = argparse.ArgumentParser(prog="python -m helpers.ipex", description="Serve one IPEX-or-stock training variant.")
    p.add_argument("--serve", required=True, choices=list(VARIANTS), help="the variant this process trains")
    p.add_argument("--dataset", default="cifar10", choices=["fashionmnist", "cifar10"])
    for flag, kind, default in (("--train-size", int, 1024), ("--test-size", int, 256), ("--batch-size", int, 64),
                                ("--lr", float, 1e-3), ("--warmup-steps", int, 4), ("--seed", int, 0)):
        p.add_argument(flag, type=kind, default=default)
    args = p.parse_args(argv)
    if variant(args.serve).ipex:
        load()  # before READY: the import is not timed; its warnings stay in this child's stderr
    train_ds = data.take(data.load_dataset(args.dataset, train=True), args.train_size, seed=1)
    test_ds = data.take(data.load_dataset(args.dataset, train=False), args.test_size, seed=2)
    batches = list(data.make_loader(train_ds, args.batch_size, train=True, seed=args.seed))
    test_batches = list(data.make_loader(test_ds, 256, train=False))
    torch.optim.Adam([torch.zeros(1, requires_grad=True)]).zero_grad()  # load the optimizer's hooks now

    def handle(request: dict[str, Any]) -> dict[str, Any]:
        if request.get("profile"):
            return {"ops": profile_ops(args.serve, *batches[0], dataset=args.dataset, seed=args.seed,
                                       steps=int(request.get("steps", 3)), warmup=int(request.get("warmup", 5)))}
        return train_round(args.serve, batches, test_batches, dataset=args.dataset, lr=args.lr,
                           warmup_steps=args.warmup_steps, seed=args.seed)

    return handle
