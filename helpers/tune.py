"""Tune your own model: search the course's levers by measured time, within a time budget.

``python -m helpers.tune --model FILE.py:FUNC [--device auto] [--planned-steps N] [--budget S] --out DIR``
(or ``make tune MODEL=FILE.py:FUNC``). ``FUNC()`` returns ``(model, inputs, targets, loss_fn)``
or the same with a fifth item ``make_optimizer(params)`` (Adam, lr 1e-3, by default); see
``helpers.tune_trial`` for the details of one trial.

Method (the course's protocol): every trial is a fresh seeded model in a child process with a
hard timeout; warm-up (and compilation) is timed apart from steady steps; the device is
synchronized before each clock read; steady steps are timed in repeated blocks (median and
spread). Each lever is first tried alone against the baseline; the winners are then combined
greedily and each combination is measured again. The score is the projected time of the
planned number of steps *including* warm-up and compilation, so a compile that does not pay
for itself over the planned run loses. Accuracy guard: the loss after the warm-up steps must
stay within ``loss_tol`` (a fraction of the starting loss) of the baseline's. A failing trial is
recorded with its error and the search goes on. No trial starts that the remaining budget
cannot hold. Output: ``DIR/tune.json``, ``DIR/rows.jsonl`` (helpers.results rows),
``DIR/tune.png`` and a table, plus the lines to apply the winner (``helpers.tune_report``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from . import devices, system, tune_report
from .tune_trial import RESULT_MARK, ModelSpecError, Workload, load_workload

FORMAT_VERSION = 1
KINDS: tuple[str, ...] = ("threads", "omp", "channels_last", "optimizer", "autocast", "batch", "ipex", "compile")
DEFAULT_COMPILE_S = {"cpu": 45.0, "cuda": 60.0}
REPORT_RESERVE_S = 4.0  # kept back from the budget for the table, figure and files
MIN_GAIN = 0.02  # a lever "wins" when it is at least 2% faster than the baseline

Runner = Callable[[dict[str, Any], float], dict[str, Any]]


class TuneError(RuntimeError):
    """Something the reader can fix (bad model file, unknown device, failing baseline)."""


def label(levers: dict[str, Any]) -> str:
    """Short name of a set of levers, e.g. ``'bf16 + compile:default'`` (``'baseline'`` when empty)."""
    if not levers:
        return "baseline"
    parts = []
    for kind in KINDS:
        if kind not in levers:
            continue
        value = levers[kind]
        parts.append({"threads": f"threads={value}", "omp": f"omp:{value}", "channels_last": "channels_last",
                      "optimizer": f"opt:{value}", "autocast": str(value),
                      "batch": f"batch x{value}", "ipex": "ipex", "compile": f"compile:{value}"}[kind])
    return " + ".join(parts)


def plan_levers(work: Workload, device: torch.device, kinds: Sequence[str] | None = None,
                topo: system.Topology | None = None) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The single-lever trials worth trying for this model and device, and those skipped (with why).

    Returns ``(candidates, skipped)``: candidates are lever dicts, cheapest first (compilation
    last); skipped entries are ``{"levers", "label", "reason"}``.
    """
    unknown = set(kinds or ()) - set(KINDS)
    if unknown:
        raise TuneError(f"unknown lever kind(s) {sorted(unknown)}; choose from {', '.join(KINDS)}")
    wanted = set(kinds) if kinds else set(KINDS)
    cands: list[dict[str, Any]] = []
    skipped: list[dict[str, Any]] = []

    def skip(levers: dict[str, Any], reason: str) -> None:
        skipped.append({"levers": levers, "label": label(levers), "reason": reason})

    cpu = device.type == "cpu"
    if "threads" in wanted or "omp" in wanted:
        topo = topo or system.topology()
        if not cpu:
            skip({"threads": "n"}, f"thread count and OpenMP placement matter for CPU training; this run is on {device.type}")
        else:
            if "threads" in wanted:
                if topo.logical_cores > 1:
                    cands.append({"threads": 1})
                if 1 < topo.physical_cores < topo.logical_cores:
                    cands.append({"threads": topo.physical_cores})
            if "omp" in wanted:
                cands.append({"omp": "gnu-bound"})
                if system.intel_openmp_library() is not None:
                    cands.append({"omp": "intel"})
                else:
                    skip({"omp": "intel"}, "Intel OpenMP is not installed (pip install intel-openmp)")
    if "channels_last" in wanted:
        if work.input_dims == 4:
            cands.append({"channels_last": True})
        else:
            skip({"channels_last": True}, f"inputs are {work.input_dims}-D; channels-last applies to 4-D (N, C, H, W) batches")
    if "optimizer" in wanted:
        cands += [{"optimizer": "foreach"}, {"optimizer": "fused"}]
    if "autocast" in wanted:
        supported = devices.autocast_dtypes(device)
        for name, dtype in (("bf16", torch.bfloat16), ("fp16", torch.float16)):
            if dtype in supported:
                cands.append({"autocast": name})
            else:
                skip({"autocast": name}, f"torch.autocast on {device.type} does not support {name} here")
    if "batch" in wanted:
        if work.batch_size >= 1 and work.input_dims >= 1:
            cands += [{"batch": 2}, {"batch": 4}]
    if "ipex" in wanted:
        _plan_ipex(device, cands, skip)
    if "compile" in wanted:
        _plan_compile(device, cands, skip)
    return cands, skipped


def _plan_ipex(device: torch.device, cands: list[dict[str, Any]], skip: Callable[..., None]) -> None:
    from . import ipex_support  # noqa: PLC0415  (reads package metadata only)

    status = ipex_support.status()
    if device.type != "cpu":
        skip({"ipex": True}, f"the course uses IPEX on the CPU; on {device.type} use torch.compile instead")
    elif not status["compatible"]:
        skip({"ipex": True}, str(status["message"]))
    else:
        cands.append({"ipex": True})


def _plan_compile(device: torch.device, cands: list[dict[str, Any]], skip: Callable[..., None]) -> None:
    if device.type == "cpu" and not (shutil.which("gcc") or shutil.which("g++") or shutil.which("cc")):
        skip({"compile": "default"}, "torch.compile on the CPU needs a C++ compiler (install gcc)")
        return
    cands.append({"compile": "default"})
    if device.type == "cuda":
        cands.append({"compile": "reduce-overhead"})
    else:
        skip({"compile": "reduce-overhead"}, "reduce-overhead adds CUDA graphs, which exist on CUDA only; elsewhere it equals default")
    cands.append({"compile": "max-autotune"})


def child_env(levers: dict[str, Any], topo: system.Topology | None = None) -> dict[str, str]:
    """Environment variables a trial's child process gets for its thread levers."""
    env: dict[str, str] = {}
    threads = levers.get("threads")
    if levers.get("omp"):
        topo = topo or system.topology()
        env.update(system.openmp_env(levers["omp"], int(threads or topo.physical_cores), topo))
    elif threads:
        env["OMP_NUM_THREADS"] = str(threads)
    return env


def subprocess_runner(request: dict[str, Any], timeout: float) -> dict[str, Any]:
    """Run one trial in ``python -m helpers.tune_trial``; kill it (and its compile workers) on timeout."""
    env = {**os.environ, **child_env(request.get("levers", {}))}
    proc = subprocess.Popen([sys.executable, "-m", "helpers.tune_trial"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)
    try:
        out, err = proc.communicate(json.dumps(request), timeout=max(timeout, 1.0))
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        return {"ok": False, "error": f"timed out after {timeout:.0f} s (killed; the budget could not hold it)"}
    for line in reversed(out.splitlines()):
        if line.startswith(RESULT_MARK):
            return json.loads(line[len(RESULT_MARK):])
    tail = (err.strip().splitlines() or ["no output"])[-1]
    return {"ok": False, "error": f"the trial process exited with code {proc.returncode}: {tail[:300]}"}


def _kill_group(proc: subprocess.Popen) -> None:
    import signal  # noqa: PLC0415

    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        proc.kill()
    proc.communicate()


def make_trial(levers: dict[str, Any], raw: dict[str, Any], *, planned_steps: int, guard_steps: int,
               base_raw: dict[str, Any] | None, loss_tol: float, stage: str, wall_s: float) -> dict[str, Any]:
    """A tune.json trial from a child's raw result: projected total time, loss check against the baseline."""
    trial: dict[str, Any] = {"label": label(levers), "levers": dict(levers), "stage": stage, "ok": bool(raw.get("ok")),
                             "step_ms": None, "spread_ms": None, "warmup_s": raw.get("warmup_s"), "total_s": None,
                             "loss_diff": None, "error": raw.get("error", ""), "wall_s": round(wall_s, 2)}
    if not trial["ok"]:
        return trial
    k = int(raw.get("batch_factor", 1))
    steps_left = max(0, math.ceil(planned_steps / k) - guard_steps)
    trial.update(step_ms=raw["step_ms"], spread_ms=raw["spread_ms"], samples_ms=raw["samples_ms"],
                 batch_size=raw.get("batch_size"), threads=raw.get("threads"),
                 total_s=raw["warmup_s"] + raw["step_ms"] / 1000 * steps_left,
                 totals_s=[raw["warmup_s"] + s / 1000 * steps_left for s in raw["samples_ms"]])
    ref = base_raw or raw
    scale = max(abs(ref["first_loss"]), 1e-12)
    trial["loss_diff"] = abs(raw["guard_loss"] - ref["guard_loss"]) / scale
    if trial["loss_diff"] > loss_tol:
        trial["ok"] = False
        trial["error"] = (f"accuracy guard: the loss after {guard_steps} steps differs from the baseline's by "
                          f"{trial['loss_diff']:.1%} of the starting loss (tolerance {loss_tol:.0%})")
    return trial


class _Search:
    """The state of one search: budget clock, trials so far, cost estimates."""

    def __init__(self, request: dict[str, Any], budget: float, runner: Runner, planned_steps: int,
                 loss_tol: float, progress: bool, start: float) -> None:
        from tqdm.auto import tqdm  # noqa: PLC0415

        self.request, self.budget, self.runner = request, budget, runner
        self.planned_steps, self.loss_tol = planned_steps, loss_tol
        self.start = start
        self.trials: list[dict[str, Any]] = []
        self.skipped: list[dict[str, Any]] = []
        self.base_raw: dict[str, Any] | None = None
        self.base_wall = 0.0
        self.compile_s: float | None = None
        # tqdm's notebook bar ignores TQDM_DISABLE, so honour it here (CI and committed runs set it)
        off = not progress or os.environ.get("TQDM_DISABLE", "").lower() in ("1", "true", "yes")
        self.bar = tqdm(total=round(budget), unit="s", desc="tune", **({"disable": True} if off else {}),
                        bar_format="{desc}: {n:.0f}/{total:.0f} s of budget |{bar}| {postfix}")

    def left(self) -> float:
        """Seconds of budget left for trials (a little is kept for writing the report)."""
        return self.budget - REPORT_RESERVE_S - (time.perf_counter() - self.start)

    def estimate(self, levers: dict[str, Any]) -> float:
        """Seconds a trial will probably take, from what has been measured so far."""
        est = self.base_wall * (1 + 0.4 * (int(levers.get("batch", 1)) - 1))
        if levers.get("compile"):
            dev = self.request["device"].split(":")[0]
            per = self.compile_s if self.compile_s is not None else DEFAULT_COMPILE_S.get(dev, 60.0)
            est += per * (3 if levers["compile"] == "max-autotune" else 1)
        if levers.get("ipex"):
            est += 6.0
        return est

    def run(self, levers: dict[str, Any], stage: str) -> dict[str, Any] | None:
        """Measure one set of levers if the budget holds it; None (recorded as skipped) otherwise."""
        left = self.left()
        est = self.estimate(levers) if self.base_raw is not None else left
        if est > left:
            self.skipped.append({"levers": dict(levers), "label": label(levers),
                                 "reason": f"budget: needs about {est:.0f} s, {max(left, 0):.0f} s left"})
            return None
        timeout = left if self.base_raw is None else min(left, max(2.5 * est, est + 20))
        self.bar.set_postfix_str(label(levers))
        t0 = time.perf_counter()
        raw = self.runner({**self.request, "levers": levers}, timeout)
        wall = time.perf_counter() - t0
        trial = make_trial(levers, raw, planned_steps=self.planned_steps, guard_steps=self.request["guard_steps"],
                           base_raw=self.base_raw, loss_tol=self.loss_tol, stage=stage, wall_s=wall)
        if self.base_raw is None and raw.get("ok"):
            self.base_raw, self.base_wall = raw, wall
        if levers.get("compile") and raw.get("warmup_s") is not None:
            self.compile_s = max(self.compile_s or 0.0, raw["warmup_s"])
        self.trials.append(trial)
        self.bar.n = min(round(time.perf_counter() - self.start), self.bar.total)
        self.bar.refresh()
        return trial


def _speedup(base: dict[str, Any], trial: dict[str, Any]) -> float:
    return base["total_s"] / trial["total_s"] if trial.get("ok") and trial.get("total_s") else 0.0


def _combine(search: _Search, singles: list[dict[str, Any]]) -> None:
    """Greedy: start from the best single lever, add the next winners one by one, keep what helps."""
    base = search.trials[0]
    best_per_kind: dict[str, dict[str, Any]] = {}
    for t in singles:
        kind = next(iter(t["levers"]))
        if _speedup(base, t) >= 1 + MIN_GAIN and (kind not in best_per_kind
                                                    or t["total_s"] < best_per_kind[kind]["total_s"]):
            best_per_kind[kind] = t
    winners = sorted(best_per_kind.values(), key=lambda t: t["total_s"])
    if len(winners) < 2:
        return
    current = winners[0]
    for w in winners[1:]:
        trial = search.run({**current["levers"], **w["levers"]}, "combined")
        if trial is not None and trial["ok"] and trial["total_s"] < current["total_s"]:
            current = trial


def tune(model: str, *, device: str = "auto", planned_steps: int = 1000, budget: float = 300.0,
         out: str | Path | None = None, kinds: Sequence[str] | None = None, loss_tol: float = 0.05,
         guard_steps: int = 10, repeats: int = 3, block_s: float = 0.25, seed: int = 0,
         runner: Runner | None = None, progress: bool = True, chapter: str = "tune",
         started: float | None = None) -> dict[str, Any]:
    """Search the levers for ``model`` (``FILE.py:FUNC``) and return the tune.json report.

    With ``out``, writes ``out/tune.json``, ``out/rows.jsonl`` and ``out/tune.png``. ``kinds``
    limits the lever kinds (see ``KINDS``). ``runner`` replaces the child-process runner (tests).
    ``started`` is the ``time.perf_counter()`` the budget counts from (default: now).
    Raises TuneError for a model spec, device or baseline the reader has to fix.
    """
    started = time.perf_counter() if started is None else started
    if planned_steps < 1 or budget <= 0 or guard_steps < 2 or repeats < 1:
        raise TuneError("planned_steps and budget must be positive, guard_steps >= 2 and repeats >= 1")
    try:
        dev = devices.get_device(device)
        work = load_workload(model, seed)  # checked here, once, so errors are clear and immediate
    except (devices.DeviceError, ModelSpecError) as exc:
        raise TuneError(str(exc)) from None
    cands, skipped = plan_levers(work, dev, kinds)
    request = {"model": model, "device": str(dev), "guard_steps": guard_steps, "repeats": repeats,
               "block_s": block_s, "seed": seed}
    search = _Search(request, budget, runner or subprocess_runner, planned_steps, loss_tol, progress, started)
    search.skipped += skipped
    base = search.run({}, "baseline")
    if base is None or not base["ok"]:
        search.bar.close()
        if base is not None and base["error"].startswith("timed out"):
            raise TuneError(f"the budget of {budget:.0f} s cannot hold even the baseline trial of {model}; "
                            "give a larger budget (--budget SECONDS).")
        raise TuneError(f"the baseline (no levers) failed, so there is nothing to compare against: "
                        f"{base['error'] if base else 'no budget'}. Check that {model} trains as written.")
    singles = [t for t in (search.run(c, "single") for c in cands) if t is not None]
    _combine(search, singles)
    search.bar.close()
    report = _report(search, model, dev, planned_steps, budget, kinds)
    if out is not None:
        tune_report.write_outputs(report, Path(out), chapter=chapter)
    return report


def _report(search: _Search, model: str, dev: torch.device, planned_steps: int, budget: float,
            kinds: Sequence[str] | None) -> dict[str, Any]:
    base = search.trials[0]
    ok = [t for t in search.trials if t["ok"]]
    best = min(ok, key=lambda t: t["total_s"])
    for t in search.trials:
        t["speedup"] = _speedup(base, t) or None
    return {"version": FORMAT_VERSION, "model": model, "device": devices.describe(dev),
            "planned_steps": planned_steps, "budget_s": budget,
            "elapsed_s": round(time.perf_counter() - search.start, 1),
            "guard_steps": search.request["guard_steps"], "loss_tol": search.loss_tol,
            "kinds": list(kinds) if kinds else list(KINDS), "torch": torch.__version__,
            "optimizer": search.base_raw.get("optimizer") if search.base_raw else None,
            "load_average": round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None,
            "logical_cores": os.cpu_count(),
            "baseline": base, "trials": search.trials, "skipped": search.skipped,
            "best": {"label": best["label"], "levers": best["levers"], "speedup": base["total_s"] / best["total_s"],
                     "total_s": best["total_s"]}}


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: ``python -m helpers.tune --model FILE.py:FUNC --out DIR``."""
    p = argparse.ArgumentParser(prog="python -m helpers.tune", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="FILE.py:FUNC; FUNC() returns (model, inputs, targets, loss_fn[, make_optimizer])")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:1, xpu, mps (default auto)")
    p.add_argument("--planned-steps", type=int, default=1000, help="training steps you plan to run (default 1000)")
    p.add_argument("--budget", type=float, default=300, help="seconds the whole search may take (default 300)")
    p.add_argument("--levers", default="", help=f"comma-separated subset of {','.join(KINDS)} (default all)")
    p.add_argument("--loss-tol", type=float, default=0.05, help="accuracy guard, fraction of the starting loss (0.05)")
    p.add_argument("--out", required=True, help="folder for tune.json, rows.jsonl and tune.png")
    args = p.parse_args(argv)
    kinds = [k.strip() for k in args.levers.split(",") if k.strip()] or None
    # The budget counts from the start of this process (importing torch is part of the wait).
    import psutil  # noqa: PLC0415

    started = time.perf_counter() - max(0.0, time.time() - psutil.Process().create_time())
    try:
        report = tune(args.model, device=args.device, planned_steps=args.planned_steps, budget=args.budget,
                      out=args.out, kinds=kinds, loss_tol=args.loss_tol, started=started)
    except TuneError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(tune_report.summary(report))
    print(f"\nwrote {Path(args.out) / 'tune.json'}, rows.jsonl and tune.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
