"""Setup checks with fixes, the machine fingerprint and the numerics parity probe: ``make doctor``.

``python -m helpers.doctor`` looks at everything the course depends on -- Python, the pinned
packages as installed, the torch build, each device, the CPU (model, sockets, cores, NUMA,
the instruction sets that decide the results), the OpenMP runtime, the C++ compiler and Python
headers that ``torch.compile`` needs on the CPU, the platform and what the course cannot do on
it (one ``limit ...`` line each), the IPEX environment (``make setup-ipex``; IPEX is retired and
never imported here), NNI and Torch-Pruning, jemalloc/tcmalloc and ``mpirun``, the Jupyter
kernel, the datasets, free memory and disk -- and runs a few training steps on every
accelerator against the CPU (``helpers.parity``). Each check is ``ok``, ``warn`` or
``fail`` with a one-line fix. The result goes to ``results/doctor.json``::

    {"version": 1, "fingerprint": {...}, "checks": [{"name", "status", "message", "fix"}, ...]}

The exit status is non-zero only when the course cannot run (a ``fail``).

The work is split in three so each check can be tested with made-up facts:
``helpers.doctor.facts.gather`` collects what this machine has (a dict of plain values),
``helpers.doctor.checks`` judges those facts and returns :class:`Check` objects, and this
module is the command: it writes the report and prints it.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable, Sequence

from .checks import STATUSES, Check, judge
from .facts import gather

DOCTOR_VERSION = 1


def exit_status(checks: Sequence[Check]) -> int:
    """1 when any check failed (the course cannot run as set up), else 0."""
    return 1 if any(c.status == "fail" for c in checks) else 0


def report(checks: Sequence[Check], fingerprint: dict[str, Any]) -> dict[str, Any]:
    """The content of ``doctor.json``: version, fingerprint (with the private machine id), checks."""
    return {"version": DOCTOR_VERSION, "fingerprint": fingerprint,
            "checks": [asdict(c) for c in checks],
            "summary": {s: sum(c.status == s for c in checks) for s in STATUSES}}


def format_checks(checks: Sequence[Check], redact: Callable[[str], str] | None = None) -> str:
    """Aligned text, one line per check and the fix beneath warnings and failures."""
    redact = redact or (lambda text: text)
    width = max((len(c.name) for c in checks), default=0)
    marks = {"ok": "ok  ", "warn": "WARN", "fail": "FAIL"}
    lines = []
    for c in checks:
        lines.append(f"[{marks[c.status]}] {c.name.ljust(width)}  {redact(c.message)}")
        if c.fix:
            lines.append(f"       {' ' * width}  fix: {redact(c.fix)}")
    counts = {s: sum(c.status == s for c in checks) for s in STATUSES}
    lines.append(f"{counts['ok']} ok, {counts['warn']} warning(s), {counts['fail']} failure(s)"
                 + ("" if not counts["fail"] else ": the course cannot run until the failures are fixed"))
    return "\n".join(lines)


def run(out: Path | str | None = None, *, parity_steps: int = 5, imports: bool = True,
        facts: dict[str, Any] | None = None) -> tuple[list[Check], dict[str, Any], Path]:
    """Gather (unless ``facts`` are given), judge, write ``doctor.json``; returns checks, report, path."""
    from .. import files, privacy, results

    facts = gather(parity_steps=parity_steps, imports=imports) if facts is None else facts
    checks = judge(facts)
    fingerprint = dict(facts.get("fingerprint", {}))
    fingerprint["machine_id"] = privacy.machine_id()
    payload = report(checks, fingerprint)
    path = Path(out) if out is not None else results.results_dir() / "doctor.json"
    files.atomic_write_text(path, json.dumps(privacy.redact(payload, all_paths=False), indent=2, default=str) + "\n")
    return checks, payload, path


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m helpers.doctor", description=__doc__.splitlines()[0])
    p.add_argument("--out", default=None, help="where to write doctor.json (default results/doctor.json)")
    p.add_argument("--parity-steps", type=int, default=5, help="training steps of the parity probe per accelerator")
    p.add_argument("--no-imports", action="store_true",
                   help="skip importing NNI and Torch-Pruning in a child process (faster, less sure)")
    args = p.parse_args(argv)
    from .. import privacy

    start = time.perf_counter()
    print("Checking the course setup (10-30 s) ...", flush=True)
    checks, _, path = run(args.out, parity_steps=args.parity_steps, imports=not args.no_imports)
    names = privacy.private_names()
    print(format_checks(checks, lambda t: privacy.redact_text(t, names, all_paths=False)))
    shown = path.resolve()
    try:
        shown = shown.relative_to(Path.cwd().resolve())
    except ValueError:
        pass
    print(f"wrote {privacy.redact_text(str(shown), names, all_paths=False)} in {time.perf_counter() - start:.0f} s")
    return exit_status(checks)
