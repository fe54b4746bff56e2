"""Build and run the launch commands of the course's DDP entry point (``python -m helpers.distributed``).

* ``torchrun_command`` / ``mpirun_command`` / ``sbatch_command`` write the command lines a
  reader would type (one torchrun per machine -- a static rendezvous at node 0, or an elastic
  c10d one at ``--rdzv-endpoint`` -- one mpirun, one sbatch); on several machines ``mpirun``
  gets ``MASTER_ADDR`` from the first host of its hostfile (``first_host``), where Open MPI
  places rank 0;
* ``check_ranks`` refuses more pinned CPU ranks than physical cores with one message,
  before anything starts;
* ``run_job`` starts one or more launchers (two torchrun "nodes" on one machine) as one
  ``helpers.children.Job`` (the course's one child-process runner), so on a timeout or Ctrl-C
  every process it started -- launchers and the ranks they spawned in their own sessions -- is
  stopped and waited for, and nothing is left holding a port or a core;
* ``measure_job`` runs a job with the course's measurement protocol (``job_arm``: one fresh job
  per call, an arm of ``measure.interleaved``); ``rank_lines`` picks
  the per-rank report lines out of a job's output.
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

from .children import Job, JobTimeout
from .distributed import SBATCH_SCRIPT
from .ranks import DistributedSetupError

if TYPE_CHECKING:
    from .measure import Result

ENTRY = ["-m", "helpers.distributed"]
MPIRUN_SCRIPT = SBATCH_SCRIPT.parent / "ddp_mpirun.sh"
_ERROR_LINE = re.compile(r"^error: (.+)$", re.M)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def check_ranks(ranks_per_node: int, device: str = "cpu", nodes_per_host: int = 1) -> None:
    """Refuse more pinned CPU ranks on this machine than it has physical cores, with the numbers.

    ``nodes_per_host``: simulated nodes sharing this machine (chapter 11); their ranks add up.
    """
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
    """One machine's torchrun line for the entry point.

    By default a static rendezvous: every node names node 0 (``master_addr:master_port``) and
    its own ``node_rank``. With ``rdzv_endpoint`` ("host:port" that every node can reach) an
    elastic c10d rendezvous instead: ``--rdzv-backend=c10d --rdzv-endpoint=... --rdzv-id=...``,
    the same line on every node, ranks assigned as nodes join, and ``nnodes`` may be a range
    ("1:4"). ``rdzv_id`` names the job (unique per job: nodes with the same id meet).
    With ``check`` (default) a CPU job that asks for more pinned ranks than this machine's
    cores is refused here, with one message, instead of failing in every rank.
    """
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
    """The first host named in an Open MPI hostfile ("node01 slots=2" per line, # comments).

    Open MPI fills the hosts in hostfile order (``--map-by slot``), so rank 0 runs there: it is
    the job's ``MASTER_ADDR``. (``127.0.0.1`` names a different machine on every node.)
    """
    for line in Path(hostfile).read_text().splitlines():
        words = line.split("#", 1)[0].split()
        if words:
            return words[0]
    raise DistributedSetupError(f"hostfile {hostfile} names no host: write one machine per line, e.g. 'node01 slots=2'")


def mpirun_command(np: int, args: Sequence[str], master_port: int | None = None, *,
                   hostfile: str | Path | None = None, master_addr: str | None = None,
                   check: bool = True) -> list[str]:
    """An Open MPI line running the entry point (the collectives still use gloo/nccl).

    Without ``hostfile`` every rank runs on this machine and meets at 127.0.0.1. With a
    hostfile the ranks are placed on its hosts in order (``--map-by slot``) and ``MASTER_ADDR``
    is rank 0's host, the hostfile's first (``first_host``), unless ``master_addr`` is given.
    """
    mpirun = shutil.which("mpirun")
    if mpirun is None:
        raise DistributedSetupError("mpirun not found: install Open MPI "
                                    "(Debian/Ubuntu: apt-get update && apt-get install -y openmpi-bin).")
    if check and hostfile is None:  # with a hostfile the ranks spread over machines this one cannot see
        _check_entry_args(np, args)
    # Open MPI refuses to run as root unless told, and more ranks than slots without --oversubscribe.
    extra = ["--allow-run-as-root"] if hasattr(os, "geteuid") and os.geteuid() == 0 else []
    forwarded = [x for var in ("PATH", "PYTHONPATH", "COURSE_PROFILE", "COURSE_DATA", "COURSE_DATA_DIR",
                               "OMP_NUM_THREADS", "TQDM_DISABLE")
                 if var in os.environ for x in ("-x", var)]
    if hostfile is not None:
        where = ["--hostfile", str(hostfile), "--map-by", "slot"]
        master_addr = master_addr or first_host(hostfile)
    else:
        where = ["--oversubscribe"]
        master_addr = master_addr or "127.0.0.1"
    # --bind-to none: the entry point pins each rank itself, from its local rank and the topology
    return [mpirun, *extra, *where, "--bind-to", "none", "-np", str(np),
            "-x", f"MASTER_ADDR={master_addr}", "-x", f"MASTER_PORT={master_port or free_port()}", *forwarded,
            sys.executable, *ENTRY, *args]


def sbatch_command(args: Sequence[str], script: str | Path = SBATCH_SCRIPT) -> list[str]:
    """The sbatch line that submits the course's batch script with the entry point's arguments."""
    return ["sbatch", str(script), *args]


@dataclass
class JobResult:
    """A finished launch: exit code, seconds, merged output, rank 0's summary (if written) and
    the entry point's one-line error message (if it printed one)."""

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
    """Start one or more launcher processes (e.g. two torchrun 'nodes'), wait, collect output.

    The launchers run as one ``helpers.children.Job``: each in its own process group, stdout and
    stderr merged and drained while the job runs. On timeout it raises DistributedSetupError, on
    Ctrl-C KeyboardInterrupt -- in both cases after stopping every process of the job.
    ``retries``: start the job again (at most this often) when its ranks could not connect to
    each other -- on a busy shared machine gloo's connection set-up occasionally fails; pass
    ``commands`` as a function to build fresh command lines (a new port) for every attempt.
    ``grace``: once one launcher has failed, seconds the others get to notice and exit on
    their own before they are stopped (a node whose peer died would otherwise wait for its
    rendezvous timeout).
    """
    if grace < 0:
        raise ValueError(f"grace must be >= 0 seconds, got {grace}")
    for attempt in range(retries + 1):
        job = _run_once(commands() if callable(commands) else commands, out, timeout, env, grace)
        if not join_failed(job) or attempt == retries:
            return job
        print(f"(the ranks could not connect; starting the job again, attempt {attempt + 2})", flush=True)
    raise AssertionError("not reached")


def scratch_root() -> Path:
    """The folder of the jobs' scratch folders (one per user, in the system's temporary folder)."""
    # a short path: Open MPI puts Unix sockets under TMPDIR, and their paths may not pass 107 bytes
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
    # torchrun writes a torchelastic_* folder per job and never removes it, Open MPI its session
    # files; a parent killed by SIGKILL leaves its folder to the next job, which reclaims it
    reclaim_scratch()
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
    # PyTorch's default Inductor cache (the temporary folder, per user), which a job's own TMPDIR
    # would move: the ranks keep compiling from, and into, the cache they always had
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
                repeats: int = 1, timeout: float = 600, env: Mapping[str, str] | None = None,
                epochs_as_samples: bool = False, retries: int = 1) -> "Result":
    """Run a job ``repeats`` times and summarise it with the course protocol.

    ``command(out_path)`` returns the launcher command lines of one run. Each run's first
    epoch is its warm-up. Timed samples: the median of the other epochs of each run, or,
    with ``epochs_as_samples``, every steady-state epoch of every run (a spread from one run).
    Metrics: accuracy (median), optimizer steps, world size and global batch of the last run.
    ``retries``: as in ``run_job`` (a run whose ranks could not connect is started again).
    A failed job raises DistributedSetupError with the entry point's own message.
    """
    samples: list[float] = []
    warm: list[float] = []
    summaries: list[dict[str, Any]] = []
    job = None
    for r in range(repeats):
        out = Path(out_dir) / f"{name}-{r}.json"
        job = _finished(name, run_job(lambda: command(out), out=out, timeout=timeout, env=env, retries=retries))
        summaries.append(job.summary)
        first, rest = _epochs(job.summary)
        warm.append(first)
        samples.extend(rest if epochs_as_samples else [statistics.median(rest)])
    assert job is not None
    return _result(name, samples, warm, summaries, job)


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
    """One job that trains once per seed (``command(out)`` plus ``--seeds``): one Result per seed.

    The entry point trains the seeds one after another, each from scratch, so the job pays its
    start-up once instead of once per seed. Each Result is what ``measure_job`` gives for a job
    of that seed alone: the median of its epochs after the first, and its accuracy.
    """
    if not seeds:
        raise ValueError("measure_seeds needs at least one seed")
    out = Path(out_dir) / f"{name}-seeds.json"
    job = _finished(name, run_job(lambda: [[*line, "--seeds", *map(str, seeds)] for line in command(out)],
                                  out=out, timeout=timeout, env=env, retries=retries))
    runs = job.summary.get("seeds")
    if not isinstance(runs, list) or len(runs) != len(seeds):
        raise DistributedSetupError(f"job {name!r} wrote no summary per seed: is --seeds passed to "
                                    "python -m helpers.distributed?")
    results = []
    for seed, summary in zip(seeds, runs):
        first, rest = _epochs(summary)
        results.append(_result(f"{name} seed {seed}", [statistics.median(rest)], [first], [summary], job))
    return results


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


def _result(name: str, samples: list[float], warm: list[float], summaries: list[dict[str, Any]],
            job: JobResult) -> "Result":
    from .measure import Result

    last = summaries[-1]
    return Result(name, samples, warm, {"accuracy": statistics.median(s["accuracy"] for s in summaries),
                                        "steps": float(last["steps"]), "world_size": float(last["world_size"]),
                                        "global_batch": float(last["global_batch"])},
                  {"last_output": job.output[-3000:], "summary": last})


def rank_lines(output: str) -> list[str]:
    """The per-rank report lines of a job's output, sorted by rank (ranks printing at the
    same moment can share a line of the merged output, so they are matched, not split)."""
    found = re.findall(r"rank \d+/\d+ \(.*?\): all_reduce\(rank\+1\) = [\d.e+]+", output)
    return sorted(found, key=lambda line: int(line.split()[1].split("/")[0]))
