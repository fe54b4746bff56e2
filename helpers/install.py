"""Install steps of the course's environments, their keys, and the pins' platform check.

IPEX (``ipex_*``) and XPU (``xpu_*``) environments, keys (``env_key``, ``ipex_venv``: py3.X + hash of the pins),
``check_platforms`` (make platforms); docs/environments.md explains each; make setup's lock: helpers.build_lock.
Standard library only: the system python3 runs it before anything is installed."""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shlex
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

XPU_INDEX = "https://download.pytorch.org/whl/xpu"
FROM_TORCH_INDEX: tuple[str, ...] = ("torch", "torchvision")
LEFT_OUT: dict[str, str] = {}
UNPINNED: dict[str, str] = {
    "intel-openmp": "the XPU build of torch requires Intel's runtime packages at versions of its own",
}
REQUIREMENTS_FILE = "xpu-requirements.txt"
CONSTRAINTS_FILE = "xpu-constraints.txt"
ROOT = Path(__file__).resolve().parent.parent

_REQUIREMENT = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:==\s*([^;\s]+))?\s*(;.*)?$")


class InstallError(RuntimeError):
    """A pin this module cannot read, or an environment that failed its check."""


def normalize(name: str) -> str:
    """A distribution name as pip compares it (PEP 503): lower case, runs of -_. as one dash."""
    return re.sub(r"[-_.]+", "-", name).lower()


def parse_pin(line: str) -> tuple[str, str | None, str]:
    """``"name==1.0; marker"`` -> (normalized name, version or None, marker text without ';')."""
    match = _REQUIREMENT.match(line)
    if not match:
        raise InstallError(f"cannot read the requirement {line!r}: the course pins are 'name==version[; marker]'")
    name, version, marker = match.groups()
    return normalize(name), version, (marker or "").lstrip(";").strip()


def course_requirements(pyproject: Path | str = ROOT / "pyproject.toml", extras: Sequence[str] = ("test",)) -> list[str]:
    """The pins of ``[project] dependencies`` plus those of the named optional extras, as written."""
    project = tomllib.loads(Path(pyproject).read_text())["project"]
    optional = project.get("optional-dependencies", {})
    unknown = [e for e in extras if e not in optional]
    if unknown:
        raise InstallError(f"pyproject.toml has no extra {', '.join(unknown)} (it has {', '.join(optional) or 'none'})")
    return list(project["dependencies"]) + [r for e in extras for r in optional[e]]


@dataclass(frozen=True)
class XpuPlan:
    """What goes where: torch/torchvision from the XPU index, the rest from PyPI under constraints."""

    torch_requirements: list[str]
    requirements: list[str]
    constraints: list[str]
    left_out: list[str]
    project_name: str


def xpu_plan(pyproject: Path | str = ROOT / "pyproject.toml") -> XpuPlan:
    """Split the course's pins into the XPU environment's three install steps."""
    torch_reqs: dict[str, str] = {}
    rest, left_out = [], []
    for line in course_requirements(pyproject):
        name, version, marker = parse_pin(line)
        if name in FROM_TORCH_INDEX:
            if version is None:
                raise InstallError(f"{name} must be pinned with == in pyproject.toml (found {line!r})")
            torch_reqs[name] = version
        elif name in LEFT_OUT:
            left_out.append(name)
        elif name in UNPINNED:
            rest.append(name + (f"; {marker}" if marker else ""))
        else:
            rest.append(line.strip())
    missing = [n for n in FROM_TORCH_INDEX if n not in torch_reqs]
    if missing:
        raise InstallError(f"pyproject.toml pins no {', '.join(missing)}")
    project_name = tomllib.loads(Path(pyproject).read_text())["project"]["name"]
    return XpuPlan(torch_requirements=[f"{n}=={v}" for n, v in torch_reqs.items()], requirements=rest,
                   constraints=[f"{n}=={v}+xpu" for n, v in torch_reqs.items()], left_out=left_out,
                   project_name=normalize(project_name))


def write_files(plan: XpuPlan, folder: Path | str) -> tuple[Path, Path]:
    """Write the requirements and constraints files of ``plan`` into ``folder``; return their paths."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    req, con = folder / REQUIREMENTS_FILE, folder / CONSTRAINTS_FILE
    head = "# Written by python -m helpers.install from pyproject.toml; do not edit (it is rewritten).\n"
    req.write_text(head + "".join(f"{r}\n" for r in plan.requirements))
    con.write_text(head + "# torch and torchvision stay the XPU builds installed from " + XPU_INDEX + "\n"
                   + "".join(f"{c}\n" for c in plan.constraints))
    return req, con


def xpu_commands(plan: XpuPlan, python: str, folder: Path | str, project: Path | str = ROOT) -> list[list[str]]:
    """The commands that install the XPU environment with ``python`` (files from ``write_files`` in ``folder``)."""
    folder = Path(folder)
    pip = [python, "-m", "pip", "install", "--quiet"]
    check = ("import torch, torchvision; v = torch.__version__; "
             "assert v.endswith('+xpu'), f'expected the XPU build of torch, found {v}'; "
             "print('torch', v, '| torchvision', torchvision.__version__, '| xpu available:', torch.xpu.is_available())")
    return [
        pip + plan.torch_requirements + ["--index-url", XPU_INDEX],
        pip + ["-r", str(folder / REQUIREMENTS_FILE), "-c", str(folder / CONSTRAINTS_FILE)],
        pip + ["--no-deps", "-e", str(project)],
        [python, "-c", check],
    ]


def unexpected_pip_check_lines(output: str, plan: XpuPlan) -> list[str]:
    """Lines of ``pip check`` output other than the ones this plan causes on purpose: the course
    package's own metadata naming a left-out or unpinned package. (Its ``torch==2.8.0`` is met by
    ``2.8.0+xpu``: a local build label does not count against an exact pin, PEP 440.)"""
    expected = set(plan.left_out) | set(UNPINNED)
    out = []
    for line in output.splitlines():
        line = line.strip()
        if not line or line.startswith("No broken requirements"):
            continue
        words = line.split()
        if normalize(words[0]) == plan.project_name and any(
                normalize(w.strip(",.")) in expected or normalize(w.split("=")[0]) in expected for w in words[2:]):
            continue
        out.append(line)
    return out


# ----------------------------------------------------------------------------------------
# The IPEX environment
# ----------------------------------------------------------------------------------------

DEFAULT_CACHE = Path.home() / ".cache" / "accelerate-course"
"""Where the course's environments live (the Makefile's ``CACHE``)."""


def ipex_pins(pyproject: Path | str = ROOT / "pyproject.toml") -> list[str]:
    """The IPEX environment's pins: ``[tool.course.ipex-environment] dependencies``."""
    tool = tomllib.loads(Path(pyproject).read_text()).get("tool", {}).get("course", {})
    pins = tool.get("ipex-environment", {}).get("dependencies")
    if not pins:
        raise InstallError("pyproject.toml has no [tool.course.ipex-environment] dependencies")
    for line in pins:
        if parse_pin(line)[1] is None:
            raise InstallError(f"the IPEX environment's pins must be exact (name==version): {line!r}")
    return list(pins)


def supported_pythons(pyproject: Path | str = ROOT / "pyproject.toml") -> list[str]:
    """The minor versions ``requires-python`` admits (``">=3.11,<3.14"`` -> ``["3.11", "3.12", "3.13"]``)."""
    spec = tomllib.loads(Path(pyproject).read_text())["project"]["requires-python"]
    low = re.search(r">=\s*3\.(\d+)", spec)
    high = re.search(r"<\s*3\.(\d+)", spec)
    if not (low and high):
        raise InstallError(f"requires-python must read '>=3.X,<3.Y' (found {spec!r})")
    return [f"3.{m}" for m in range(int(low.group(1)), int(high.group(1)))]


def python_tag(version: Sequence[int] | None = None) -> str:
    """``"py3.12"`` for Python 3.12 (default: the running Python): the part of an environment's key that
    keeps clones on different Pythons apart."""
    major, minor = (version or sys.version_info)[:2]
    return f"py{major}.{minor}"


def env_key(pyproject: Path | str = ROOT / "pyproject.toml", version: Sequence[int] | None = None) -> str:
    """The default (and XPU) environment's key, ``py3.X-<12 hex digits>``: the Python minor version and a hash
    of the pins only (requires-python, dependencies, extras, as parsed TOML), never of dates or layout."""
    project = tomllib.loads(Path(pyproject).read_text())["project"]
    pins = [project["requires-python"], project["dependencies"], project.get("optional-dependencies", {})]
    digest = hashlib.sha256(json.dumps(pins, sort_keys=True).encode()).hexdigest()[:12]
    return f"{python_tag(version)}-{digest}"


def pins_key(pins: Sequence[str]) -> str:
    """12 hex digits that change whenever a pin changes (and never for comments or layout)."""
    return hashlib.sha256(json.dumps(sorted(pins)).encode()).hexdigest()[:12]


def ipex_venv(cache: Path | str | None = None, pyproject: Path | str = ROOT / "pyproject.toml",
              version: Sequence[int] | None = None) -> Path:
    """The IPEX environment's folder: ``<cache>/venv-ipex-py3.X-<key of its pins>`` (default: this Python's 3.X)."""
    return Path(cache or DEFAULT_CACHE) / f"venv-ipex-{python_tag(version)}-{pins_key(ipex_pins(pyproject))}"


def ipex_supported(system: str | None = None, machine: str | None = None) -> bool:
    """IPEX 2.8.0 publishes CPU wheels for Linux x86-64 only."""
    import platform  # noqa: PLC0415

    return (system or platform.system()) == "Linux" and (machine or platform.machine()) in ("x86_64", "AMD64")


def ipex_commands(python: str, pins: Sequence[str], project: Path | str = ROOT) -> list[list[str]]:
    """The commands that install the IPEX environment into the venv of ``python``."""
    pip = [python, "-m", "pip", "install", "--quiet"]
    check = ("import importlib.metadata as m, torch; "
             "print('IPEX environment: torch', torch.__version__, '| intel-extension-for-pytorch', "
             "m.version('intel-extension-for-pytorch'))")
    return [pip + list(pins), pip + ["--no-deps", "-e", str(project)], [python, "-c", check]]


def course_environments(cache: Path | str | None = None) -> list[Path]:
    """Every course environment in ``cache``: the folders ``venv-*`` (default, IPEX, XPU; any pins and Python),
    links to them included (an environment renamed when its key changed keeps its old name as a link)."""
    folder = Path(cache or DEFAULT_CACHE)
    return sorted(p for p in folder.glob("venv-*") if p.is_dir()) if folder.is_dir() else []


def folder_size(path: Path | str) -> int:
    """Bytes of the files under ``path`` (links not followed)."""
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                pass
    return total


# ----------------------------------------------------------------------------------------
# The pins on other platforms
# ----------------------------------------------------------------------------------------

PLATFORMS: dict[str, str] = {
    "Linux x86-64": "x86_64-manylinux_2_28",
    "Linux aarch64": "aarch64-manylinux_2_28",
    "macOS arm64 (14 or later)": "aarch64-apple-darwin",
    "Windows x86-64": "x86_64-pc-windows-msvc",
}
"""The platforms the default pins must install on, as uv's ``--python-platform`` names them."""
MACOS_TARGET = "14.0"


IPEX_PLATFORM = "Linux x86-64"
"""The one platform the IPEX environment's pins are resolved for (IPEX publishes no other CPU wheels)."""


def platform_command(python: str, requirements: Path | str, platform_name: str, python_version: str = "3.11") -> list[str]:
    """``uv pip compile`` of ``requirements`` for one of ``PLATFORMS`` and one Python version, wheels only."""
    return [python, "-m", "uv", "pip", "compile", str(requirements), "--python-version", python_version,
            "--python-platform", PLATFORMS[platform_name], "--only-binary", ":all:", "--no-header",
            "--quiet", "--no-annotate"]


def check_platforms(python: str = sys.executable, pyproject: Path | str = ROOT / "pyproject.toml",
                    folder: Path | str | None = None) -> dict[tuple[str, str, str], str]:
    """Resolve the default pins for every platform x supported Python, and the IPEX environment's pins for
    Linux x86-64 x every Python; returns {(environment, platform, Python): "" if ok, else uv's error}."""
    import tempfile  # noqa: PLC0415

    folder = Path(folder or tempfile.mkdtemp(prefix="course-platforms-"))
    default, ipex = folder / "course-requirements.txt", folder / "ipex-requirements.txt"
    default.write_text("".join(f"{r}\n" for r in course_requirements(pyproject)))
    ipex.write_text("".join(f"{r}\n" for r in ipex_pins(pyproject)))
    env = {**os.environ, "MACOSX_DEPLOYMENT_TARGET": MACOS_TARGET}
    jobs = [("default", name, version, default) for version in supported_pythons(pyproject) for name in PLATFORMS]
    jobs += [("IPEX", IPEX_PLATFORM, version, ipex) for version in supported_pythons(pyproject)]
    out = {}
    for kind, name, version, req in jobs:
        proc = subprocess.run(platform_command(python, req, name, version), capture_output=True, text=True, env=env)
        out[(kind, name, version)] = "" if proc.returncode == 0 else tail_lines(proc.stderr or proc.stdout)
    return out


def tail_lines(text: str, lines: int = 6) -> str:
    """The last ``lines`` non-empty lines of ``text``."""
    return "\n".join([ln for ln in text.strip().splitlines() if ln.strip()][-lines:])


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m helpers.install", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    setup = sub.add_parser("setup", help="install the environment into the running Python's venv")
    setup.add_argument("--device", choices=["xpu"], required=True)
    setup.add_argument("--python", default=sys.executable, help="the environment's Python (default: this one)")
    setup.add_argument("--folder", default=sys.prefix, help="where to write the requirement files (default: the venv)")
    setup.add_argument("--project", default=str(ROOT), help="the course's clone (default: this one)")
    setup.add_argument("--dry-run", action="store_true", help="write the files and print the commands, run nothing")
    check = sub.add_parser("check", help="pip check, accepting only the differences the plan makes on purpose")
    check.add_argument("--device", choices=["xpu"], required=True)
    check.add_argument("--python", default=sys.executable)
    sub.add_parser("env-key", help="print the default environment's key: py3.X-<hash of the pins>")
    venv = sub.add_parser("ipex-venv", help="print the IPEX environment's folder (keyed by its pins and this Python)")
    venv.add_argument("--cache", default=None, help=f"where the environments live (default {DEFAULT_CACHE})")
    ipex = sub.add_parser("setup-ipex", help="install the IPEX environment into the venv of --python")
    ipex.add_argument("--python", default=sys.executable)
    ipex.add_argument("--project", default=str(ROOT))
    ipex.add_argument("--dry-run", action="store_true")
    sub.add_parser("platforms", help="resolve the pins for Linux x86-64/aarch64, macOS arm64, Windows x every Python")
    envs = sub.add_parser("environments", help="list the course environments in the cache, or remove them")
    envs.add_argument("--cache", default=None)
    envs.add_argument("--keep", nargs="*", default=[], help="folders that are in use (listed as such)")
    envs.add_argument("--remove", action="store_true", help="remove every course environment and say how much it freed")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "env-key":
        print(env_key())
        return 0
    if args.command == "ipex-venv":
        print(ipex_venv(args.cache))
        return 0
    if args.command == "setup-ipex":
        if not ipex_supported():
            raise InstallError("IPEX 2.8.0 publishes CPU wheels for Linux x86-64 only: chapter 04's IPEX arms "
                               "need such a machine (the rest of the course runs without them)")
        for cmd in ipex_commands(args.python, ipex_pins(), args.project):
            print("+", shlex.join(cmd), flush=True)
            if not args.dry_run:
                subprocess.run(cmd, check=True)
        return 0
    if args.command == "environments":
        import shutil  # noqa: PLC0415

        keep = {Path(k).resolve() for k in args.keep}
        found = course_environments(args.cache)
        if args.remove:
            freed = 0
            for env in found:
                if env.is_symlink():  # an old name kept for a renamed environment: the link only
                    env.unlink()
                    continue
                freed += folder_size(env)
                shutil.rmtree(env, ignore_errors=True)
            print(f"removed {len(found)} course environment(s), {freed / 1e9:.1f} GB freed")
            return 0
        older = [e for e in found if e.resolve() not in keep]
        if older:
            print(f"{len(older)} other course environment(s) in {Path(args.cache or DEFAULT_CACHE)} "
                  f"(older pins; `make clean-venv` removes every one): " + ", ".join(e.name for e in older))
        return 0
    if args.command == "platforms":
        failed = {}
        for (kind, name, version), error in check_platforms().items():
            label = f"{kind + ' pins,':<14}{name:<28} Python {version}"
            print(f"{label:<58} {'resolves' if not error else 'FAILS'}", flush=True)
            if error:
                failed[label] = error
        for label, error in failed.items():
            print(f"\n{label}:\n  " + error.replace("\n", "\n  "), file=sys.stderr)
        return 1 if failed else 0
    plan = xpu_plan()
    if args.command == "setup":
        write_files(plan, args.folder)
        print(f"XPU environment: torch/torchvision from {XPU_INDEX}"
              + (f"; left out: {', '.join(plan.left_out)} ({'; '.join(LEFT_OUT[n] for n in plan.left_out)})"
                 if plan.left_out else ""))
        for cmd in xpu_commands(plan, args.python, args.folder, args.project):
            print("+", shlex.join(cmd), flush=True)
            if not args.dry_run:
                subprocess.run(cmd, check=True)
        return 0
    proc = subprocess.run([args.python, "-m", "pip", "check"], capture_output=True, text=True)
    bad = unexpected_pip_check_lines(proc.stdout + proc.stderr, plan)
    if bad:
        print("pip check found problems the XPU plan does not explain:\n  " + "\n  ".join(bad), file=sys.stderr)
        return 1
    print("pip check: ok for the XPU environment"
          + (f" ({', '.join(plan.left_out)} left out on purpose)" if plan.left_out else ""))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except (InstallError, subprocess.CalledProcessError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(1)
