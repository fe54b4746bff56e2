"""The setup check (``make doctor``, chapter 00): ``gather`` reads this machine, ``judge`` turns the facts into
ok / warn / fail ``Check``s with a fix each, ``run`` writes results/doctor.json. What and why: docs/running.md."""

from __future__ import annotations

import argparse
import contextlib
import ctypes.util
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import sysconfig
import time
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path
from typing import Any, Sequence

from packaging.requirements import Requirement

from .. import files, results, system
from ..processes import Job, JobTimeout
from ..system import DIST_NAME, PLATFORM_LABELS, left_out_pins, platform_label
from . import install, workshop

DOCTOR_VERSION = 1
STATUSES: tuple[str, ...] = ("ok", "warn", "fail")
#: The allocators chapter 04 preloads: {name: what it asks ``ctypes.util.find_library`` for}.
ALLOCATORS: dict[str, str] = {"jemalloc": "jemalloc", "tcmalloc": "tcmalloc_minimal"}
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


def _ok(name: str, message: str) -> Check:
    return Check(name, "ok", message)


def _first_line(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:200]}"


def _installed(name: str) -> str | None:
    with contextlib.suppress(metadata.PackageNotFoundError):
        return metadata.version(name)
    return None


def pinned_requirements(dist: str = DIST_NAME) -> list[dict[str, Any]]:
    """The course package's requirements (from its installed metadata) with what is installed."""
    try:
        reqs = [Requirement(text) for text in metadata.requires(dist) or []]
    except metadata.PackageNotFoundError:
        return []
    pins = []
    for req in reqs:
        if req.marker is None or req.marker.evaluate({"extra": ""}):
            installed = _installed(req.name)
            pins.append({"name": req.name, "spec": str(req.specifier), "installed": installed,
                         "matches": installed is not None and (not req.specifier or installed in req.specifier)})
    return pins


def _version_line(path: str) -> tuple[bool, str | None]:
    """Whether ``path --version`` succeeds, and the first line it printed (of stderr when it failed)."""
    try:
        proc = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as exc:
        return False, _first_line(exc)
    runs = proc.returncode == 0
    return runs, ((proc.stdout if runs else proc.stderr).strip().splitlines() or [None])[0]


def compiler_facts() -> dict[str, Any]:
    """The C++ compiler torch.compile would use ($CXX, else g++ or c++), whether it runs, and Python.h."""
    wanted = os.environ.get("CXX", "").split()
    path = shutil.which(wanted[0]) if wanted else shutil.which("g++") or shutil.which("c++")
    # macOS has /usr/bin/g++ and c++ even without a compiler: they fail until the tools are installed
    runs, version = _version_line(path) if path else (False, None)
    include = sysconfig.get_paths()["include"]
    return {"cxx_env": os.environ.get("CXX") or None, "cxx": path, "runs": runs, "version": version, "include": include,
            "python_h": os.path.isfile(os.path.join(include, "Python.h")),
            "python": ".".join(str(v) for v in sys.version_info[:2])}


def wanted_imports(left_out: Sequence[str] = ()) -> list[str]:
    """The modules the import probe tries: ``IMPORTS`` less those whose pin is ``left_out``."""
    return [module for module, dist in IMPORTS.items() if dist not in left_out]


def _imports_in_child(modules: Sequence[str]) -> dict[str, Job]:
    """Start one child per module, each importing it (warnings off): {module: job}."""
    return {m: Job([[sys.executable, "-W", "ignore", "-c", f"import {m}"]]).start() for m in modules}


def _import_errors(children: dict[str, Job], timeout: float = 60) -> dict[str, str | None]:
    """{module: None, or the last line its import printed}; each child gets ``timeout`` s more from now."""
    errors: dict[str, str | None] = {}
    for module, child in children.items():
        try:
            done = child.wait(timeout + time.perf_counter() - child.started)
            last = (done.output.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
            errors[module] = None if done.returncode == 0 else last[:300]
        except JobTimeout:
            errors[module] = f"import took over {timeout:.0f} s"
    return errors


def _kernel() -> dict[str, Any]:
    try:
        from jupyter_client.kernelspec import KernelSpecManager

        exe = (KernelSpecManager().get_kernel_spec("python3").argv or [""])[0]
    except Exception as exc:  # no jupyter_client, or no kernel named python3
        return {"error": _first_line(exc)}
    if not os.path.isabs(exe):  # "python", "python3", "{python}": the Python that starts Jupyter
        return {"python": "the Python that starts Jupyter", "same_env": True}
    return {"python": exe, "same_env": Path(exe).parent.resolve() == Path(sys.executable).parent.resolve()}


def _accelerators() -> list[dict[str, Any]]:
    """Each GPU: its name and description, and what the parity probe found there (or the error it raised)."""
    import torch

    from .. import devices
    from ..arc_workloads import parity_check

    found = []
    for kind in ("cuda", "xpu", "mps"):
        count = (1 if kind == "mps" else getattr(torch, kind).device_count()) if devices.is_available(kind) else 0
        for i in range(count):
            entry: dict[str, Any] = {"name": "mps" if kind == "mps" else f"{kind}:{i}"}
            try:  # a broken driver must not end the doctor
                entry["description"] = devices.describe(entry["name"])
                if kind != "mps":
                    memory = getattr(torch, kind).get_device_properties(i).total_memory
                    entry["description"] += f", {memory / 2**30:.1f} GB"
                entry["parity"] = parity_check(entry["name"])
            except Exception as exc:
                entry["error"] = _first_line(exc)
            found.append(entry)
    return found


def _disk() -> dict[str, int]:
    free = {}
    for label, folder in (("results", results.results_dir()), ("cache", system.cache_dir())):
        folder = Path(folder)
        free[label] = shutil.disk_usage(next(p for p in (folder, *folder.parents) if p.exists())).free
    return free


def gather(imports: bool = True) -> dict[str, Any]:
    """Collect the facts of this machine that ``judge`` turns into checks (``imports``: run the import probe)."""
    course_env = sys.prefix != sys.base_prefix and Path(sys.prefix).resolve().name.startswith("venv-") or \
        os.environ.get("CONDA_DEFAULT_ENV", "").startswith("accelerate")
    facts: dict[str, Any] = {
        "python": {"version": list(sys.version_info[:3]), "supported": install.supported_pythons(),
                   "executable": sys.executable, "prefix": sys.prefix, "course_env": course_env},
        "pins": pinned_requirements(),
        "platform": {"system": platform.system(), "machine": platform.machine(), "left_out": left_out_pins(),
                     "wsl": "microsoft" in platform.release().lower(), "ipex_wheels": install.ipex_supported()}}
    children = _imports_in_child(wanted_imports(facts["platform"]["left_out"])) if imports else None
    try:
        import torch

        facts["torch"] = {"version": torch.__version__, "cuda": torch.version.cuda,
                          "xpu": bool(getattr(torch.version, "xpu", None)) or hasattr(torch, "xpu")
                          and torch.xpu.is_available(), "hip": getattr(torch.version, "hip", None)}
    except Exception as exc:
        facts["torch"] = {"error": f"{type(exc).__name__}: {exc}"}
        return facts
    import psutil

    from .. import ipex

    facts["fingerprint"] = system.fingerprint()
    memory, mpirun = psutil.virtual_memory(), shutil.which("mpirun")
    facts.update(isa=facts["fingerprint"]["bf16"], compiler=compiler_facts(), ipex_env=ipex.environment(),
                 kernel=_kernel(), disk=_disk(),
                 allocators={name: ctypes.util.find_library(lib) for name, lib in ALLOCATORS.items()},
                 memory={"available": memory.available, "total": memory.total},
                 mpirun=(mpirun, _version_line(mpirun)[1] if mpirun else None),
                 devices=_accelerators(), imports=None if children is None else _import_errors(children))
    return facts


def check_python(version: Sequence[int], supported: Sequence[str], prefix: str = "", course_env: bool = True,
                 executable: str = "") -> Check:
    """The Python that runs the doctor (version, path, environment) against the ``supported`` minor versions."""
    found = f"Python {'.'.join(map(str, version[:3]))}" + (f" ({executable})" if executable else "")
    where = "" if course_env else f" (not the course environment: {prefix})"
    names = supported[0] if len(supported) == 1 else ", ".join(supported[:-1]) + " or " + supported[-1]
    install = (f"install Python {names} (the README's Prerequisites: on Ubuntu 24.04 and Debian 12/13 the system "
               "python3) and run `make setup`")
    if tuple(version[:2]) < (3, 10):
        return Check("python", "fail", f"{found} is too old for the course's torch{where}", install)
    if ".".join(str(v) for v in version[:2]) not in supported:
        return Check("python", "warn", f"{found} is not supported: the course's pins install on Python {names}{where}",
                     install)
    if not course_env:
        return Check("python", "warn", f"{found}, supported{where}",
                     "run the course from its environment: `make doctor`, or the venv's own python")
    return _ok("python", f"{found}, supported (the course supports {names})")


def check_pins(pins: Sequence[dict[str, Any]]) -> Check:
    """Each pinned requirement (``name``, ``spec``, ``installed``) against what is installed."""
    if not pins:
        return Check("pins", "warn", "the course package's metadata lists no requirements (not installed?)",
                     "run `make setup` (installs helpers and the pinned packages)")
    missing = [p["name"] for p in pins if p["installed"] is None]
    wrong = [f"{p['name']} {p['installed']} (pinned {p['spec']})" for p in pins
             if p["installed"] is not None and not p.get("matches", True)]
    if set(missing) & CORE_PACKAGES:
        return Check("pins", "fail", f"missing: {', '.join(missing)}",
                     "run `make setup` (it installs every pinned package)")
    found = [f"{what}: {', '.join(names)}" for what, names in (("missing", missing), ("other versions", wrong)) if names]
    if found:
        return Check("pins", "warn", "; ".join(found),
                     "run `make setup`; results may differ from the committed outputs until the pins match")
    return _ok("pins", f"all {len(pins)} pinned packages installed at their pinned versions")


def check_torch_build(build: dict[str, Any]) -> Check:
    """The torch build: its version and the GPU support (CUDA, XPU, ROCm) compiled in."""
    if build.get("error"):
        return Check("torch build", "fail", f"torch does not import: {build['error']}", "run `make setup`")
    parts = [f"torch {build['version']}", f"CUDA {build['cuda']}" if build.get("cuda") else "no CUDA",
             "XPU" if build.get("xpu") else "no XPU"] + ([f"ROCm {build['hip']}"] if build.get("hip") else [])
    return _ok("torch build", ", ".join(parts) + " build (the devices check lists the GPUs it finds)")


def check_cpu(fp: dict[str, Any]) -> Check:
    """CPU model, sockets, physical and logical cores, NUMA nodes, and the OpenMP runtime torch loaded."""
    msg = (f"{fp.get('cpu_model', 'unknown')}: {fp.get('sockets')} socket(s), {fp.get('physical_cores')} physical / "
           f"{fp.get('logical_cores')} logical cores, {fp.get('numa_nodes')} NUMA node(s); OpenMP: "
           f"{', '.join(fp.get('openmp') or []) or 'none found'}")
    if (fp.get("physical_cores") or 0) < 2:
        return Check("cpu", "warn", msg + "; chapters 02, 04 and 09 compare thread and rank counts and need 2+ cores",
                     "use a machine (or VM) with at least 2 physical cores for those chapters")
    return _ok("cpu", msg)


def check_isa(flags: dict[str, bool], machine: str = "x86_64", system: str = "Linux") -> Check:
    """AVX2, AVX-512, AVX512-BF16, AMX: x86 only, read from Linux's /proc/cpuinfo (unknown elsewhere)."""
    measured = "chapter 07 measures whether bf16 beats fp32 here"
    if machine not in X86_MACHINES:
        return _ok("instruction sets", f"{machine} CPU: AVX2, AVX-512 and AMX are x86 instruction sets and do not "
                                       f"apply; {measured}")
    if system != "Linux" and not any(flags.values()):
        return _ok("instruction sets", f"not read on {system} (the doctor reads them from Linux's /proc/cpuinfo); "
                                       f"{measured}")
    names = {"AVX2": "avx2", "AVX-512": "avx512", "AVX512-BF16": "native_bf16", "AMX": "amx"}
    lacks = [n for n, k in names.items() if not flags.get(k)]
    msg = f"has {', '.join(n for n in names if n not in lacks) or 'none of AVX2/AVX-512/AVX512-BF16/AMX'}"
    msg += f"; lacks {', '.join(lacks)}" if lacks else ""
    if not flags.get("avx2"):
        return Check("instruction sets", "warn", msg + ": every CPU chapter will be slow",
                     "expect several times the stated minutes; use COURSE_PROFILE=smoke to try the chapters")
    if not flags.get("native_bf16"):
        msg += " -> bf16 is emulated on this CPU (chapter 07 measures it; expect it to be slower than fp32)"
    return _ok("instruction sets", msg)


def check_ipex(env: dict[str, Any], plat: dict[str, Any]) -> Check:
    """The IPEX environment (``helpers.ipex.environment``), always with IPEX's retired status."""
    from ..ipex import RETIREMENT_NOTE, SETUP_COMMAND

    note = " ".join(s for s in re.split(r"(?<=\.) ", RETIREMENT_NOTE) if SETUP_COMMAND not in s)
    if not plat.get("ipex_wheels", True):
        return Check("ipex", "warn", f"no IPEX wheel for {platform_label(plat)} (IPEX publishes CPU wheels for "
                     f"Linux x86-64 only): chapter 04 skips its IPEX arms. {note}",
                     "chapter 04's IPEX arms need a Linux x86-64 machine; the rest of the course runs here")
    if not env.get("ok"):  # its message says what is missing (or that it is not installed) and what to run
        return Check("ipex", "warn", f"{env.get('message')}; chapter 04 skips its IPEX arms. {note}",
                     f"optional: `{SETUP_COMMAND}` (torch 2.8 + IPEX 2.8, about 2 minutes, 7 GB)")
    return _ok("ipex", f"IPEX environment ready: torch {env.get('torch')} + IPEX {env.get('ipex')} + the course "
                       f"package ({env.get('python')}); chapter 04 runs its IPEX arms there. {note}")


def check_pruning(imports: dict[str, str | None] | None, versions: dict[str, str | None],
                  left_out: Sequence[str] = ()) -> Check:
    """NNI and Torch-Pruning for chapter 06 (NNI only where pinned); ``imports``: None when the probe did not run."""
    wanted, errors = wanted_imports(left_out), imports or {}
    bad = [f"{m} does not import: {errors[m]}" for m in wanted if errors.get(m)]
    if bad:
        return Check("nni + torch-pruning", "warn", "; ".join(bad),
                     "run `make setup`; chapter 06 needs " + ("both" if len(wanted) > 1 else "Torch-Pruning"))
    found = " and ".join(f"{IMPORTS[m]} {versions.get(IMPORTS[m])}" for m in wanted)
    return _ok("nni + torch-pruning", found + (" import" if imports is not None else " (import not tried)"))


def check_allocators(found: dict[str, str | None]) -> Check:
    """jemalloc / tcmalloc, the allocators chapter 04 preloads with LD_PRELOAD (judged on Linux only)."""
    have = sorted(k for k, v in found.items() if v)
    if not have:
        return Check("allocators", "warn", "neither jemalloc nor tcmalloc is installed (chapter 04 skips that lever)",
                     APT_LINE)
    return _ok("allocators", f"found {', '.join(have)} (chapter 04 can preload {'them' if len(have) > 1 else 'it'})")


def check_mpirun(path: str | None, version: str | None, system: str = "Linux") -> Check:
    """``mpirun`` (Open MPI) for chapter 11's mpirun launch."""
    if not path:
        fix = {"Darwin": "macOS: `brew install open-mpi`", "Windows": f"use WSL2 (Ubuntu) and, there, {APT_COMMAND}"}
        return Check("mpirun", "warn", "mpirun not found: chapter 11 shows the mpirun launch without running it",
                     fix.get(system, APT_LINE))
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


def _graded(name: str, value: float, message: str, fail: tuple[float, str], warn: tuple[float, str]) -> Check:
    """A fail below ``fail[0]``, a warning below ``warn[0]`` (each with its fix), else ok."""
    for status, (below, fix) in (("fail", fail), ("warn", warn)):
        if value < below:
            return Check(name, status, message, fix)
    return _ok(name, message)


def check_memory(available: int, total: int) -> Check:
    """Free memory: under 1 GB nothing trains; under 4 GB the workshop profile may swap."""
    return _graded("memory", available / 2**30, f"{available / 2**30:.1f} GB free of {total / 2**30:.1f} GB",
                   (1, "close other programs; the course needs at least 1 GB (4 GB for workshop)"),
                   (4, "close other programs or use COURSE_PROFILE=smoke"))


def check_disk(free: dict[str, int]) -> Check:
    """Free disk where the course writes (results, the cache with datasets and the environment)."""
    return _graded("disk", min(free.values(), default=0) / 2**30,
                   ", ".join(f"{k} {v / 2**30:.1f} GB free" for k, v in sorted(free.items())),
                   (0.5, "free some disk space: results and checkpoints need at least 0.5 GB"),
                   (5, "free some disk space: the real datasets and results need about 5 GB"))


def check_devices(found: Sequence[dict[str, Any]]) -> list[Check]:
    """One check per GPU: what it is, and whether a few training steps there agree with the CPU's."""
    if not found:
        return [_ok("devices", "no accelerator: the CPU is the reference, nothing to compare")]
    checks = []
    for d in found:
        name = d["name"]
        if d.get("error"):
            checks.append(Check(f"device {name}", "fail", f"training on {name} failed: {d['error']}",
                                f"update the {name} driver and torch build, or run with --device cpu"))
        elif d["parity"].ok:
            checks.append(_ok(f"device {name}", f"{d['description']}: {d['parity'].summary()}"))
        else:
            checks.append(Check(f"device {name}", "fail", f"{d['description']}: {d['parity'].summary()}",
                                f"do not trust training on {name}: update its driver / torch build, "
                                "or pick the CPU (`--device cpu`, `DEVICE=cpu`)"))
    return checks


def check_compiler(compiler: dict[str, Any], system: str = "Linux") -> Check:
    """The C++ compiler and Python headers that torch.compile needs to build its CPU kernels."""
    py, cxx = compiler.get("python", "3.11"), compiler.get("cxx")
    fixes = {"Linux": f"Debian/Ubuntu: `sudo apt-get install g++ python{py}-dev` (other distributions: their g++ "
                      f"and Python {py} development packages)",
             "Darwin": "macOS: `xcode-select --install` (the Command Line Tools bring clang++ as c++)",
             "Windows": f"use WSL2 (Ubuntu) and, there, `sudo apt-get install g++ python{py}-dev`"}
    fix = fixes.get(system, fixes["Linux"])
    if compiler.get("cxx_env") and not cxx:
        problem = f"$CXX is {compiler['cxx_env']!r}, which is not found"
        fix = f"point CXX at an installed compiler or unset it; {fix}"
    elif not cxx:
        problem = "no C++ compiler ($CXX unset, no g++ or c++ on PATH)"
    elif not compiler.get("runs", True):
        problem = f"{cxx} does not run ({compiler.get('version') or 'no output'})"
    elif not compiler.get("python_h"):
        problem = f"{cxx} found, but Python.h is missing from {compiler.get('include')}"
        if system == "Darwin":
            fix = (f"reinstall Python {py} from python.org or with Homebrew (`brew install python@{py}`): "
                   "both ship the headers")
    else:
        source = "$CXX" if compiler.get("cxx_env") else "PATH"
        return _ok("c++ compiler", f"{cxx} (from {source}; {compiler.get('version') or 'version unknown'}) "
                                   "and Python.h: torch.compile can build CPU kernels")
    return Check("c++ compiler", "fail", f"{problem}: torch.compile on the CPU cannot build its kernels (chapter 03 "
                 "and the compiled arms of later chapters)", fix)


def check_platform(plat: dict[str, Any]) -> list[Check]:
    """The platform, then one ``limit ...`` warning per thing the course cannot do there (docs/hardware.md)."""
    system, label = plat.get("system", ""), platform_label(plat)
    limits = []
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
        ]
    if system == "Windows":
        limits.append(Check("limit windows", "warn", "Windows: make, torchrun's launches and mpirun need a Linux shell",
                            "use WSL2 (`wsl --install`, Ubuntu) and run the course there"))
    where = label + (" (WSL2)" if plat.get("wsl") else "")
    if label not in PLATFORM_LABELS.values():
        head = Check("platform", "warn", f"{where} is not one of the platforms the pins are checked on "
                     f"({', '.join(sorted(set(PLATFORM_LABELS.values())))}); `make setup` may fail here",
                     "use one of those platforms; `make platforms` resolves the pins for each")
    else:
        head = _ok("platform", f"{where}: {len(limits) or 'no'} platform limit(s){', listed below' if limits else ''}")
    return [head, *limits]


def judge(facts: dict[str, Any]) -> list[Check]:
    """Every check, from facts shaped like ``gather()``'s (after a torch that does not import, the first three)."""
    py = facts["python"]
    checks = [check_python(py["version"], py["supported"], py.get("prefix", ""), py.get("course_env", True),
                           py.get("executable", "")),
              check_pins(facts.get("pins", [])), check_torch_build(facts.get("torch", {}))]
    if "fingerprint" not in facts:
        return checks
    plat, fingerprint = facts["platform"], facts["fingerprint"]
    system = plat.get("system", "Linux")
    allocators = [check_allocators(facts["allocators"])] if system == "Linux" else []  # elsewhere: a limit
    return [*checks, *check_devices(facts["devices"]), check_cpu(fingerprint),
            check_isa(facts["isa"], plat.get("machine", "x86_64"), system), check_compiler(facts["compiler"], system),
            *check_platform(plat), check_ipex(facts["ipex_env"], plat),
            check_pruning(facts.get("imports"), fingerprint.get("versions", {}), plat.get("left_out", [])),
            *allocators, check_mpirun(*facts["mpirun"], system=system), check_kernel(facts["kernel"]),
            check_memory(facts["memory"]["available"], facts["memory"]["total"]), check_disk(facts["disk"])]


def report(checks: Sequence[Check], fingerprint: dict[str, Any]) -> dict[str, Any]:
    """The content of ``doctor.json``: version, fingerprint (with the private machine id), checks, summary."""
    return {"version": DOCTOR_VERSION, "fingerprint": fingerprint, "checks": [asdict(c) for c in checks],
            "summary": {s: sum(c.status == s for c in checks) for s in STATUSES}}


def format_checks(checks: Sequence[Check]) -> str:
    """Aligned text, one line per check and the fix beneath warnings and failures, then the counts."""
    width = max((len(c.name) for c in checks), default=0)
    marks = {"ok": "ok  ", "warn": "WARN", "fail": "FAIL"}
    lines = []
    for c in checks:
        lines.append(f"[{marks[c.status]}] {c.name.ljust(width)}  {c.message}")
        if c.fix:
            lines.append(f"       {' ' * width}  fix: {c.fix}")
    counts = report(checks, {})["summary"]
    lines.append(f"{counts['ok']} ok, {counts['warn']} warning(s), {counts['fail']} failure(s)"
                 + (": the course cannot run until the failures are fixed" if counts["fail"] else ""))
    return "\n".join(lines)


def run(out: Path | str | None = None, *, imports: bool = True) -> tuple[list[Check], dict[str, Any], Path]:
    """Gather, judge, write ``doctor.json``; returns checks, report, path."""
    facts = gather(imports=imports)
    checks = judge(facts)
    payload = report(checks, {**facts.get("fingerprint", {}), "machine_id": system.machine_id()})
    path = Path(out) if out is not None else results.results_dir() / "doctor.json"
    files.atomic_write_text(path, json.dumps(workshop.redact(payload, all_paths=False), indent=2, default=str) + "\n")
    return checks, payload, path


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m helpers.course.doctor", description=__doc__.splitlines()[0])
    p.add_argument("--out", default=None, help="where to write doctor.json (default results/doctor.json)")
    p.add_argument("--no-imports", action="store_true",
                   help="skip importing NNI and Torch-Pruning in a child process (faster, less sure)")
    args = p.parse_args(argv)
    start = time.perf_counter()
    print("Checking the course setup (10-30 s) ...", flush=True)
    checks, _, path = run(args.out, imports=not args.no_imports)
    path, here = path.resolve(), Path.cwd().resolve()
    text = f"{format_checks(checks)}\nwrote {path.relative_to(here) if path.is_relative_to(here) else path}"
    print(workshop.redact_text(text, all_paths=False) + f" in {time.perf_counter() - start:.0f} s")
    return 1 if any(c.status == "fail" for c in checks) else 0


if __name__ == "__main__":
    sys.exit(main())
