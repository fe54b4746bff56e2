"""Build and run the launch commands of the course's DDP entry point (``python -m helpers.distributed``).

``torchrun_command`` writes one machine's torchrun line; ``run_job`` starts launchers as one ``processes.Job``
(nothing left holding a port or a core); ``measure_job``/``job_arm``/``measure_seeds`` time jobs with the
course's protocol.
"""

from __future__ import annotations

import contextlib
import getpass
import json
import os
import re
import shutil
import socket
import statistics
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator, Mapping, Sequence

from .distributed import DistributedSetupError
from .processes import Job, JobTimeout

if TYPE_CHECKING:
    from .measure import Result

ENTRY = ["-m", "helpers.distributed"]
_ERROR_LINE = re.compile(r"^error: (.+)$", re.M)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def check_ranks(ranks_per_node: int, device: str = "cpu", nodes_per_host: int = 1) -> None:
    """Refuse more pinned CPU ranks on this machine than it has physical cores (``nodes_per_host``: simulated
    nodes sharing it, chapter 11; their ranks add up)."""
    from . import system

    if ranks_per_node < 1 or nodes_per_host < 1:
        raise DistributedSetupError("the number of ranks (and of nodes) must be at least 1")
    cores = system.topology().physical_cores
    total = ranks_per_node * nodes_per_host
    if device.split(":")[0] == "cpu" and total > cores:
        who = f"{total} ranks ({nodes_per_host} nodes x {ranks_per_node})" if nodes_per_host > 1 \
            else f"{total} ranks"
        raise DistributedSetupError(
            f"{who} requested but this machine has {cores} physical cores: each CPU rank gets whole cores, "
            f"so use at most {cores} ranks here (or add --no-pin to the job's arguments to share cores knowingly)."
        )


def _entry_option(args: Sequence[str], name: str, default: str) -> str:
    for i, a in enumerate(args):
        if a == name and i + 1 < len(args):
            return args[i + 1]
        if a.startswith(name + "="):
            return a.split("=", 1)[1]
    return default


def _check_entry_args(nproc: int, args: Sequence[str]) -> None:
    if "--no-pin" in args:
        return
    device = _entry_option(args, "--device", "cpu")
    check_ranks(nproc, device, int(_entry_option(args, "--nodes-per-host", "1")))


def torchrun_command(nproc: int, args: Sequence[str], *, nnodes: int | str = 1, node_rank: int = 0,
                     master_addr: str = "127.0.0.1", master_port: int | None = None,
                     max_restarts: int = 0, monitor_interval: float = 0.5, check: bool = True,
                     rdzv_endpoint: str | None = None, rdzv_id: str | None = None) -> list[str]:
    """One machine's torchrun line: a static rendezvous at ``master_addr:master_port``, or with ``rdzv_endpoint``
    an elastic c10d one named ``rdzv_id`` (``nnodes`` may be "1:4"). ``check``: refuse more pinned CPU ranks
    than cores here (``check_ranks``)."""
    if check:
        _check_entry_args(nproc, args)
    head = [sys.executable, "-m", "torch.distributed.run", f"--nnodes={nnodes}", f"--nproc-per-node={nproc}"]
    if rdzv_endpoint is not None:
        if not rdzv_id:
            raise DistributedSetupError("an elastic (c10d) rendezvous needs rdzv_id: a name for the job that every "
                                        "node passes, e.g. rdzv_id='course-job-42'")
        where = ["--rdzv-backend=c10d", f"--rdzv-endpoint={rdzv_endpoint}", f"--rdzv-id={rdzv_id}"]
    else:
        where = [f"--node-rank={node_rank}", f"--master-addr={master_addr}",
                 f"--master-port={master_port or free_port()}"]
    return [*head, *where, f"--max-restarts={max_restarts}", f"--monitor-interval={monitor_interval}", *ENTRY, *args]


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
    error: str | None = field(default=None)


def first_error(output: str) -> str | None:
    """The entry point's own ``error: ...`` message in a job's output (printed once by rank 0)."""
    found = _ERROR_LINE.search(output)
    return found.group(1).strip() if found else None


_JOIN_FAILED = ("could not join the job", "connectFullMesh failed")


def join_failed(job: JobResult) -> bool:
    """True when the job failed because its ranks could not connect to each other."""
    return job.returncode != 0 and any(s in job.output for s in _JOIN_FAILED)


def run_job(commands: Sequence[Sequence[str]] | Callable[[], Sequence[Sequence[str]]],
            out: str | Path | None = None, timeout: float = 300, env: Mapping[str, str] | None = None,
            retries: int = 0, grace: float = 15.0) -> JobResult:
    """Start launchers (e.g. two torchrun 'nodes') as one ``processes.Job``, wait, collect the output; on a timeout
    DistributedSetupError, every process stopped. ``retries``: again when the ranks could not connect (``commands``
    a function: fresh lines, a new port); ``grace``: seconds the others get after one launcher failed."""
    if grace < 0:
        raise ValueError(f"grace must be >= 0 seconds, got {grace}")
    for attempt in range(retries + 1):
        job = _run_once(commands() if callable(commands) else commands, out, timeout, env, grace)
        if not join_failed(job) or attempt == retries:
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


def _inductor_cache() -> str:
    # PyTorch's default Inductor cache, which the job's own TMPDIR would move
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = f"uid_{getattr(os, 'getuid', lambda: 0)()}"
    return os.path.join(tempfile.gettempdir(), "torchinductor_" + re.sub(r'[\\/:*?"<>|]', "_", user))


def _run_once(commands: Sequence[Sequence[str]], out: str | Path | None, timeout: float,
              env: Mapping[str, str] | None, grace: float) -> JobResult:
    if out is not None and Path(out).exists():
        Path(out).unlink()
    with job_scratch() as scratch:
        cache = os.environ.get("TORCHINDUCTOR_CACHE_DIR", _inductor_cache())
        job = Job(commands, env={**os.environ, "TQDM_DISABLE": "1", "PYTHONUNBUFFERED": "1",
                                 "TORCHINDUCTOR_CACHE_DIR": cache, "TMPDIR": str(scratch), **(env or {})})
        try:
            finished = job.start().wait(timeout, grace)
        except JobTimeout as exc:
            raise DistributedSetupError(f"{exc}. Its last output:\n{exc.output[-1500:]}") from None
    summary = json.loads(Path(out).read_text()) if out is not None and Path(out).exists() else None
    return JobResult(finished.returncode, finished.seconds, finished.output, summary, first_error(finished.output))


def measure_job(name: str, command: Callable[[Path], Sequence[Sequence[str]]], out_dir: str | Path, *,
                timeout: float = 600, env: Mapping[str, str] | None = None, retries: int = 1) -> "Result":
    """Run the job ``command(out_path)`` once: a Result of its median epoch after the first (the warm-up kept apart),
    accuracy, steps, world size, global batch; a failed job raises DistributedSetupError with its message."""
    out = Path(out_dir) / f"{name}.json"
    job = _finished(name, run_job(lambda: command(out), out=out, timeout=timeout, env=env, retries=retries))
    return _result(name, job.summary, job)


def job_arm(name: str, command: Callable[[Path], Sequence[Sequence[str]]], out_dir: str | Path,
            outputs: dict[str, str] | None = None, *, env: Mapping[str, str] | None = None) -> Callable[[], "Result"]:
    """An arm for ``measure.interleaved``: every call runs one fresh job (``measure_job``), so each round
    gets new processes; ``outputs[name]`` keeps the last job's output (for ``rank_lines``)."""
    def once() -> "Result":
        res = measure_job(name, command, out_dir, env=env)
        if outputs is not None:
            outputs[name] = res.settings["last_output"]
        return res
    return once


def measure_seeds(name: str, command: Callable[[Path], Sequence[Sequence[str]]], out_dir: str | Path,
                  seeds: Sequence[int], *, timeout: float = 600, env: Mapping[str, str] | None = None,
                  retries: int = 1) -> list["Result"]:
    """One job (``command(out)`` plus ``--seeds``) that trains once per seed, paying its start-up once: one Result
    per seed, as ``measure_job`` gives for a job of that seed alone."""
    if not seeds:
        raise ValueError("measure_seeds needs at least one seed")
    out = Path(out_dir) / f"{name}-seeds.json"
    job = _finished(name, run_job(lambda: [[*line, "--seeds", *map(str, seeds)] for line in command(out)],
                                  out=out, timeout=timeout, env=env, retries=retries))
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


def _epochs(summary: dict[str, Any]) -> tuple[float, list[float]]:
    times = summary["epoch_times"]
    if len(times) < 2:
        raise DistributedSetupError("measuring a job needs --epochs >= 2 to keep the warm-up epoch apart")
    return times[0], times[1:]


def _result(name: str, summary: dict[str, Any], job: JobResult) -> "Result":
    from .measure import Result

    first, rest = _epochs(summary)
    metrics = {"accuracy": summary["accuracy"], **{k: float(summary[k]) for k in ("steps", "world_size", "global_batch")}}
    return Result(name, [statistics.median(rest)], [first], metrics, {"last_output": job.output[-3000:], "summary": summary})


def rank_lines(output: str) -> list[str]:
    """The per-rank report lines of a job's output, sorted by rank (matched, not split: ranks can share a line)."""
    found = re.findall(r"rank \d+/\d+ \(.*?\): all_reduce\(rank\+1\) = [\d.e+]+", output)
    return sorted(found, key=lambda line: int(line.split()[1].split("/")[0]))
