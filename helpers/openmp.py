"""OpenMP on the CPU (chapters 02 and 04): each runtime variant's settings computed from the topology
(``openmp_env``), and which runtime served torch and how it bound its threads, read in fresh processes
(``openmp_in_fresh_processes``; ``python -m helpers.openmp`` is that probe's worker)."""

from __future__ import annotations

import re
import sys

if __name__ == "__main__":  # the probe's worker process (helpers.processes); what the runtimes print goes to stderr
    from .processes import worker_main

    worker_main("helpers.openmp", quiet_stdout=True)

from pathlib import Path  # noqa: E402
from typing import Any, Callable  # noqa: E402

from .processes import Children  # noqa: E402
from .system import Topology, openmp_runtimes, topology  # noqa: E402,F401  (openmp_runtimes: for the chapters)

OPENMP_VARIANTS: tuple[str, ...] = ("gnu-default", "gnu-bound", "intel")
_PROBE: tuple[str, ...] = ("-m", "helpers.openmp")
_GNU_AFFINITY = re.compile(r"^level \d+ thread \S+ affinity (\S+)$")
_INTEL_AFFINITY = re.compile(r"^OMP: pid \d+ tid \d+ thread (\d+) bound to OS proc set \{([^}]*)\}$")
_SETTING = re.compile(r"^(?:\[host\])?\s*(_?[A-Z][A-Z0-9_]*)\s*=\s*'?(.*?)'?$")  # GNU: KEY = 'v'; Intel: [host] KEY='v'


def intel_openmp_library() -> Path | None:
    """Path of Intel's libiomp5.so installed by the ``intel-openmp`` wheel, if present."""
    for prefix in {sys.prefix, sys.base_prefix}:
        candidate = Path(prefix) / "lib" / "libiomp5.so"
        if candidate.exists():
            return candidate
    return None


def kmp_affinity(cpus: list[int]) -> str:
    """Value for Intel OpenMP's ``KMP_AFFINITY`` binding thread i to cpus[i]."""
    return f"granularity=fine,proclist=[{','.join(str(c) for c in cpus)}],explicit"


def openmp_env(variant: str, threads: int, topo: Topology | None = None) -> dict[str, str]:
    """Environment variables of one OpenMP variant for a *fresh* process (runtimes read them at start-up):
    ``gnu-default`` only OMP_NUM_THREADS; ``gnu-bound`` libgomp with one thread per physical core
    (OMP_PROC_BIND, GOMP_CPU_AFFINITY); ``intel`` libiomp5 by LD_PRELOAD, KMP_AFFINITY, KMP_BLOCKTIME=0."""
    topo = topo or topology()
    if variant not in OPENMP_VARIANTS:
        raise ValueError(f"Unknown OpenMP variant {variant!r}; use one of {', '.join(OPENMP_VARIANTS)}.")
    if threads < 1:
        raise ValueError("threads must be at least 1")
    cores = topo.one_cpu_per_core()
    siblings = [cpu for group in topo.smt_siblings() for cpu in group[1:]]
    cpus = (cores + siblings)[:threads]
    if threads > len(cpus):
        raise ValueError(f"{threads} threads requested but only {len(cpus)} logical CPUs are "
                         "available to this process.")
    env = {"OMP_NUM_THREADS": str(threads)}
    if variant == "gnu-bound":
        env.update({"OMP_PROC_BIND": "TRUE", "GOMP_CPU_AFFINITY": " ".join(str(c) for c in cpus)})
    elif variant == "intel":
        lib = intel_openmp_library()
        if lib is None:
            raise RuntimeError("Intel OpenMP (libiomp5.so) is not installed in this environment. "
                               "Install it with `pip install intel-openmp` (Linux x86_64 only).")
        env.update({"LD_PRELOAD": str(lib), "KMP_AFFINITY": kmp_affinity(cpus), "KMP_BLOCKTIME": "0"})
    return env


def worker(argv: list[str]) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """The probe's handler: a few parallel operators per request, the runtimes' C stdio flushed to stderr."""
    import ctypes

    import torch

    def handle(request: dict[str, Any]) -> dict[str, Any]:
        x = torch.ones(512, 512)
        for _ in range(3):
            torch.relu(x @ x).sum()
        ctypes.CDLL(None).fflush(None)
        return {"torch_threads": torch.get_num_threads()}

    return handle


def _settings(lines: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for m in filter(None, map(_SETTING.match, lines)):
        out.setdefault(m[1], m[2])
    return out


def parse_openmp_display(text: str) -> dict[str, object]:
    """What the runtimes printed under OMP_DISPLAY_ENV=VERBOSE and OMP_DISPLAY_AFFINITY=TRUE: ``served_by``,
    ``intel_initialised``, ``gnu_settings``, ``settings`` (the serving runtime's), ``bound_to`` (each thread's CPU
    set as printed, e.g. ``["0", "1"]``) and ``binding`` (one line)."""
    gnu, intel, block = {}, {}, None
    bound: dict[int, str] = {}
    gnu_threads: list[str] = []
    for line in map(str.strip, text.splitlines()):  # GNU prints its block when loaded, Intel when it runs
        if m := _INTEL_AFFINITY.match(line):
            bound.setdefault(int(m.group(1)), m.group(2))
        elif m := _GNU_AFFINITY.match(line):
            gnu_threads.append(m.group(1))
        elif "OPENMP DISPLAY ENVIRONMENT BEGIN" in line:
            block = []
        elif "OPENMP DISPLAY ENVIRONMENT END" in line and block is not None:
            if any(ln.startswith("[host]") for ln in block):
                intel = _settings(block)
            else:
                gnu = _settings(block)
            block = None
        elif block is not None:
            block.append(line)
    bound_to = [bound[i] for i in sorted(bound)] if bound else gnu_threads
    served = "Intel OpenMP (libiomp5)" if intel else "GNU OpenMP (libgomp)" if gnu else "unknown"
    return {"served_by": served, "intel_initialised": bool(intel), "gnu_settings": gnu, "settings": intel or gnu,
            "bound_to": bound_to, "binding": binding_summary(bound_to)}


def binding_summary(bound_to: list[str]) -> str:
    """One line for the per-thread CPU sets a runtime reported: pinned one CPU each, or not."""
    if not bound_to:  # PyTorch runs a one-thread team's work without opening a parallel region
        return "not reported (no parallel region with more than one thread ran)"
    single = all(re.fullmatch(r"\d+", cpus.strip()) for cpus in bound_to)
    if single and len(set(bound_to)) == len(bound_to):
        return "pinned, one CPU each: " + ", ".join(f"thread {i} on {c}" for i, c in enumerate(bound_to))
    if len(set(bound_to)) == 1:
        return f"not pinned: every thread may run on CPUs {bound_to[0]}"
    return "; ".join(f"thread {i} on {c}" for i, c in enumerate(bound_to))


def openmp_in_fresh_processes(envs: dict[str, dict[str, str] | None], timeout: float = 120) -> dict[str, dict[str, object]]:
    """``parse_openmp_display`` plus ``torch_threads`` of a new process per entry of ``envs`` (name -> extra
    environment), started side by side (a probe times nothing), keyed the same way."""
    if not envs:
        return {}
    shown = {"OMP_DISPLAY_ENV": "VERBOSE", "OMP_DISPLAY_AFFINITY": "TRUE"}
    commands = {name: ([sys.executable, *_PROBE], {**(env or {}), **shown}) for name, env in envs.items()}
    out = {}
    with Children(commands, startup_timeout=timeout) as kids:
        for name in envs:
            threads = kids.ask(name, {}, timeout=timeout)["torch_threads"]
            out[name] = {**parse_openmp_display(kids.stderr(name)), "torch_threads": threads}
    return out
