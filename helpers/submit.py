"""Pack one machine's latest results for a workshop organiser: ``make submit``.

``python -m helpers.submit [RUN] [--out FILE]`` takes the rows of the latest run (the newest
``rows.jsonl`` in a folder under ``results/``: a ``make reproduce`` or ``make bench`` run; the
rows notebooks append to ``results/rows.jsonl`` only when there is no run), or of the run
folder or rows file named, and writes one small JSON file, ``results/submission-<machine id>-<time>.json``,
that ``python -m helpers.pool`` reads. It holds the result rows (chapter, experiment,
variant, metric, unit, median/min/max, repeats, ratios, published values, profile, data
source, time) and the hardware fingerprint stored once (CPU model, cores, instruction
sets, GPU names, library versions) under a salted machine id. User name, host name and
every path are removed (``helpers.privacy.redact``), and the file is checked for them
before it is written.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Sequence

from . import files, privacy, results
from .results import ResultsFormatError, Row

SUBMISSION_FORMAT = "accelerate-course-submission"
SUBMISSION_VERSION = 1


class SubmitError(ValueError):
    """Nothing to submit, or a submission that would leak a private name."""


def latest_rows_file(root: Path | str) -> Path:
    """The most recently written ``rows.jsonl`` of a run folder under ``root``; ``root``'s own
    ``rows.jsonl`` (where notebooks run in JupyterLab keep adding rows) only when there is no run."""
    root = Path(root)
    found = [p for p in root.rglob(results.ROWS_FILE) if p.stat().st_size > 0] if root.is_dir() else []
    runs = [p for p in found if p.parent != root]
    found = runs or found
    if not found:
        raise SubmitError(f"no results under {root}: run `make reproduce` (or `make bench`) first")
    return max(found, key=lambda p: (p.stat().st_mtime, str(p)))


def rows_file(source: Path | str | None, root: Path | str) -> Path:
    """The rows to submit: ``source`` (a run folder or rows file) or the latest under ``root``."""
    if source is None:
        return latest_rows_file(root)
    source = Path(source)
    if source.is_dir():
        if (source / results.ROWS_FILE).exists():
            return source / results.ROWS_FILE
        return latest_rows_file(source)
    if not source.exists():
        raise SubmitError(f"{source} does not exist")
    return source


def pack(rows: Sequence[Row], names: dict[str, str] | None = None) -> dict[str, Any]:
    """The submission payload: fingerprints stored once, every string redacted."""
    if not rows:
        raise SubmitError("the run has no result rows to submit")
    names = privacy.private_names() if names is None else names
    fingerprints: list[dict[str, Any]] = []
    index: dict[str, int] = {}
    packed = []
    for r in rows:
        fp = dict(r.fingerprint)
        fp.setdefault("machine_id", privacy.machine_id())
        key = json.dumps(fp, sort_keys=True, default=str)
        if key not in index:
            index[key] = len(fingerprints)
            fingerprints.append(fp)
        d = results.asdict(r)
        d.pop("versions", None)  # inside the fingerprint already
        d["fingerprint"] = index[key]
        packed.append(d)
    machines = sorted({fp["machine_id"] for fp in fingerprints})
    chapters = Counter(r.chapter for r in rows)
    payload = {
        "format": SUBMISSION_FORMAT, "version": SUBMISSION_VERSION, "rows_version": results.SCHEMA_VERSION,
        "machine_id": machines[0] if len(machines) == 1 else machines,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "contents": describe(rows),
        "chapters": dict(sorted(chapters.items())),
        "fingerprints": fingerprints, "rows": packed,
    }
    payload = privacy.redact(payload, names, all_paths=True)
    leaks = find_leaks(json.dumps(payload), names)
    if leaks:  # redact() should have removed them: never write a file that still has one
        raise SubmitError(f"the submission would still contain {', '.join(leaks)}; not written")
    return payload


def read_submission(path: Path | str) -> list[Row]:
    """Rows of a ``make submit`` file (fingerprints stored once, referenced by index)."""
    path = Path(path)
    try:
        payload = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ResultsFormatError(f"{path.name} is not JSON ({exc.msg})") from None
    if not isinstance(payload, dict) or payload.get("format") != SUBMISSION_FORMAT:
        raise ResultsFormatError(f"{path.name} is not a course submission (made by `make submit`)")
    if payload.get("version") != SUBMISSION_VERSION:
        raise ResultsFormatError(
            f"{path.name} is a submission of format version {payload.get('version')!r}; this course reads "
            f"version {SUBMISSION_VERSION}. Update the course (git pull), or ask for a submission made with it.")
    fingerprints = payload.get("fingerprints", [])
    rows = []
    for d in payload.get("rows", []):
        d = dict(d)
        fp = fingerprints[d["fingerprint"]] if isinstance(d.get("fingerprint"), int) else d.get("fingerprint", {})
        d["fingerprint"] = fp
        d.setdefault("versions", dict(fp.get("versions", {})))
        rows.append(results.row_from_dict(d))
    return rows


def find_leaks(text: str, names: dict[str, str] | None = None) -> list[str]:
    """Which private things (user, host, home folder, an absolute path) occur in ``text``."""
    names = privacy.private_names() if names is None else names
    leaks = [k for k in ("home", "user", "host", "host_short")
             if names.get(k) and len(names[k]) >= 2 and k != "home"
             and privacy.redact_text(text, {k: names[k]}, all_paths=False) != text]
    home = names.get("home", "")
    if home and home != "/" and home in text:
        leaks.append("home")
    if privacy.redact_text(text, {}, all_paths=True) != text:
        leaks.append("a path")
    return leaks


def describe(rows: Sequence[Row]) -> str:
    """One paragraph saying what a submission contains."""
    experiments = sorted({f"{r.chapter}/{r.experiment}" for r in rows})
    profiles = sorted({r.profile for r in rows})
    data = sorted({r.data for r in rows})
    return (f"{len(rows)} result rows ({len(experiments)} experiments: {', '.join(experiments[:12])}"
            f"{', ...' if len(experiments) > 12 else ''}; profile {', '.join(profiles)}; data {', '.join(data)}). "
            "Per row: chapter, experiment, variant, metric, unit, median/min/max, repeats, ratio to the baseline, "
            "published value and ratio, profile, data source, time. Per machine, once: CPU model, sockets, cores, "
            "NUMA nodes, instruction sets, OpenMP runtime, GPU names, OS kernel, library versions, and a salted "
            "machine id. No user name, host name or path.")


def submit(source: Path | str | None = None, out: Path | str | None = None,
           root: Path | str | None = None) -> tuple[Path, dict[str, Any]]:
    """Write the submission file; returns its path and payload."""
    root = Path(root) if root is not None else results.results_dir()
    path = rows_file(source, root)
    payload = pack(results.read_rows(path))
    machine = payload["machine_id"] if isinstance(payload["machine_id"], str) else "several"
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    target = Path(out) if out is not None else root / f"submission-{machine[:8]}-{stamp}.json"
    files.atomic_write_text(target, json.dumps(payload, indent=1, sort_keys=True) + "\n")
    return target, payload


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m helpers.submit", description=__doc__.splitlines()[0])
    p.add_argument("source", nargs="?", default=None,
                   help="a run folder or rows.jsonl (default: the newest rows.jsonl under results/)")
    p.add_argument("--out", default=None, help="file to write (default results/submission-<id>-<time>.json)")
    args = p.parse_args(argv)
    try:
        target, payload = submit(args.source, args.out)
    except (SubmitError, results.ResultsFormatError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    size = target.stat().st_size
    shown = target.name if target.parent.resolve() == results.results_dir().resolve() else target
    print(f"wrote {privacy.redact_text(str(shown), all_paths=False)} ({size / 1024:.0f} KB) for machine "
          f"{payload['machine_id']}")
    print(payload["contents"])
    print("Send this file to the workshop organiser; they merge everyone's with "
          "`make pool IN=\"submission-*.json\" OUT=pooled`.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
