"""The course's environments: ``python -m helpers.course.install`` (make setup, setup-ipex, platforms, clean-venv).

The XPU and IPEX environments' install steps, the default one's key, the pins' check on other platforms and a build
under a lock. Standard library only: the system python3 runs it. Why: docs/environments.md."""

import argparse
import contextlib
import hashlib
import importlib.util
import json
import os
import platform
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path
from typing import Callable, Sequence

from ..envs import DEFAULT_CACHE, ROOT, ipex_venv, pins_key, python_tag  # noqa: F401  (part of this module's API)
from ..processes import tail

PYPROJECT = ROOT / "pyproject.toml"
XPU_INDEX = "https://download.pytorch.org/whl/xpu"
FROM_TORCH_INDEX: tuple[str, ...] = ("torch", "torchvision")
UNPINNED = {"intel-openmp"}  # the XPU build of torch requires Intel's runtime packages at versions of its own

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


def course_requirements(pyproject: Path | str = PYPROJECT) -> list[str]:
    """The pins of ``[project] dependencies`` plus those of the ``test`` extra, as written."""
    project = tomllib.loads(Path(pyproject).read_text())["project"]
    return list(project["dependencies"]) + list(project["optional-dependencies"]["test"])


def xpu_plan(pyproject: Path | str = PYPROJECT) -> tuple[list[str], list[str]]:
    """The course's pins for the XPU environment: (torch and torchvision, from the XPU index; the rest, from PyPI)."""
    torch_requirements, rest = [], []
    for line in course_requirements(pyproject):  # every pin is name==version (tests/test_environment.py)
        name, version, marker = parse_pin(line)
        if name in FROM_TORCH_INDEX:
            torch_requirements.append(f"{name}=={version}")
        else:
            rest.append(name + (f"; {marker}" if marker else "") if name in UNPINNED else line.strip())
    return torch_requirements, rest


def _pip_install(python: str, *args: str) -> list[str]:
    return [python, "-m", "pip", "install", "--quiet", *args]


def xpu_commands(python: str, folder: Path | str, project: Path | str = ROOT) -> list[list[str]]:
    """The commands that install the XPU environment; its requirements and constraints files go to ``folder``."""
    torch_requirements, requirements = xpu_plan()
    req, con = Path(folder) / "xpu-requirements.txt", Path(folder) / "xpu-constraints.txt"
    req.parent.mkdir(parents=True, exist_ok=True)
    head = "# Written by python -m helpers.course.install from pyproject.toml; do not edit (it is rewritten).\n"
    req.write_text(head + "".join(f"{r}\n" for r in requirements))
    con.write_text(head + "".join(f"{r}+xpu\n" for r in torch_requirements))
    check = ("import torch, torchvision; v = torch.__version__; "
             "assert v.endswith('+xpu'), f'expected the XPU build of torch, found {v}'; "
             "print('torch', v, '| torchvision', torchvision.__version__, "
             "'| xpu available:', torch.xpu.is_available())")
    return [_pip_install(python, *torch_requirements, "--index-url", XPU_INDEX),
            _pip_install(python, "-r", str(req), "-c", str(con)),
            _pip_install(python, "--no-deps", "-e", str(project)), [python, "-c", check]]


def unexpected_pip_check_lines(output: str, pyproject: Path | str = PYPROJECT) -> list[str]:
    """``pip check`` lines other than the course package's own requirement of an ``UNPINNED`` package."""
    project_name = normalize(tomllib.loads(Path(pyproject).read_text())["project"]["name"])
    out = []
    for line in filter(None, map(str.strip, output.splitlines())):
        words = [normalize(re.split(r"[=<>!~,]", word)[0]) for word in line.split()]
        planned = words[0] == project_name and UNPINNED & {*words[2:5]}
        if not (planned or line.startswith("No broken requirements")):
            out.append(line)
    return out


def ipex_pins(pyproject: Path | str = PYPROJECT) -> list[str]:
    """The IPEX environment's pins: ``[tool.course.ipex-environment] dependencies``."""
    return list(tomllib.loads(Path(pyproject).read_text())["tool"]["course"]["ipex-environment"]["dependencies"])


def ipex_commands(python: str, pins: Sequence[str], project: Path | str = ROOT) -> list[list[str]]:
    """The commands that install the IPEX environment into the venv of ``python``."""
    check = ("import importlib.metadata as m, torch; "
             "print('IPEX environment: torch', torch.__version__, '| intel-extension-for-pytorch', "
             "m.version('intel-extension-for-pytorch'))")
    return [_pip_install(python, *pins), _pip_install(python, "--no-deps", "-e", str(project)), [python, "-c", check]]


def ipex_supported(system: str | None = None, machine: str | None = None) -> bool:
    """IPEX 2.8.0 publishes CPU wheels for Linux x86-64 only."""
    return (system or platform.system()) == "Linux" and (machine or platform.machine()) in ("x86_64", "AMD64")


def supported_pythons(pyproject: Path | str = PYPROJECT) -> list[str]:
    """The minor versions ``requires-python`` admits (``">=3.11,<3.14"`` -> ``["3.11", "3.12", "3.13"]``)."""
    spec = tomllib.loads(Path(pyproject).read_text())["project"]["requires-python"]
    bounds = re.fullmatch(r">=\s*3\.(\d+)\s*,\s*<\s*3\.(\d+)", spec.strip())
    if not bounds:
        raise InstallError(f"requires-python must read '>=3.X,<3.Y' (found {spec!r})")
    return [f"3.{m}" for m in range(int(bounds.group(1)), int(bounds.group(2)))]


def env_key(pyproject: Path | str = PYPROJECT, version: Sequence[int] | None = None) -> str:
    """The default (and XPU) environment's key: ``py3.X-`` and 12 hex digits of a hash of the parsed pins."""
    project = tomllib.loads(Path(pyproject).read_text())["project"]
    pins = [project["requires-python"], project["dependencies"], project.get("optional-dependencies", {})]
    digest = hashlib.sha256(json.dumps(pins, sort_keys=True).encode()).hexdigest()[:12]
    return f"{python_tag(version)}-{digest}"


PLATFORMS: dict[str, str] = {  # where the default pins must install, as uv's --python-platform names them
    "Linux x86-64": "x86_64-manylinux_2_28",
    "Linux aarch64": "aarch64-manylinux_2_28",
    "macOS arm64 (14 or later)": "aarch64-apple-darwin",
    "Windows x86-64": "x86_64-pc-windows-msvc",
}
MACOS_TARGET = "14.0"


def check_platforms(python: str = sys.executable, pyproject: Path | str = PYPROJECT) -> dict[tuple[str, str, str], str]:
    """Resolve the default pins per platform and Python, the IPEX pins on Linux x86-64; {key: uv's error or ""}."""
    pins = {"default": course_requirements(pyproject), "IPEX": ipex_pins(pyproject)}
    env = {**os.environ, "MACOSX_DEPLOYMENT_TARGET": MACOS_TARGET}
    jobs = [("default", name, version) for version in supported_pythons(pyproject) for name in PLATFORMS]
    jobs += [("IPEX", "Linux x86-64", version) for version in supported_pythons(pyproject)]  # IPEX's only one
    out = {}
    for kind, name, version in jobs:  # uv pip compile (pins on stdin) for one platform and Python, wheels only
        cmd = [python, "-m", "uv", "pip", "compile", "-", "--python-version", version, "--python-platform",
               PLATFORMS[name], "--only-binary", ":all:", "--no-header", "--quiet", "--no-annotate"]
        proc = subprocess.run(cmd, input="\n".join(pins[kind]) + "\n", capture_output=True, text=True, env=env)
        out[(kind, name, version)] = "" if proc.returncode == 0 else tail(proc.stderr or proc.stdout, 6)
    return out


def _make_lock_tool(folder: Path) -> None:
    """A venv in ``folder`` with filelock only, at the version the course pins (seconds; needs the package index)."""
    pin = next((line for line in course_requirements() if parse_pin(line)[0] == "filelock"), "filelock")
    for cmd in ([sys.executable, "-m", "venv", str(folder)], _pip_install(str(folder / "bin" / "python"), pin)):
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode:
            raise InstallError(f"could not make the lock tool ({shlex.join(cmd)}): "
                               f"{tail(proc.stderr or proc.stdout, 3)}; check the network and run make again")


def lock_tool(cache: Path | str, make: Callable[[Path], None] = _make_lock_tool) -> Path:
    """The Python of ``<cache>/.lock-tool-py3.X`` (a venv with filelock), made once and renamed into place."""
    cache = Path(cache)
    final = cache / f".lock-tool-{python_tag()}"
    python = final / "bin" / "python"  # make (and so the lock) needs Linux or macOS: WSL2 on Windows
    if python.exists() and subprocess.run([str(python), "-c", "import filelock"], capture_output=True).returncode == 0:
        return python
    cache.mkdir(parents=True, exist_ok=True)
    print(f"Making the lock tool of the course environments (filelock, once per Python): {final}", flush=True)
    private = Path(tempfile.mkdtemp(prefix=final.name + ".tmp-", dir=cache))
    try:
        make(private)
        shutil.rmtree(final, ignore_errors=True)  # a broken one
        with contextlib.suppress(OSError):  # another clone's went in first: use that one
            os.rename(private, final)
    finally:
        shutil.rmtree(private, ignore_errors=True)
    return python


def build_locked(venv: Path | str, command: Sequence[str], say: Callable[[str], None] = print) -> int:
    """Run ``command`` (it builds ``venv``, then writes ``<venv>/.installed``) holding ``<venv>.lock`` (filelock)."""
    from .. import locks  # noqa: PLC0415  (filelock: importable only in a Python that has it)

    venv = Path(venv)
    path = venv.with_name(venv.name + ".lock")
    waited = False
    while True:
        try:
            with locks.hold(path, wait=None if waited else 0, what=f"the build of {venv}"):
                if (venv / ".installed").exists():
                    say(f"{venv} is ready (built by the other run): reusing it")
                    return 0
                if waited:
                    say(f"The other run did not finish {venv}: building it here")
                return subprocess.run(list(command)).returncode
        except locks.Held:
            say(f"Another `make setup` is building {venv} ({locks.describe(locks.holder(path))}): "
                "waiting for it to finish, then reusing it")
            waited = True


def _lock(argv: Sequence[str], args: argparse.Namespace) -> int:
    command = args.build[1:] if args.build[:1] == ["--"] else args.build
    if not command:
        raise InstallError("python -m helpers.course.install lock needs the build command after --")
    if importlib.util.find_spec("filelock") is None:  # the system python3: lock in the lock tool's Python
        tool = lock_tool(args.cache or Path(args.venv).parent)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
        return subprocess.run([str(tool), "-m", "helpers.course.install", *argv], env=env).returncode
    return build_locked(args.venv, command, say=lambda line: print(line, flush=True))


def _environments(args: argparse.Namespace) -> int:
    found = sorted(p for p in Path(args.cache or DEFAULT_CACHE).glob("venv-*") if p.is_dir())  # links included
    if args.remove:
        freed = 0
        for env in found:
            if env.is_symlink():  # an old name kept for a renamed environment: the link only
                env.unlink()
            else:
                freed += sum(p.lstat().st_size for p in env.rglob("*") if not p.is_dir())
                shutil.rmtree(env, ignore_errors=True)
        print(f"removed {len(found)} course environment(s), {freed / 1e9:.1f} GB freed")
        return 0
    keep = {Path(k).resolve() for k in args.keep}
    older = [e.name for e in found if e.resolve() not in keep]
    if older:
        print(f"{len(older)} other course environment(s) in {Path(args.cache or DEFAULT_CACHE)} "
              f"(older pins; `make clean-venv` removes every one): " + ", ".join(older))
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


def _run(commands: list[list[str]], dry_run: bool = False) -> int:
    for cmd in commands:
        print("+", shlex.join(cmd), flush=True)
        if not dry_run:
            subprocess.run(cmd, check=True)
    return 0


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m helpers.course.install", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    setup = sub.add_parser("setup", help="install the XPU environment into the running Python's venv")
    setup.add_argument("--device", choices=["xpu"], required=True)
    setup.add_argument("--folder", default=sys.prefix, help="where to write the requirement files (default: the venv)")
    setup.add_argument("--project", default=str(ROOT), help="the course's clone (default: this one)")
    setup.add_argument("--dry-run", action="store_true", help="write the files and print the commands, run nothing")
    check = sub.add_parser("check", help="pip check, accepting only the differences the plan makes on purpose")
    check.add_argument("--device", choices=["xpu"], required=True)
    sub.add_parser("env-key", help="print the default environment's key: py3.X-<hash of the pins>")
    venv = sub.add_parser("ipex-venv", help="print the IPEX environment's folder (keyed by its pins and this Python)")
    venv.add_argument("--cache", default=None, help=f"where the environments live (default {DEFAULT_CACHE})")
    ipex = sub.add_parser("setup-ipex", help="install the IPEX environment into the running Python's venv")
    ipex.add_argument("--project", default=str(ROOT), help="the course's clone (default: this one)")
    sub.add_parser("platforms", help="resolve the pins for Linux x86-64/aarch64, macOS arm64, Windows x every Python")
    envs = sub.add_parser("environments", help="list the course environments in the cache, or remove them")
    envs.add_argument("--cache", default=None)
    envs.add_argument("--keep", nargs="*", default=[], help="folders that are in use (not listed)")
    envs.add_argument("--remove", action="store_true", help="remove every course environment and say how much it freed")
    lock = sub.add_parser("lock", help="run a build of --venv under its lock: -- then the build command")
    lock.add_argument("--venv", required=True, help="the environment's folder; the build writes <venv>/.installed")
    lock.add_argument("--cache", default=None, help="where the lock tool goes when this Python lacks filelock")
    lock.add_argument("build", nargs=argparse.REMAINDER, help="-- then the build command")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = _parser().parse_args(argv)
    if args.command == "lock":
        return _lock(argv, args)
    if args.command in ("env-key", "ipex-venv"):
        print(env_key() if args.command == "env-key" else ipex_venv(args.cache))
        return 0
    if args.command == "setup-ipex":
        if not ipex_supported():
            raise InstallError("IPEX 2.8.0 publishes CPU wheels for Linux x86-64 only: chapter 04's IPEX arms "
                               "need such a machine (the rest of the course runs without them)")
        return _run(ipex_commands(sys.executable, ipex_pins(), args.project))
    if args.command == "setup":
        return _run(xpu_commands(sys.executable, args.folder, args.project), args.dry_run)
    if args.command == "environments":
        return _environments(args)
    if args.command == "platforms":
        return _platforms()
    proc = subprocess.run([sys.executable, "-m", "pip", "check"], capture_output=True, text=True)
    bad = unexpected_pip_check_lines(proc.stdout + proc.stderr)
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
