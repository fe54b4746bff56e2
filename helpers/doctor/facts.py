"""The doctor's facts: ``gather`` collects what this machine has -- Python, the pinned packages as
installed, the platform (and which pins its environment markers leave out there), the torch
build, devices, CPU and instruction sets, OpenMP, the C++ compiler and Python headers that
``torch.compile`` needs on the CPU, the IPEX environment (read from its package metadata by its
own Python: nothing here imports IPEX), NNI and Torch-Pruning (imported in a child process),
allocators, ``mpirun``, the Jupyter kernel, datasets, memory, disk, and a parity probe on every
accelerator -- as a dict of plain values that ``helpers.doctor.checks.judge`` turns into checks.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import socket
import subprocess
import sys
import sysconfig
import threading
import time
from importlib import metadata
from pathlib import Path
from typing import Any, Sequence

from ..children import Job, JobTimeout

DIST_NAME = "accelerate-course-helpers"
ALLOCATORS: dict[str, tuple[str, ...]] = {"jemalloc": ("libjemalloc.so",), "tcmalloc": ("libtcmalloc.so",
                                                                                      "libtcmalloc_minimal.so")}
DATASET_HOSTS: tuple[tuple[str, int], ...] = (("ossci-datasets.s3.amazonaws.com", 443), ("www.cs.toronto.edu", 443))
#: What the child process imports ({key: distribution}; the key is the module), each only where its pin
#: applies. Never IPEX: it lives in an environment of its own, and importing it next to another torch
#: minor version ends the process.
IMPORTS: dict[str, str] = {"nni": "nni", "torch_pruning": "torch-pruning"}
#: ``sys_platform`` for each ``platform.system()``, to evaluate the pins' markers for another platform.
SYS_PLATFORMS: dict[str, str] = {"Linux": "linux", "Darwin": "darwin", "Windows": "win32"}


def _installed(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def pinned_requirements(dist: str = DIST_NAME) -> list[dict[str, Any]]:
    """The course package's requirements (from its installed metadata) with what is installed."""
    from packaging.requirements import Requirement

    try:
        reqs = metadata.requires(dist) or []
    except metadata.PackageNotFoundError:
        return []
    pins = []
    for text in reqs:
        req = Requirement(text)
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        installed = _installed(req.name)
        pins.append({"name": req.name, "spec": str(req.specifier), "installed": installed,
                     "matches": installed is not None and (not req.specifier or installed in req.specifier)})
    return pins


def marker_environment(system: str | None = None, machine: str | None = None) -> dict[str, str]:
    """This Python's marker environment, with ``platform_system``/``platform_machine`` (and ``sys_platform``)
    replaced by ``system``/``machine`` when given -- how a pin's marker reads on another platform."""
    from packaging.markers import default_environment

    env = dict(default_environment())
    if system is not None:
        env["platform_system"] = system
        env["sys_platform"] = SYS_PLATFORMS.get(system, system.lower())
        env["os_name"] = "nt" if system == "Windows" else "posix"
    if machine is not None:
        env["platform_machine"] = machine
    return env


def left_out_pins(system: str | None = None, machine: str | None = None, dist: str = DIST_NAME) -> list[str]:
    """The course package's requirements whose environment markers leave them out on this platform
    (or on ``system``/``machine``), read from its installed metadata; extras are not counted."""
    from packaging.requirements import Requirement

    try:
        reqs = metadata.requires(dist) or []
    except metadata.PackageNotFoundError:
        return []
    env = marker_environment(system, machine)
    out = []
    for text in reqs:
        req = Requirement(text)
        if req.marker is None or "extra" in str(req.marker):  # an extra's requirement (e.g. pytest) is no pin
            continue
        if not req.marker.evaluate({**env, "extra": ""}):
            out.append(req.name)
    return sorted(set(out))


def platform_facts(system: str | None = None, machine: str | None = None) -> dict[str, Any]:
    """The platform: ``system`` and ``machine`` (as ``platform`` names them), the macOS release, whether
    this Linux is WSL, which pins are left out here (``left_out``) and whether IPEX has wheels here."""
    from .. import install

    system = system or platform.system()
    machine = machine or platform.machine()
    return {"system": system, "machine": machine,
            "macos": platform.mac_ver()[0] if system == "Darwin" else None,
            "wsl": system == "Linux" and "microsoft" in platform.release().lower(),
            "left_out": left_out_pins(system, machine),
            "ipex_wheels": install.ipex_supported(system, machine)}


def compiler_facts(env: dict[str, str] | None = None) -> dict[str, Any]:
    """The C++ compiler ``torch.compile`` would use on the CPU (``$CXX``, else ``g++`` or ``c++`` on PATH),
    whether its ``--version`` runs (``version``: its first line, or the error's), and whether this
    Python's headers (``Python.h``) are installed."""
    env = os.environ if env is None else env
    wanted = env.get("CXX") or None
    path = version = None
    runs = False
    if wanted:
        path = shutil.which(wanted.split()[0]) if wanted.split() else None
    else:
        path = shutil.which("g++") or shutil.which("c++")
    if path:  # macOS has /usr/bin/g++ and c++ even without a compiler: they fail until the tools are installed
        try:
            proc = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30)
            runs = proc.returncode == 0
            version = (proc.stdout.strip().splitlines() or [None])[0] if runs else \
                (proc.stderr.strip().splitlines() or [None])[0]
        except (OSError, subprocess.SubprocessError) as exc:
            version = f"{type(exc).__name__}: {exc}"
    include = sysconfig.get_paths()["include"]
    return {"cxx_env": wanted, "cxx": path, "runs": runs, "version": version, "include": include,
            "python_h": os.path.isfile(os.path.join(include, "Python.h")),
            "python": ".".join(str(v) for v in sys.version_info[:2])}


def ipex_pins() -> dict[str, str]:
    """The IPEX environment's pins of torch and IPEX ({name: version}); empty where pyproject.toml is absent."""
    from .. import install

    try:
        pins = [install.parse_pin(line) for line in install.ipex_pins()]
    except (OSError, install.InstallError, KeyError, ValueError):
        return {}
    return {name: version for name, version, _ in pins if name in ("torch", "intel-extension-for-pytorch") and version}


def ipex_environment() -> dict[str, Any]:
    """The IPEX environment as ``helpers.ipex_support.environment`` reads it (its own Python, package metadata only)."""
    from .. import ipex_support

    try:
        return ipex_support.environment()
    except Exception as exc:  # a broken environment must not end the doctor
        return {"python": None, "ok": False, "torch": None, "torchvision": None, "ipex": None,
                "message": f"could not read the IPEX environment: {type(exc).__name__}: {exc}"}


def wanted_imports(left_out: Sequence[str] = ()) -> dict[str, str]:
    """The modules the import probe tries ({key: module}): ``IMPORTS`` less those whose pin is ``left_out``."""
    return {key: key for key, dist in IMPORTS.items() if dist not in left_out}


def _imports_in_child(modules: dict[str, str]) -> Job:
    """Start a child that imports ``modules`` ({key: module}) and prints one JSON line of errors."""
    code = ("import json, sys, warnings\nwarnings.simplefilter('ignore')\nout = {}\n"
            "for key, mod in json.loads(sys.argv[1]).items():\n"
            "    try:\n        __import__(mod)\n        out[key] = None\n"
            "    except BaseException as exc:\n"
            "        out[key] = f'{type(exc).__name__}: {exc}'.splitlines()[0][:300]\n"
            "print('IMPORTS ' + json.dumps(out), flush=True)\n")
    return Job([[sys.executable, "-c", code, json.dumps(modules)]]).start()


def _online(hosts: Sequence[tuple[str, int]] = DATASET_HOSTS, timeout: float = 3.0) -> bool:
    result: list[bool] = []

    def probe() -> None:
        for host, port in hosts:
            try:
                socket.create_connection((host, port), timeout=timeout).close()
                result.append(True)
                return
            except OSError:
                continue
        result.append(False)

    thread = threading.Thread(target=probe, daemon=True)
    thread.start()
    thread.join(timeout * len(hosts) + 1)
    return bool(result and result[0])


def _kernel() -> dict[str, Any]:
    try:
        from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel

        try:
            spec = KernelSpecManager().get_kernel_spec("python3")
        except NoSuchKernel:
            return {"error": "no kernel named python3 is installed"}
    except ImportError as exc:
        return {"error": f"jupyter_client is missing ({exc})"}
    exe = spec.argv[0] if spec.argv else ""
    if exe in ("python", "python3", "{python}") or not os.path.isabs(exe):
        return {"python": "the Python that starts Jupyter", "same_env": True}
    same = Path(exe).resolve().is_relative_to(Path(sys.prefix).resolve()) or \
        Path(exe).resolve() == Path(sys.executable).resolve()
    return {"python": exe, "same_env": same}


def _allocators(machine: str | None = None) -> dict[str, str | None]:
    try:
        listing = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        listing = ""
    found: dict[str, str | None] = {}
    for name, libs in ALLOCATORS.items():
        found[name] = None
        for line in listing.splitlines():
            if any(line.strip().startswith(lib) for lib in libs):
                found[name] = line.split("=>")[-1].strip()
                break
        if found[name] is None:
            for folder in (f"/usr/lib/{machine or platform.machine()}-linux-gnu", "/usr/lib64", "/usr/lib",
                           "/usr/local/lib", os.path.join(sys.prefix, "lib")):
                hits = sorted(p for lib in libs for p in Path(folder).glob(lib + "*")) if os.path.isdir(folder) else []
                if hits:
                    found[name] = str(hits[0])
                    break
    return found


def _mpirun() -> tuple[str | None, str | None]:
    path = shutil.which("mpirun")
    if not path:
        return None, None
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=10).stdout
        return path, (out.strip().splitlines() or [""])[0]
    except (OSError, subprocess.SubprocessError):
        return path, None


def _devices() -> tuple[list[dict[str, Any]], list[str]]:
    import torch

    from .. import devices

    found = [{"name": "cpu", "description": "cpu (always present)"}]
    accelerators = []
    for kind in ("cuda", "xpu", "mps"):
        if not devices.is_available(kind):
            continue
        count = {"cuda": torch.cuda.device_count, "xpu": lambda: torch.xpu.device_count()}.get(kind, lambda: 1)()
        for i in range(count):
            name = f"{kind}:{i}" if kind != "mps" else "mps"
            entry: dict[str, Any] = {"name": name}
            try:
                entry["description"] = devices.describe(name)
                module = getattr(torch, kind, None)
                if kind in ("cuda", "xpu") and module is not None:
                    entry["memory_gb"] = module.get_device_properties(i).total_memory / 2**30
            except Exception as exc:  # a broken driver must not end the doctor
                entry["error"] = str(exc).splitlines()[0][:200]
            found.append(entry)
            accelerators.append(name)
    return found, accelerators


def _course_env() -> bool:
    prefix = Path(sys.prefix).resolve()
    return sys.prefix != sys.base_prefix and prefix.name.startswith("venv-") or \
        os.environ.get("CONDA_DEFAULT_ENV", "").startswith("accelerate")


def gather(parity_steps: int = 5, imports: bool = True, import_timeout: float = 60) -> dict[str, Any]:
    """Collect the facts of this machine that ``judge`` turns into checks."""
    facts: dict[str, Any] = {}
    try:
        requires = metadata.metadata(DIST_NAME).get("Requires-Python")
    except metadata.PackageNotFoundError:
        requires = None
    facts["python"] = {"version": list(sys.version_info[:3]), "requires": requires, "executable": sys.executable,
                       "prefix": sys.prefix, "course_env": _course_env()}
    facts["pins"] = pinned_requirements()
    facts["platform"] = platform_facts()
    child = None
    if imports:
        child = _imports_in_child(wanted_imports(facts["platform"]["left_out"]))
    try:
        import torch

        facts["torch"] = {"version": torch.__version__, "cuda": torch.version.cuda,
                          "xpu": bool(getattr(torch.version, "xpu", None)) or hasattr(torch, "xpu")
                          and torch.xpu.is_available(), "hip": getattr(torch.version, "hip", None),
                          "cuda_devices": torch.cuda.device_count() if torch.version.cuda else 0}
    except Exception as exc:
        facts["torch"] = {"error": f"{type(exc).__name__}: {exc}"}
        return facts
    from .. import run_sizes, system

    facts["fingerprint"] = system.fingerprint()
    facts["isa"] = system.cpu_bf16_support()
    facts["devices"], facts["accelerators"] = _devices()
    facts["compiler"] = compiler_facts()
    facts["ipex_env"] = ipex_environment()
    facts["ipex_pins"] = ipex_pins()
    facts["allocators"] = _allocators()
    facts["mpirun"] = _mpirun()
    facts["kernel"] = _kernel()
    try:
        source = run_sizes.data_source()
    except run_sizes.ProfileError:
        source = "real"
    facts["datasets"] = {"source": source, "cached": _cached_datasets(), "online": None}
    if not all(facts["datasets"]["cached"].values()) and source != "standin":
        facts["datasets"]["online"] = _online()
    import psutil

    vm = psutil.virtual_memory()
    facts["memory"] = {"available": vm.available, "total": vm.total}
    facts["disk"] = _disk()
    facts["parity"] = _parity(facts["accelerators"], parity_steps)
    if child is not None:
        try:  # the import timeout counts from now: the child imported while the rest was gathered
            out = child.wait(import_timeout + time.perf_counter() - child.started).output
            found = [ln for ln in out.splitlines() if ln.startswith("IMPORTS ")]
            facts["imports"] = json.loads(found[-1][len("IMPORTS "):]) if found else {}
        except (JobTimeout, json.JSONDecodeError):
            facts["imports"] = {k: f"import took over {import_timeout:.0f} s"
                                for k in wanted_imports(facts["platform"]["left_out"])}
    else:
        facts["imports"] = None  # not tried
    return facts


def _cached_datasets() -> dict[str, bool]:
    from .. import data

    cached = {}
    for name in data.SPECS:
        try:
            data.load_dataset(name, train=False, source="real", download=False)
            cached[name] = True
        except Exception:
            cached[name] = False
    return cached


def _disk() -> dict[str, int]:
    from .. import privacy, results

    free = {}
    for label, folder in (("results", results.results_dir()), ("cache", privacy.cache_dir())):
        probe = Path(folder)
        while not probe.exists() and probe != probe.parent:
            probe = probe.parent
        free[label] = shutil.disk_usage(probe).free
    return free


def _parity(accelerators: Sequence[str], steps: int) -> list[Any]:
    from .. import parity

    out: list[Any] = []
    for device in accelerators:
        try:
            out.append(parity.check(device, steps=steps))
        except Exception as exc:
            out.append(f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}")
    return out
