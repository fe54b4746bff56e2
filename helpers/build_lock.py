"""An environment's build under a lock (``make setup``, ``make setup-ipex``): one clone builds, the others wait.

``build_locked`` runs the build holding ``<venv>.lock`` (filelock, through ``helpers.locks``); a second caller
waits, saying so, then reuses the result. The system python3 that runs make has no filelock: ``lock_tool``
makes a small venv with it, once per Python. Standard library only until filelock is needed.
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Callable, Sequence

from .install import ROOT, InstallError, course_requirements, parse_pin, python_tag, tail_lines



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
    """The Python of ``<cache>/.lock-tool-py3.X``, a small venv with filelock, for a bootstrap Python that lacks
    it. Made once in a private folder and renamed into place (one atomic step), so two clones racing to
    make it never use a half-made one: the loser removes its copy and uses the winner's."""
    import shutil  # noqa: PLC0415
    import tempfile  # noqa: PLC0415

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
    """Run ``command`` (which builds ``venv`` and ends by writing ``<venv>/.installed``) while holding
    ``<venv>.lock``. A second caller waits, saying so and naming the holder, and then reuses the finished
    environment instead of building it again; if the first build failed (no ``.installed``), it builds it.
    The operating system releases the lock of a process that dies, so a killed build never blocks the next."""
    from . import locks  # noqa: PLC0415  (filelock: not importable before the lock tool runs this)

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


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m helpers.build_lock", description=__doc__.splitlines()[0])
    p.add_argument("--venv", required=True, help="the environment's folder; the command must write <venv>/.installed")
    p.add_argument("--cache", default=None, help="where the lock tool goes when this Python lacks filelock "
                                                 "(default: the venv's parent)")
    p.add_argument("build", nargs=argparse.REMAINDER, help="-- then the build command")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m helpers.build_lock --venv DIR [--cache DIR] -- COMMAND...``"""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = _parser().parse_args(argv)
    command = args.build[1:] if args.build[:1] == ["--"] else args.build
    if not command:
        raise InstallError("helpers.build_lock needs the build command after --")
    try:
        import filelock  # noqa: F401, PLC0415
    except ImportError:  # the bootstrap Python (python3 of the system): take the lock with the lock tool's
        tool = lock_tool(args.cache or Path(args.venv).parent)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
        return subprocess.run([str(tool), "-m", "helpers.build_lock", *argv], env=env).returncode
    return build_locked(args.venv, command, say=lambda line: print(line, flush=True))


if __name__ == "__main__":
    try:
        sys.exit(main())
    except (InstallError, subprocess.CalledProcessError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(1)
