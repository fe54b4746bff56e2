"""What the platform allows the course: the platform's limits (from the pins' environment markers) and
the C++ compiler with Python headers that torch.compile needs, each judged from plain facts into a
``Check`` with that platform's own fix (Debian/Ubuntu, macOS, Windows through WSL2)."""

from __future__ import annotations

import re
from typing import Any, Sequence

from .finding import Check
from .finding import ok as _ok

#: The fix for a missing mpirun or allocator on Debian/Ubuntu (one line installs all three).
APT_COMMAND = "`sudo apt-get install openmpi-bin libjemalloc2 libtcmalloc-minimal4`"
APT_LINE = f"Debian/Ubuntu: {APT_COMMAND}"
#: The platforms the pins are checked on (``helpers.install.PLATFORMS``), by (system, machine).
PLATFORM_LABELS: dict[tuple[str, str], str] = {
    ("Linux", "x86_64"): "Linux x86-64", ("Linux", "aarch64"): "Linux aarch64", ("Linux", "arm64"): "Linux aarch64",
    ("Darwin", "arm64"): "macOS arm64", ("Windows", "AMD64"): "Windows x86-64", ("Windows", "x86_64"): "Windows x86-64",
}
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


def platform_label(plat: dict[str, Any]) -> str:
    """'Linux x86-64', 'Linux aarch64', 'macOS arm64', 'Windows x86-64', else 'SYSTEM MACHINE'."""
    system, machine = plat.get("system", ""), plat.get("machine", "")
    return PLATFORM_LABELS.get((system, machine), f"{system} {machine}".strip() or "unknown platform")


def check_platform(plat: dict[str, Any], accelerators: Sequence[str] = ()) -> list[Check]:
    """The platform, then one ``limit ...`` warning per thing the course cannot do there, and why.

    The limits come from the facts: pins whose environment markers leave them out here
    (``left_out``), LD_PRELOAD (Linux only), the torchrun chapters and ``mps`` on macOS, and the
    shell tools on Windows. IPEX's own limit is the ``ipex`` check's.
    """
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
