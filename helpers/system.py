"""Machine fingerprint and OpenMP / CPU-affinity settings computed from the topology.

Everything a measurement must be recorded with: CPU model, sockets, physical vs logical
cores (SMT siblings), NUMA nodes, instruction-set flags that decide fast bf16, the OpenMP
runtime(s) really loaded in this process (via threadpoolctl), and library versions.

It also turns the topology into settings: one logical CPU per physical core for
``GOMP_CPU_AFFINITY`` / ``KMP_AFFINITY`` proclists, and per-rank CPU sets for
distributed jobs -- computed, never hard-coded as "0-15".
"""

from __future__ import annotations

import os
import platform
import re
import sys
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

_SYS_CPU = Path("/sys/devices/system/cpu")


@dataclass(frozen=True)
class LogicalCPU:
    """One logical CPU (hardware thread) and the physical core and socket it belongs to."""

    cpu: int
    core: int
    socket: int


@dataclass(frozen=True)
class Topology:
    """The CPUs this process may run on, grouped into physical cores."""

    cpus: tuple[LogicalCPU, ...]
    numa_nodes: int = 1
    model: str = "unknown"
    flags: frozenset[str] = field(default_factory=frozenset)

    @property
    def logical_cores(self) -> int:
        return len(self.cpus)

    @property
    def physical_cores(self) -> int:
        return len({(c.socket, c.core) for c in self.cpus})

    @property
    def sockets(self) -> int:
        return len({c.socket for c in self.cpus})

    @property
    def threads_per_core(self) -> int:
        return max(1, self.logical_cores // max(1, self.physical_cores))

    def one_cpu_per_core(self) -> list[int]:
        """The first logical CPU of every physical core, ordered by socket then core."""
        first: dict[tuple[int, int], int] = {}
        for c in sorted(self.cpus, key=lambda c: (c.socket, c.core, c.cpu)):
            first.setdefault((c.socket, c.core), c.cpu)
        return list(first.values())

    def smt_siblings(self) -> list[list[int]]:
        """Logical CPUs grouped by physical core (each inner list shares one core)."""
        groups: dict[tuple[int, int], list[int]] = {}
        for c in sorted(self.cpus, key=lambda c: (c.socket, c.core, c.cpu)):
            groups.setdefault((c.socket, c.core), []).append(c.cpu)
        return list(groups.values())


def _read_int(path: Path, default: int = 0) -> int:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return default


def _cpuinfo() -> tuple[str, frozenset[str]]:
    model, flags = platform.processor() or "unknown", frozenset()
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return model, flags
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "model name" and model in ("unknown", "", platform.machine()):
            model = value.strip()
        elif key == "flags" and not flags:
            flags = frozenset(value.split())
    return model, flags


def topology(sys_cpu: Path = _SYS_CPU) -> Topology:
    """Read the CPU topology of the CPUs this process is allowed to use (Linux sysfs).

    Falls back to psutil's counts (assuming no SMT information) on other systems.
    """
    try:
        allowed = sorted(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        allowed = list(range(os.cpu_count() or 1))
    cpus = []
    for cpu in allowed:
        topo = sys_cpu / f"cpu{cpu}" / "topology"
        core = _read_int(topo / "core_id", default=cpu)
        socket = _read_int(topo / "physical_package_id", default=0)
        cpus.append(LogicalCPU(cpu=cpu, core=core, socket=socket))
    if not (sys_cpu / "cpu0" / "topology").exists():
        import psutil

        physical = psutil.cpu_count(logical=False) or len(allowed)
        per_core = max(1, len(allowed) // physical)
        cpus = [LogicalCPU(cpu=c, core=i // per_core, socket=0) for i, c in enumerate(allowed)]
    nodes = len(list((sys_cpu.parent / "node").glob("node[0-9]*"))) or 1
    model, flags = _cpuinfo()
    return Topology(cpus=tuple(cpus), numa_nodes=nodes, model=model, flags=flags)


def cpu_bf16_support(flags: frozenset[str] | None = None) -> dict[str, bool]:
    """Which bf16 features the CPU has.

    ``native_bf16`` (AVX512_BF16 or AMX) means bf16 math is fast; ``ipex_bf16_prepack``
    (AVX-512 BW/VL/DQ or AVX-NE-CONVERT) is what IPEX's bf16 weight prepacking asserts.
    Without either, bf16 autocast still runs but is emulated and usually slower than fp32.
    """
    flags = topology().flags if flags is None else flags
    avx512 = {"avx512bw", "avx512vl", "avx512dq"} <= flags
    return {
        "native_bf16": bool({"avx512_bf16", "amx_bf16"} & flags),
        "amx": "amx_bf16" in flags,
        "ipex_bf16_prepack": avx512 or "avx_ne_convert" in flags,
        "avx2": "avx2" in flags,
        "avx512": "avx512f" in flags,
    }


def openmp_runtimes() -> list[dict[str, str]]:
    """OpenMP runtimes loaded into this process (GNU libgomp, Intel libiomp5, LLVM libomp).

    Several can be loaded at once (torch links libgomp; LD_PRELOAD may add libiomp5), so
    this list shows what is present, not which one serves torch's parallel regions.
    """
    from threadpoolctl import threadpool_info

    import torch  # noqa: F401  -- make sure torch's runtime is loaded before we look

    seen = []
    for info in threadpool_info():
        if info.get("user_api") == "openmp":
            seen.append({
                "library": Path(info.get("filepath", "")).name,
                "internal_api": str(info.get("internal_api", "")),
                "version": str(info.get("version") or ""),
                "num_threads": str(info.get("num_threads", "")),
            })
    return seen


def intel_openmp_library() -> Path | None:
    """Path of Intel's libiomp5.so installed by the ``intel-openmp`` wheel, if present."""
    for prefix in {sys.prefix, sys.base_prefix}:
        candidate = Path(prefix) / "lib" / "libiomp5.so"
        if candidate.exists():
            return candidate
    return None


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "not installed"


def library_versions() -> dict[str, str]:
    """Versions of the libraries that decide performance, read without importing IPEX/NNI."""
    import torch

    versions = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torchvision": _version("torchvision"),
        "intel-extension-for-pytorch": _version("intel-extension-for-pytorch"),
        "nni": _version("nni"),
        "torch-pruning": _version("torch-pruning"),
        "cuda": str(torch.version.cuda),
        "mkldnn": str(torch.backends.mkldnn.is_available()),
    }
    versions.update(build_versions(torch.__config__.show()))
    return versions


_MKL_LINE = re.compile(r"Math Kernel Library Version\s+(\d[\w.]*)")
_ONEDNN_LINE = re.compile(r"(?:MKL-DNN|oneDNN)\s+v?(\d+(?:\.\d+)+)")


def build_versions(config: str) -> dict[str, str]:
    """MKL and oneDNN versions from ``torch.__config__.show()`` text, e.g.
    ``{"mkl": "2024.2", "onednn": "3.7.1"}``; a library the text does not name is left out."""
    found = {}
    for line in config.splitlines():
        if "mkl" not in found and (m := _MKL_LINE.search(line)):
            found["mkl"] = m.group(1)
        elif "onednn" not in found and (m := _ONEDNN_LINE.search(line)):
            found["onednn"] = m.group(1)
    return found


def fingerprint() -> dict[str, object]:
    """Everything a result must be stored with: hardware, topology, runtimes, versions."""
    import torch

    topo = topology()
    gpus = []
    if torch.cuda.is_available():
        gpus = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    elif hasattr(torch, "xpu") and torch.xpu.is_available():
        gpus = [torch.xpu.get_device_name(i) for i in range(torch.xpu.device_count())]
    return {
        "cpu_model": topo.model,
        "sockets": topo.sockets,
        "physical_cores": topo.physical_cores,
        "logical_cores": topo.logical_cores,
        "threads_per_core": topo.threads_per_core,
        "numa_nodes": topo.numa_nodes,
        "bf16": cpu_bf16_support(topo.flags),
        "torch_threads": torch.get_num_threads(),
        "openmp": [rt["library"] for rt in openmp_runtimes()],
        "accelerators": gpus,
        "os": f"{platform.system()} {platform.release()}",
        "versions": library_versions(),
    }


def env_report() -> str:
    """One line describing the machine, for the first cell of every notebook."""
    import torch

    topo = topology()
    accel = "no GPU"
    if torch.cuda.is_available():
        accel = f"{torch.cuda.device_count()}x {torch.cuda.get_device_name(0)}"
    elif hasattr(torch, "xpu") and torch.xpu.is_available():
        accel = f"{torch.xpu.device_count()}x {torch.xpu.get_device_name(0)}"
    return (
        f"torch {torch.__version__} | {topo.model} | {topo.physical_cores} physical / "
        f"{topo.logical_cores} logical cores | {torch.get_num_threads()} torch threads | {accel}"
    )


def gomp_cpu_affinity(cpus: list[int]) -> str:
    """Value for GNU OpenMP's ``GOMP_CPU_AFFINITY``: thread i is bound to cpus[i]."""
    if not cpus:
        raise ValueError("gomp_cpu_affinity needs at least one CPU")
    return " ".join(str(c) for c in cpus)


def kmp_affinity(cpus: list[int]) -> str:
    """Value for Intel OpenMP's ``KMP_AFFINITY`` binding thread i to cpus[i]."""
    if not cpus:
        raise ValueError("kmp_affinity needs at least one CPU")
    return f"granularity=fine,proclist=[{','.join(str(c) for c in cpus)}],explicit"


OPENMP_VARIANTS: tuple[str, ...] = ("gnu-default", "gnu-bound", "intel")


def openmp_env(variant: str, threads: int, topo: Topology | None = None) -> dict[str, str]:
    """Environment variables for one OpenMP variant, for a *fresh* process.

    * ``gnu-default``: only OMP_NUM_THREADS (the runtime places threads as it likes);
    * ``gnu-bound``: GNU OpenMP with threads bound one per physical core
      (OMP_PROC_BIND, GOMP_CPU_AFFINITY from the topology). The book also set
      OMP_SCHEDULE=STATIC; it is left out because it only sets the schedule of loops declared
      ``schedule(runtime)``, and PyTorch's own parallel loops split their range by thread
      number themselves (ATen/ParallelOpenMP.h), so it changes nothing for them;
    * ``intel``: Intel's libiomp5 through LD_PRELOAD, KMP_AFFINITY proclist, KMP_BLOCKTIME=0.

    OpenMP reads these once at start-up, so they only take effect in a new process.
    """
    topo = topo or topology()
    if variant not in OPENMP_VARIANTS:
        raise ValueError(f"Unknown OpenMP variant {variant!r}; use one of {', '.join(OPENMP_VARIANTS)}.")
    if threads < 1:
        raise ValueError("threads must be at least 1")
    cores = topo.one_cpu_per_core()
    siblings = [cpu for group in topo.smt_siblings() for cpu in group[1:]]
    cpus = (cores + siblings)[:threads]
    if threads > len(cpus):
        raise ValueError(
            f"{threads} threads requested but only {len(cpus)} logical CPUs are available to this process."
        )
    env = {"OMP_NUM_THREADS": str(threads)}
    if variant == "gnu-bound":
        env.update({"OMP_PROC_BIND": "TRUE", "GOMP_CPU_AFFINITY": gomp_cpu_affinity(cpus)})
    elif variant == "intel":
        lib = intel_openmp_library()
        if lib is None:
            raise RuntimeError(
                "Intel OpenMP (libiomp5.so) is not installed in this environment. "
                "Install it with `pip install intel-openmp` (Linux x86_64 only)."
            )
        env.update({
            "LD_PRELOAD": str(lib),
            "KMP_AFFINITY": kmp_affinity(cpus),
            "KMP_BLOCKTIME": "0",
        })
    return env


# The probe child: the course's child-process protocol (helpers.children) on a copy of the real
# stdout, with the C-level stdout sent to stderr, so that what the OpenMP runtimes print (GNU's
# settings at load, Intel's at its first parallel region, the per-thread affinity lines of
# OMP_DISPLAY_AFFINITY, which Intel's runtime writes to stdout) all lands in the child's stderr.
_PROBE = ("import os; protocol = os.fdopen(os.dup(1), 'w'); os.dup2(2, 1); "
          "from helpers.system import _serve_probe; _serve_probe(protocol)")


def _serve_probe(protocol: object) -> None:
    """The probe child: import torch, then run a few parallel operators per request."""
    import ctypes

    from .children import serve
    from .startup import exit_without_collection, import_frozen

    import_frozen("torch")  # starts sooner (see helpers.startup)
    import torch

    def handle(request: dict[str, object]) -> dict[str, object]:
        x = torch.ones(512, 512)
        for _ in range(3):
            torch.relu(x @ x).sum()
        ctypes.CDLL(None).fflush(None)  # the runtimes' buffered C stdio reaches stderr now
        return {"torch_threads": torch.get_num_threads()}

    serve(handle, stdout=protocol)
    exit_without_collection()


def _display_blocks(text: str) -> list[list[str]]:
    blocks, current = [], None
    for line in text.splitlines():
        if "OPENMP DISPLAY ENVIRONMENT BEGIN" in line:
            current = []
        elif "OPENMP DISPLAY ENVIRONMENT END" in line:
            if current is not None:
                blocks.append(current)
            current = None
        elif current is not None:
            current.append(line.strip())
    return blocks


def _settings(lines: list[str]) -> dict[str, str]:
    out = {}
    for line in lines:
        line = line.removeprefix("[host]").strip()
        for sep in (" = ", "="):
            key, found, value = line.partition(sep)
            if found and key.strip().lstrip("_").replace("_", "").isalnum() and key.strip().isupper():
                out.setdefault(key.strip(), value.strip().strip("'"))
                break
    return out


_GNU_AFFINITY = re.compile(r"^level \d+ thread \S+ affinity (\S+)$")
_INTEL_AFFINITY = re.compile(r"^OMP: pid \d+ tid \d+ thread (\d+) bound to OS proc set \{([^}]*)\}$")


def parse_openmp_display(text: str) -> dict[str, object]:
    """What the OpenMP runtimes printed under OMP_DISPLAY_ENV=VERBOSE and OMP_DISPLAY_AFFINITY=TRUE.

    GNU libgomp prints its settings when it is loaded (torch always loads it) as ``KEY = 'value'``;
    Intel's libiomp5 prints its own (``[host] KEY='value'``) only when it initialises, i.e. when it
    really runs a parallel region. Each runtime that runs a parallel region prints one affinity
    line per thread: the CPUs the thread is allowed on, as the runtime applied its binding.
    Returns ``served_by``, ``intel_initialised``, ``gnu_loaded``, ``gnu_settings``,
    ``intel_settings``, ``settings`` (those of the runtime that served), ``bound_to`` (one CPU
    set per thread as the runtime printed it, e.g. ``["0", "1"]``, ``["0-1", "0-1"]`` or
    ``["0,1", "0,1"]``) and ``binding`` (one line, from ``binding_summary``).
    """
    gnu, intel = {}, {}
    for block in _display_blocks(text):
        if any(line.startswith("[host]") for line in block):
            intel = _settings(block)
        else:
            gnu = _settings(block)
    bound: dict[int, str] = {}
    gnu_threads: list[str] = []
    for line in text.splitlines():
        line = line.strip()
        if m := _INTEL_AFFINITY.match(line):
            bound.setdefault(int(m.group(1)), m.group(2))
        elif m := _GNU_AFFINITY.match(line):
            gnu_threads.append(m.group(1))
    bound_to = [bound[i] for i in sorted(bound)] if bound else gnu_threads
    served = "Intel OpenMP (libiomp5)" if intel else "GNU OpenMP (libgomp)" if gnu else "unknown"
    return {"served_by": served, "intel_initialised": bool(intel), "gnu_loaded": bool(gnu),
            "gnu_settings": gnu, "intel_settings": intel, "settings": intel or gnu,
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
    """Which OpenMP runtime serves torch's parallel regions, and how it bound its threads, in a
    new process per entry of ``envs`` (name -> extra environment variables), keyed the same way.

    Each process runs with OMP_DISPLAY_ENV=VERBOSE and OMP_DISPLAY_AFFINITY=TRUE and computes a
    few parallel operators; ``parse_openmp_display`` reads what the runtimes printed. A probe
    times nothing, so the processes start side by side (``helpers.children``).
    """
    from .children import Children

    if not envs:
        return {}
    shown = {"OMP_DISPLAY_ENV": "VERBOSE", "OMP_DISPLAY_AFFINITY": "TRUE"}
    commands = {name: ([sys.executable, "-c", _PROBE], {**(env or {}), **shown}) for name, env in envs.items()}
    out = {}
    with Children(commands, startup_timeout=timeout) as kids:
        for name in envs:
            threads = kids.ask(name, {}, timeout=timeout)["torch_threads"]
            out[name] = {**parse_openmp_display(kids.stderr(name)), "torch_threads": threads}
    return out


def openmp_in_fresh_process(env: dict[str, str] | None = None, timeout: float = 120) -> dict[str, object]:
    """``openmp_in_fresh_processes`` for one environment (see there)."""
    return openmp_in_fresh_processes({"probe": env}, timeout)["probe"]
