"""Tune your own model (chapter 13, ``make tune``): ``python -m helpers.tune --model FILE.py:FUNC --out DIR``.

The method (single levers within a budget, their greedy combination, a confirmation in rounds): docs/tools.md."""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import psutil
import torch
from tqdm.auto import tqdm

from .. import devices, measure, processes, run_sizes, variants
from . import report as tune_report
from .report import AA, INCONCLUSIVE, NO_CANDIDATE_REASON, ONLY_HINTS_REASON, projected_s
from .levers import DEFAULT_COMPILE_S, KINDS, by_diagnosis, changes_training, child_env, diagnosis_record, label, plan_levers
from .trial import TuneError, load_workload

Runner = Callable[[dict[str, Any], float], dict[str, Any]]
FORMAT_VERSION = 4  # 4: a top-level "diagnosis"; best.confirmed.word may be "inconclusive (budget)"
REPORT_RESERVE_S = 4.0  # kept back from the budget for the table, figure and files
MIN_GAIN = measure.MIN_EFFECT  # a lever "wins" a trial when it is at least 2% faster than the baseline
LOSS_TOL = 0.05  # the accuracy guard: the loss after the guard steps within 5% of the starting loss of the baseline's
NEAR_MISS = 0.75  # a single lever this close to the baseline in its one trial is confirmed too (docs/tools.md)
BATCH_GUARD = ("untested: the batch lever repeats your one batch, so its loss equals the baseline's by "
               "construction; check accuracy on your real data")
MAX_ARMS = 4  # arms besides the baseline (and the A/A arm) in one confirmation


def trial_command(levers: dict[str, Any]) -> tuple[list[str], dict[str, str]]:
    """The command line and extra environment of a trial process with ``levers``."""
    return [sys.executable, "-m", "helpers.tune.trial"], child_env(levers)


def subprocess_runner(request: dict[str, Any], timeout: float) -> dict[str, Any]:
    """One trial in a new process with an empty compile cache of its own (removed after), killed past ``timeout``."""
    start, cache = time.monotonic(), tempfile.mkdtemp(prefix="tune-cache-")
    argv, env = trial_command(request.get("levers", {}))
    env = {**env, "TORCHINDUCTOR_CACHE_DIR": cache, "TRITON_CACHE_DIR": os.path.join(cache, "triton")}
    kids = processes.Children({"trial": (argv, env)}, startup_timeout=max(timeout, 1.0))
    try:
        kids.start()
        return kids.ask("trial", request, timeout=max(1.0, timeout - (time.monotonic() - start)))
    except processes.ChildError as exc:
        if "within" in str(exc):
            return {"ok": False, "error": f"timed out after {timeout:.0f} s (killed: the trial ran past its time limit)"}
        return {"ok": False, "error": f"the trial process failed: {processes.tail(str(exc), 1)[:300]}"}
    finally:
        kids.close()
        shutil.rmtree(cache, ignore_errors=True)


def make_trial(levers: dict[str, Any], raw: dict[str, Any], *, planned_steps: int, guard_steps: int,
               base_raw: dict[str, Any] | None, stage: str, wall_s: float) -> dict[str, Any]:
    """A tune.json trial from a child's raw result: projected total time, loss check against the baseline."""
    trial: dict[str, Any] = {"label": label(levers), "levers": dict(levers), "stage": stage, "ok": bool(raw.get("ok")),
                             "step_ms": None, "spread_ms": None, "warmup_s": raw.get("warmup_s"), "total_s": None,
                             "loss_diff": None, "error": raw.get("error", ""), "wall_s": round(wall_s, 2)}
    if not trial["ok"]:
        return trial
    trial.update(step_ms=raw["step_ms"], spread_ms=raw["spread_ms"], samples_ms=raw["samples_ms"],
                 batch_size=raw.get("batch_size"), threads=raw.get("threads"),
                 total_s=projected_s(raw, planned_steps, guard_steps),
                 totals_s=[projected_s(raw, planned_steps, guard_steps, s) for s in raw["samples_ms"]])
    ref = base_raw or raw
    scale = max(abs(ref["first_loss"]), 1e-12)
    trial["loss_diff"] = abs(raw["guard_loss"] - ref["guard_loss"]) / scale
    trial["guard"] = "checked"
    if levers.get("batch"):
        trial["guard"] = BATCH_GUARD
    elif trial["loss_diff"] > LOSS_TOL:
        trial["ok"] = False
        trial["error"] = (f"accuracy guard: the loss after {guard_steps} steps differs from the baseline's by "
                          f"{trial['loss_diff']:.1%} of the starting loss (tolerance {LOSS_TOL:.0%})")
    return trial


class _Search:
    """The state of one search: budget clock, trials so far, cost estimates."""

    def __init__(self, request: dict[str, Any], budget: float, runner: Runner, planned_steps: int,
                 progress: bool, start: float, confirm_rounds: int = 0, diagnose: bool = True) -> None:
        self.request, self.budget, self.runner = request, budget, runner
        self.planned_steps, self.start = planned_steps, start
        self.confirm_rounds, self.diagnose = confirm_rounds, diagnose
        self.trials: list[dict[str, Any]] = []
        self.skipped: list[dict[str, Any]] = []
        self.base_raw: dict[str, Any] | None = None
        self.base_wall = 0.0
        self.compile_s: float | None = None
        self.bar = tqdm(total=round(budget), unit="s", desc="tune", disable=run_sizes.bars_off(progress),
                        bar_format="{desc}: {n:.0f}/{total:.0f} s of budget |{bar}| {postfix}")

    def kept(self, reserve: bool = True) -> float:
        """Seconds kept back for the report and (``reserve``) a verdict on one setting as costly as the baseline."""
        kept = REPORT_RESERVE_S
        if reserve and self.base_raw is not None and self.confirm_rounds:
            kept += min(self.confirm_rounds, measure.MIN_ROUNDS) * (2 * self.base_trial_s() + self.startup_s(2))
        return kept

    def left(self, reserve: bool = True) -> float:
        """Seconds of budget left for trials (what ``kept`` keeps back is not counted)."""
        return self.budget - self.kept(reserve) - (time.perf_counter() - self.start)

    def base_trial_s(self) -> float:
        """Seconds the baseline's trial took in its child process (start-up not counted)."""
        return float(self.base_raw.get("child_s") or self.base_wall) if self.base_raw else 0.0

    def startup_s(self, processes: int) -> float:
        """Seconds ``processes`` trial processes take to start side by side, from the baseline's start-up."""
        one = max(0.0, self.base_wall - self.base_trial_s())
        return one * math.ceil(processes / max(1, os.cpu_count() or 1))

    def estimate(self, levers: dict[str, Any]) -> float:
        """Seconds a trial will probably take, from what has been measured so far."""
        est = self.base_wall * (1 + 0.4 * (int(levers.get("batch", 1)) - 1))
        if levers.get("compile"):
            dev = self.request["device"].split(":")[0]
            per = self.compile_s if self.compile_s is not None else DEFAULT_COMPILE_S.get(dev, 60.0)
            est += per * (3 if levers["compile"] == "max-autotune" else 1)
        return est

    def candidate_found(self) -> bool:
        """Whether a trial so far would go to the confirmation (a winner or a near miss)."""
        base = self.trials[0] if self.trials and self.trials[0].get("ok") else None
        return base is not None and any(is_winner(base, t) or is_near_miss(base, t) for t in self.trials[1:])

    def run(self, levers: dict[str, Any], stage: str) -> dict[str, Any] | None:
        """Measure one set of levers if the budget holds it; None, recorded as skipped, otherwise."""
        left = self.left()
        est = self.estimate(levers) if self.base_raw is not None else left
        borrowed = est > left and self.base_raw is not None and not self.candidate_found()
        if borrowed:
            left = self.left(reserve=False)
        if est > left:
            self.skipped.append({"levers": dict(levers), "label": label(levers),
                                 "reason": f"budget: needs about {est:.0f} s, {max(left, 0):.0f} s left " + (
                                     f"({self.kept(reserve=False):.0f} s kept for the report; nothing to confirm "
                                     "yet, so none for the confirmation)" if borrowed
                                     else f"({self.kept():.0f} s kept for the confirmation and the report)")})
            return None
        timeout = left if self.base_raw is None else min(left, max(2.5 * est, est + 20))
        ask = self.diagnose and stage == "baseline"
        self.bar.set_postfix_str(label(levers))
        t0 = time.perf_counter()
        raw = self.runner({**self.request, "levers": levers, "diagnose": ask}, timeout / 2 if ask else timeout)
        if ask and not raw.get("ok"):  # the diagnosis may be what overran: the baseline again without it
            failed = raw.get("error", "")
            t0 = time.perf_counter()
            raw = self.runner({**self.request, "levers": levers, "diagnose": False}, self.left())
            raw["diagnosis"] = {"error": f"no diagnosis: the baseline trial with it failed ({failed[:160]}), "
                                         "so it ran again without; trials keep the plan's order"}
        wall = time.perf_counter() - t0 - float(raw.get("diagnosis_s") or 0.0)
        trial = make_trial(levers, raw, planned_steps=self.planned_steps, guard_steps=self.request["guard_steps"],
                           base_raw=self.base_raw, stage=stage, wall_s=wall)
        trial["child_s"] = raw.get("child_s")
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


def is_winner(base: dict[str, Any], trial: dict[str, Any]) -> bool:
    """A trial at least ``MIN_GAIN`` faster than ``base`` over the planned steps: it goes to the confirmation."""
    return bool(trial.get("ok")) and trial is not base and _speedup(base, trial) >= 1 + MIN_GAIN


def is_near_miss(base: dict[str, Any], trial: dict[str, Any]) -> bool:
    """A single lever, training unchanged, not a winner but at least ``NEAR_MISS`` of the baseline's speed."""
    return (bool(trial.get("ok")) and trial is not base and not changes_training(trial["levers"])
            and NEAR_MISS <= _speedup(base, trial) < 1 + MIN_GAIN)


def _combine(search: _Search, singles: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The greedy combination of the winners (best per kind, no batch); None without winners."""
    best_per_kind: dict[str, dict[str, Any]] = {}  # fastest first, so the first of each kind is its best
    for t in sorted(singles, key=lambda t: t["total_s"] if t["ok"] else math.inf):
        if is_winner(search.trials[0], t) and not changes_training(t["levers"]):
            best_per_kind.setdefault(next(iter(t["levers"])), t)
    if not best_per_kind:
        return None
    current, *rest = best_per_kind.values()
    for w in rest:
        trial = search.run({**current["levers"], **w["levers"]}, "combined")
        if trial is not None and is_winner(current, trial):
            current = trial
    return current


def confirm(search: _Search, winners: list[dict[str, Any]], kept: dict[str, Any] | None, rounds: int) -> dict[str, Any]:
    """The best few ``winners`` the budget holds measured again (``measure_arms``), with those ``"left_out"``."""
    kept_levers = kept["levers"] if kept else None
    arms = order_arms(winners, kept_levers)
    if rounds < 1:
        return {"word": "not confirmed", "rounds": 0, "reason": "confirmation turned off (confirm_rounds=0)",
                "left_out": [{"label": a["label"], "levers": a["levers"], "reason": "confirmation turned off",
                              "role": role(a, kept_levers)} for a in arms]}
    base_s = search.base_trial_s()
    chosen, left_out, afford = fit_arms(arms, base_s, search.left(reserve=False), rounds, kept_levers, search.startup_s)
    if not chosen:
        first = round_s(arms[:1], base_s, search.startup_s)
        return {"word": "not confirmed", "rounds": 0, "left_out": left_out,
                "reason": f"the budget left room for {max(int(search.left(reserve=False) // first), 0)} confirmation "
                          f"rounds; a verdict needs {measure.MIN_ROUNDS} (about {first * measure.MIN_ROUNDS:.0f} s): "
                          "give a larger budget"}
    per_round = round_s(chosen, base_s)
    search.bar.set_postfix_str(f"confirming {len(chosen)} setting(s)")
    # a disturbed comparison (its A/A arm got a verdict) is measured again only as often as the budget holds
    passes = int(search.left(reserve=False) // (afford * round_s(chosen, base_s, search.startup_s)))
    record = measure_arms(chosen, search.request, rounds=afford, kept=kept_levers, timeout=max(30.0, 3 * per_round),
                          total=lambda raw: projected_s(raw, search.planned_steps, search.request["guard_steps"]),
                          attempts=None if passes >= measure.AA_ATTEMPTS else max(1, passes),
                          runner=None if search.runner is subprocess_runner else search.runner)
    record["left_out"] = left_out
    return record


def tune(model: str, *, device: str = "auto", planned_steps: int = 1000, budget: float = 300.0,
         out: str | Path | None = None, kinds: Sequence[str] | None = None, guard_steps: int = 10, repeats: int = 3,
         block_s: float = 0.25, runner: Runner | None = None, progress: bool = True, chapter: str = "tune",
         started: float | None = None, confirm_rounds: int | None = None, diagnose: bool = True) -> dict[str, Any]:
    """Search the levers for ``model`` (``FILE.py:FUNC``); the tune.json report, also written to ``out``.
    ``runner``: trials in this process (tests); ``started``: the ``time.perf_counter()`` the budget counts from."""
    started = time.perf_counter() if started is None else started
    if planned_steps < 1 or budget <= 0 or guard_steps < 2 or repeats < 1:
        raise TuneError("planned_steps and budget must be positive, guard_steps >= 2 and repeats >= 1")
    try:
        dev = devices.get_device(device)
    except devices.DeviceError as exc:
        raise TuneError(str(exc)) from None
    work = load_workload(model)  # checked here, once, so errors are clear and immediate
    cands, skipped = plan_levers(work, dev, kinds)
    request = {"model": model, "device": str(dev), "guard_steps": guard_steps, "repeats": repeats, "block_s": block_s}
    confirm_rounds = measure.ROUNDS if confirm_rounds is None else confirm_rounds
    search = _Search(request, budget, runner or subprocess_runner, planned_steps, progress, started,
                     confirm_rounds, diagnose)
    search.skipped += skipped
    base = search.run({}, "baseline")
    if base is None or not base["ok"]:
        search.bar.close()
        if base is not None and base["error"].startswith("timed out"):
            raise TuneError(f"the budget of {budget:.0f} s cannot hold even the baseline trial of {model}; "
                            "give a larger budget (--budget SECONDS).")
        raise TuneError(f"the baseline (no levers) failed, so there is nothing to compare against: "
                        f"{base['error'] if base else 'no budget'}. Check that {model} trains as written.")
    diagnosis = diagnosis_record((search.base_raw or {}).get("diagnosis") if diagnose else {"error": "not asked"}, cands)
    cands = by_diagnosis(cands, diagnosis["shares"])  # the first trial attacks the regime with the largest share
    singles = [t for t in (search.run(c, "single") for c in cands) if t is not None]
    kept = _combine(search, singles)
    for t in search.trials:
        t["speedup"] = _speedup(base, t) or None
    winners = [t for t in singles if is_winner(base, t)] + ([kept] if kept is not None else [])
    near = sorted((t for t in singles if is_near_miss(base, t)), key=lambda t: t["total_s"])
    for t in near:
        t["near_miss"] = True
    confirmation = (confirm(search, winners + near, kept, confirm_rounds) if winners or near
                    else {"word": "no candidate", "rounds": 0, "arms": []})
    search.bar.close()
    front = kept or (near[0] if near else None)  # the search's front-runner among what may be recommended
    reason = ONLY_HINTS_REASON if winners else NO_CANDIDATE_REASON
    best = recommend(confirmation, base["total_s"], front, reason, _unmeasured(search, cands, confirmation))
    report = {"version": FORMAT_VERSION, "model": model, "device": devices.describe(dev),
              "planned_steps": planned_steps, "budget_s": budget, "elapsed_s": round(time.perf_counter() - started, 1),
              "guard_steps": guard_steps, "loss_tol": LOSS_TOL, "kinds": list(kinds or KINDS),
              "torch": torch.__version__, "optimizer": search.base_raw.get("optimizer"),
              "logical_cores": os.cpu_count(), "baseline": base, "trials": search.trials, "skipped": search.skipped,
              "confirmation": confirmation, "best": best, "diagnosis": diagnosis}
    if out is not None:
        tune_report.write_outputs(report, Path(out), chapter=chapter)
    return report


def _unmeasured(search: _Search, cands: list[dict[str, Any]], confirmation: dict[str, Any]) -> tuple[int, int]:
    """(N, M): N of the M levers that could be recommended the budget left unmeasured (untried or not confirmed)."""
    labels = {label(c) for c in cands if not changes_training(c)}
    left = [x for x in search.skipped + (confirmation.get("left_out") or []) if x["label"] in labels
            and x.get("role", "candidate") == "candidate" and str(x["reason"]).startswith("budget")]
    return len({x["label"] for x in left}), len(labels)


def role(trial: dict[str, Any], kept: dict[str, Any] | None) -> str:
    """``hint`` (changes the training), ``candidate`` (in ``kept``, or a single near miss), else ``not kept``."""
    levers = trial["levers"]
    if changes_training(levers):
        return "hint"
    in_kept = bool(levers) and all((kept or {}).get(k) == v for k, v in levers.items())
    return "candidate" if in_kept or (trial.get("near_miss") and len(levers) == 1) else "not kept"


def order_arms(winners: Sequence[dict[str, Any]], kept: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The trials to confirm (winners and near misses), once each: candidates first, then by projected total."""
    arms = {t["label"]: t for t in winners}  # a label twice is the same trial (the kept combination of one)
    return sorted(arms.values(), key=lambda t: (role(t, kept) != "candidate", t["total_s"]))


def round_s(arms: Sequence[dict[str, Any]], base_s: float, startup: Callable[[int], float] = lambda n: 0.0) -> float:
    """Seconds one round's trials take (the baseline, each arm, the A/A arm from two arms on) plus ``startup(n)``,
    the seconds their n processes take to start side by side."""
    aa = len(arms) >= 2
    trials = sum(float(a.get("child_s") or a.get("wall_s") or base_s) for a in arms)
    return base_s * (1 + aa) + trials + startup(1 + len(arms) + aa)


def fit_arms(arms: Sequence[dict[str, Any]], base_s: float, left_s: float, rounds: int,
             kept: dict[str, Any] | None = None, startup: Callable[[int], float] = lambda n: 0.0
             ) -> tuple[list[dict[str, Any]], list[dict[str, Any]], int]:
    """``(chosen, left_out with each arm's ``role``, rounds)``: the best few arms ``left_s`` seconds hold (at most
    ``MAX_ARMS``; the first needs the fewest rounds that give a verdict, each further one all ``rounds``, both
    completed to a whole Williams design as ``measure.interleaved`` runs them)."""
    chosen: list[dict[str, Any]] = []
    left_out: list[dict[str, Any]] = []
    runs = 0

    for arm in arms:
        if len(chosen) >= MAX_ARMS:
            reason = f"a confirmation measures the best {MAX_ARMS} arms at most"
        else:
            trial = [*chosen, arm]
            per = round_s(trial, base_s, startup)
            can = int(left_s // per) if per > 0 else rounds
            need = min(rounds, measure.MIN_ROUNDS) if not chosen else rounds
            names = 1 + len(trial) + (len(trial) >= 2)  # the baseline, the arms, the A/A arm from two arms on
            planned = (measure.planned_rounds(names, x) for x in range(min(rounds, can), need - 1, -1))
            fits = [r for r in planned if r <= can]  # the most rounds of a complete design the budget holds
            if fits:
                chosen.append(arm)
                runs = fits[0]
                continue
            need = measure.planned_rounds(names, need)
            reason = (f"budget: {need} rounds with it would take about {need * per:.0f} s, "
                      f"{max(left_s, 0):.0f} s were left")
        left_out.append({"label": arm["label"], "levers": dict(arm["levers"]), "reason": reason,
                         "role": role(arm, kept)})
    return chosen, left_out, runs


def measure_arms(arms: Sequence[dict[str, Any]], request: dict[str, Any], *, rounds: int, kept: dict[str, Any] | None,
                 timeout: float, total: Callable[[dict[str, Any]], float], attempts: int | None = None,
                 runner: Runner | None = None) -> dict[str, Any]:
    """tune.json's confirmation: the baseline, ``arms`` (and from two on the A/A arm) in interleaved rounds, a new trial
    process per arm and round (``runner``: in this process, tests), compared by ``total(raw)``."""
    levers = {"baseline": {}, **{a["label"]: dict(a["levers"]) for a in arms}, **({AA: {}} if len(arms) >= 2 else {})}
    requests = {name: {**request, "levers": lv, "arm": name} for name, lv in levers.items()}

    def value(raw: dict[str, Any]) -> tuple[float, dict[str, float]]:
        if not raw.get("ok"):
            raise TuneError(f"confirmation: a trial failed: {raw.get('error')}")
        return float(total(raw)), {"warmup_s": float(raw["warmup_s"]), "step_ms": float(raw["step_ms"])}

    try:
        if runner is not None:
            got = measure.interleaved({n: (lambda r=r: value(runner(r, timeout))) for n, r in requests.items()}, rounds,
                                      progress=False, attempts=attempts)
        else:
            got = variants.fresh_process_rounds({n: trial_command(r["levers"]) for n, r in requests.items()},
                                                rounds=rounds, requests=requests, value=value, timeout=timeout,
                                                progress=False, fresh_cache=True, attempts=attempts)[0]
    except (TuneError, processes.ChildError) as exc:
        return {"word": "not confirmed", "rounds": 0, "reason": str(exc)}
    aa = got.aa_verdict()
    out = []
    for a in arms:
        out.append({"label": a["label"], "levers": dict(a["levers"]), "role": role(a, kept),
                    "search_speedup": a.get("speedup"), **dataclasses.asdict(got.verdict(a["label"], "baseline")),
                    "totals_s": list(got.samples[a["label"]]),
                    **got.result(a["label"]).metrics})
    base = got.result("baseline").metrics
    return {"rounds": got.rounds, "design": got.design, "attempts": got.attempts, "reruns": got.reruns,
            "disturbed": got.aa_failed,
            "aa": None if aa is None else dataclasses.asdict(aa), "baseline_s": list(got.samples["baseline"]),
            "baseline_warmup_s": base.get("warmup_s"), "baseline_step_ms": base.get("step_ms"), "arms": out}


def recommend(confirmation: dict[str, Any], base_total: float, front: dict[str, Any] | None,
              no_candidate_reason: str = NO_CANDIDATE_REASON, unmeasured: tuple[int, int] = (0, 0)) -> dict[str, Any]:
    """tune.json's ``best``: the candidate confirmed "faster" with the fewest levers within noise; else the defaults,
    ``front`` named as unconfirmed (``INCONCLUSIVE`` when ``unmeasured``, (N, M): N of M candidates unmeasured)."""
    arms = confirmation.get("arms") or []
    disturbed = bool(confirmation.get("disturbed"))
    faster = [a for a in arms if a["role"] == "candidate" and a["word"] == "faster" and not disturbed]
    if faster:
        top = max(faster, key=lambda a: a["ratio"])
        for pick in sorted(faster, key=lambda a: (len(a["levers"]), -a["ratio"])):  # ends at ``top`` at the latest
            v = None if pick is top else measure.verdict(pick["totals_s"], top["totals_s"])
            if v is None or v.word != "faster":
                break
        best = {"label": pick["label"], "levers": dict(pick["levers"]), "speedup": pick["ratio"],
                "total_s": base_total / pick["ratio"], "confirmed": _record(pick, confirmation)}
        if v is not None:
            best["fewer_levers"] = {"over": top["label"], **dataclasses.asdict(v)}
        return best
    measured = {a["label"]: a for a in arms}
    if front is None:
        confirmed = {"word": "no candidate", "rounds": 0, "reason": no_candidate_reason}
    elif front["label"] in measured:
        confirmed = _record(measured[front["label"]], confirmation)
    else:
        confirmed = {"word": "not confirmed", "rounds": 0,
                     "reason": confirmation.get("reason") or "the budget did not hold its confirmation"}
    if unmeasured[0] and not disturbed:
        confirmed = {**confirmed, "word": INCONCLUSIVE, "front": confirmed,
                     "reason": f"{unmeasured[0]} of {unmeasured[1]} candidates not measured"}
    unconfirmed = (None if front is None else
                   {"label": front["label"], "levers": dict(front["levers"]), "search_speedup": front.get("speedup")})
    return {"label": "baseline", "levers": {}, "speedup": 1.0, "total_s": base_total, "confirmed": confirmed,
            "unconfirmed": unconfirmed}


def _record(arm: dict[str, Any], confirmation: dict[str, Any]) -> dict[str, Any]:
    """``best.confirmed``: the arm's verdict with how the rounds were taken."""
    return {**{k: arm.get(k, "") for k in ("ratio", "low", "high", "word", "rounds", "reason")},
            "detectable": arm.get("detectable"), "reruns": confirmation.get("reruns", 0),
            "attempts": confirmation.get("attempts", 1)}


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: ``python -m helpers.tune --model FILE.py:FUNC --out DIR``."""
    p = argparse.ArgumentParser(prog="python -m helpers.tune", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="FILE.py:FUNC; FUNC() returns (model, inputs, targets, loss_fn[, make_optimizer])")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:1, xpu, mps (default auto)")
    p.add_argument("--planned-steps", type=int, default=1000, help="training steps you plan to run (default 1000)")
    p.add_argument("--budget", type=float, default=300, help="seconds the whole search may take (default 300)")
    p.add_argument("--out", required=True, help="folder for tune.json, rows.jsonl and tune.png")
    args = p.parse_args(argv)
    started = time.perf_counter() - max(0.0, time.time() - psutil.Process().create_time())  # importing torch counts
    try:
        report = tune(args.model, device=args.device, planned_steps=args.planned_steps, budget=args.budget,
                      out=args.out, started=started)
    except TuneError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(tune_report.summary(report))
    print(f"\nwrote {Path(args.out) / 'tune.json'}, rows.jsonl and tune.png")
    return 0
