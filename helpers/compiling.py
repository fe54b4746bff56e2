"""torch.compile made measurable: compile time apart from steady state, every backend on a
fresh model, graph breaks made visible, compiled regions found in a profile.

Importing this module changes nothing. While ``time_training_steps`` compiles, what the
compiler writes to stderr (max-autotune's pages of kernel timing tables, "No CUDA runtime"
on a CUDA build without a GPU) is kept in ``CompileOutcome.log`` instead of the notebook.
"""

from __future__ import annotations

import contextlib
import io
import logging
import time
import warnings
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import nn

from . import devices
from .measure import Stats, time_fn
from .tables import Table
from .seeds import set_seed

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
    set_seed(seed)
    device = torch.device(device)
    model = build_model().to(device)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    x, y = inputs.to(device), targets.to(device)
    name = backend or "eager"
    from torch._inductor import config as inductor_config

    log = io.StringIO()
    try:
        step_model = model if backend is None else torch.compile(
            model, backend=backend, mode=None if mode in (None, "default") else mode)

        def step() -> None:
            loss = nn.functional.cross_entropy(step_model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()

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


def compiled_regions(prof: "torch.profiler.profile") -> Table:
    """Profiler rows that belong to compiled code (CompiledFunction, Torch-Compiled Region)."""
    table = Table(["event", "calls", "CPU total ms"])
    for e in prof.key_averages():
        if "Compiled" in e.key or "compiled" in e.key:
            table.add(e.key, int(e.count), e.cpu_time_total / 1000.0)
    return table
