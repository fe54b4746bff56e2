"""Run sizes and switches from the environment: ``COURSE_PROFILE`` (``pick``), ``COURSE_DATA``, ``COURSE_OPTIONAL``,
``TQDM_DISABLE``."""

from __future__ import annotations

import os
from typing import TypeVar

T = TypeVar("T")

PROFILES: tuple[str, ...] = ("smoke", "workshop", "full")
DEFAULT_PROFILE = "workshop"
DATA_SOURCES: tuple[str, ...] = ("real", "standin")


class ProfileError(ValueError):
    """An unknown value in COURSE_PROFILE or COURSE_DATA."""


def normalize(name: str | None) -> str:
    """A profile name as the course spells it (case and spaces ignored, empty: the default); else ProfileError."""
    value = (name or "").strip().lower() or DEFAULT_PROFILE
    if value not in PROFILES:
        raise ProfileError(f"COURSE_PROFILE={name!r} is not a known profile. "
                           f"Use one of {', '.join(PROFILES)}, e.g. `export COURSE_PROFILE=smoke`.")
    return value


def current_profile() -> str:
    """The active profile name from ``COURSE_PROFILE`` (default ``workshop``)."""
    return normalize(os.environ.get("COURSE_PROFILE"))


def pick(*, smoke: T, workshop: T, full: T) -> T:
    """The value given for the active profile."""
    return {"smoke": smoke, "workshop": workshop, "full": full}[current_profile()]


def data_source(profile: str | None = None) -> str:
    """``'real'`` or ``'standin'`` from ``COURSE_DATA``; unset, the stand-in at the smoke size of ``profile``."""
    value = os.environ.get("COURSE_DATA", "").strip().lower()
    if not value:
        chosen = current_profile() if profile is None else normalize(profile)
        return "standin" if chosen == "smoke" else "real"
    if value not in DATA_SOURCES:
        raise ProfileError(f"COURSE_DATA={value!r} is not a known data source. "
                           f"Use one of {', '.join(DATA_SOURCES)}.")
    return value


def optional_parts() -> bool:
    """Whether the chapters run their optional parts: ``COURSE_OPTIONAL`` unset/1/true/yes/on, or 0/false/no/off."""
    value = os.environ.get("COURSE_OPTIONAL", "").strip().lower() or "1"
    if value not in ("1", "true", "yes", "on", "0", "false", "no", "off"):
        raise ProfileError(f"COURSE_OPTIONAL={value!r} is not understood. Use 1 (run the optional parts) or 0 (skip them).")
    return value in ("1", "true", "yes", "on")


def describe() -> str:
    """One line naming the profile and the data source, for notebook headers."""
    source = data_source()
    note = " (synthetic stand-in images, not the real dataset)" if source == "standin" else ""
    optional = "" if optional_parts() else " optional parts=off"
    return f"profile={current_profile()} data={source}{note}{optional}"


def bars_off(show: bool = True) -> bool:
    """Whether a progress bar stays off: not ``show``, or ``TQDM_DISABLE`` set (tqdm's notebook bar ignores it)."""
    return not show or os.environ.get("TQDM_DISABLE", "").strip().lower() in ("1", "true", "yes")
