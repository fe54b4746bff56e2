"""torch.compile made measurable: a cold compile per instance (``cold_compile``), the first steps of a
new process with an empty cache (``first_steps``: compile and recompile cost apart from steady state),
graph breaks made visible, where a compiled step's time went (own time per operator, copies by caller),
the kernels Inductor generated compared between modes, and the step count after which compiling pays back.

Importing this module changes nothing. ``python -m helpers.compiling first-steps ...`` is the child
process that ``first_steps`` starts.
"""

from __future__ import annotations

import collections
import contextlib
import hashlib
import io
import math
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import torch
from torch import nn

from . import devices
from .seeds import set_seed
from .step import train_step

MODES: tuple[str, ...] = ("default", "reduce-overhead", "max-autotune")


@contextlib.contextmanager
def cold_compile() -> Iterator[str]:
    """Inside the block, ``torch.compile`` starts from nothing, as in a new process with an empty cache:
    Dynamo's compiled code is dropped (``torch.compiler.reset()``), Inductor's in-memory caches are cleared
    and ``TORCHINDUCTOR_CACHE_DIR`` (and ``TRITON_CACHE_DIR``) point at a new, empty folder, removed after
    the block; yields that folder. Build, compile and run the instance inside the block, so that every
    instance of a compiled arm pays its own compile."""
    from torch._inductor.utils import clear_caches

    torch.compiler.reset()
    clear_caches()
    saved = {k: os.environ.get(k) for k in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")}
    with tempfile.TemporaryDirectory(prefix="inductor-cold-") as cache:
        os.environ.update(TORCHINDUCTOR_CACHE_DIR=cache, TRITON_CACHE_DIR=os.path.join(cache, "triton"))
        try:
            yield cache
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
            torch.compiler.reset()
            clear_caches()


def timed(fn: Callable[[], Any], n: int = 1, device: torch.device | str = "cpu") -> float:
    """Seconds for ``n`` calls of ``fn``, the device synchronized before and after."""
    device = torch.device(device)
    devices.synchronize(device)
    start = time.perf_counter()
    for _ in range(n):
        fn()
    devices.synchronize(device)
    return time.perf_counter() - start


def round_arm(new_step: Callable[[], Callable[[], Any]], *, steps: int, cold: bool = True, warmup: int = 2,
              device: torch.device | str = "cpu") -> Callable[[], tuple[float, dict[str, float]]]:
    """One arm's turn in a round of ``measure.interleaved``: ``new_step()`` builds a new instance (model,
    optimizer, ``torch.compile``) and returns its step; inside ``cold_compile()`` when ``cold`` (a compiled
    arm then compiles from nothing in every round). Its first step is timed on its own (for a compiled arm,
    the compile), ``warmup`` steps run untimed, then ``steps`` timed ones. Returns ``(seconds per step,
    {"first step s": ...})``; what the compiler writes to stderr meanwhile is dropped."""
    def run() -> tuple[float, dict[str, float]]:
        with cold_compile() if cold else contextlib.nullcontext():
            with contextlib.redirect_stderr(io.StringIO()):
                step = new_step()
                first = timed(step, 1, device)
                timed(step, warmup, device)
            return timed(step, steps, device) / steps, {"first step s": first}
    return run


def recompile_reasons(log: str) -> list[str]:
    """The first failed guard of each recompile in a ``TORCH_LOGS=recompiles`` log (the line after each
    "triggered by"), e.g. "16 <= x.size()[0]"."""
    lines = log.splitlines()
    return [nxt.split("- 0/", 1)[1].split(":", 1)[1].split("#")[0].strip()
            for line, nxt in zip(lines, lines[1:]) if "triggered by" in line and "- 0/" in nxt]


FIRST_STEPS = ("first step s", "later step s", "first at last batch s", "later at last batch s",
               "full batch after recompile s", "compile s", "recompile s")


def first_steps(mode: str, *, model: str = "book_cnn", device: torch.device | str = "cpu", batch: int = 64,
                last: int = 32, channels: int = 1, size: int = 28, cache: str | None = None, fresh: bool = True,
                timeout: float = 1800) -> dict[str, float]:
    """The first training steps of a NEW process (``python -m helpers.compiling first-steps``) that compiles
    ``model`` ("book_cnn" or a torchvision name) with ``mode`` ("eager": not compiled), with Inductor's cache
    in ``cache`` (None: a new, empty folder, removed after; ``fresh=False``: the cache this process's
    environment names, e.g. a warm one for a quick check). Returns the seconds named in ``FIRST_STEPS``:
    the first step at ``batch`` (it compiles) and the best of 3 later ones, the same at ``last`` (the epoch's
    last, smaller batch: a recompile) and the best of 3 full batches after it (run by the dynamic graph); then
    "compile s" (first step minus a later one, at least 0) and "recompile s" (the same at the last batch)."""
    with contextlib.ExitStack() as stack:
        env = dict(os.environ)
        if cache or fresh:
            folder = cache or stack.enter_context(tempfile.TemporaryDirectory(prefix="inductor-first-"))
            env.update(TORCHINDUCTOR_CACHE_DIR=folder, TRITON_CACHE_DIR=os.path.join(folder, "triton"))
        argv = [sys.executable, "-m", "helpers.compiling", "first-steps", mode, model, str(device),
                *map(str, (batch, last, channels, size))]
        proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"first_steps({mode!r}, {model!r}) failed:\n{proc.stderr[-2000:]}")
    first, later, first_last, later_last, after = (float(v) for v in proc.stdout.split()[-5:])
    return dict(zip(FIRST_STEPS, (first, later, first_last, later_last, after, max(0.0, first - later),
                                  max(0.0, first_last - later_last))))


def _first_steps_main(args: Sequence[str]) -> list[float]:
    """The child of ``first_steps``: args = mode, model, device, batch, last, channels, size."""
    from . import models

    mode, name, device = args[0], args[1], torch.device(args[2])
    batch, last, channels, size = map(int, args[3:7])
    set_seed(0)
    model = (models.book_cnn("fashionmnist") if name == "book_cnn"
             else models.torchvision_model(name, num_classes=10)).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    if mode != "eager":
        model = torch.compile(model, mode=mode)

    def seconds(n: int) -> float:
        x, y = torch.randn(n, channels, size, size, device=device), torch.randint(0, 10, (n,), device=device)
        devices.synchronize(device)
        start = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
        devices.synchronize(device)
        return time.perf_counter() - start

    return [seconds(batch), min(seconds(batch) for _ in range(3)), seconds(last),
            min(seconds(last) for _ in range(3)), min(seconds(batch) for _ in range(3))]


def list_backends() -> list[str]:
    """Backends torch.compile knows here (``torch.compiler.list_backends()``)."""
    return list(torch.compiler.list_backends())


def new_training_step(build_model: Callable[[], nn.Module], inputs: torch.Tensor, targets: torch.Tensor, *,
                      backend: str | None = "inductor", mode: str | None = None,
                      options: dict[str, Any] | None = None, device: torch.device | str = "cpu", seed: int = 0,
                      lr: float = 1e-3) -> Callable[[], torch.Tensor]:
    """A fresh seeded model and Adam optimizer, compiled with ``backend`` (None = eager); returns
    ``step()``, which runs one training step on ``inputs``/``targets`` and returns the loss.

    This is the step chapter 03 writes out (zero_grad, forward, cross-entropy, backward,
    optimizer step: the course's one, ``helpers.step.train_step``); ``mode`` is a ``torch.compile`` mode ("default" = None) and ``options``
    Inductor options passed to ``torch.compile``. Nothing is compiled until the first call.
    """
    if mode is not None and mode not in MODES:
        raise ValueError(f"Unknown compile mode {mode!r}; choose one of {', '.join(MODES)}.")
    set_seed(seed)
    device = torch.device(device)
    model = build_model().to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    x, y = inputs.to(device), targets.to(device)
    if backend is not None:
        model = torch.compile(model, backend=backend, mode=None if mode in (None, "default") else mode,
                              options=options)

    def step() -> torch.Tensor:
        return train_step(model, optimizer, nn.functional.cross_entropy, x, y, device_type=device.type).detach()

    return step


def try_backends(names: Sequence[str], one_step: Callable[[str], Any], *, skip: dict[str, str] | None = None,
                 title: str = "") -> tuple["Table", list[str]]:
    """Each backend in ``names`` tried with ``one_step(name)`` (one training step of a fresh model compiled with
    it), after ``torch.compiler.reset()``; ``skip`` maps names to the reason they are not run. Returns a table
    (backend, status: the skip reason, "works: measured below" or the error's first line) and the names that
    worked. What the compiler writes to stderr meanwhile is dropped."""
    from .tables import Table

    table, working = Table(["backend", "status"], title=title), []
    for name in names:
        if skip and name in skip:
            table.add(name, skip[name])
            continue
        torch.compiler.reset()
        try:
            with contextlib.redirect_stderr(io.StringIO()):
                one_step(name)
            working.append(name)
            table.add(name, "works: measured below")
        except Exception as exc:  # any backend failure becomes a row with its reason
            exc = getattr(exc, "inner_exception", None) or exc  # BackendCompilerFailed wraps the real error
            first = next((ln for ln in str(exc).strip().splitlines() if ln.strip()), "")
            table.add(name, f"{type(exc).__name__}: {first[:110]}")
    return table, working


def graph_breaks(fn: Callable[..., Any], *args: Any) -> dict[str, Any]:
    """How Dynamo splits ``fn(*args)``: number of graphs, of breaks, and why it broke."""
    torch.compiler.reset()
    out = torch._dynamo.explain(fn)(*args)  # the documented tool; torch.compiler has no public twin
    torch.compiler.reset()
    reasons = []
    for r in out.break_reasons:
        text = str(getattr(r, "reason", r)).strip().splitlines()
        reasons.append(text[0] if text else "")
    return {"graphs": out.graph_count, "breaks": out.graph_break_count, "reasons": reasons,
            "ops_per_graph": [len(ops) for ops in out.ops_per_graph]}


def payback_steps(compile_s: float, saved_s_per_step: float, *, recompile_s: float = 0.0,
                  recompile_at: int | None = None) -> float | None:
    """Training steps after which a compiled run has caught up with eager for good.

    Compiling costs ``compile_s`` extra seconds at the first step and, when the run reaches step
    ``recompile_at`` (an epoch's last, smaller batch), ``recompile_s`` more; every step saves
    ``saved_s_per_step``. Returns None when nothing is saved (compiling never pays back).
    A run that catches up before ``recompile_at`` but falls behind again there has paid back
    only once it has also recovered the recompile.
    """
    if compile_s < 0 or recompile_s < 0:
        raise ValueError("compile_s and recompile_s are extra seconds, >= 0")
    if saved_s_per_step <= 0:
        return None
    first = compile_s / saved_s_per_step
    both = (compile_s + recompile_s) / saved_s_per_step
    if recompile_at is None or recompile_s == 0:
        return first
    return first if both < recompile_at else both


def payback_text(verdict: Any, eager_step_s: float, compile_s: float, recompile_s: float,
                 steps_per_epoch: int) -> str | None:
    """"after about N steps (E epochs)" (two significant digits) when ``verdict`` (compiled against eager, from
    ``measure.verdict``) says faster, else None: the step saves ``eager_step_s * (1 - 1 / ratio)``, and the
    break-even is ``payback_steps`` with the recompile at the first epoch's last batch."""
    if not verdict.won:
        return None
    saved = eager_step_s * (1 - 1 / verdict.ratio)
    n = payback_steps(compile_s, saved, recompile_s=recompile_s, recompile_at=steps_per_epoch)
    if n is None:
        return None
    return f"after about {significant(n):,.0f} steps ({significant(n / steps_per_epoch):g} epochs)"


def significant(x: float, digits: int = 2) -> float:
    """``x`` rounded to ``digits`` significant digits (1234 -> 1200.0 with 2): a figure that
    claims no more precision than the measurement behind it has."""
    if digits < 1:
        raise ValueError("digits must be >= 1")
    if x == 0 or not math.isfinite(x):
        return float(x)
    return float(round(x, digits - 1 - int(math.floor(math.log10(abs(x))))))


_CALL = re.compile(r"\b(extern_kernels\.\w+|torch\.ops\.aten\.\w+)(?:\.default)?\(")


@dataclass(frozen=True)
class GeneratedCode:
    """What Inductor wrote into one cache directory: a hash of every generated C++ kernel's
    source, and the library calls (``extern_kernels.*``, ``torch.ops.aten.*``: oneDNN/MKL
    convolutions and matmuls) that its wrapper code makes, counted."""

    kernels: frozenset[str] = frozenset()
    library_calls: dict[str, int] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.kernels or self.library_calls)

    def same_as(self, other: "GeneratedCode") -> bool:
        """The same C++ kernels (byte for byte) and the same library calls."""
        return self.kernels == other.kernels and self.library_calls == other.library_calls


def generated_code(cache_dir: str | Path) -> GeneratedCode:
    """Read what Inductor generated into ``cache_dir`` (a ``TORCHINDUCTOR_CACHE_DIR`` that one
    compile filled): C++ kernel sources (``*.cpp``) and the Python wrappers that call them.

    This reads files, not an API: if a PyTorch version lays the cache out differently, the
    result is empty (falsy) rather than wrong.
    """
    root = Path(cache_dir)
    kernels = frozenset(hashlib.sha256(f.read_bytes()).hexdigest() for f in sorted(root.rglob("*.cpp")))
    calls: collections.Counter[str] = collections.Counter()
    for f in sorted(root.glob("*/*.py")):  # output code: <cache>/<2 chars>/<hash>.py
        for line in f.read_text(errors="replace").splitlines():
            if not line.lstrip().startswith("#"):
                calls.update(_CALL.findall(line))
    return GeneratedCode(kernels, dict(sorted(calls.items())))


def self_ms_per_step(prof: "torch.profiler.profile", steps: int) -> dict[str, float]:
    """Each profiled event's own (self) CPU time in ms per step, from a profile of ``steps`` steps.

    For a compiled step, the self time of ``CompiledFunction`` (forward) and
    ``CompiledFunctionBackward`` is the time spent in Inductor's generated kernels; library
    calls they make (convolutions, matmuls, copies) are their own rows. Compare two profiles
    row by row to see where a compiled step gains or loses time.
    """
    if steps < 1:
        raise ValueError("steps must be >= 1")
    return {e.key: e.self_cpu_time_total / 1000.0 / steps for e in prof.key_averages()
            if not e.key.startswith("ProfilerStep")}


_CONVERSIONS = ("aten::copy_", "aten::to", "aten::_to_copy", "aten::clone", "aten::contiguous")


def copies_by_caller(prof: "torch.profiler.profile", steps: int) -> dict[str, float]:
    """Milliseconds per step spent in ``aten::copy_``, by the operator that asked for the copy.

    Layout conversions (``.to(memory_format=...)``, ``.contiguous()``) reach ``copy_`` through
    ``aten::to`` / ``_to_copy`` / ``clone``; the caller is the nearest enclosing event that is
    none of these, e.g. ``aten::convolution_backward`` converting a weight, or autograd's
    ``AccumulateGrad`` copying a gradient into the layout of its parameter.
    """
    if steps < 1:
        raise ValueError("steps must be >= 1")
    out: dict[str, float] = collections.defaultdict(float)
    for event in prof.events():
        if event.name != "aten::copy_":
            continue
        parent = event.cpu_parent
        while parent is not None and parent.name in _CONVERSIONS:
            parent = parent.cpu_parent
        out[parent.name if parent is not None else "(top level)"] += event.cpu_time_total / 1000.0 / steps
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


if __name__ == "__main__":  # python -m helpers.compiling first-steps MODE MODEL DEVICE BATCH LAST CHANNELS SIZE
    if len(sys.argv) != 9 or sys.argv[1] != "first-steps":
        sys.exit("usage: python -m helpers.compiling first-steps MODE MODEL DEVICE BATCH LAST CHANNELS SIZE")
    import logging

    logging.getLogger("torch.utils.cpp_extension").setLevel(logging.ERROR)  # "No CUDA runtime is found"
    print(*_first_steps_main(sys.argv[2:]))
