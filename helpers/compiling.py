"""torch.compile made measurable: a cold compile per instance, the first steps of a new process (``first_steps``
starts ``python -m helpers.compiling first-steps``), graph breaks, own time per operator, the kernels Inductor
generated, and the step count after which compiling pays back. Importing it changes nothing.
"""

from __future__ import annotations

import collections
import contextlib
import hashlib
import io
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence
from unittest import mock

import torch
from torch import nn

from . import devices
from .seeds import set_seed
from .step import train_step
from .tables import Table


@contextlib.contextmanager
def cold_compile() -> Iterator[str]:
    """Inside the block ``torch.compile`` starts from nothing, as in a new process (yields its empty cache folder)."""
    from torch._inductor.utils import clear_caches

    torch.compiler.reset()
    clear_caches()
    with tempfile.TemporaryDirectory(prefix="inductor-cold-") as cache, mock.patch.dict(
            os.environ, TORCHINDUCTOR_CACHE_DIR=cache, TRITON_CACHE_DIR=os.path.join(cache, "triton")):
        try:
            yield cache
        finally:
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
    """One arm's turn for ``measure.interleaved``: ``new_step()`` builds a new instance (inside ``cold_compile`` when
    ``cold``); its first step timed apart, ``warmup`` untimed, ``steps`` timed -> ``(s per step, {"first step s"})``."""
    def run() -> tuple[float, dict[str, float]]:
        with cold_compile() if cold else contextlib.nullcontext():
            with contextlib.redirect_stderr(io.StringIO()):
                step = new_step()
                first = timed(step, 1, device)
                timed(step, warmup, device)
            return timed(step, steps, device) / steps, {"first step s": first}
    return run


def recompile_reasons(log: str) -> list[str]:
    """The first failed guard of each recompile in a ``TORCH_LOGS=recompiles`` log, e.g. "16 <= x.size()[0]"."""
    lines = log.splitlines()
    return [nxt.split("- 0/", 1)[1].split(":", 1)[1].split("#")[0].strip()
            for line, nxt in zip(lines, lines[1:]) if "triggered by" in line and "- 0/" in nxt]


FIRST_STEPS = ("first step s", "later step s", "first at last batch s", "later at last batch s",
               "full batch after recompile s", "compile s", "recompile s")


def first_steps(mode: str, *, device: torch.device | str = "cpu", batch: int = 64, last: int = 32,
                cache: str | None = None, fresh: bool = True) -> dict[str, float]:
    """The seconds named in ``FIRST_STEPS`` of a new process compiling the FashionMNIST book CNN with ``mode``
    ("eager": none): first and best later steps at ``batch`` and at ``last`` (a recompile), then full ones.
    ``cache``: Inductor's folder (None: new and empty; ``fresh=False``: this environment's)."""
    env = dict(os.environ)
    with tempfile.TemporaryDirectory(prefix="inductor-first-") as scratch:
        if cache or fresh:
            folder = cache or scratch
            env.update(TORCHINDUCTOR_CACHE_DIR=folder, TRITON_CACHE_DIR=os.path.join(folder, "triton"))
        argv = [sys.executable, "-m", "helpers.compiling", "first-steps", mode, str(device), str(batch), str(last)]
        proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        raise RuntimeError(f"first_steps({mode!r}) failed:\n{proc.stderr[-2000:]}")
    first, later, first_last, later_last, after = (float(v) for v in proc.stdout.split()[-5:])
    return dict(zip(FIRST_STEPS, (first, later, first_last, later_last, after, max(0.0, first - later),
                                  max(0.0, first_last - later_last))))


def _first_steps_main(args: Sequence[str]) -> list[float]:
    from . import models

    mode, device, batch, last = args[0], torch.device(args[1]), int(args[2]), int(args[3])
    set_seed(0)
    model = models.book_cnn("fashionmnist").to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    if mode != "eager":
        model = torch.compile(model, mode=mode)

    def seconds(n: int) -> float:
        x, y = torch.randn(n, 1, 28, 28, device=device), torch.randint(0, 10, (n,), device=device)
        return timed(lambda: train_step(model, optimizer, nn.functional.cross_entropy, x, y, device_type=device.type),
                     1, device)

    return [seconds(batch), min(seconds(batch) for _ in range(3)), seconds(last),
            min(seconds(last) for _ in range(3)), min(seconds(batch) for _ in range(3))]


def new_training_step(build_model: Callable[[], nn.Module], inputs: torch.Tensor, targets: torch.Tensor, *,
                      backend: str | None = "inductor", mode: str | None = None,
                      device: torch.device | str = "cpu") -> Callable[[], torch.Tensor]:
    """A fresh model (seed 0) and Adam, compiled with ``backend`` (None: eager) and ``mode``: ``step()`` runs one
    training step on ``inputs``/``targets`` and returns the loss (compiles on the first call)."""
    set_seed(0)
    device = torch.device(device)
    model = build_model().to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    x, y = inputs.to(device), targets.to(device)
    if backend is not None:
        model = torch.compile(model, backend=backend, mode=mode)

    def step() -> torch.Tensor:
        return train_step(model, optimizer, nn.functional.cross_entropy, x, y, device_type=device.type).detach()

    return step


def try_backends(names: Sequence[str], one_step: Callable[[str], Any], *, skip: dict[str, str] | None = None,
                 title: str = "") -> tuple[Table, list[str]]:
    """Each backend tried with ``one_step(name)`` (``skip``: name -> reason not run): a table of statuses (the error's
    first line for a failure) and the names that worked."""
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
    reasons = [(str(getattr(r, "reason", r)).strip().splitlines() or [""])[0] for r in out.break_reasons]
    return {"graphs": out.graph_count, "breaks": out.graph_break_count, "reasons": reasons,
            "ops_per_graph": [len(ops) for ops in out.ops_per_graph]}


def payback_text(verdict: Any, eager_step_s: float, compile_s: float, recompile_s: float,
                 steps_per_epoch: int) -> str | None:
    """"after about N steps (E epochs)" when ``verdict`` (compiled vs eager) says faster, else None: steps until the
    savings repay ``compile_s``, and ``recompile_s`` too unless they had already by the epoch's last batch."""
    if not verdict.won or verdict.ratio <= 1:
        return None
    saved = eager_step_s * (1 - 1 / verdict.ratio)
    n = (compile_s + recompile_s) / saved
    if n < steps_per_epoch:  # ahead by the recompile at the last batch: the first crossing holds
        n = compile_s / saved
    steps, epochs = (float(f"{v:.2g}") for v in (n, n / steps_per_epoch))  # two significant digits
    return f"after about {steps:,.0f} steps ({epochs:g} epochs)"


_CALL = re.compile(r"\b(extern_kernels\.\w+|torch\.ops\.aten\.\w+)(?:\.default)?\(")


@dataclass(frozen=True)
class GeneratedCode:
    """What Inductor wrote into one cache folder: hashes of its C++ kernels, and its wrappers' library calls counted."""

    kernels: frozenset[str] = frozenset()
    library_calls: dict[str, int] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.kernels or self.library_calls)

    def same_as(self, other: "GeneratedCode") -> bool:
        """The same C++ kernels (byte for byte) and the same library calls."""
        return self.kernels == other.kernels and self.library_calls == other.library_calls


def generated_code(cache_dir: str | Path) -> GeneratedCode:
    """What Inductor generated into ``cache_dir`` (files, not an API: another layout gives an empty, falsy result)."""
    root = Path(cache_dir)
    kernels = frozenset(hashlib.sha256(f.read_bytes()).hexdigest() for f in sorted(root.rglob("*.cpp")))
    calls: collections.Counter[str] = collections.Counter()
    for f in sorted(root.glob("*/*.py")):  # output code: <cache>/<2 chars>/<hash>.py
        for line in f.read_text(errors="replace").splitlines():
            if not line.lstrip().startswith("#"):
                calls.update(_CALL.findall(line))
    return GeneratedCode(kernels, dict(sorted(calls.items())))


def self_ms_per_step(prof: "torch.profiler.profile", steps: int) -> dict[str, float]:
    """Each profiled event's own (self) CPU time in ms per step, from a profile of ``steps`` steps."""
    return {e.key: e.self_cpu_time_total / 1000.0 / steps for e in prof.key_averages()
            if not e.key.startswith("ProfilerStep")}


if __name__ == "__main__":  # python -m helpers.compiling first-steps MODE DEVICE BATCH LAST
    if len(sys.argv) != 6 or sys.argv[1] != "first-steps":
        sys.exit("usage: python -m helpers.compiling first-steps MODE DEVICE BATCH LAST")
    import logging

    logging.getLogger("torch.utils.cpp_extension").setLevel(logging.ERROR)  # "No CUDA runtime is found"
    print(*_first_steps_main(sys.argv[2:]))
