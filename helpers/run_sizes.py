"""Run sizes (smoke / workshop / full, chosen by ``COURSE_PROFILE``) and the data-source switch.

The size of every run in the course is chosen by one environment variable,
``COURSE_PROFILE``:

* ``smoke``    -- seconds per notebook on a 2-core CPU, tiny stand-in data (what CI runs);
* ``workshop`` -- minutes per notebook on a laptop CPU (the default);
* ``full``     -- the book's settings (hours, usually on a GPU).

``pick(smoke=..., workshop=..., full=...)`` keeps notebooks readable: the settings are
visible at the top of each notebook and the same notebook runs in every profile.

Where the data comes from is a separate switch, ``COURSE_DATA`` (``real`` or
``standin``). It defaults to ``standin`` in the smoke profile and ``real`` otherwise.

Whether a chapter runs its optional parts is a third, ``COURSE_OPTIONAL`` (``1``, the default, or
``0``), read by ``optional_parts()``; a notebook's ``RUN_OPTIONAL`` starts from it.
"""

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
    """A profile name as the course spells it: case and spaces ignored, empty means the default.

    Every place that reads a profile (``COURSE_PROFILE``, a ``--profile`` option) goes
    through here, so ``SMOKE`` and ``smoke`` mean the same everywhere. Unknown names raise
    ProfileError naming the choices.
    """
    value = (name or "").strip().lower() or DEFAULT_PROFILE
    if value not in PROFILES:
        raise ProfileError(
            f"COURSE_PROFILE={name!r} is not a known profile. "
            f"Use one of {', '.join(PROFILES)}, e.g. `export COURSE_PROFILE=smoke`."
        )
    return value


def current_profile() -> str:
    """Return the active profile name from ``COURSE_PROFILE`` (default ``workshop``)."""
    return normalize(os.environ.get("COURSE_PROFILE"))


def pick(*, smoke: T, workshop: T, full: T) -> T:
    """Return the value given for the active profile."""
    return {"smoke": smoke, "workshop": workshop, "full": full}[current_profile()]


def data_source(profile: str | None = None) -> str:
    """Return ``'real'`` or ``'standin'`` from ``COURSE_DATA``; unset, the stand-in for the smoke
    profile and the real data otherwise (``profile``, default: the active one)."""
    value = os.environ.get("COURSE_DATA", "").strip().lower()
    if not value:
        chosen = current_profile() if profile is None else normalize(profile)
        return "standin" if chosen == "smoke" else "real"
    if value not in DATA_SOURCES:
        raise ProfileError(
            f"COURSE_DATA={value!r} is not a known data source. "
            f"Use one of {', '.join(DATA_SOURCES)}."
        )
    return value


OPTIONAL_VALUES: dict[str, bool] = {"1": True, "true": True, "yes": True, "on": True,
                                     "0": False, "false": False, "no": False, "off": False}


def optional_parts() -> bool:
    """Whether the chapters run their optional parts: ``COURSE_OPTIONAL`` unset, ``1``, ``true``,
    ``yes`` or ``on`` means yes (the default); ``0``, ``false``, ``no`` or ``off`` means no, the
    path of a reader who skips them (``make test`` runs the student copies so). Anything else
    raises ProfileError."""
    value = os.environ.get("COURSE_OPTIONAL", "").strip().lower()
    if not value:
        return True
    if value not in OPTIONAL_VALUES:
        raise ProfileError(f"COURSE_OPTIONAL={value!r} is not understood. Use 1 (run the optional parts) or 0 (skip them).")
    return OPTIONAL_VALUES[value]


def describe() -> str:
    """One line naming the profile and the data source, for notebook headers."""
    source = data_source()
    note = " (synthetic stand-in images, not the real dataset)" if source == "standin" else ""
    optional = "" if optional_parts() else " optional parts=off"
    return f"profile={current_profile()} data={source}{note}{optional}"
