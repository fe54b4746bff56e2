"""torch.compile made measurable: compile time apart from steady state, every backend on a
fresh model, graph breaks made visible, compiled regions found in a profile."""

from __future__ import annotations

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
from .training import set_seed

MODES: tuple[str, ...] = ("default", "reduce-overhead", "max-autotune")

# PyPI's CUDA build of torch warns "No CUDA runtime is found" when Inductor compiles on a
# machine without a GPU; it is harmless there and would clutter every notebook.
logging.getLogger("torch.utils.cpp_extension").setLevel(logging.ERROR)


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


def list_backends() -> list[str]:
    """Backends torch.compile knows here (``torch._dynamo.list_backends()``)."""
    return list(torch._dynamo.list_backends())


def _short(exc: BaseException) -> str:
    exc = getattr(exc, "inner_exception", None) or exc  # BackendCompilerFailed wraps the real reason
    text = str(exc).strip().splitlines()
    first = next((ln for ln in text if ln.strip()), "")
    return f"{type(exc).__name__}: {first[:160]}"


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


# Inductor/cudagraphs "perf hints" (e.g. cudagraphs skipping CPU tensors) are collected into
# the outcome's note instead of being printed with source paths.
_HINTS = "torch._inductor.cudagraph_utils.__perf_hints"


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
    torch._dynamo.reset()
    set_seed(seed)
    device = torch.device(device)
    model = build_model().to(device)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    x, y = inputs.to(device), targets.to(device)
    name = backend or "eager"
    hints, hint_logger = _Collect(), logging.getLogger(_HINTS)
    hint_logger.addHandler(hints)
    propagate, hint_logger.propagate = hint_logger.propagate, False
    from torch._inductor import config as inductor_config

    caches = inductor_config.force_disable_caches
    inductor_config.force_disable_caches = cold_cache or caches
    try:
        step_model = model if backend is None else torch.compile(
            model, backend=backend, mode=None if mode in (None, "default") else mode)

        def step() -> None:
            loss = nn.functional.cross_entropy(step_model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()

        with warnings.catch_warnings():  # e.g. cudagraphs says it skips CPU tensors
            warnings.simplefilter("ignore")
            devices.synchronize(device)
            start = time.perf_counter()
            step()
            devices.synchronize(device)
            first = time.perf_counter() - start
            res = time_fn(step, repeats=steps, warmup=warmup, device=device)
    except Exception as exc:  # any backend failure becomes a row with its reason
        return CompileOutcome(name, mode or "default", False, error=_short(exc))
    finally:
        torch._dynamo.reset()
        inductor_config.force_disable_caches = caches
        hint_logger.removeHandler(hints)
        hint_logger.propagate = propagate
    note = ""
    if any("skipping cudagraphs" in m for m in hints.messages):
        reason = next(m for m in hints.messages if "skipping cudagraphs" in m).split(" due to ")[-1]
        note = f"cudagraphs not applied ({reason.split('.')[0].split('(')[0].strip()})"
    return CompileOutcome(name, mode or "default", True, first, res.stats, note=note)


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
    torch._dynamo.reset()
    out = torch._dynamo.explain(fn)(*args)
    torch._dynamo.reset()
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
