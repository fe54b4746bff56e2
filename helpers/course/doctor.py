"""The setup check: ``python -m helpers.course.doctor`` (``make doctor``; chapter 00 runs it too).

``gather`` collects this machine's facts as plain values, ``judge`` turns them into ``Check``s (ok, warn or
fail, each with a one-line fix; tested on made-up facts) and ``run`` writes ``results/doctor.json``. The exit
status is non-zero only on a ``fail``. What it checks and why: docs/running.md."""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import socket
import subprocess
import sys
import sysconfig
import threading
import time
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path
from typing import Any, Callable, Sequence

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

from .. import files, results, run_sizes, system
from ..processes import Job, JobTimeout
from ..system import DIST_NAME, PLATFORM_LABELS, left_out_pins, platform_label
from . import install, workshop

DOCTOR_VERSION = 1
STATUSES: tuple[str, ...] = ("ok", "warn", "fail")

ALLOCATORS: dict[str, tuple[str, ...]] = {"jemalloc": ("libjemalloc.so",), "tcmalloc": ("libtcmalloc.so",
                                                                                      "libtcmalloc_minimal.so")}
DATASET_HOSTS: tuple[tuple[str, int], ...] = (("ossci-datasets.s3.amazonaws.com", 443), ("www.cs.toronto.edu", 443))
#: What the import probe tries ({module: distribution}); never IPEX (its import ends a process without torch 2.8).
IMPORTS: dict[str, str] = {"nni": "nni", "torch_pruning": "torch-pruning"}
#: Packages without which no chapter runs; any other pinned package missing is a warning.
CORE_PACKAGES: frozenset[str] = frozenset({"torch", "torchvision", "matplotlib", "tqdm", "psutil", "threadpoolctl",
                                           "jupyterlab", "nbval"})
#: The fix for a missing mpirun or allocator on Debian/Ubuntu (one line installs all three).
APT_COMMAND = "`sudo apt-get install openmpi-bin libjemalloc2 libtcmalloc-minimal4`"
APT_LINE = f"Debian/Ubuntu: {APT_COMMAND}"
X86_MACHINES: frozenset[str] = frozenset({"x86_64", "AMD64", "amd64", "i386", "i686"})
#: Why a pin left out by its environment marker limits the course, and what to do: {distribution: (why, fix)}.
LEFT_OUT_LIMITS: dict[str, tuple[str, str]] = {
    "openvino": ("no OpenVINO wheel for {label} (its pin excludes this platform): chapter 14 measures eager PyTorch "
                 "and ONNX Runtime only", "chapter 14's OpenVINO arms need Linux x86-64, macOS arm64 or Windows"),
    "nni": ("no NNI wheel for {label} (NNI 3.0 is pinned on x86-64 only): chapter 06 computes the same L1-norm masks "
            "with Torch-Pruning", "nothing to do; NNI's own pruners need an x86-64 machine"),
    "intel-openmp": ("no Intel OpenMP (libiomp5) for {label} (pinned on Linux x86-64 only): chapters 02 and 04 skip "
                     "their Intel OpenMP arms", "the GNU/Intel OpenMP comparison needs Linux x86-64"),
}


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
    """A finding with nothing to fix."""
    return Check(name, "ok", message)


def _installed(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def pinned_requirements(dist: str = DIST_NAME) -> list[dict[str, Any]]:
    """The course package's requirements (from its installed metadata) with what is installed."""
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


def platform_facts(system: str | None = None, machine: str | None = None) -> dict[str, Any]:
    """The platform: system, machine, macOS release, WSL, the pins left out here and whether IPEX has wheels."""
    system = system or platform.system()
    machine = machine or platform.machine()
    return {"system": system, "machine": machine,
            "macos": platform.mac_ver()[0] if system == "Darwin" else None,
            "wsl": system == "Linux" and "microsoft" in platform.release().lower(),
            "left_out": left_out_pins(system, machine),
            "ipex_wheels": install.ipex_supported(system, machine)}


def compiler_facts(env: dict[str, str] | None = None) -> dict[str, Any]:
    """The C++ compiler torch.compile would use ($CXX, else g++ or c++), whether it runs, and Python.h."""
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
    try:
        pins = [install.parse_pin(line) for line in install.ipex_pins()]
    except (OSError, install.InstallError, KeyError, ValueError):
        return {}
    return {name: version for name, version, _ in pins if name in ("torch", "intel-extension-for-pytorch") and version}


def ipex_environment() -> dict[str, Any]:
    """The IPEX environment as ``helpers.ipex.environment`` reads it (its own Python, package metadata only)."""
    from .. import ipex

    try:
        return ipex.environment()
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
    free = {}
    for label, folder in (("results", results.results_dir()), ("cache", system.cache_dir())):
        probe = Path(folder)
        while not probe.exists() and probe != probe.parent:
            probe = probe.parent
        free[label] = shutil.disk_usage(probe).free
    return free


def _parity(accelerators: Sequence[str], steps: int) -> list[Any]:
    from ..arc_workloads import parity_check

    out: list[Any] = []
    for device in accelerators:
        try:
            out.append(parity_check(device, steps=steps))
        except Exception as exc:
            out.append(f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}")
    return out


def supported_minors(requires: str | None) -> list[str]:
    """The Python minor versions ``requires`` admits (``">=3.11,<3.14"`` -> ``["3.11", "3.12", "3.13"]``)."""
    if not requires:
        return []
    spec = SpecifierSet(requires)
    return [f"3.{m}" for m in range(8, 30) if spec.contains(f"3.{m}.0") or spec.contains(f"3.{m}.99")]


def _listed(items: Sequence[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " or " + items[-1]


def check_python(version: Sequence[int], requires: str | None, prefix: str = "", course_env: bool = True,
                 executable: str = "") -> Check:
    """The Python that runs the doctor (version, path, environment) against ``Requires-Python``."""
    text = ".".join(str(v) for v in version[:3])
    found = f"Python {text}" + (f" ({executable})" if executable else "")
    where = "" if course_env else f" (not the course environment: {prefix})"
    supported = supported_minors(requires)
    names = _listed(supported) if supported else "3.11"
    install = (f"install Python {names} (the README's Prerequisites: on Ubuntu 24.04 and Debian 12/13 the system "
               "python3) and run `make setup`")
    if tuple(version[:2]) < (3, 10):
        return Check("python", "fail", f"{found} is too old for the course's torch{where}", install)
    if requires:
        if text not in SpecifierSet(requires):
            return Check("python", "warn", f"{found} is not supported: the course's pins install on Python {names} "
                         f"(requires-python {requires}){where}", install)
    if not course_env:
        return Check("python", "warn", f"{found}, supported{where}",
                     "run the course from its environment: `make doctor`, or the venv's own python")
    return _ok("python", f"{found}, supported ({'the course supports ' + names if supported else 'no requirement'})")


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


def check_isa(flags: dict[str, bool], machine: str = "x86_64", system: str = "Linux") -> Check:
    """AVX2, AVX-512, AVX512-BF16, AMX: x86 only, read from Linux's /proc/cpuinfo (unknown elsewhere)."""
    if machine not in X86_MACHINES:
        return _ok("instruction sets", f"{machine} CPU: AVX2, AVX-512 and AMX are x86 instruction sets and do not "
                                       "apply; chapter 07 measures whether bf16 beats fp32 here")
    if system != "Linux" and not any(flags.values()):
        return _ok("instruction sets", f"not read on {system} (the doctor reads them from Linux's /proc/cpuinfo); "
                                       "chapter 07 measures whether bf16 beats fp32 here")
    names = [("AVX2", "avx2"), ("AVX-512", "avx512"), ("AVX512-BF16", "native_bf16"), ("AMX", "amx")]
    have = [n for n, k in names if flags.get(k)]
    lacks = [n for n, k in names if not flags.get(k)]
    msg = f"has {', '.join(have) or 'none of AVX2/AVX-512/AVX512-BF16/AMX'}" + (f"; lacks {', '.join(lacks)}"
                                                                              if lacks else "")
    if not flags.get("avx2"):
        return Check("instruction sets", "warn", msg + ": every CPU chapter will be slow",
                     "expect several times the stated minutes; use COURSE_PROFILE=smoke to try the chapters")
    if not flags.get("native_bf16"):
        msg += " -> bf16 is emulated on this CPU (chapter 07 measures it; expect it to be slower than fp32)"
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


def _retired(note: str, setup_command: str) -> str:
    """``note`` without its sentences that name ``setup_command`` (for platforms where it cannot work)."""
    return " ".join(x for x in re.split(r"(?<=\.) ", note) if setup_command not in x)


def check_ipex(env: dict[str, Any], plat: dict[str, Any], retirement: str, setup_command: str = "make setup-ipex",
               pins: dict[str, str] | None = None) -> Check:
    """The IPEX environment (``helpers.ipex.environment``), always with IPEX's retired status."""
    note = _retired(retirement, setup_command)
    if not plat.get("ipex_wheels", True):
        return Check("ipex", "warn", f"no IPEX wheel for {platform_label(plat)} (IPEX publishes CPU wheels for "
                     f"Linux x86-64 only): chapter 04 skips its IPEX arms. {note}",
                     "chapter 04's IPEX arms need a Linux x86-64 machine; the rest of the course runs here")
    if env.get("python") is None:
        return Check("ipex", "warn", f"the IPEX environment is not installed: chapter 04 skips its IPEX arms and "
                     f"says so. {note}", f"optional: `{setup_command}` (torch 2.8 + IPEX 2.8, about 2 minutes, 7 GB)")
    if not env.get("ok"):
        return Check("ipex", "warn", f"{env.get('message')}; chapter 04 skips its IPEX arms. {note}",
                     f"rebuild it: `{setup_command}`")
    found = {"torch": env.get("torch"), "intel-extension-for-pytorch": env.get("ipex")}
    off = [f"{k} {found[k]} (pinned {v})" for k, v in sorted((pins or {}).items())
           if k in found and str(found[k]).split("+")[0] != v]
    if off:
        return Check("ipex", "warn", f"the IPEX environment holds other versions than its pins: {', '.join(off)}; "
                     f"chapter 04's IPEX results may differ. {note}", f"rebuild it: `{setup_command}`")
    return _ok("ipex", f"IPEX environment ready: torch {env.get('torch')} + IPEX {env.get('ipex')} + the course "
                       f"package ({env.get('python')}); chapter 04 runs its IPEX arms there. {note}")


def check_pruning(import_errors: dict[str, str | None], versions: dict[str, str | None], tried: bool = True,
                  left_out: Sequence[str] = ()) -> Check:
    """NNI (masks) and Torch-Pruning (channel removal) importable, for chapter 06; NNI only where it is pinned."""
    wanted = [(k, dist) for k, dist in (("nni", "nni"), ("torch_pruning", "torch-pruning")) if dist not in left_out]
    if not tried:
        import_errors = {k: "not installed" for k, dist in wanted if versions.get(dist) in (None, "not installed")}
    bad = {k: v for k, v in import_errors.items() if v and k in dict(wanted)}
    if bad:
        return Check("nni + torch-pruning", "warn",
                     "; ".join(f"{k} does not import: {v}" for k, v in sorted(bad.items())),
                     "run `make setup`; chapter 06 needs " + ("both" if len(wanted) > 1 else "Torch-Pruning"))
    how = "import" if tried else "installed (import not tried)"
    if "nni" in left_out:
        return _ok("nni + torch-pruning", f"Torch-Pruning {versions.get('torch-pruning')} "
                                          f"{'imports' if tried else 'is installed (import not tried)'}; "
                                          "NNI is not pinned on this platform (see limit nni)")
    return _ok("nni + torch-pruning", f"NNI {versions.get('nni')} (archived upstream; chapter 06 uses its pruners) "
                                      f"and Torch-Pruning {versions.get('torch-pruning')} {how}")


def check_allocators(found: dict[str, str | None], system: str = "Linux") -> Check:
    """jemalloc / tcmalloc, the memory allocators chapter 04 can preload (Linux: LD_PRELOAD)."""
    if system != "Linux":
        return _ok("allocators", f"not looked for on {system}: chapter 04 preloads them with LD_PRELOAD, on Linux only "
                                 "(see the limits)")
    have = sorted(k for k, v in found.items() if v)
    if not have:
        return Check("allocators", "warn", "neither jemalloc nor tcmalloc is installed (chapter 04 skips that lever)",
                     APT_LINE)
    return _ok("allocators", f"found {', '.join(have)} (chapter 04 can preload "
                             f"{'them' if len(have) > 1 else 'it'})")


def check_mpirun(path: str | None, version: str | None, system: str = "Linux") -> Check:
    """``mpirun`` (Open MPI) for chapter 11's mpirun launch."""
    if not path:
        fix = {"Darwin": "macOS: `brew install open-mpi`",
               "Windows": f"use WSL2 (Ubuntu) and, there, {APT_COMMAND}"
               }.get(system, APT_LINE)
        return Check("mpirun", "warn", "mpirun not found: chapter 11 shows the mpirun launch without running it", fix)
    if version and "open mpi" not in version.lower() and "open-mpi" not in version.lower():
        return Check("mpirun", "warn", f"mpirun is not Open MPI ({version}): chapter 11's ranks come from Open MPI's "
                     "OMPI_COMM_WORLD_* variables", "install Open MPI and put its mpirun first on PATH; " + APT_LINE)
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
    """One check per accelerator from ``arc_workloads.parity_check`` results (or the error it raised)."""
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


def check_compiler(compiler: dict[str, Any], system: str = "Linux") -> Check:
    """The C++ compiler and Python headers that torch.compile needs to build its CPU kernels."""
    py = compiler.get("python", "3.11")
    fixes = {"Linux": f"Debian/Ubuntu: `sudo apt-get install g++ python{py}-dev` (other distributions: their g++ "
                      f"and Python {py} development packages)",
             "Darwin": "macOS: `xcode-select --install` (the Command Line Tools bring clang++ as c++)",
             "Windows": f"use WSL2 (Ubuntu) and, there, `sudo apt-get install g++ python{py}-dev`"}
    fix = fixes.get(system, fixes["Linux"])
    cant = "torch.compile on the CPU cannot build its kernels (chapter 03 and the compiled arms of later chapters)"
    if compiler.get("cxx_env") and not compiler.get("cxx"):
        return Check("c++ compiler", "fail", f"$CXX is {compiler['cxx_env']!r}, which is not found: {cant}",
                     f"point CXX at an installed compiler or unset it; {fix}")
    if not compiler.get("cxx"):
        return Check("c++ compiler", "fail", f"no C++ compiler ($CXX unset, no g++ or c++ on PATH): {cant}", fix)
    if not compiler.get("runs", True):
        return Check("c++ compiler", "fail", f"{compiler['cxx']} does not run "
                     f"({compiler.get('version') or 'no output'}): {cant}", fix)
    if not compiler.get("python_h"):
        if system == "Darwin":
            fix = (f"reinstall Python {py} from python.org or with Homebrew (`brew install python@{py}`): "
                   "both ship the headers")
        return Check("c++ compiler", "fail", f"{compiler['cxx']} found, but Python.h is missing from "
                     f"{compiler.get('include')}: {cant}", fix)
    source = "$CXX" if compiler.get("cxx_env") else "PATH"
    return _ok("c++ compiler", f"{compiler['cxx']} (from {source}; {compiler.get('version') or 'version unknown'}) "
                               "and Python.h: torch.compile can build CPU kernels")


def check_platform(plat: dict[str, Any], accelerators: Sequence[str] = ()) -> list[Check]:
    """The platform, then one ``limit ...`` warning per thing the course cannot do there (docs/hardware.md)."""
    system, label = plat.get("system", ""), platform_label(plat)
    limits: list[Check] = []
    for dist in plat.get("left_out", []):
        why, fix = LEFT_OUT_LIMITS.get(dist, (f"{dist} is not installed on {{label}} (its pin excludes this "
                                              "platform)", f"the parts that use {dist} need another platform"))
        limits.append(Check(f"limit {dist}", "warn", why.format(label=label), fix))
    if system == "Darwin":
        limits += [
            Check("limit LD_PRELOAD", "warn", "macOS has no LD_PRELOAD: chapters 02 and 04 skip the parts that preload "
                  "Intel OpenMP, jemalloc or tcmalloc", "those comparisons need Linux"),
            Check("limit torchrun", "warn", "torchrun on macOS: gloo is the only backend and the course's CI does not "
                  "run the torchrun chapters there", "for results like the chapters' run them on Linux"),
            Check("limit mps", "warn", f"Apple GPU (mps) {'found' if 'mps' in accelerators else 'not found'}: "
                  "chapters that pick a device use mps when present, and the course's CI does not run the MPS paths",
                  "if a result looks wrong, compare with the CPU (`DEVICE=cpu`); the parity check compares mps "
                  "with it"),
        ]
        if plat.get("macos") and _version_tuple(plat["macos"]) < (14,):
            limits.append(Check("limit macOS", "warn", f"macOS {plat['macos']}: the pins are resolved for macOS 14 "
                                "or later (`make platforms`); older releases are not checked",
                                "update macOS to 14 or later"))
    if system == "Windows":
        limits.append(Check("limit windows", "warn", "Windows: make, torchrun's launches and mpirun need a Linux shell",
                            "use WSL2 (`wsl --install`, Ubuntu) and run the course there"))
    where = label + (" (WSL2)" if plat.get("wsl") else "")
    if label not in PLATFORM_LABELS.values():
        head = Check("platform", "warn", f"{where} is not one of the platforms the pins are checked on "
                     f"({', '.join(sorted(set(PLATFORM_LABELS.values())))}); `make setup` may fail here",
                     "use one of those platforms; `make platforms` resolves the pins for each")
    elif limits:
        head = _ok("platform", f"{where}: the course runs with {len(limits)} limit(s), listed below")
    else:
        head = _ok("platform", f"{where}: no platform limits (IPEX: see the ipex check)")
    return [head] + limits


def _version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", text)[:3])


def judge(facts: dict[str, Any]) -> list[Check]:
    """Every check, from facts shaped like ``gather()``'s (missing facts are skipped)."""
    py = facts["python"]
    checks = [check_python(py["version"], py.get("requires"), py.get("prefix", ""), py.get("course_env", True),
                           py.get("executable", "")),
              check_pins(facts.get("pins", [])), check_torch_build(facts.get("torch", {}))]
    if "fingerprint" not in facts:
        return checks
    from ..ipex import RETIREMENT_NOTE, SETUP_COMMAND

    imports = facts.get("imports")
    tried = imports is not None
    imports = imports or {}
    versions = facts["fingerprint"].get("versions", {})
    plat = facts["platform"]
    system = plat.get("system", "Linux")
    checks += check_devices(facts["devices"])
    checks += [check_cpu(facts["fingerprint"]), check_isa(facts["isa"], plat.get("machine", "x86_64"), system),
               check_openmp(facts["fingerprint"].get("openmp", [])), check_compiler(facts["compiler"], system)]
    checks += check_platform(plat, facts["accelerators"])
    checks += [check_ipex(facts["ipex_env"], plat, RETIREMENT_NOTE, SETUP_COMMAND, facts.get("ipex_pins")),
               check_pruning({k: imports.get(k) for k in ("nni", "torch_pruning")}, versions, tried,
                             plat.get("left_out", [])),
               check_allocators(facts["allocators"], system), check_mpirun(*facts["mpirun"], system=system),
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
    facts = gather(parity_steps=parity_steps, imports=imports) if facts is None else facts
    checks = judge(facts)
    fingerprint = dict(facts.get("fingerprint", {}))
    fingerprint["machine_id"] = system.machine_id()
    payload = report(checks, fingerprint)
    path = Path(out) if out is not None else results.results_dir() / "doctor.json"
    files.atomic_write_text(path, json.dumps(workshop.redact(payload, all_paths=False), indent=2, default=str) + "\n")
    return checks, payload, path


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m helpers.course.doctor", description=__doc__.splitlines()[0])
    p.add_argument("--out", default=None, help="where to write doctor.json (default results/doctor.json)")
    p.add_argument("--parity-steps", type=int, default=5, help="training steps of the parity probe per accelerator")
    p.add_argument("--no-imports", action="store_true",
                   help="skip importing NNI and Torch-Pruning in a child process (faster, less sure)")
    args = p.parse_args(argv)
    start = time.perf_counter()
    print("Checking the course setup (10-30 s) ...", flush=True)
    checks, _, path = run(args.out, parity_steps=args.parity_steps, imports=not args.no_imports)
    names = workshop.private_names()
    print(format_checks(checks, lambda t: workshop.redact_text(t, names, all_paths=False)))
    shown = path.resolve()
    try:
        shown = shown.relative_to(Path.cwd().resolve())
    except ValueError:
        pass
    print(f"wrote {workshop.redact_text(str(shown), names, all_paths=False)} in {time.perf_counter() - start:.0f} s")
    return exit_status(checks)


if __name__ == "__main__":
    sys.exit(main())
