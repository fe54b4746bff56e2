"""Setup checks with fixes, the machine fingerprint and the numerics parity probe: ``make doctor``.

``python -m helpers.doctor`` looks at everything the course depends on -- Python, the pinned
packages as installed, the torch build, each device, the CPU (model, sockets, cores, NUMA,
the instruction sets that decide the results), the OpenMP runtime, IPEX (and its retired,
archived status), NNI and Torch-Pruning, jemalloc/tcmalloc and ``mpirun``, the Jupyter
kernel, the datasets, free memory and disk -- and runs a few training steps on every
accelerator against the CPU (``helpers.parity``). Each check is ``ok``, ``warn`` or
``fail`` with a one-line fix. The result goes to ``results/doctor.json``::

    {"version": 1, "fingerprint": {...}, "checks": [{"name", "status", "message", "fix"}, ...]}

The exit status is non-zero only when the course cannot run (a ``fail``).

The work is split in two so each check can be tested with made-up facts: ``gather()``
collects what this machine has (a dict of plain values), the ``check_*`` functions judge
those facts and return :class:`Check` objects.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path
from typing import Any, Callable, Sequence

DOCTOR_VERSION = 1
STATUSES: tuple[str, ...] = ("ok", "warn", "fail")
DIST_NAME = "accelerate-course-helpers"
#: Packages without which no chapter runs; any other pinned package missing is a warning.
CORE_PACKAGES: frozenset[str] = frozenset({"torch", "torchvision", "matplotlib", "tqdm", "psutil", "threadpoolctl",
                                           "jupyterlab", "nbval"})
ALLOCATORS: dict[str, tuple[str, ...]] = {"jemalloc": ("libjemalloc.so",), "tcmalloc": ("libtcmalloc.so",
                                                                                      "libtcmalloc_minimal.so")}
DATASET_HOSTS: tuple[tuple[str, int], ...] = (("ossci-datasets.s3.amazonaws.com", 443), ("www.cs.toronto.edu", 443))
_IMPORTS = {"ipex": "intel_extension_for_pytorch", "nni": "nni", "torch_pruning": "torch_pruning"}


@dataclass
class Check:
    """One finding: ``status`` is ok, warn or fail; ``fix`` says what to do (empty when ok)."""

    name: str
    status: str
    message: str
    fix: str = ""

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"status must be one of {STATUSES}, got {self.status!r}")


def _ok(name: str, message: str) -> Check:
    return Check(name, "ok", message)


# --- judging the facts ------------------------------------------------------------------------

def check_python(version: Sequence[int], requires: str | None, prefix: str = "", course_env: bool = True) -> Check:
    """Python version against the package's ``Requires-Python``; which environment runs it."""
    text = ".".join(str(v) for v in version[:3])
    where = "" if course_env else f" (not the course environment: {prefix})"
    if tuple(version[:2]) < (3, 10):
        return Check("python", "fail", f"Python {text} is too old for torch 2.8{where}",
                     "install Python 3.11 and run `make setup`")
    if requires:
        from packaging.specifiers import SpecifierSet

        if text not in SpecifierSet(requires):
            return Check("python", "warn", f"Python {text}; the course's pins were made for {requires}{where}",
                         "use Python 3.11 (`make setup` builds the environment with it)")
    if not course_env:
        return Check("python", "warn", f"Python {text}{where}",
                     "run the course from its environment: `make doctor`, or the venv's own python")
    return _ok("python", f"Python {text} ({requires or 'no requirement'})")


def check_pins(pins: Sequence[dict[str, Any]]) -> Check:
    """Each pinned requirement (``name``, ``spec``, ``installed``) against what is installed."""
    missing_core = [p["name"] for p in pins if p["installed"] is None and p["name"] in CORE_PACKAGES]
    missing = [p["name"] for p in pins if p["installed"] is None and p["name"] not in CORE_PACKAGES]
    wrong = [f"{p['name']} {p['installed']} (pinned {p['spec']})" for p in pins
             if p["installed"] is not None and not p.get("matches", True)]
    if not pins:
        return Check("pins", "warn", "the course package's metadata lists no requirements (not installed?)",
                     "run `make setup` (installs helpers and the pinned packages)")
    if missing_core:
        return Check("pins", "fail", f"missing: {', '.join(missing_core + missing)}",
                     "run `make setup` (it installs every pinned package)")
    if missing or wrong:
        return Check("pins", "warn", "; ".join(filter(None, [f"missing: {', '.join(missing)}" if missing else "",
                                                            f"other versions: {', '.join(wrong)}" if wrong else ""])),
                     "run `make setup`; results may differ from the committed outputs until the pins match")
    return _ok("pins", f"all {len(pins)} pinned packages installed at their pinned versions")


def check_torch_build(build: dict[str, Any]) -> Check:
    """The torch build: version, CUDA / XPU support compiled in, and whether the GPU runtime works."""
    if build.get("error"):
        return Check("torch build", "fail", f"torch does not import: {build['error']}", "run `make setup`")
    parts = [f"torch {build['version']}"]
    parts.append(f"CUDA {build['cuda']}" if build.get("cuda") else "no CUDA")
    parts.append("XPU" if build.get("xpu") else "no XPU")
    if build.get("hip"):
        parts.append(f"ROCm {build['hip']}")
    message = ", ".join(parts) + " build"
    if build.get("cuda") and build.get("cuda_devices", 0) == 0:
        message += "; no NVIDIA GPU visible (the build also runs on the CPU)"
    return _ok("torch build", message)


def check_devices(found: Sequence[dict[str, Any]]) -> list[Check]:
    """One check per device: its name and memory."""
    checks = []
    for d in found:
        mem = f", {d['memory_gb']:.1f} GB" if d.get("memory_gb") else ""
        if d.get("error"):
            checks.append(Check(f"device {d['name']}", "warn", f"{d['name']} is present but fails: {d['error']}",
                                "check the driver (nvidia-smi / xpu-smi); the course still runs on the CPU"))
        else:
            checks.append(_ok(f"device {d['name']}", f"{d['description']}{mem}"))
    return checks


def check_cpu(fp: dict[str, Any]) -> Check:
    """CPU model, sockets, physical and logical cores, NUMA nodes."""
    msg = (f"{fp.get('cpu_model', 'unknown')}: {fp.get('sockets')} socket(s), {fp.get('physical_cores')} physical / "
           f"{fp.get('logical_cores')} logical cores, {fp.get('numa_nodes')} NUMA node(s)")
    if (fp.get("physical_cores") or 0) < 2:
        return Check("cpu", "warn", msg + "; chapters 02, 04 and 09 compare thread and rank counts and need 2+ cores",
                     "use a machine (or VM) with at least 2 physical cores for those chapters")
    return _ok("cpu", msg)


def check_isa(flags: dict[str, bool]) -> Check:
    """The instruction sets that decide the CPU results: AVX2, AVX-512, AVX512-BF16, AMX."""
    names = [("AVX2", "avx2"), ("AVX-512", "avx512"), ("AVX512-BF16", "native_bf16"), ("AMX", "amx")]
    have = [n for n, k in names if flags.get(k)]
    lacks = [n for n, k in names if not flags.get(k)]
    msg = f"has {', '.join(have) or 'none of AVX2/AVX-512/AVX512-BF16/AMX'}" + (f"; lacks {', '.join(lacks)}"
                                                                              if lacks else "")
    if not flags.get("avx2"):
        return Check("instruction sets", "warn", msg + ": every CPU chapter will be slow",
                     "expect several times the stated minutes; use COURSE_PROFILE=smoke to try the chapters")
    if not flags.get("native_bf16"):
        msg += " -> bf16 is emulated on this CPU (chapter 07: slower than fp32, as expected)"
    if not flags.get("ipex_bf16_prepack", flags.get("avx512")):
        msg += "; IPEX bf16 weight prepacking is not possible (chapter 04 skips it)"
    return _ok("instruction sets", msg)


def check_openmp(runtimes: Sequence[str]) -> Check:
    """Which OpenMP runtime torch loads (GNU libgomp or Intel libiomp5)."""
    if not runtimes:
        return Check("openmp", "warn", "no OpenMP runtime found in this process (threadpoolctl saw none)",
                     "torch's CPU kernels may run single-threaded; reinstall torch with `make setup`")
    kinds = ["Intel (libiomp5)" if "iomp" in r else "GNU (libgomp)" if "gomp" in r else f"LLVM/other ({r})"
             for r in runtimes]
    return _ok("openmp", f"loaded: {', '.join(kinds)} (chapter 04 shows which one serves the threads)")


def check_ipex(status: dict[str, Any], import_error: str | None, retirement: str, tried: bool = True) -> Check:
    """IPEX installed, matched to torch, importable; always with its retired/archived status."""
    if status.get("installed") is None:
        return Check("ipex", "warn", f"IPEX is not installed: chapter 04 skips its IPEX part. {retirement}",
                     "optional; `make setup` installs it on Linux x86-64")
    if not status.get("compatible"):
        return Check("ipex", "warn", f"{status.get('message')} {retirement}",
                     "install the course's pins with `make setup` (torch 2.8.0 + IPEX 2.8.0)")
    if import_error:
        return Check("ipex", "warn", f"IPEX {status['installed']} matches torch but fails to import: {import_error}. "
                     f"{retirement}", "reinstall it with `make setup`; chapter 04 skips IPEX until it imports")
    imports = "and imports" if tried else "(import not tried)"
    return Check("ipex", "warn", f"IPEX {status['installed']} matches torch {status['torch']} {imports}. "
                 f"{retirement}", "nothing to do for the course; do not use IPEX for new or exposed services")


def check_pruning(import_errors: dict[str, str | None], versions: dict[str, str | None], tried: bool = True) -> Check:
    """NNI (masks) and Torch-Pruning (channel removal) importable, for chapter 06."""
    if not tried:
        import_errors = {k: "not installed" for k, dist in (("nni", "nni"), ("torch_pruning", "torch-pruning"))
                         if versions.get(dist) in (None, "not installed")}
    bad = {k: v for k, v in import_errors.items() if v}
    if bad:
        return Check("nni + torch-pruning", "warn",
                     "; ".join(f"{k} does not import: {v}" for k, v in sorted(bad.items())),
                     "run `make setup`; chapter 06 needs both")
    return _ok("nni + torch-pruning", f"NNI {versions.get('nni')} (archived upstream, pruners work on torch 2.8) "
               f"and Torch-Pruning {versions.get('torch-pruning')} " + ("import" if tried else "installed (import not tried)"))


def check_allocators(found: dict[str, str | None]) -> Check:
    """jemalloc / tcmalloc, the memory allocators chapter 04 can preload."""
    have = sorted(k for k, v in found.items() if v)
    if not have:
        return Check("allocators", "warn", "neither jemalloc nor tcmalloc is installed (chapter 04 skips that lever)",
                     "Debian/Ubuntu: `sudo apt-get install libjemalloc2 libtcmalloc-minimal4`")
    return _ok("allocators", f"found {', '.join(have)} (chapter 04 can preload "
                             f"{'them' if len(have) > 1 else 'it'})")


def check_mpirun(path: str | None, version: str | None) -> Check:
    """``mpirun`` for chapter 11's Open MPI launch."""
    if not path:
        return Check("mpirun", "warn", "mpirun not found: chapter 11 shows the mpirun launch without running it",
                     "Debian/Ubuntu: `sudo apt-get install openmpi-bin`")
    return _ok("mpirun", f"mpirun present ({version or 'version unknown'})")


def check_kernel(kernel: dict[str, Any]) -> Check:
    """The ``python3`` Jupyter kernel (what JupyterLab and ``make reproduce`` start) runs the course env."""
    if kernel.get("error"):
        return Check("jupyter kernel", "warn", f"no usable python3 kernel: {kernel['error']}",
                     "run `make setup` (installs ipykernel into the course environment)")
    if kernel.get("same_env"):
        return _ok("jupyter kernel", "the python3 kernel runs the course environment's Python")
    return Check("jupyter kernel", "warn", f"the python3 kernel runs {kernel.get('python')}, "
                 "not the course environment: notebooks would miss the pins",
                 "remove the stray kernelspec (`jupyter kernelspec list`, then `jupyter kernelspec remove python3`) "
                 "and start JupyterLab with `make lab`")


def check_datasets(source: str, cached: dict[str, bool], online: bool | None) -> Check:
    """Real datasets on disk, or the machine online to download them; the stand-in needs neither."""
    have = sorted(k for k, v in cached.items() if v)
    lack = sorted(k for k, v in cached.items() if not v)
    if not lack:
        return _ok("datasets", f"cached: {', '.join(have)}")
    if source == "standin":
        return _ok("datasets", f"COURSE_DATA=standin: chapters use the synthetic stand-in "
                               f"(not cached: {', '.join(lack)})")
    if online:
        return _ok("datasets", f"not cached yet: {', '.join(lack)}; they download on first use (about 200 MB)")
    return Check("datasets", "warn", f"not cached and the download hosts are unreachable: {', '.join(lack)}",
                 "put the files in COURSE_DATA_DIR (see README), or run with COURSE_DATA=standin")


def check_memory(available: int, total: int) -> Check:
    """Free memory: under 1 GB nothing trains; under 4 GB the workshop profile may swap."""
    gb = available / 2**30
    msg = f"{gb:.1f} GB free of {total / 2**30:.1f} GB"
    if gb < 1:
        return Check("memory", "fail", msg, "close other programs; the course needs at least 1 GB (4 GB for workshop)")
    if gb < 4:
        return Check("memory", "warn", msg, "close other programs or use COURSE_PROFILE=smoke")
    return _ok("memory", msg)


def check_disk(free: dict[str, int]) -> Check:
    """Free disk where the course writes (results, the cache with datasets and the environment)."""
    low = min(free.values()) / 2**30 if free else 0.0
    msg = ", ".join(f"{k} {v / 2**30:.1f} GB free" for k, v in sorted(free.items()))
    if low < 0.5:
        return Check("disk", "fail", msg, "free some disk space: results and checkpoints need at least 0.5 GB")
    if low < 5:
        return Check("disk", "warn", msg, "free some disk space: the real datasets and results need about 5 GB")
    return _ok("disk", msg)


def check_parity(results: Sequence[Any], accelerators: Sequence[str]) -> list[Check]:
    """One check per accelerator from ``helpers.parity`` results (or the error it raised)."""
    if not accelerators:
        return [_ok("parity", "no accelerator: the CPU is the reference, nothing to compare")]
    checks = []
    for device, res in zip(accelerators, results):
        if isinstance(res, str):
            checks.append(Check(f"parity {device}", "fail", f"training on {device} failed: {res}",
                                f"update the {device} driver and torch build, or run with --device cpu"))
        elif res.ok:
            checks.append(_ok(f"parity {device}", res.summary()))
        else:
            checks.append(Check(f"parity {device}", "fail", res.summary(),
                                f"do not trust training on {device}: update its driver / torch build, "
                                "or pick the CPU (`--device cpu`, `DEVICE=cpu`)"))
    return checks


# --- gathering the facts of this machine ------------------------------------------------------

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


def _imports_in_child(modules: dict[str, str], timeout: float) -> subprocess.Popen[str]:
    code = ("import json, sys, warnings\nwarnings.simplefilter('ignore')\nout = {}\n"
            "for key, mod in json.loads(sys.argv[1]).items():\n"
            "    try:\n        __import__(mod)\n        out[key] = None\n"
            "    except BaseException as exc:\n        out[key] = f'{type(exc).__name__}: {exc}'.splitlines()[0][:300]\n"
            "print(json.dumps(out))\n")
    return subprocess.Popen([sys.executable, "-c", code, json.dumps(modules)], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)


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

    from . import devices

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
        from . import ipex_support

        status = ipex_support.status()
    except Exception as exc:  # torch itself broken: the torch-build check says so
        status = {"installed": _installed("intel-extension-for-pytorch"), "compatible": False, "message": str(exc)}
    child = None
    if imports:
        wanted = {"nni": "nni", "torch_pruning": "torch_pruning"}
        if status.get("compatible"):
            wanted["ipex"] = _IMPORTS["ipex"]
        child = _imports_in_child(wanted, import_timeout)
    try:
        import torch

        facts["torch"] = {"version": torch.__version__, "cuda": torch.version.cuda,
                          "xpu": bool(getattr(torch.version, "xpu", None)) or hasattr(torch, "xpu")
                          and torch.xpu.is_available(), "hip": getattr(torch.version, "hip", None),
                          "cuda_devices": torch.cuda.device_count() if torch.version.cuda else 0}
    except Exception as exc:
        facts["torch"] = {"error": f"{type(exc).__name__}: {exc}"}
        return facts
    from . import profiles, system

    facts["fingerprint"] = system.fingerprint()
    facts["isa"] = system.cpu_bf16_support()
    facts["devices"], facts["accelerators"] = _devices()
    facts["ipex"] = status
    facts["allocators"] = _allocators()
    facts["mpirun"] = _mpirun()
    facts["kernel"] = _kernel()
    try:
        source = profiles.data_source()
    except profiles.ProfileError:
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
        try:
            out, _ = child.communicate(timeout=import_timeout)
            facts["imports"] = json.loads(out or "{}")
        except (subprocess.TimeoutExpired, json.JSONDecodeError):
            child.kill()
            child.communicate()
            facts["imports"] = {k: f"import took over {import_timeout:.0f} s" for k in ("nni", "torch_pruning")}
    else:
        facts["imports"] = None  # not tried
    return facts


def _cached_datasets() -> dict[str, bool]:
    from . import data

    cached = {}
    for name in data.SPECS:
        try:
            data.load_dataset(name, train=False, source="real", download=False)
            cached[name] = True
        except Exception:
            cached[name] = False
    return cached


def _disk() -> dict[str, int]:
    from . import privacy, results

    free = {}
    for label, folder in (("results", results.results_dir()), ("cache", privacy.cache_dir())):
        probe = Path(folder)
        while not probe.exists() and probe != probe.parent:
            probe = probe.parent
        free[label] = shutil.disk_usage(probe).free
    return free


def _parity(accelerators: Sequence[str], steps: int) -> list[Any]:
    from . import parity

    out: list[Any] = []
    for device in accelerators:
        try:
            out.append(parity.check(device, steps=steps))
        except Exception as exc:
            out.append(f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}")
    return out


def judge(facts: dict[str, Any]) -> list[Check]:
    """Every check, from facts shaped like ``gather()``'s (missing facts are skipped)."""
    py = facts["python"]
    checks = [check_python(py["version"], py.get("requires"), py.get("prefix", ""), py.get("course_env", True)),
              check_pins(facts.get("pins", [])), check_torch_build(facts.get("torch", {}))]
    if "fingerprint" not in facts:
        return checks
    from .ipex_support import RETIREMENT_NOTE

    imports = facts.get("imports")
    tried = imports is not None
    imports = imports or {}
    versions = facts["fingerprint"].get("versions", {})
    checks += check_devices(facts["devices"])
    checks += [check_cpu(facts["fingerprint"]), check_isa(facts["isa"]),
               check_openmp(facts["fingerprint"].get("openmp", [])),
               check_ipex(facts["ipex"], imports.get("ipex"), RETIREMENT_NOTE, tried),
               check_pruning({k: imports.get(k) for k in ("nni", "torch_pruning")}, versions, tried),
               check_allocators(facts["allocators"]), check_mpirun(*facts["mpirun"]),
               check_kernel(facts["kernel"]),
               check_datasets(facts["datasets"]["source"], facts["datasets"]["cached"], facts["datasets"]["online"]),
               check_memory(facts["memory"]["available"], facts["memory"]["total"]), check_disk(facts["disk"])]
    checks += check_parity(facts["parity"], facts["accelerators"])
    return checks


def exit_status(checks: Sequence[Check]) -> int:
    """1 when any check failed (the course cannot run as set up), else 0."""
    return 1 if any(c.status == "fail" for c in checks) else 0


def report(checks: Sequence[Check], fingerprint: dict[str, Any]) -> dict[str, Any]:
    """The content of ``doctor.json``: version, fingerprint (with the private machine id), checks."""
    return {"version": DOCTOR_VERSION, "fingerprint": fingerprint,
            "checks": [asdict(c) for c in checks],
            "summary": {s: sum(c.status == s for c in checks) for s in STATUSES}}


def format_checks(checks: Sequence[Check], redact: Callable[[str], str] | None = None) -> str:
    """Aligned text, one line per check and the fix beneath warnings and failures."""
    redact = redact or (lambda text: text)
    width = max((len(c.name) for c in checks), default=0)
    marks = {"ok": "ok  ", "warn": "WARN", "fail": "FAIL"}
    lines = []
    for c in checks:
        lines.append(f"[{marks[c.status]}] {c.name.ljust(width)}  {redact(c.message)}")
        if c.fix:
            lines.append(f"       {' ' * width}  fix: {redact(c.fix)}")
    counts = {s: sum(c.status == s for c in checks) for s in STATUSES}
    lines.append(f"{counts['ok']} ok, {counts['warn']} warning(s), {counts['fail']} failure(s)"
                 + ("" if not counts["fail"] else ": the course cannot run until the failures are fixed"))
    return "\n".join(lines)


def run(out: Path | str | None = None, *, parity_steps: int = 5, imports: bool = True,
        facts: dict[str, Any] | None = None) -> tuple[list[Check], dict[str, Any], Path]:
    """Gather (unless ``facts`` are given), judge, write ``doctor.json``; returns checks, report, path."""
    from . import files, privacy, results

    facts = gather(parity_steps=parity_steps, imports=imports) if facts is None else facts
    checks = judge(facts)
    fingerprint = dict(facts.get("fingerprint", {}))
    fingerprint["machine_id"] = privacy.machine_id()
    payload = report(checks, fingerprint)
    path = Path(out) if out is not None else results.results_dir() / "doctor.json"
    files.atomic_write_text(path, json.dumps(privacy.redact(payload, all_paths=False), indent=2, default=str) + "\n")
    return checks, payload, path


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m helpers.doctor", description=__doc__.splitlines()[0])
    p.add_argument("--out", default=None, help="where to write doctor.json (default results/doctor.json)")
    p.add_argument("--parity-steps", type=int, default=5, help="training steps of the parity probe per accelerator")
    p.add_argument("--no-imports", action="store_true",
                   help="skip importing IPEX, NNI and Torch-Pruning in a child process (faster, less sure)")
    args = p.parse_args(argv)
    from . import privacy

    start = time.perf_counter()
    print("Checking the course setup (10-30 s) ...", flush=True)
    checks, _, path = run(args.out, parity_steps=args.parity_steps, imports=not args.no_imports)
    names = privacy.private_names()
    print(format_checks(checks, lambda t: privacy.redact_text(t, names, all_paths=False)))
    shown = path.resolve()
    try:
        shown = shown.relative_to(Path.cwd().resolve())
    except ValueError:
        pass
    print(f"wrote {privacy.redact_text(str(shown), names, all_paths=False)} in {time.perf_counter() - start:.0f} s")
    return exit_status(checks)


if __name__ == "__main__":
    sys.exit(main())
