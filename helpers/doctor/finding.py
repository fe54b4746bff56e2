"""One finding of the doctor: a ``Check`` with its status (ok, warn or fail) and a one-line fix."""

from __future__ import annotations

from dataclasses import dataclass

STATUSES: tuple[str, ...] = ("ok", "warn", "fail")


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


def ok(name: str, message: str) -> Check:
    """A finding with nothing to fix."""
    return Check(name, "ok", message)
