"""The machine a result was measured on: CPU topology, OpenMP runtimes, versions, ``fingerprint``, ``env_report``."""

from __future__ import annotations

import contextlib
import hashlib
import os
import platform
import re
import secrets
import socket
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

from .files import atomic_write_text

_SYS_CPU = Path("/sys/devices/system/cpu")
_BUILD_LINES = {"mkl": re.compile(r"Math Kernel Library Version\s+(\d[\w.]*)"),
                "onednn": re.compile(r"(?:MKL-DNN|oneDNN)\s+v?(\d+(?:\.\d+)+)")}


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
        return [group[0] for group in self.smt_siblings()]

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
    """The CPUs this process may use, from Linux sysfs (elsewhere psutil's counts, without SMT siblings)."""
    try:
        allowed = sorted(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        allowed = list(range(os.cpu_count() or 1))
    if (sys_cpu / "cpu0" / "topology").exists():
        cpus = [LogicalCPU(cpu, _read_int(sys_cpu / f"cpu{cpu}/topology/core_id", default=cpu),
                           _read_int(sys_cpu / f"cpu{cpu}/topology/physical_package_id")) for cpu in allowed]
    else:
        import psutil

        physical = psutil.cpu_count(logical=False) or len(allowed)
        per_core = max(1, len(allowed) // physical)
        cpus = [LogicalCPU(cpu=c, core=i // per_core, socket=0) for i, c in enumerate(allowed)]
    nodes = len(list((sys_cpu.parent / "node").glob("node[0-9]*"))) or 1
    model, flags = _cpuinfo()
    return Topology(cpus=tuple(cpus), numa_nodes=nodes, model=model, flags=flags)


def cpu_bf16_support(flags: frozenset[str] | None = None) -> dict[str, bool]:
    """The CPU's bf16 features: ``native_bf16`` (AVX512_BF16 or AMX), ``amx``, ``ipex_bf16_prepack`` (AVX-512), ..."""
    flags = topology().flags if flags is None else flags
    avx512 = {"avx512bw", "avx512vl", "avx512dq"} <= flags
    return {"native_bf16": bool({"avx512_bf16", "amx_bf16"} & flags), "amx": "amx_bf16" in flags,
            "ipex_bf16_prepack": avx512 or "avx_ne_convert" in flags, "avx2": "avx2" in flags,
            "avx512": "avx512f" in flags}


def openmp_runtimes() -> list[dict[str, str]]:
    """OpenMP runtimes loaded into this process (several can be: torch links libgomp, LD_PRELOAD may add libiomp5)."""
    from threadpoolctl import threadpool_info

    import torch  # noqa: F401  -- make sure torch's runtime is loaded before we look

    return [{"library": Path(info.get("filepath", "")).name, "internal_api": str(info.get("internal_api", "")),
             "version": str(info.get("version") or ""), "num_threads": str(info.get("num_threads", ""))}
            for info in threadpool_info() if info.get("user_api") == "openmp"]


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "not installed"


def library_versions() -> dict[str, str]:
    """Versions of the libraries that decide performance, read without importing IPEX/NNI."""
    import torch

    return {"python": platform.python_version(), "torch": torch.__version__,
            **{dist: _version(dist) for dist in ("torchvision", "intel-extension-for-pytorch", "nni", "torch-pruning")},
            "cuda": str(torch.version.cuda), "mkldnn": str(torch.backends.mkldnn.is_available()),
            **build_versions(torch.__config__.show())}


def build_versions(config: str) -> dict[str, str]:
    """MKL and oneDNN versions in ``torch.__config__.show()`` text, e.g. ``{"mkl": "2024.2", "onednn": "3.7.1"}``."""
    found = {key: _BUILD_LINES[key].search(config) for key in _BUILD_LINES}
    return {key: match.group(1) for key, match in found.items() if match}


DIST_NAME = "accelerate-course-helpers"
SYS_PLATFORMS: dict[str, str] = {"Linux": "linux", "Darwin": "darwin", "Windows": "win32"}
PLATFORM_LABELS: dict[tuple[str, str], str] = {
    ("Linux", "x86_64"): "Linux x86-64", ("Linux", "aarch64"): "Linux aarch64", ("Linux", "arm64"): "Linux aarch64",
    ("Darwin", "arm64"): "macOS arm64", ("Windows", "AMD64"): "Windows x86-64", ("Windows", "x86_64"): "Windows x86-64",
}


def platform_label(plat: dict[str, object]) -> str:
    """'Linux x86-64', 'Linux aarch64', 'macOS arm64', 'Windows x86-64', else 'SYSTEM MACHINE'."""
    system, machine = str(plat.get("system", "")), str(plat.get("machine", ""))
    return PLATFORM_LABELS.get((system, machine), f"{system} {machine}".strip() or "unknown platform")


def left_out_pins(system: str | None = None, machine: str | None = None, dist: str = DIST_NAME) -> list[str]:
    """The course's pins whose environment markers leave them out on this (or that) platform; extras not counted."""
    from packaging.markers import default_environment
    from packaging.requirements import Requirement

    try:
        reqs = metadata.requires(dist) or []
    except metadata.PackageNotFoundError:
        return []
    system, machine = system or platform.system(), machine or platform.machine()
    env = {**default_environment(), "platform_system": system, "platform_machine": machine, "extra": "",
           "sys_platform": SYS_PLATFORMS.get(system, system.lower()),
           "os_name": "nt" if system == "Windows" else "posix"}
    return sorted({r.name for r in map(Requirement, reqs)
                   if r.marker is not None and "extra" not in str(r.marker) and not r.marker.evaluate(env)})


def _accelerators() -> list[str]:
    import torch

    for kind in ("cuda", "xpu"):
        module = getattr(torch, kind, None)
        if module is not None and module.is_available():
            return [module.get_device_name(i) for i in range(module.device_count())]
    return []


def fingerprint() -> dict[str, object]:
    """Everything a result must be stored with: hardware, topology, runtimes, versions."""
    import torch

    topo = topology()
    return {"cpu_model": topo.model, "sockets": topo.sockets, "physical_cores": topo.physical_cores,
            "logical_cores": topo.logical_cores, "threads_per_core": topo.threads_per_core,
            "numa_nodes": topo.numa_nodes, "bf16": cpu_bf16_support(topo.flags),
            "torch_threads": torch.get_num_threads(),
            "openmp": [rt["library"] for rt in openmp_runtimes()], "accelerators": _accelerators(),
            "os": f"{platform.system()} {platform.release()}", "versions": library_versions()}


def env_report() -> str:
    """One line describing the machine, for the first cell of every notebook."""
    import torch

    topo, gpus = topology(), _accelerators()
    accel = f"{len(gpus)}x {gpus[0]}" if gpus else "no GPU"
    return (
        f"torch {torch.__version__} | {topo.model} | {topo.physical_cores} physical / "
        f"{topo.logical_cores} logical cores | {torch.get_num_threads()} torch threads | {accel}"
    )


def cache_dir() -> Path:
    """The course's per-user cache folder (``~/.cache/accelerate-course``), as the Makefile uses."""
    return Path.home() / ".cache" / "accelerate-course"


def _machine_identity() -> str:
    for source in ("/etc/machine-id", "/var/lib/dbus/machine-id"):
        with contextlib.suppress(OSError):
            if text := Path(source).read_text().strip():
                return text
    import uuid

    return str(uuid.getnode())  # the network hardware address, where there is no machine-id


def machine_id(cache: Path | str | None = None) -> str:
    """A short hash naming this machine privately: ``sha256(salt | machine-id | host name)``, salt kept in ``cache``."""
    salt_file = (Path(cache) if cache is not None else cache_dir()) / "machine-salt"
    try:
        salt = salt_file.read_text().strip()
    except OSError:
        salt = ""
    if not salt:
        salt = secrets.token_hex(16)
        with contextlib.suppress(OSError):  # a read-only home: the id still works for this process
            atomic_write_text(salt_file, salt + "\n")
    digest = hashlib.sha256(f"{salt}|{_machine_identity()}|{socket.gethostname()}".encode()).hexdigest()
    return digest[:16]
