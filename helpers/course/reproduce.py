"""Every chapter's measurements, headless: ``python -m helpers.course.reproduce`` (``make reproduce``).

Each chapter runs in its own kernel into a new folder ``results/<time>-<profile>/`` (``--resume`` continues one)
whose ``report.md`` renders the rows the chapters append to its ``rows.jsonl``. More: docs/tools.md."""

import argparse
import base64
import json
import math
import os
import re
import shlex
import signal
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any, Sequence

# No module that imports torch at the top: the run folder's lock comes first.
from .. import files, locks, results, run_sizes, system
from ..processes import Job
from . import workshop

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"
LOCK = "reproduce.lock"
CELL_TIMEOUT = 1800  # seconds


HARDWARE: dict[str, tuple[str, int, str, str]] = {
    "10": ("cuda", 2, "2 or more CUDA GPUs", "not measured on this machine; published numbers shown"),
    "12": ("xpu", 1, "an Intel Arc GPU (xpu)",
           "every measurement ran on the best device this machine has (cuda, xpu, mps or cpu), beside the "
           "blog's Arc numbers; only the xccl (DDP on Intel GPUs) part needs an Intel GPU"),
}
"""Hardware a chapter needs (device kind, how many, its name); without it the chapter still runs and does the last."""


def missing_hardware(chapter: str) -> str | None:
    """``"needs <hardware>: <what the chapter does without it>"`` when this machine lacks it, else None."""
    if chapter not in HARDWARE:
        return None
    import torch

    from .. import devices

    kind, count, what, without = HARDWARE[chapter]
    present = devices.is_available(kind) and (count == 1 or torch.cuda.device_count() >= count)
    return None if present else f"needs {what}: {without}"


def chapter_notebooks(directory: Path = NOTEBOOKS, chapters: Sequence[str] | None = None) -> list[Path]:
    """The chapter notebooks (NN_slug.ipynb): the chapters named ('03', '3', ...), else all but 00 (the setup check)."""
    found = sorted(directory.glob("[0-9][0-9]_*.ipynb"))
    wanted = {c.zfill(2) for c in chapters or []}
    unknown = wanted - {p.name[:2] for p in found}
    if unknown:
        raise ValueError(f"no notebook for chapter(s) {', '.join(sorted(unknown))} in {directory}")
    found = [p for p in found if p.name[:2] in wanted or (not wanted and p.name[:2] != "00")]
    if not found:
        raise ValueError(f"no chapter notebooks in {directory}")
    return found


def fetch_datasets(source: str | None = None) -> None:
    """With real data, every course dataset on disk (downloaded if needed) before any chapter; else ValueError."""
    if (source or run_sizes.data_source()) != "real":
        return
    from .. import data

    try:
        for name in data.SPECS:
            for train in (True, False):
                data.load_dataset(name, train=train, source="real")
    except data.DatasetUnavailableError as exc:
        raise ValueError(str(exc)) from exc


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def failure_reason(exc: BaseException) -> str:
    """The last line of an error (a notebook's error is its cell's last line), without colours."""
    lines = [ln for ln in _ANSI.sub("", str(exc)).strip().splitlines() if ln.strip()]
    last = lines[-1][:1000] if lines else ""
    return last if isinstance(exc, NotebookError) and last else f"{type(exc).__name__}: {last}"


class NotebookError(RuntimeError):
    """A chapter's notebook failed (its message ends with the failing cell's last error line)."""


# Runs in a child process: nbclient there answers Ctrl-C by shutting its kernel down, and the
# parent, which gets the same Ctrl-C, knows the run was interrupted -- no nbclient internals.
_EXECUTE = r"""
import sys
import nbformat
from nbclient import NotebookClient

source, destination, log, timeout, folder = sys.argv[1:6]
nb = nbformat.read(source, as_version=4)
client = NotebookClient(nb, timeout=int(timeout), kernel_name="python3", resources={"metadata": {"path": folder}})
with open(log, "w") as stream:
    try:
        client.execute(stdout=stream, stderr=stream)
    except BaseException as exc:
        sys.exit(f"{type(exc).__name__}: {exc}")  # to stderr, status 1
    finally:
        nbformat.write(nb, destination)
"""


# After Ctrl-C the runner has had the same SIGINT: let it shut its kernel down, then insist.
POLITE_STOP = ((None, 5.0), (signal.SIGINT, 30.0), (signal.SIGTERM, 10.0), (signal.SIGKILL, 10.0))


def execute(notebook: Path, destination: Path, log: Path, env: dict[str, str]) -> None:
    """Execute a notebook in its folder with ``env`` in a child process; the kernel's own output goes to ``log``."""
    args = [sys.executable, "-c", _EXECUTE, str(notebook), str(destination), str(log), str(CELL_TIMEOUT),
            str(notebook.parent)]
    # in the caller's process group, so a terminal's Ctrl-C reaches the runner as well
    finished = Job([args], env=env, new_session=False).start().wait(math.inf, on_interrupt=POLITE_STOP)
    if finished.returncode != 0:
        if finished.returncode == -signal.SIGINT:
            raise KeyboardInterrupt
        raise NotebookError(finished.output.strip() or f"the notebook runner exited with status {finished.returncode}")


def extract(executed: Path, figures: Path) -> tuple[list[str], list[str]]:
    """The outputs of its "Published vs yours" section and ``report`` cells (markdown), its figures saved as PNG."""
    import nbformat

    nb = nbformat.read(executed, as_version=4)
    tables, images, in_section = [], [], False
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            for line in cell.source.splitlines():
                if line.startswith("## "):
                    in_section = "published vs yours" in line.lower()
            continue
        wanted = in_section or "report" in cell.get("metadata", {}).get("tags", [])
        for out in cell.get("outputs", []):
            data = out.get("data", {})
            if "image/png" in data:
                path = figures / f"{executed.stem}-{len(images) + 1}.png"
                path.write_bytes(base64.b64decode(data["image/png"]))
                images.append(path.name)
            elif wanted:
                text = data.get("text/markdown") or data.get("text/plain") or "".join(out.get("text", ""))
                if text and out.get("name") != "stderr":
                    tables.append(text if "text/markdown" in data else f"```\n{text.rstrip()}\n```")
    return tables, images


def write_report(folder: Path, state: dict[str, Any]) -> Path:
    """state.json, report.md (fingerprint, then per chapter its status, tables, figures) and rows.csv; the report."""
    files.atomic_write_text(folder / "state.json", json.dumps(state, indent=2, default=str))
    rows = results.read_rows(folder / results.ROWS_FILE) if (folder / results.ROWS_FILE).exists() else []
    lines = [f"# Course measurements ({state['profile']} profile)", "",
             f"Started {state['started']}; {'finished' if state.get('finished') else 'in progress'}. "
             f"{state.get('data', '')}", "",
             "Tables are rendered from the run's result rows (`rows.jsonl`, also as `rows.csv`): ratios are "
             "baseline / variant for times (> 1 means faster), measured in the same run.", "",
             "Machine:", "", "```", json.dumps(state["machine"], indent=2, default=str), "```", ""]
    for name in state["chapters"]:
        ch = state["results"].get(name, {})
        lines += [f"## {name}", ""]
        if ch.get("missing"):
            lines += [f"*Chapter {name[:2]} {ch['missing']}.*", ""]
        if ch.get("status") == "failed":
            lines += [f"**Failed:** {ch.get('error', '')} (see `notebooks/{name}.ipynb` and `logs/{name}.log`)", ""]
        elif ch.get("status") != "done":
            lines += ["*Not run yet.*", ""]
            continue
        lines += [f"Ran in {ch['seconds']:.0f} s. Executed notebook: `notebooks/{name}.ipynb`.", ""]
        mine = [r for r in rows if r.chapter == name[:2]]
        if mine:
            lines += [workshop.render_markdown(mine, heading_level=3)]
        elif ch.get("tables"):
            lines += ["*This chapter wrote no result rows; its notebook printed:*", ""]
            lines += [t + "\n" for t in ch["tables"]]
        else:
            lines += ["*This chapter has no table for the report.*", ""]
        lines += [f"![{img}](figures/{img})" for img in ch.get("figures", [])] + [""]
    others = [r for r in rows if r.chapter not in {name[:2] for name in state["results"]}]
    if others:  # rows of chapters not in this run's list or not finished (each table's heading names its chapter)
        lines += ["## Other rows", "", workshop.render_markdown(others, heading_level=3)]
    if rows:
        workshop.render_csv(rows, folder / "rows.csv")
    report = folder / "report.md"
    files.atomic_write_text(report, "\n".join(lines))
    return report


def resume_command(profile: str, folder: Path | str) -> str:
    """The command that runs a folder's unfinished and failed chapters again (make, then python -m)."""
    where = shlex.quote(str(folder))
    return (f"`COURSE_PROFILE={profile} RESUME={where} make reproduce` "
            f"(or `python -m helpers.course.reproduce --profile {profile} --resume {where}`)")


def _resume_folder(root: Path, resume: str, profile: str) -> Path:
    """The run folder to continue (``latest``: the newest unfinished one, of this profile if any)."""
    if resume == "latest":
        states = {p.parent: json.loads(p.read_text()) for p in sorted(root.glob("*/state.json"), reverse=True)}
        unfinished = [f for f, state in states.items() if not state.get("finished")]
        if not unfinished:
            raise ValueError(f"nothing to resume in {root}: every run there finished (or none started)")
        folder = next((f for f in unfinished if states[f].get("profile") == profile), unfinished[0])
    else:
        folder = Path(resume).resolve()
        if not (folder / "state.json").exists():
            raise ValueError(f"nothing to resume in {resume} (no state.json)")
    state = json.loads((folder / "state.json").read_text())
    if state["profile"] != profile:
        raise ValueError(f"the run to resume ({folder.name}) used COURSE_PROFILE={state['profile']}, not {profile}: "
                         f"resume it with {resume_command(state['profile'], resume)}")
    return folder


def _new_folder(root: Path, profile: str) -> Path:
    """A new, empty run folder: never an earlier run's, nor one that a run started in the same second took."""
    folder = root / f"{datetime.now().strftime('%Y%m%d-%H%M%S')}-{profile}"
    while True:
        try:
            folder.mkdir(parents=True)
            return folder
        except FileExistsError:
            folder = folder.with_name(folder.name + "x")


def run(profile: str, *, chapters: Sequence[str] | None = None, root: Path = Path("results"),
        resume: str | None = None, notebooks: Path = NOTEBOOKS) -> Path:
    """Execute the chapters (kernels get COURSE_PROFILE, COURSE_RESULTS) and write the report; returns the folder."""
    profile = run_sizes.normalize(profile)
    source_data = run_sizes.data_source(profile)
    root = root.resolve()
    folder = _resume_folder(root, resume, profile) if resume else None
    paths = [] if resume else chapter_notebooks(notebooks, chapters)
    fetch_datasets(source_data)  # fail in seconds, not once per chapter, and before a folder is made
    folder = folder or _new_folder(root, profile)
    with locks.hold(folder / LOCK, wait=0, what=f"the run folder {folder}"):
        if resume:  # read under the lock: the holder before us may have changed it
            state = json.loads((folder / "state.json").read_text())
        else:
            note = " (synthetic stand-in images, not the real dataset)" if source_data == "standin" else ""
            state = {"profile": profile, "data": f"profile={profile} data={source_data}{note}",
                     "started": datetime.now().isoformat(timespec="seconds"),
                     "machine": {**system.fingerprint(), "machine_id": system.machine_id()},
                     "chapters": [p.stem for p in paths], "notebooks": str(Path(notebooks).resolve()),
                     "results": {}, "finished": False}
        _run_chapters(folder, state)
    return folder


def _run_chapters(folder: Path, state: dict[str, Any]) -> None:
    """Run the chapters of ``state`` that are not done yet, recording each; then the final report."""
    profile = state["profile"]
    env = {"TQDM_DISABLE": "1", **os.environ, "COURSE_PROFILE": profile, "COURSE_RESULTS": str(folder)}
    for sub in ("notebooks", "figures", "logs"):
        (folder / sub).mkdir(exist_ok=True)
    source = Path(state.get("notebooks", NOTEBOOKS))
    todo = [n for n in state["chapters"] if state["results"].get(n, {}).get("status") != "done"]
    print(f"{folder}: {len(state['chapters']) - len(todo)} chapter(s) done, {len(todo)} to run ({profile} profile)")
    for i, name in enumerate(todo, 1):
        missing = missing_hardware(name[:2])
        print(f"[{i}/{len(todo)}] {name}" + (f" ({missing})" if missing else ""), flush=True)
        start = time.perf_counter()
        entry: dict[str, Any] = {"missing": missing}
        executed = folder / "notebooks" / f"{name}.ipynb"
        try:
            execute(source / f"{name}.ipynb", executed, log=folder / "logs" / f"{name}.log", env=env)
            tables, figures = extract(executed, folder / "figures")
            entry.update(status="done", tables=tables, figures=figures)
        except KeyboardInterrupt:  # the chapter stays unfinished: a resume runs it again
            write_report(folder, state)
            print(f"interrupted during {name}; continue with {resume_command(profile, folder)}", flush=True)
            raise
        except Exception as exc:  # a failing chapter is reported, the others still run
            entry.update(status="failed", error=failure_reason(exc))
        entry["seconds"] = time.perf_counter() - start
        state["results"][name] = entry
        write_report(folder, state)
        print(f"      {entry['status']} in {entry['seconds']:.0f} s", flush=True)
    state["finished"] = True
    print(f"report: {write_report(folder, state)}")


def summary(folder: Path) -> list[str]:
    """One line per failed chapter (reason, log, notebook), then the command that re-runs only those."""
    state = json.loads((folder / "state.json").read_text())
    failed = [n for n in state["chapters"] if state["results"].get(n, {}).get("status") == "failed"]
    lines = [f"FAILED {n}: {state['results'][n].get('error', '')} -- log: {folder / 'logs' / f'{n}.log'} -- "
             f"notebook: {folder / 'notebooks' / f'{n}.ipynb'}" for n in failed]
    if failed:
        lines.append(f"{len(failed)} of {len(state['chapters'])} chapter(s) failed; run only those again with "
                     f"{resume_command(state['profile'], folder)}")
    return lines


def main(argv: Sequence[str] | None = None) -> None:
    """The command line; exits 0 (all ran), 1 (a chapter failed), 2 (nothing ran: bad input, folder held), 130."""
    p = argparse.ArgumentParser(prog="python -m helpers.course.reproduce", description=__doc__.splitlines()[0])
    p.add_argument("--profile", default=os.environ.get("COURSE_PROFILE", "").strip() or run_sizes.DEFAULT_PROFILE,
                   type=str.lower, choices=run_sizes.PROFILES)
    p.add_argument("--chapters", nargs="+", default=None, help="e.g. 01 02 (default: all)")
    p.add_argument("--resume", default=None, help="'latest' or a run folder to continue")
    p.add_argument("--notebooks", type=Path, default=NOTEBOOKS, help="the notebooks to run (e.g. notebooks/student)")
    args = p.parse_args(argv)
    try:
        folder = run(args.profile, chapters=args.chapters, resume=args.resume, notebooks=args.notebooks)
    except KeyboardInterrupt:
        sys.exit(130)
    except (ValueError, locks.Held) as exc:  # bad input, a held folder or missing real data: nothing ran
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
    failed = summary(folder)
    for line in failed:
        print(line, flush=True)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
