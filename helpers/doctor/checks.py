"""The doctor's judgement: each ``check_*`` turns facts (plain values, as ``gather`` collects them)
into a :class:`Check` -- ok, warn or fail, with a one-line fix -- and ``judge`` runs them all.

Nothing here looks at the machine, so every check is tested with made-up facts -- a fake Linux
aarch64, macOS or Windows included. The platform's limits and the compiler check live in
``helpers.doctor.platforms`` (re-exported here); a finding is a ``helpers.doctor.finding.Check``.
"""

from __future__ import annotations

import re
from typing import Any, Sequence

from .finding import STATUSES, Check, ok as _ok  # noqa: F401  (Check and STATUSES are part of this module's API)
from .platforms import (APT_COMMAND, APT_LINE, LEFT_OUT_LIMITS, PLATFORM_LABELS, X86_MACHINES,  # noqa: F401
                        check_compiler, check_platform, platform_label)
#: Packages without which no chapter runs; any other pinned package missing is a warning.
CORE_PACKAGES: frozenset[str] = frozenset({"torch", "torchvision", "matplotlib", "tqdm", "psutil", "threadpoolctl",
                                           "jupyterlab", "nbval"})



# --- judging the facts ------------------------------------------------------------------------

def supported_minors(requires: str | None) -> list[str]:
    """The Python minor versions ``requires`` admits (``">=3.11,<3.14"`` -> ``["3.11", "3.12", "3.13"]``)."""
    if not requires:
        return []
    from packaging.specifiers import SpecifierSet

    spec = SpecifierSet(requires)
    return [f"3.{m}" for m in range(8, 30) if spec.contains(f"3.{m}.0") or spec.contains(f"3.{m}.99")]


def _listed(items: Sequence[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " or " + items[-1]


def check_python(version: Sequence[int], requires: str | None, prefix: str = "", course_env: bool = True,
                 executable: str = "") -> Check:
    """The Python that runs the doctor (version, path) against the package's ``Requires-Python``, and
    which environment it is."""
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
        from packaging.specifiers import SpecifierSet

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
    """The instruction sets that decide the CPU results: AVX2, AVX-512, AVX512-BF16, AMX (x86 only; the
    flags come from Linux's /proc/cpuinfo, so elsewhere they are unknown rather than absent)."""
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
    """The IPEX environment (``helpers.ipex_support.environment``: torch 2.8 + IPEX 2.8 + the course package),
    always with IPEX's retired status; where IPEX has no wheels, that instead of the setup command."""
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
    checks = [check_python(py["version"], py.get("requires"), py.get("prefix", ""), py.get("course_env", True),
                           py.get("executable", "")),
              check_pins(facts.get("pins", [])), check_torch_build(facts.get("torch", {}))]
    if "fingerprint" not in facts:
        return checks
    from ..ipex_support import RETIREMENT_NOTE, SETUP_COMMAND

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
