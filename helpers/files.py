"""Atomic file writes: a crash while writing leaves the previous file intact (checkpoints, states, rows)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable, IO


def atomic_write(path: Path | str, write: Callable[[IO[bytes]], None]) -> Path:
    """Call ``write(f)`` on a temporary file beside ``path``, fsync it, then rename it over ``path`` (atomic)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def atomic_write_text(path: Path | str, text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` atomically."""
    return atomic_write(path, lambda f: f.write(text.encode("utf-8")))
