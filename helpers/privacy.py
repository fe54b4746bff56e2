"""What may leave the machine: a private machine id and redaction of user, host and path names.

``machine_id()`` names this machine by ``sha256(salt + machine-id + host name)``, the salt being
a random value made once and kept in the user's cache (``~/.cache/accelerate-course/machine-salt``):
one machine's repeated results merge, nobody gets from the id back to the host, and machines
sharing a home folder still differ. ``redact`` / ``redact_text`` remove the home folder, the
user and host names and (for anything sent elsewhere) every absolute path; ``private_names``
lists what they look for. Used by ``helpers.results`` (every row's fingerprint),
``helpers.submit`` and ``helpers.doctor``.
"""

from __future__ import annotations

import getpass
import hashlib
import re
import secrets
import socket
from pathlib import Path
from typing import Any

from .files import atomic_write_text


def cache_dir() -> Path:
    """The course's per-user cache folder (``~/.cache/accelerate-course``), as the Makefile uses."""
    return Path.home() / ".cache" / "accelerate-course"


def _machine_identity() -> str:
    for source in ("/etc/machine-id", "/var/lib/dbus/machine-id"):
        try:
            text = Path(source).read_text().strip()
        except OSError:
            continue
        if text:
            return text
    import uuid

    return str(uuid.getnode())  # the network hardware address, where there is no machine-id


def machine_id(cache: Path | str | None = None) -> str:
    """A short hash that names this machine without revealing it.

    ``sha256(salt + machine-id + host name)``, the salt being a random value made once and
    kept in ``cache`` (default ``cache_dir()``): the same machine gives the same id on every
    run, nobody can get from the id back to the host, and two machines sharing one home
    folder (a cluster) still get different ids.
    """
    folder = Path(cache) if cache is not None else cache_dir()
    salt_file = folder / "machine-salt"
    try:
        salt = salt_file.read_text().strip()
    except OSError:
        salt = ""
    if not salt:
        salt = secrets.token_hex(16)
        try:
            atomic_write_text(salt_file, salt + "\n")
        except OSError:  # a read-only home: the id still works for this process
            pass
    digest = hashlib.sha256(f"{salt}|{_machine_identity()}|{socket.gethostname()}".encode()).hexdigest()
    return digest[:16]


_ABS_PATH = re.compile(r"(?<![\w.~<>:/])(?:/[^\s/'\",;:()\[\]{}|]+)+/?")
_WIN_PATH = re.compile(r"\b[A-Za-z]:\\[^\s'\",;]*")


def private_names() -> dict[str, str]:
    """This machine's names that must not leave it: user, host (and short host), home folder."""
    names = {"home": str(Path.home())}
    try:
        names["user"] = getpass.getuser()
    except (KeyError, OSError):
        pass
    host = socket.gethostname()
    names["host"] = host
    names["host_short"] = host.split(".")[0]
    return {k: v for k, v in names.items() if v}


def redact_text(text: str, names: dict[str, str] | None = None, *, all_paths: bool = True) -> str:
    """``text`` without the home folder, user name, host name, and (``all_paths``) any absolute path.

    Without ``all_paths`` the home folder becomes ``~`` and other paths stay (for a local
    console); with it every absolute path becomes ``<path>`` (for what leaves the machine).
    User and host names are replaced as whole words, when at least 2 characters long.
    """
    names = private_names() if names is None else names
    home = names.get("home", "")
    if home and home != "/":
        text = text.replace(home.rstrip("/") + "/", "~/")
        text = re.sub(re.escape(home.rstrip("/")) + r"\b", "~", text)
    if all_paths:
        text = re.sub(r"file://[^\s'\",;]*", "<path>", text)
        text = _ABS_PATH.sub("<path>", text)
        text = _WIN_PATH.sub("<path>", text)
        text = re.sub(r"(?<![\w<>])~(?:/[^\s'\",;:()\[\]{}|]*)?(?![\w])", "<path>", text)
    for key, label in (("host", "<host>"), ("host_short", "<host>"), ("user", "<user>")):
        value = names.get(key, "")
        if len(value) >= 2:
            text = re.sub(rf"(?<![\w-]){re.escape(value)}(?![\w-])", label, text)
    return text


def redact(obj: Any, names: dict[str, str] | None = None, *, all_paths: bool = True) -> Any:
    """``redact_text`` applied to every string (keys and values) inside dicts, lists and tuples."""
    names = private_names() if names is None else names
    if isinstance(obj, str):
        return redact_text(obj, names, all_paths=all_paths)
    if isinstance(obj, dict):
        return {redact(k, names, all_paths=all_paths): redact(v, names, all_paths=all_paths) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [redact(v, names, all_paths=all_paths) for v in obj]
    return obj
