"""torch.compile made measurable: compile time apart from steady state, every backend on a
fresh model, graph breaks made visible, where a compiled step's time went (own time per
operator, copies by caller), the kernels Inductor generated compared between modes, and the
step count after which compiling pays back.

Importing this module changes nothing. While ``time_training_steps`` compiles, what the
compiler writes to stderr (max-autotune's pages of kernel timing tables, "No CUDA runtime"
on a CUDA build without a GPU) is kept in ``CompileOutcome.log`` instead of the notebook.
"""

from __future__ import annotations

import collections
import contextlib
import hashlib
import io
import logging
import math
import re
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn

from . import devices
from .measure import Stats, time_fn
from .tables import Table
from .seeds import set_seed
from .step import train_step

MODES: tuple[str, ...] = ("default", "reduce-overhead", "max-autotune")


@dataclass
class CompileOutcome:
    """One backend/mode tried on a fresh model: first-step (compile) time and steady steps."""

    backend: str
    mode: str
    ok: bool
    first_step_s: float | None = None
    steady: Stats | None = None
    error: str = ""
    note: str = ""
    log: str = ""  # what the compiler wrote to stderr meanwhile (e.g. autotuning tables)


def list_backends() -> list[str]:
    """Backends torch.compile knows here (``torch.compiler.list_backends()``)."""
    return list(torch.compiler.list_backends())


def _short(exc: BaseException) -> str:
    exc = getattr(exc, "inner_exception", None) or exc  # BackendCompilerFailed wraps the real reason
    text = str(exc).strip().splitlines()
    first = next((ln for ln in text if ln.strip()), "")
    return f"{type(exc).__name__}: {first[:160]}"


@contextlib.contextmanager
def _compiler_output_kept(buffer: io.StringIO):
    """Inside the block, stderr goes to ``buffer`` and the harmless "No CUDA runtime is found"
    warning of PyPI's CUDA build on a machine without a GPU is not logged; both undone after."""
    cpp_logger = logging.getLogger("torch.utils.cpp_extension")
    level = cpp_logger.level
    cpp_logger.setLevel(logging.ERROR)
    try:
        with contextlib.redirect_stderr(buffer), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # e.g. cudagraphs says it skips CPU tensors
            yield
    finally:
        cpp_logger.setLevel(level)


def _uses_cudagraphs(backend: str | None, mode: str | None) -> bool:
    return backend == "cudagraphs" or (backend == "inductor" and mode == "reduce-overhead")


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


def time_training_steps(build_model: Callable[[], nn.Module], inputs: torch.Tensor, targets: torch.Tensor, *,
                        backend: str | None = "inductor", mode: str | None = None, steps: int = 10,
                        warmup: int = 2, device: torch.device | str = "cpu", seed: int = 0,
                        lr: float = 1e-3, cold_cache: bool = False) -> CompileOutcome:
    """Time training steps of a fresh seeded model, compiled with ``backend`` (None = eager).

    The first step (where compilation happens) is timed on its own; then ``warmup``
    untimed steps and ``steps`` timed ones. Failures are returned, not raised.
    ``cold_cache=True`` disables Inductor's on-disk caches for the call, so the first step
    shows the full compile cost even when an earlier run compiled the same graph.
    """
    if mode is not None and mode not in MODES:
        raise ValueError(f"Unknown compile mode {mode!r}; choose one of {', '.join(MODES)}.")
    torch.compiler.reset()
    device = torch.device(device)
    name = backend or "eager"
    from torch._inductor import config as inductor_config

    log = io.StringIO()
    try:
        step = new_training_step(build_model, inputs, targets, backend=backend, mode=mode, device=device,
                                 seed=seed, lr=lr)
        disable_caches = cold_cache or inductor_config.force_disable_caches
        with _compiler_output_kept(log), inductor_config.patch(force_disable_caches=disable_caches):
            devices.synchronize(device)
            start = time.perf_counter()
            step()
            devices.synchronize(device)
            first = time.perf_counter() - start
            res = time_fn(step, repeats=steps, warmup=warmup, device=device)
    except Exception as exc:  # any backend failure becomes a row with its reason
        return CompileOutcome(name, mode or "default", False, error=_short(exc), log=log.getvalue())
    finally:
        torch.compiler.reset()
    note = ""
    if _uses_cudagraphs(backend, mode) and device.type != "cuda":
        # CUDA graphs record CUDA kernels only: with tensors elsewhere the graph runs without them.
        note = f"cudagraphs not applied (tensors on {device.type})"
    return CompileOutcome(name, mode or "default", True, first, res.stats, note=note, log=log.getvalue())


def outcomes_table(outcomes: list[CompileOutcome], baseline: str = "eager", title: str = "") -> Table:
    """First-step time, steady step time and speed-up against ``baseline`` (or the reason it failed)."""
    base = next((o for o in outcomes if o.backend == baseline and o.ok), None)
    table = Table(["backend", "mode", "first step s", "steady step ms", "min ms", "max ms", "speed-up", "status"],
                  title=title, note=f"speed-up = steady step time of {baseline} / this one; first step includes compiling")
    for o in outcomes:
        if o.ok and o.steady is not None:
            speed = base.steady.median / o.steady.median if base and base.steady else None
            table.add(o.backend, o.mode, o.first_step_s, o.steady.median * 1e3, o.steady.minimum * 1e3,
                      o.steady.maximum * 1e3, speed, f"ok; {o.note}" if o.note else "ok")
        else:
            table.add(o.backend, o.mode, None, None, None, None, None, o.error)
    return table


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
