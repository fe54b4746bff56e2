"""Guarded access to Intel Extension for PyTorch (IPEX) -- retired, used where the book does.

IPEX 2.8 is the final release (development stopped after 2.8; the repository is archived
and flagged as having known security issues). Its CPU build requires torch 2.8.* and, on a
version mismatch, its import prints an error and exits the process -- which would kill a
Jupyter kernel. The course's default environment runs current PyTorch and never imports it:
IPEX lives in an environment of its own (``make setup-ipex``; ``ipex_python`` finds its Python,
``environment`` reads its versions without importing anything). In that environment this module
checks versions from package metadata *before* importing, and checks the CPU before asking for
bf16 weight prepacking (which asserts AVX-512 or AVX-NE-CONVERT). Upstream replacements:
``channels_last``, fused Adam, ``torch.autocast('cpu', dtype=torch.bfloat16)`` and
``torch.compile`` (Inductor) on CPUs, native ``torch.xpu`` on Intel GPUs.

It also runs chapter 04's comparison across environments: ``python -m helpers.ipex_support
--serve VARIANT`` is one variant's child process (``helpers.children`` protocol), started with the
IPEX environment's Python for the torch 2.8 arms and with the course's own Python for the
current-PyTorch arms, so that only the IPEX variants' processes ever import IPEX (its import
replaces some of PyTorch's kernels, the CPU autocast ones included). ``round_commands`` gives the
arms' command lines for ``helpers.variants.fresh_process_rounds`` (a new process per arm and round)
and ``round_value`` reads one round's answer.
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
from typing import Any, Iterable, Mapping, Sequence

if __name__ == "__main__":  # a variant's own process (python -m helpers.ipex_support), not an import
    from .startup import import_frozen

    import_frozen("torch")  # starts sooner (see helpers.startup)

import torch  # noqa: E402

from . import models, system  # noqa: E402
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
"""The one command that installs the IPEX environment (Linux x86-64)."""
IPEX_PYTHON_ENV = "COURSE_IPEX_PYTHON"
"""The variable through which the Makefile tells a notebook where the IPEX environment's Python is."""


class IPEXUnavailable(RuntimeError):
    """IPEX is missing, incompatible with this torch, or the CPU lacks a needed feature."""


def status() -> dict[str, object]:
    """Installed IPEX version, torch version and whether the two fit (no import of IPEX)."""
    try:
        version = metadata.version("intel-extension-for-pytorch")
    except metadata.PackageNotFoundError:
        return {"installed": None, "torch": torch.__version__, "compatible": False,
                "message": f"IPEX is not installed in this environment; it lives in the IPEX environment ({SETUP_COMMAND})."}
    ipex_mm = version.split("+")[0].split(".")[:2]
    torch_mm = torch.__version__.split("+")[0].split(".")[:2]
    ok = ipex_mm == torch_mm
    message = "ok" if ok else (
        f"IPEX {version} needs torch {'.'.join(ipex_mm)}.* but torch {torch.__version__} is installed; "
        f"importing it would end this Python process. Use the IPEX environment ({SETUP_COMMAND}: torch 2.8.0)."
    )
    return {"installed": version, "torch": torch.__version__, "compatible": ok, "message": message}


def ipex_python() -> str | None:
    """The IPEX environment's Python: ``$COURSE_IPEX_PYTHON`` (the Makefile sets it), else the environment
    keyed by this clone's pins in the default cache; None when neither exists."""
    from . import install  # noqa: PLC0415  (standard library only)

    wanted = os.environ.get(IPEX_PYTHON_ENV)
    if wanted:
        return wanted if os.path.exists(wanted) else None
    try:
        candidate = install.ipex_venv() / "bin" / "python"
    except install.InstallError:
        return None
    return str(candidate) if candidate.exists() else None


_PROBE = ("import importlib.metadata as m, importlib.util, json, sys\n"
          "def v(n):\n"
          "    try:\n        return m.version(n)\n"
          "    except m.PackageNotFoundError:\n        return None\n"
          "print(json.dumps({'python': sys.version.split()[0], 'torch': v('torch'), "
          "'torchvision': v('torchvision'), 'ipex': v('intel-extension-for-pytorch'), "
          "'helpers': v('accelerate-course-helpers'), "
          "'helpers_at': getattr(importlib.util.find_spec('helpers'), 'origin', None)}))")


def environment(python: str | None = None) -> dict[str, Any]:
    """What the IPEX environment holds, read from package metadata in its own Python (IPEX is not imported).

    Returns ``{"python": path or None, "ok": bool, "torch", "torchvision", "ipex", "message"}``;
    ``message`` says what to do when ``ok`` is False.
    """
    python = python or ipex_python()
    if python is None:
        return {"python": None, "ok": False, "torch": None, "torchvision": None, "ipex": None,
                "message": f"the IPEX environment is not installed: {SETUP_COMMAND} (Linux x86-64, about 2 minutes)"}
    try:
        proc = subprocess.run([python, "-c", _PROBE], capture_output=True, text=True, timeout=120)
        found = json.loads(proc.stdout.strip().splitlines()[-1])
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError):
        return {"python": python, "ok": False, "torch": None, "torchvision": None, "ipex": None,
                "message": f"{python} does not answer; rebuild the IPEX environment: {SETUP_COMMAND}"}
    ok = bool(found.get("ipex") and found.get("torch") and
              found["ipex"].split("+")[0].split(".")[:2] == found["torch"].split("+")[0].split(".")[:2]
              and found.get("helpers"))
    message = "ok" if ok else (f"the IPEX environment at {python} is incomplete (torch {found.get('torch')}, IPEX "
                               f"{found.get('ipex')}, course package {found.get('helpers')}): {SETUP_COMMAND}")
    here = Path(__file__).resolve().parent
    if ok and (not found.get("helpers_at") or Path(found["helpers_at"]).resolve().parent != here):
        ok, message = False, (f"the IPEX environment's course package is {found.get('helpers_at') or 'not importable'}, "
                              f"not this clone's {here}: {SETUP_COMMAND} (it re-links it in seconds)")
    return {"python": python, "ok": ok, "torch": found.get("torch"), "torchvision": found.get("torchvision"),
            "ipex": found.get("ipex"), "message": message}


def load() -> ModuleType:
    """Import IPEX after checking compatibility; raises IPEXUnavailable with what to do."""
    st = status()
    if not st["compatible"]:
        raise IPEXUnavailable(str(st["message"]))
    # IPEX 2.8 logs a deprecation notice for its fused-update options on every optimize()
    # (the retirement note says it all) and, on CUDA builds without a GPU, "No CUDA runtime".
    logging.getLogger("IPEX").setLevel(logging.ERROR)
    logging.getLogger("torch.utils.cpp_extension").setLevel(logging.ERROR)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import intel_extension_for_pytorch as ipex  # noqa: PLC0415
    return ipex


def bf16_prepack_supported() -> bool:
    """Whether this CPU can run IPEX's bf16 weight prepacking (AVX-512 BW/VL/DQ or AVX-NE-CONVERT)."""
    return bool(system.cpu_bf16_support()["ipex_bf16_prepack"])


def optimize(model: torch.nn.Module, optimizer: torch.optim.Optimizer, dtype: torch.dtype | None = None,
             **kwargs: object) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """``ipex.optimize`` for training: returns the (copied) model and optimizer to use.

    The model must be in train() mode. For ``dtype=torch.bfloat16`` the CPU is checked first.
    """
    if dtype == torch.bfloat16 and not bf16_prepack_supported():
        raise IPEXUnavailable(
            "IPEX bf16 training prepacks weights with AVX-512 (BW/VL/DQ) or AVX-NE-CONVERT instructions; "
            "this CPU has neither (AVX2 only). Use fp32 with IPEX, or torch.autocast('cpu', dtype=torch.bfloat16) "
            "(runs everywhere, fast only with AVX512-BF16/AMX)."
        )
    if not model.training:
        raise ValueError("call model.train() before optimizing for training (IPEX asserts it)")
    ipex = load()
    return ipex.optimize(model, optimizer=optimizer, dtype=dtype, **kwargs)


# ----------------------------------------------------------------------------------------
# IPEX against stock PyTorch, each variant in a process of its own.
#
# Importing IPEX registers its own kernels over some of PyTorch's, the AutocastCPU ones
# included (its import warns "Overriding a previously registered kernel ... dispatch key:
# AutocastCPU"). A "stock" variant measured in a process that has imported IPEX is not stock,
# so every variant below runs in a child of its own (``helpers.children``; a new one per arm and
# round in chapter 04's comparison), and only the children of IPEX variants import IPEX.
# ----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Variant:
    """What one variant changes on top of stock fp32 eager training."""

    channels_last: bool = False   # model and inputs in channels-last memory format
    bf16: bool = False            # forward and loss under torch.autocast("cpu", dtype=torch.bfloat16)
    ipex: bool = False            # model and optimizer through ipex.optimize (IPEX imported in its process)
    compile: str | None = None    # a torch.compile backend ("inductor", "ipex"), None = eager
    fused: bool = False           # torch.optim.Adam(..., fused=True): one kernel updates every parameter


VARIANTS: dict[str, Variant] = {
    "stock_fp32": Variant(),
    "stock_fused": Variant(fused=True),
    "stock_fp32_cl": Variant(channels_last=True),
    "stock_cl_fused": Variant(channels_last=True, fused=True),
    "ipex_fp32": Variant(ipex=True),
    "stock_bf16_cl": Variant(channels_last=True, bf16=True),
    "ipex_bf16": Variant(ipex=True, bf16=True),
    "inductor": Variant(compile="inductor"),
    "ipex_backend": Variant(ipex=True, compile="ipex"),
    "upstream": Variant(channels_last=True, fused=True, compile="inductor"),
    "upstream_bf16": Variant(channels_last=True, fused=True, bf16=True, compile="inductor"),
}
"""The variants a child can serve. ``stock_fused``: Adam with ``fused=True`` (the fair control for
IPEX's fused optimizer); ``stock_cl_fused``: channels-last and fused Adam, eager (stock PyTorch's
replacements for IPEX's layout and update, without compile); ``ipex_fp32``/``ipex_bf16``:
``ipex.optimize`` (which puts convolution weights in oneDNN's blocked layout itself and fuses the
optimizer's update); ``ipex_backend``:
``torch.compile`` with the ``ipex`` backend on a plain model; ``inductor``: ``torch.compile``'s
default backend; ``upstream``: ``stock_cl_fused`` compiled (so that against ``stock_cl_fused`` it
isolates the compile); ``upstream_bf16``: that with bf16 autocast (for CPUs with bf16 kernels)."""


def variant(name: str) -> Variant:
    """The ``Variant`` called ``name``; a ValueError lists the known names."""
    if name not in VARIANTS:
        raise ValueError(f"unknown variant {name!r}; known: {', '.join(VARIANTS)}")
    return VARIANTS[name]


def prepare(name: str, model: torch.nn.Module, optimizer: torch.optim.Optimizer
            ) -> tuple[torch.nn.Module, torch.optim.Optimizer, torch.dtype | None, bool]:
    """Apply variant ``name`` to a fresh model (in train mode) and its optimizer.

    Returns ``(model, optimizer, autocast_dtype, channels_last)``: train with the returned model
    and optimizer, run forward and loss under ``torch.autocast("cpu", dtype=autocast_dtype)``
    when it is not None, and convert inputs to channels-last when ``channels_last``.
    """
    v = variant(name)
    if v.channels_last:
        model = model.to(memory_format=torch.channels_last)
    dtype = torch.bfloat16 if v.bf16 else None
    if v.ipex and v.compile is None:
        model, optimizer = optimize(model, optimizer, dtype=dtype)
    elif v.ipex:
        load()  # registers the "ipex" backend of torch.compile
    return model, optimizer, dtype, v.channels_last


def make_optimizer(name: str, model: torch.nn.Module, lr: float = 1e-3) -> torch.optim.Optimizer:
    """Adam for variant ``name``: ``fused=True`` where the variant asks for it, else PyTorch's default
    (on CPU tensors the single-tensor loop: one small kernel per parameter and statistic)."""
    return torch.optim.Adam(model.parameters(), lr=lr, **({"fused": True} if variant(name).fused else {}))


def _step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor,
          dtype: torch.dtype | None, channels_last: bool) -> torch.Tensor:
    """One training step (the course's one, ``helpers.step.train_step``), the batch in the variant's layout."""
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    return train_step(model, optimizer, torch.nn.functional.cross_entropy, x, y, autocast_dtype=dtype)


def train_round(name: str, batches: Sequence[tuple[torch.Tensor, torch.Tensor]],
                test_batches: Sequence[tuple[torch.Tensor, torch.Tensor]], *, dataset: str = "cifar10",
                lr: float = 1e-3, warmup_steps: int = 4, seed: int = 0) -> dict[str, Any]:
    """One round of variant ``name``: a fresh seeded model, ``warmup_steps`` untimed steps, then
    one timed pass over ``batches``, then accuracy on ``test_batches``. A compiled variant compiles
    in its warm-up (``warmup_s``); a later round in the same process would reuse the code compiled
    there (Dynamo guards on the parameters' shapes and dtypes, not on the module object), which is
    why chapter 04 starts a new process, with an empty Inductor cache, per arm and round.

    Returns ``{"value": seconds per training step, "metrics": {...}}`` (metrics: ``accuracy`` in %,
    ``loss`` of the last step, ``warmup_s``, ``prepare_s`` (building the variant), ``steps`` and
    ``page_faults_per_step``: minor page faults of this process per timed step, i.e. pages the
    kernel had to map afresh because the allocator had handed memory back to it).
    """
    if not batches:
        raise ValueError("train_round needs at least one batch")
    v = variant(name)
    set_seed(seed)
    started = time.perf_counter()
    model = models.book_cnn(dataset).train()
    optimizer = make_optimizer(name, model, lr)
    model, optimizer, dtype, cl = prepare(name, model, optimizer)
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
    """Profile ``steps`` training steps (forward, loss, backward, update) of a fresh model of
    variant ``name``; returns one row per operator: ``key``, ``calls``, ``self_ms`` (summed over
    the profiled steps)."""
    from torch.profiler import ProfilerActivity, profile

    from .profiling import quiet_kineto

    set_seed(seed)
    model = models.book_cnn(dataset).train()
    optimizer = make_optimizer(name, model)
    model, optimizer, dtype, cl = prepare(name, model, optimizer)
    for _ in range(warmup):
        _step(model, optimizer, x, y, dtype, cl)
    with quiet_kineto(), profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            _step(model, optimizer, x, y, dtype, cl)
    return [{"key": e.key, "calls": int(e.count), "self_ms": e.self_cpu_time_total / 1000.0}
            for e in prof.key_averages() if e.self_cpu_time_total > 0]


OP_GROUPS: dict[str, tuple[str, ...]] = {
    "max-pool": ("max_pool",),
    "convolution": ("conv",),
    "linear (mm, addmm)": ("aten::mm", "aten::addmm", "linear"),
    "optimizer update": ("adam", "_foreach", "lerp", "addcdiv", "addcmul", "sqrt"),
    "layout / dtype copies": ("copy_", "contiguous", "to_dense", "reorder", "aten::to", "_to_copy", "clone"),
}
"""How ``op_groups`` sorts operators (the first group whose needle is in the name wins; the
rest is "other")."""


def op_groups(ops: Iterable[Mapping[str, Any]]) -> dict[str, float]:
    """Self time in ms per kind of operator (``OP_GROUPS``, then "other") of ``profile_ops`` rows."""
    out = {group: 0.0 for group in OP_GROUPS}
    out["other"] = 0.0
    for op in ops:
        key = str(op["key"]).lower()
        group = next((g for g, needles in OP_GROUPS.items() if any(n.lower() in key for n in needles)), "other")
        out[group] += float(op["self_ms"])
    return out


def serve_argv(name: str, *, dataset: str = "cifar10", train_size: int = 1024, test_size: int = 256,
               batch_size: int = 64, lr: float = 1e-3, warmup_steps: int = 4, seed: int = 0,
               python: str | None = None) -> list[str]:
    """The command line of the child process that serves variant ``name`` (see ``main``), run by
    ``python`` (default: this one; the IPEX environment's Python for the torch 2.8 arms)."""
    variant(name)
    return [python or sys.executable, "-m", "helpers.ipex_support", "--serve", name, "--dataset", dataset,
            "--train-size", str(train_size), "--test-size", str(test_size), "--batch-size", str(batch_size),
            "--lr", repr(lr), "--warmup-steps", str(warmup_steps), "--seed", str(seed)]


def round_commands(arms: Mapping[str, tuple[str, str | None]], env: Mapping[str, str] | None = None,
                   **options: Any) -> dict[str, tuple[list[str], dict[str, str] | None]]:
    """``{arm: (variant, python)}`` (python None: this one) -> ``{arm: (argv, env)}`` for
    ``helpers.variants.fresh_process_rounds``; ``options`` go to ``serve_argv`` (train_size, lr, ...)."""
    return {arm: (serve_argv(name, python=python, **options), dict(env) if env else None)
            for arm, (name, python) in arms.items()}


def round_value(payload: Mapping[str, Any]) -> tuple[float, dict[str, Any]]:
    """One round's answer of a ``--serve`` child as ``(seconds per step, metrics)`` for ``measure.interleaved``."""
    return float(payload["value"]), dict(payload["metrics"])


def _serve(args: argparse.Namespace) -> None:
    """The child: load the data (and IPEX, for IPEX variants) before READY, then answer requests:
    ``{}`` trains one round, ``{"profile": true}`` profiles, ``{"describe": true}`` says what
    ``prepare`` made of the model."""
    from . import children, data

    v = variant(args.serve)
    if v.ipex:
        load()  # before READY: the import is not timed; its warnings stay in this child's stderr
    train_ds = data.take(data.load_dataset(args.dataset, train=True), args.train_size, seed=1)
    test_ds = data.take(data.load_dataset(args.dataset, train=False), args.test_size, seed=2)
    batches = list(data.make_loader(train_ds, args.batch_size, train=True, seed=args.seed))
    test_batches = list(data.make_loader(test_ds, 256, train=False))
    torch.optim.Adam([torch.zeros(1, requires_grad=True)]).zero_grad()  # load the optimizer's hooks now

    def handle(request: dict[str, Any]) -> dict[str, Any]:
        if request.get("profile"):
            x, y = batches[0]
            return {"ops": profile_ops(args.serve, x, y, dataset=args.dataset, steps=int(request.get("steps", 3)),
                                       warmup=int(request.get("warmup", 5)), seed=args.seed)}
        if request.get("describe"):
            model = models.book_cnn(args.dataset).train()
            model, _, dtype, cl = prepare(args.serve, model, torch.optim.Adam(model.parameters()))
            conv = model.layer1[0]
            return {"torch": torch.__version__, "fused_adam": v.fused or v.ipex, "compiled": v.compile or "eager",
                    "conv1": type(conv).__name__, "weight_dtype": str(conv.weight.dtype).removeprefix("torch."),
                    "autocast": str(dtype).removeprefix("torch.") if dtype else "off", "channels_last_inputs": cl,
                    "ipex_imported": "intel_extension_for_pytorch" in sys.modules,
                    "standin": data.is_standin(train_ds), "torch_threads": torch.get_num_threads()}
        return train_round(args.serve, batches, test_batches, dataset=args.dataset, lr=args.lr,
                           warmup_steps=args.warmup_steps, seed=args.seed)

    children.serve(handle)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m helpers.ipex_support",
                                description="Serve one IPEX-or-stock training variant as a child of helpers.children.")
    p.add_argument("--serve", required=True, choices=list(VARIANTS), help="the variant this process trains")
    p.add_argument("--dataset", default="cifar10", choices=["fashionmnist", "cifar10"])
    p.add_argument("--train-size", type=int, default=1024)
    p.add_argument("--test-size", type=int, default=256)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--warmup-steps", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)
    return p


def main(argv: list[str] | None = None) -> None:
    """``python -m helpers.ipex_support --serve VARIANT ...``: one variant's child process."""
    _serve(_parser().parse_args(argv))


if __name__ == "__main__":
    from .startup import exit_without_collection

    main()
    exit_without_collection()
