"""The doctor's facts: ``gather`` collects what this machine has -- Python, the pinned packages as
installed, the torch build, devices, CPU and instruction sets, OpenMP, IPEX, NNI and
Torch-Pruning (imported in a child process), allocators, ``mpirun``, the Jupyter kernel,
datasets, memory, disk, and a parity probe on every accelerator -- as a dict of plain values
that ``helpers.doctor.checks.judge`` turns into checks.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
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
_IMPORTS = {"ipex": "intel_extension_for_pytorch", "nni": "nni", "torch_pruning": "torch_pruning"}


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


def _imports_in_child(modules: dict[str, str]) -> Job:
    """Start a child that imports ``modules`` ({key: module}) and prints one JSON line of errors."""
    code = ("import json, sys, warnings\nwarnings.simplefilter('ignore')\nout = {}\n"
            "for key, mod in json.loads(sys.argv[1]).items():\n"
            "    try:\n        __import__(mod)\n        out[key] = None\n"
            "    except BaseException as exc:\n        out[key] = f'{type(exc).__name__}: {exc}'.splitlines()[0][:300]\n"
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


def _allocators() -> dict[str, str | None]:
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
            for folder in ("/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib", "/usr/local/lib",
                           os.path.join(sys.prefix, "lib")):
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
    facts["python"] = {"version": list(sys.version_info[:3]), "requires": requires,
                       "prefix": sys.prefix, "course_env": _course_env()}
    facts["pins"] = pinned_requirements()
    try:
        from .. import ipex_support

        status = ipex_support.status()
    except Exception as exc:  # torch itself broken: the torch-build check says so
        status = {"installed": _installed("intel-extension-for-pytorch"), "compatible": False, "message": str(exc)}
    child = None
    if imports:
        wanted = {"nni": "nni", "torch_pruning": "torch_pruning"}
        if status.get("compatible"):
            wanted["ipex"] = _IMPORTS["ipex"]
        child = _imports_in_child(wanted)
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
    facts["ipex"] = status
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
            facts["imports"] = {k: f"import took over {import_timeout:.0f} s" for k in ("nni", "torch_pruning")}
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
