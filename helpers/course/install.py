"""The course's environments: ``python -m helpers.course.install`` (make setup, setup-ipex, platforms, clean-venv).

Install steps of the XPU and IPEX environments, their keys (py3.X + a hash of the pins), the pins' check on
other platforms, and a build under a lock (``lock``: one clone builds, the others wait, then reuse it).
Standard library only until the lock: the system python3 runs it first. Why: docs/environments.md."""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from ..envs import DEFAULT_CACHE, ROOT, ipex_venv, pins_key, python_tag  # noqa: F401  (part of this module's API)

XPU_INDEX = "https://download.pytorch.org/whl/xpu"
FROM_TORCH_INDEX: tuple[str, ...] = ("torch", "torchvision")
UNPINNED: dict[str, str] = {
    "intel-openmp": "the XPU build of torch requires Intel's runtime packages at versions of its own",
}
REQUIREMENTS_FILE = "xpu-requirements.txt"
CONSTRAINTS_FILE = "xpu-constraints.txt"

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
    project_name: str


def xpu_plan(pyproject: Path | str = ROOT / "pyproject.toml") -> XpuPlan:
    """Split the course's pins into the XPU environment's three install steps."""
    torch_reqs: dict[str, str] = {}
    rest = []
    for line in course_requirements(pyproject):
        name, version, marker = parse_pin(line)
        if name in FROM_TORCH_INDEX:
            if version is None:
                raise InstallError(f"{name} must be pinned with == in pyproject.toml (found {line!r})")
            torch_reqs[name] = version
        elif name in UNPINNED:
            rest.append(name + (f"; {marker}" if marker else ""))
        else:
            rest.append(line.strip())
    missing = [n for n in FROM_TORCH_INDEX if n not in torch_reqs]
    if missing:
        raise InstallError(f"pyproject.toml pins no {', '.join(missing)}")
    project_name = tomllib.loads(Path(pyproject).read_text())["project"]["name"]
    return XpuPlan(torch_requirements=[f"{n}=={v}" for n, v in torch_reqs.items()], requirements=rest,
                   constraints=[f"{n}=={v}+xpu" for n, v in torch_reqs.items()], project_name=normalize(project_name))


def write_files(plan: XpuPlan, folder: Path | str) -> tuple[Path, Path]:
    """Write the requirements and constraints files of ``plan`` into ``folder``; return their paths."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    req, con = folder / REQUIREMENTS_FILE, folder / CONSTRAINTS_FILE
    head = "# Written by python -m helpers.course.install from pyproject.toml; do not edit (it is rewritten).\n"
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
    """``pip check`` lines other than the course package's own metadata naming an ``UNPINNED`` package."""
    out = []
    for line in output.splitlines():
        line = line.strip()
        if not line or line.startswith("No broken requirements"):
            continue
        words = line.split()
        if normalize(words[0]) == plan.project_name and any(
                normalize(w.strip(",.")) in UNPINNED or normalize(w.split("=")[0]) in UNPINNED for w in words[2:]):
            continue
        out.append(line)
    return out


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


def env_key(pyproject: Path | str = ROOT / "pyproject.toml", version: Sequence[int] | None = None) -> str:
    """The default (and XPU) environment's key: ``py3.X-`` and 12 hex digits of a hash of the parsed pins."""
    project = tomllib.loads(Path(pyproject).read_text())["project"]
    pins = [project["requires-python"], project["dependencies"], project.get("optional-dependencies", {})]
    digest = hashlib.sha256(json.dumps(pins, sort_keys=True).encode()).hexdigest()[:12]
    return f"{python_tag(version)}-{digest}"


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
    """Every ``venv-*`` folder in ``cache`` (default, IPEX, XPU; any pins and Python), links included."""
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


def check_platforms(python: str = sys.executable, pyproject: Path | str = ROOT / "pyproject.toml",
                    folder: Path | str | None = None) -> dict[tuple[str, str, str], str]:
    """Resolve the default pins per platform and Python, the IPEX pins on Linux x86-64; {key: uv's error or ""}."""
    folder = Path(folder or tempfile.mkdtemp(prefix="course-platforms-"))
    default, ipex = folder / "course-requirements.txt", folder / "ipex-requirements.txt"
    default.write_text("".join(f"{r}\n" for r in course_requirements(pyproject)))
    ipex.write_text("".join(f"{r}\n" for r in ipex_pins(pyproject)))
    env = {**os.environ, "MACOSX_DEPLOYMENT_TARGET": MACOS_TARGET}
    jobs = [("default", name, version, default) for version in supported_pythons(pyproject) for name in PLATFORMS]
    jobs += [("IPEX", IPEX_PLATFORM, version, ipex) for version in supported_pythons(pyproject)]
    out = {}
    for kind, name, version, req in jobs:  # uv pip compile for one platform and Python, wheels only
        cmd = [python, "-m", "uv", "pip", "compile", str(req), "--python-version", version, "--python-platform",
               PLATFORMS[name], "--only-binary", ":all:", "--no-header", "--quiet", "--no-annotate"]
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
        out[(kind, name, version)] = "" if proc.returncode == 0 else tail_lines(proc.stderr or proc.stdout)
    return out


def tail_lines(text: str, lines: int = 6) -> str:
    """The last ``lines`` non-empty lines of ``text``."""
    return "\n".join([ln for ln in text.strip().splitlines() if ln.strip()][-lines:])


def lock_path(venv: Path | str) -> Path:
    """The lock file of an environment's build: ``<venv>.lock``, beside the folder (its build removes the folder)."""
    venv = Path(venv)
    return venv.with_name(venv.name + ".lock")


def filelock_requirement(pyproject: Path | str = ROOT / "pyproject.toml") -> str:
    """filelock as the course pins it (torch depends on it), else unpinned: what the lock tool installs."""
    for line in course_requirements(pyproject, extras=()):
        name, version, _ = parse_pin(line)
        if name == "filelock":
            return f"filelock=={version}" if version else "filelock"
    return "filelock"


def venv_python(venv: Path | str) -> Path:
    """The Python of the venv in ``venv``."""
    return Path(venv) / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def _make_lock_tool(folder: Path) -> None:
    """A venv in ``folder`` with filelock only (seconds; needs the package index)."""
    for cmd in ([sys.executable, "-m", "venv", str(folder)],
                [str(venv_python(folder)), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                 filelock_requirement()]):
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode:
            raise InstallError(f"could not make the lock tool ({shlex.join(cmd)}): "
                               f"{tail_lines(proc.stderr or proc.stdout, 3)}; check the network and run make again")


def lock_tool(cache: Path | str, make: Callable[[Path], None] = _make_lock_tool) -> Path:
    """The Python of ``<cache>/.lock-tool-py3.X`` (a venv with filelock), made once and renamed into place."""
    cache = Path(cache)
    final = cache / f".lock-tool-{python_tag()}"
    if venv_python(final).exists() and subprocess.run([str(venv_python(final)), "-c", "import filelock"],
                                                      capture_output=True).returncode == 0:
        return venv_python(final)
    cache.mkdir(parents=True, exist_ok=True)
    print(f"Making the lock tool of the course environments (filelock, once per Python): {final}", flush=True)
    private = Path(tempfile.mkdtemp(prefix=final.name + ".tmp-", dir=cache))
    try:
        make(private)
        if final.exists():  # a broken one: move it aside in one step, then remove it
            aside = Path(tempfile.mkdtemp(prefix=final.name + ".old-", dir=cache))
            try:
                os.replace(final, aside / "x")
            except OSError:
                pass
            shutil.rmtree(aside, ignore_errors=True)
        try:
            os.rename(private, final)
        except OSError:  # another clone's went in first: use that one
            pass
    finally:
        shutil.rmtree(private, ignore_errors=True)
    return venv_python(final)


def build_locked(venv: Path | str, command: Sequence[str], say: Callable[[str], None] = print,
                 note_every: float = 60.0) -> int:
    """Run ``command`` (it builds ``venv``, then writes ``<venv>/.installed``) holding ``<venv>.lock``."""
    from .. import locks  # noqa: PLC0415  (filelock: not importable before the lock tool runs this)

    venv, path = Path(venv), lock_path(venv)
    what = f"the build of {venv}"
    try:
        with locks.hold(path, wait=0, what=what):
            return _build(venv, command, say, waited=False)
    except locks.Held:
        pass
    say(f"Another `make setup` is building {venv} ({locks.describe(locks.holder(path))}): "
        f"waiting for it to finish, then reusing it")
    minutes = 0.0
    while True:
        try:
            with locks.hold(path, wait=note_every, what=what):
                return _build(venv, command, say, waited=True)
        except locks.Held:
            minutes += note_every / 60
            say(f"... still waiting for the other build of {venv} ({minutes:.0f} min)")


def _build(venv: Path, command: Sequence[str], say: Callable[[str], None], waited: bool) -> int:
    if (venv / ".installed").exists():
        say(f"{venv} is ready (built by the other run): reusing it")
        return 0
    if waited:
        say(f"The other run did not finish {venv}: building it here")
    return subprocess.run(list(command)).returncode


def _lock(argv: list[str], args: argparse.Namespace) -> int:
    command = args.build[1:] if args.build[:1] == ["--"] else args.build
    if not command:
        raise InstallError("python -m helpers.course.install lock needs the build command after --")
    try:
        import filelock  # noqa: F401, PLC0415
    except ImportError:  # the bootstrap Python (python3 of the system): take the lock with the lock tool's
        tool = lock_tool(args.cache or Path(args.venv).parent)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
        return subprocess.run([str(tool), "-m", "helpers.course.install", *argv], env=env).returncode
    return build_locked(args.venv, command, say=lambda line: print(line, flush=True))


def _environments(args: argparse.Namespace) -> int:
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


def _platforms() -> int:
    failed = {}
    for (kind, name, version), error in check_platforms().items():
        label = f"{kind + ' pins,':<14}{name:<28} Python {version}"
        print(f"{label:<58} {'resolves' if not error else 'FAILS'}", flush=True)
        if error:
            failed[label] = error
    for label, error in failed.items():
        print(f"\n{label}:\n  " + error.replace("\n", "\n  "), file=sys.stderr)
    return 1 if failed else 0


def _run(commands: list[list[str]], dry_run: bool) -> int:
    for cmd in commands:
        print("+", shlex.join(cmd), flush=True)
        if not dry_run:
            subprocess.run(cmd, check=True)
    return 0


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m helpers.course.install", description=__doc__.splitlines()[0])
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
    lock = sub.add_parser("lock", help="run a build of --venv under its lock: -- then the build command")
    lock.add_argument("--venv", required=True, help="the environment's folder; the command must write <venv>/.installed")
    lock.add_argument("--cache", default=None, help="where the lock tool goes when this Python lacks filelock "
                                                    "(default: the venv's parent)")
    lock.add_argument("build", nargs=argparse.REMAINDER, help="-- then the build command")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = _parser().parse_args(argv)
    if args.command == "lock":
        return _lock(argv, args)
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
        return _run(ipex_commands(args.python, ipex_pins(), args.project), args.dry_run)
    if args.command == "environments":
        return _environments(args)
    if args.command == "platforms":
        return _platforms()
    plan = xpu_plan()
    if args.command == "setup":
        write_files(plan, args.folder)
        print(f"XPU environment: torch/torchvision from {XPU_INDEX}")
        return _run(xpu_commands(plan, args.python, args.folder, args.project), args.dry_run)
    proc = subprocess.run([args.python, "-m", "pip", "check"], capture_output=True, text=True)
    bad = unexpected_pip_check_lines(proc.stdout + proc.stderr, plan)
    if bad:
        print("pip check found problems the XPU plan does not explain:\n  " + "\n  ".join(bad), file=sys.stderr)
        return 1
    print("pip check: ok for the XPU environment")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except (InstallError, subprocess.CalledProcessError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(1)
