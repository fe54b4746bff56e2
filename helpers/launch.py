"""Build and run the launch commands of the course's DDP entry point (``python -m helpers.distributed``).

``torchrun_command`` writes one machine's torchrun line; ``run_job`` starts launchers as one ``processes.Job``
(nothing left holding a port or a core); ``measure_job``/``job_arm``/``measure_seeds`` time jobs with the
course's protocol.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import socket
import statistics
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator, Mapping, Sequence

from .distributed import DistributedSetupError, parser
from .processes import Job, JobTimeout

if TYPE_CHECKING:
    from .measure import Result

ENTRY = ["-m", "helpers.distributed"]
_ERROR_LINE = re.compile(r"^error: (.+)$", re.M)  # the entry point's own message, printed once by rank 0
_JOIN_FAILED = ("could not join the job", "connectFullMesh failed", "EADDRINUSE")  # could not connect; port taken


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def check_ranks(ranks_per_node: int, device: str = "cpu", nodes_per_host: int = 1) -> None:
    """Refuse more pinned CPU ranks here than physical cores (ranks of ``nodes_per_host`` simulated nodes add up)."""
    from . import system

    if ranks_per_node < 1 or nodes_per_host < 1:
        raise DistributedSetupError("the number of ranks (and of nodes) must be at least 1")
    cores = system.topology().physical_cores
    total = ranks_per_node * nodes_per_host
    if device.split(":")[0] == "cpu" and total > cores:
        who = f"{total} ranks" + (f" ({nodes_per_host} nodes x {ranks_per_node})" if nodes_per_host > 1 else "")
        raise DistributedSetupError(
            f"{who} requested but this machine has {cores} physical cores: each CPU rank gets whole cores, "
            f"so use at most {cores} ranks here (or add --no-pin to the job's arguments to share cores knowingly)."
        )


def torchrun_command(nproc: int, args: Sequence[str]) -> list[str]:
    """This machine's torchrun line for ``nproc`` ranks of the entry point; refuses more pinned CPU ranks than cores."""
    job = parser().parse_known_args(args)[0]
    if not job.no_pin:
        check_ranks(nproc, job.device, job.nodes_per_host)
    return [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc}", "--master-addr=127.0.0.1",
            f"--master-port={free_port()}", "--monitor-interval=0.5", *ENTRY, *args]


def first_host(hostfile: str | Path) -> str:
    """The first host of an Open MPI hostfile ("node01 slots=2" per line, # comments): rank 0's, the MASTER_ADDR."""
    for line in Path(hostfile).read_text().splitlines():
        words = line.split("#", 1)[0].split()
        if words:
            return words[0]
    raise DistributedSetupError(f"hostfile {hostfile} names no host: write one machine per line, e.g. 'node01 slots=2'")


@dataclass
class JobResult:
    """A finished launch: exit code, seconds, merged output, rank 0's summary and the entry point's error line."""

    returncode: int
    seconds: float
    output: str
    summary: dict[str, Any] | None
    error: str | None = None


def run_job(commands: Sequence[Sequence[str]] | Callable[[], Sequence[Sequence[str]]],
            out: str | Path | None = None, timeout: float = 300, env: Mapping[str, str] | None = None,
            retries: int = 0, grace: float = 15.0) -> JobResult:
    """Start launchers (e.g. two torchrun 'nodes') as one ``processes.Job``, wait, collect the output; on a timeout
    DistributedSetupError, every process stopped. ``retries``: again when the ranks could not connect (``commands``
    a function: fresh lines, a new port); ``grace``: seconds the others get after one launcher failed."""
    for attempt in range(retries + 1):
        job = _run_once(commands() if callable(commands) else commands, out, timeout, env, grace)
        if attempt == retries or job.returncode == 0 or not any(s in job.output for s in _JOIN_FAILED):
            return job
        print(f"(the ranks could not connect; starting the job again, attempt {attempt + 2})", flush=True)
    raise AssertionError("not reached")


def scratch_root() -> Path:
    """The folder of the jobs' scratch folders (one per user; short: Open MPI's socket paths stay under 107 bytes)."""
    return Path(tempfile.gettempdir()) / f"course-jobs-{getattr(os, 'getuid', lambda: 0)()}"


def reclaim_scratch() -> list[Path]:
    """Remove the scratch folders whose owner process has ended (a parent killed by SIGKILL); return them."""
    import psutil

    gone = []
    root = scratch_root()
    for folder in root.iterdir() if root.is_dir() else []:
        owner = folder.name.split("-", 1)[0]
        if owner.isdigit() and not psutil.pid_exists(int(owner)):
            shutil.rmtree(folder, ignore_errors=True)
            gone.append(folder)
    with contextlib.suppress(OSError):
        root.rmdir()  # only when empty
    return gone


@contextlib.contextmanager
def job_scratch() -> Iterator[Path]:
    """A new TMPDIR folder for one job, ``<scratch_root>/<pid>-<random>``, removed when the job ends."""
    reclaim_scratch()  # torchrun and Open MPI leave files there; a parent killed by SIGKILL leaves its folder
    root = scratch_root()
    for attempt in range(3):  # another job may remove the (empty) root between our mkdir and mkdtemp
        root.mkdir(mode=0o700, exist_ok=True)
        try:
            folder = Path(tempfile.mkdtemp(prefix=f"{os.getpid()}-", dir=root))
            break
        except FileNotFoundError:
            if attempt == 2:
                raise
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)
        reclaim_scratch()  # and the root, when no other job has a folder there


def _run_once(commands: Sequence[Sequence[str]], out: str | Path | None, timeout: float,
              env: Mapping[str, str] | None, grace: float) -> JobResult:
    if out is not None and Path(out).exists():
        Path(out).unlink()
    with job_scratch() as scratch:
        job = Job(commands, env={**os.environ, "TQDM_DISABLE": "1", "PYTHONUNBUFFERED": "1", "TMPDIR": str(scratch),
                                 **(env or {})})
        try:
            finished = job.start().wait(timeout, grace)
        except JobTimeout as exc:
            raise DistributedSetupError(f"{exc}. Its last output:\n{exc.output[-1500:]}") from None
    summary = json.loads(Path(out).read_text()) if out is not None and Path(out).exists() else None
    error = _ERROR_LINE.search(finished.output)
    return JobResult(finished.returncode, finished.seconds, finished.output, summary, error and error.group(1).strip())


def measure_job(name: str, command: Callable[[Path], Sequence[Sequence[str]]], out_dir: str | Path,
                env: Mapping[str, str] | None = None) -> "Result":
    """Run the job ``command(out_path)`` once: a Result of its median epoch after the first (the warm-up kept apart),
    accuracy, steps, world size, global batch; a failed job raises DistributedSetupError with its message."""
    out = Path(out_dir) / f"{name}.json"
    job = _finished(name, run_job(lambda: command(out), out=out, timeout=600, env=env, retries=1))
    return _result(name, job.summary, job)


def job_arm(name: str, command: Callable[[Path], Sequence[Sequence[str]]], out_dir: str | Path,
            outputs: dict[str, str] | None = None, *, env: Mapping[str, str] | None = None) -> Callable[[], "Result"]:
    """An arm for ``measure.interleaved``: a fresh job per call (``env`` added to its environment); ``outputs[name]``
    keeps the last job's output."""
    def once() -> "Result":
        res = measure_job(name, command, out_dir, env=env)
        if outputs is not None:
            outputs[name] = res.settings["last_output"]
        return res
    return once


def measure_seeds(name: str, command: Callable[[Path], Sequence[Sequence[str]]], out_dir: str | Path,
                  seeds: Sequence[int]) -> list["Result"]:
    """One job (``command(out)`` plus ``--seeds``) paying its start-up once: a ``measure_job`` Result per seed."""
    out = Path(out_dir) / f"{name}-seeds.json"
    job = _finished(name, run_job(lambda: [[*line, "--seeds", *map(str, seeds)] for line in command(out)],
                                  out=out, timeout=600, retries=1))
    runs = job.summary.get("seeds")
    if not isinstance(runs, list) or len(runs) != len(seeds):
        raise DistributedSetupError(f"job {name!r} wrote no summary per seed: is --seeds passed to "
                                    "python -m helpers.distributed?")
    return [_result(f"{name} seed {seed}", summary, job) for seed, summary in zip(seeds, runs)]


def _finished(name: str, job: JobResult) -> JobResult:
    if job.returncode != 0 or job.summary is None:
        detail = job.error or job.output[-1500:]
        raise DistributedSetupError(f"job {name!r} failed (exit {job.returncode}): {detail}")
    return job


def _result(name: str, summary: dict[str, Any], job: JobResult) -> "Result":
    from .measure import Result

    first, *rest = summary["epoch_times"]
    if not rest:
        raise DistributedSetupError("measuring a job needs --epochs >= 2 to keep the warm-up epoch apart")
    metrics = {"accuracy": summary["accuracy"], **{k: float(summary[k]) for k in ("steps", "world_size", "global_batch")}}
    return Result(name, [statistics.median(rest)], [first], metrics, {"last_output": job.output[-3000:], "summary": summary})


def rank_lines(output: str) -> list[str]:
    """The per-rank report lines of a job's output, sorted by rank (matched, not split: ranks can share a line)."""
    found = re.findall(r"rank \d+/\d+ \(.*?\): all_reduce\(rank\+1\) = [\d.e+]+", output)
    return sorted(found, key=lambda line: int(line.split()[1].split("/")[0]))
