"""The doctor's judgement: each ``check_*`` turns facts (plain values, as ``gather`` collects them)
into a :class:`Check` -- ok, warn or fail, with a one-line fix -- and ``judge`` runs them all.

Nothing here looks at the machine, so every check is tested with made-up facts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

STATUSES: tuple[str, ...] = ("ok", "warn", "fail")
#: Packages without which no chapter runs; any other pinned package missing is a warning.
CORE_PACKAGES: frozenset[str] = frozenset({"torch", "torchvision", "matplotlib", "tqdm", "psutil", "threadpoolctl",
                                           "jupyterlab", "nbval"})


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


def judge(facts: dict[str, Any]) -> list[Check]:
    """Every check, from facts shaped like ``gather()``'s (missing facts are skipped)."""
    py = facts["python"]
    checks = [check_python(py["version"], py.get("requires"), py.get("prefix", ""), py.get("course_env", True)),
              check_pins(facts.get("pins", [])), check_torch_build(facts.get("torch", {}))]
    if "fingerprint" not in facts:
        return checks
    from ..ipex_support import RETIREMENT_NOTE

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
