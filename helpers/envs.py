"""Where the course's environments live (cache folder, IPEX venv keyed by its pins); standard library only."""

from __future__ import annotations

import hashlib
import json
import sys
import tomllib
from pathlib import Path
from typing import Sequence

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_CACHE = Path.home() / ".cache" / "accelerate-course"  # the Makefile's CACHE


def python_tag(version: Sequence[int] | None = None) -> str:
    """``"py3.12"`` for Python 3.12 (default: the running one): keeps clones on different Pythons apart."""
    major, minor = (version or sys.version_info)[:2]
    return f"py{major}.{minor}"


def pins_key(pins: Sequence[str]) -> str:
    """12 hex digits that change whenever a pin changes (and never for comments or layout)."""
    return hashlib.sha256(json.dumps(sorted(pins)).encode()).hexdigest()[:12]


def ipex_venv(cache: Path | str | None = None, pyproject: Path | str = ROOT / "pyproject.toml",
              version: Sequence[int] | None = None) -> Path:
    """``<cache>/venv-ipex-py3.X-<key of [tool.course.ipex-environment] dependencies>``; KeyError without them."""
    pins = tomllib.loads(Path(pyproject).read_text())["tool"]["course"]["ipex-environment"]["dependencies"]
    return Path(cache or DEFAULT_CACHE) / f"venv-ipex-{python_tag(version)}-{pins_key(pins)}"
