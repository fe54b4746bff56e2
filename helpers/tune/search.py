"""Tune your own model: search the course's levers by measured time, within a time budget.

``python -m helpers.tune --model FILE.py:FUNC --out DIR`` (``make tune``). The baseline trial also
diagnoses the step (which regime bounds it) and the levers that attack that regime are tried first; then
the winners are combined and ``helpers.tune.confirm`` decides. The method is told in docs/tools.md."""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from pathlib import Path
from typing import Any, Sequence

import torch

from .. import devices, measure
from . import report as tune_report
from . import confirm as confirm_arms
from .levers import DEFAULT_COMPILE_S, KINDS, changes_training, label, plan_levers  # noqa: F401  (KINDS: chapter 13)
from .levers import by_diagnosis, diagnosis_record
from .sessions import RoundSession, Runner, RunnerSession, SessionFactory, subprocess_runner
from .trial import ModelSpecError, TuneError, load_workload


FORMAT_VERSION = 4  # 4: a top-level "diagnosis"; best.confirmed.word may be "inconclusive (budget)"
REPORT_RESERVE_S = 4.0  # kept back from the budget for the table, figure and files
MIN_GAIN = measure.MIN_EFFECT  # a lever "wins" a trial when it is at least 2% faster than the baseline
NEAR_MISS = 0.75
"""A single lever that leaves the training unchanged and reached at least this fraction of the
baseline's speed in its one search trial is also sent to confirmation (when the budget holds it):
one trial in a fresh process can be off by a fifth or more on a shared machine (chapter 13 once saw
channels-last at 0.91x in its search trial and 1.18x in interleaved rounds)."""
BATCH_GUARD = ("untested: the batch lever repeats your one batch, so its loss equals the baseline's by "
               "construction; check accuracy on your real data")


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
    trial["spread_total_s"] = (max(trial["totals_s"]) - min(trial["totals_s"])) if trial["totals_s"] else 0.0
    ref = base_raw or raw
    scale = max(abs(ref["first_loss"]), 1e-12)
    trial["loss_diff"] = abs(raw["guard_loss"] - ref["guard_loss"]) / scale
    trial["guard"] = "checked"
    if levers.get("batch"):
        trial["guard"] = BATCH_GUARD
    elif trial["loss_diff"] > loss_tol:
        trial["ok"] = False
        trial["error"] = (f"accuracy guard: the loss after {guard_steps} steps differs from the baseline's by "
                          f"{trial['loss_diff']:.1%} of the starting loss (tolerance {loss_tol:.0%})")
    return trial


class _Search:
    """The state of one search: budget clock, trials so far, cost estimates."""

    def __init__(self, request: dict[str, Any], budget: float, runner: Runner, planned_steps: int,
                 loss_tol: float, progress: bool, start: float, confirm_rounds: int = 0, diagnose: bool = True) -> None:
        from tqdm.auto import tqdm  # noqa: PLC0415

        self.request, self.budget, self.runner = request, budget, runner
        self.planned_steps, self.loss_tol = planned_steps, loss_tol
        self.start = start
        self.confirm_rounds, self.diagnose = confirm_rounds, diagnose
        self.trials: list[dict[str, Any]] = []
        self.skipped: list[dict[str, Any]] = []
        self.base_raw: dict[str, Any] | None = None
        self.base_wall = 0.0
        self.compile_s: float | None = None
        # tqdm's notebook bar ignores TQDM_DISABLE, so honour it here (CI and committed runs set it)
        off = not progress or os.environ.get("TQDM_DISABLE", "").lower() in ("1", "true", "yes")
        self.bar = tqdm(total=round(budget), unit="s", desc="tune", **({"disable": True} if off else {}),
                        bar_format="{desc}: {n:.0f}/{total:.0f} s of budget |{bar}| {postfix}")

    def kept(self, reserve: bool = True) -> float:
        """Seconds of the budget kept back from trials: a little for writing the report and, with
        ``reserve``, enough for the fewest confirmation rounds that give a verdict to one setting as
        costly as the baseline (more settings are confirmed when the search leaves more time)."""
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
        """Seconds ``processes`` trial processes take to start side by side (as many at a time as there
        are cores), from the baseline's: its wall time less the trial's own."""
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
        """Measure one set of levers if the budget holds it; None (recorded as skipped) otherwise.
        While no trial has given the confirmation anything to measure, its reserve may go to trials
        (a later candidate then gets what is left, and says so if that is too little)."""
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
                           base_raw=self.base_raw, loss_tol=self.loss_tol, stage=stage, wall_s=wall)
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
    """A trial is a winner (it goes to the confirmation) when it was at least ``MIN_GAIN`` faster than
    ``base`` over the planned steps in its search trial. Nothing else is asked of one trial: whether
    the gain is real is for the interleaved confirmation rounds to say, not the spread of a few
    timed blocks (that gate dropped channels-last, which interleaved rounds then found 1.23x faster)."""
    return bool(trial.get("ok")) and trial is not base and _speedup(base, trial) >= 1 + MIN_GAIN


def is_near_miss(base: dict[str, Any], trial: dict[str, Any]) -> bool:
    """A single lever that leaves the training unchanged, ran, was not a winner, and reached at least
    ``NEAR_MISS`` of the baseline's speed in its one search trial: worth confirming, since one trial
    can hide a real gain."""
    return (bool(trial.get("ok")) and trial is not base and not changes_training(trial["levers"])
            and NEAR_MISS <= _speedup(base, trial) < 1 + MIN_GAIN)


def _combine(search: _Search, singles: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Greedy: start from the best single lever, add the next winners (best per kind) one by one, keep
    an addition only when the combination is at least ``MIN_GAIN`` faster than without it. Levers that
    change the training (the batch size) stay out: they are hints, never part of a recommendation.
    Returns the kept combination's trial (a single lever when nothing was added), None without winners."""
    base = search.trials[0]
    best_per_kind: dict[str, dict[str, Any]] = {}
    for t in singles:
        kind = next(iter(t["levers"]))
        if changes_training(t["levers"]) or not is_winner(base, t):
            continue
        if kind not in best_per_kind or t["total_s"] < best_per_kind[kind]["total_s"]:
            best_per_kind[kind] = t
    winners = sorted(best_per_kind.values(), key=lambda t: t["total_s"])
    if not winners:
        return None
    current = winners[0]
    for w in winners[1:]:
        trial = search.run({**current["levers"], **w["levers"]}, "combined")
        if trial is not None and is_winner(current, trial):
            current = trial
    return current


def confirm(search: _Search, winners: list[dict[str, Any]], kept: dict[str, Any] | None,
            session_factory: SessionFactory | None, rounds: int) -> dict[str, Any]:
    """Measure the best few ``winners`` again against the baseline in interleaved rounds, a new process per
    arm and round (``helpers.tune.confirm``: which arms, the A/A arm, the verdicts).

    Every process trains a fresh seeded model with an empty compile cache (its cold warm-up and compile
    included in its projected total, as in the search). Returns the confirmation record of
    ``confirm.measure_arms`` plus ``"left_out"`` (arms the budget or ``MAX_ARMS`` kept out), or
    ``{"word": "not confirmed", "rounds": 0, "reason": ...}`` when no arm could be measured.
    """
    kept_levers = kept["levers"] if kept else None
    arms = confirm_arms.order_arms(winners, kept_levers)
    if rounds < 1:
        return {"word": "not confirmed", "rounds": 0, "reason": "confirmation turned off (confirm_rounds=0)",
                "left_out": [{"label": a["label"], "levers": a["levers"], "reason": "confirmation turned off",
                              "role": confirm_arms.arm_role(a, kept_levers)} for a in arms]}
    base_s = search.base_trial_s()
    chosen, left_out, afford = confirm_arms.fit_arms(arms, base_s, search.left(reserve=False), rounds,
                                                     startup=search.startup_s)
    roles = {a["label"]: confirm_arms.arm_role(a, kept_levers) for a in arms}
    for x in left_out:
        x["role"] = roles[x["label"]]
    if not chosen:
        first = confirm_arms.round_s(arms[:1], base_s) + search.startup_s(confirm_arms.processes(arms[:1]))
        return {"word": "not confirmed", "rounds": 0, "left_out": left_out,
                "reason": f"the budget left room for {max(int(search.left(reserve=False) // first), 0)} confirmation "
                          f"rounds; a verdict needs {measure.MIN_ROUNDS} (about {first * measure.MIN_ROUNDS:.0f} s): "
                          "give a larger budget"}
    per_round = confirm_arms.round_s(chosen, base_s)
    steps, guard = search.planned_steps, search.request["guard_steps"]

    def total(levers: dict[str, Any], raw: dict[str, Any]) -> float:
        t = make_trial(levers, raw, planned_steps=steps, guard_steps=guard, base_raw=None, loss_tol=search.loss_tol,
                       stage="confirm", wall_s=0.0)
        return float(t["total_s"])

    search.bar.set_postfix_str(f"confirming {len(chosen)} setting(s)")
    if session_factory is None:
        session_factory = RoundSession
    # a disturbed comparison (its A/A arm got a verdict) is measured again only as often as the budget holds
    passes = int(search.left(reserve=False) // (afford * (per_round + search.startup_s(confirm_arms.processes(chosen)))))
    record = confirm_arms.measure_arms(
        chosen, search.request, rounds=afford, kept=kept_levers, factory=session_factory,
        timeout=max(30.0, 3 * per_round), total=total,
        attempts=None if passes >= measure.AA_ATTEMPTS else max(1, passes))
    record["left_out"] = left_out
    return record


def tune(model: str, *, device: str = "auto", planned_steps: int = 1000, budget: float = 300.0,
         out: str | Path | None = None, kinds: Sequence[str] | None = None, loss_tol: float = 0.05,
         guard_steps: int = 10, repeats: int = 3, block_s: float = 0.25, seed: int = 0,
         runner: Runner | None = None, progress: bool = True, chapter: str = "tune",
         started: float | None = None, confirm_rounds: int | None = None,
         session_factory: SessionFactory | None = None, diagnose: bool = True) -> dict[str, Any]:
    """Search the levers for ``model`` (``FILE.py:FUNC``) and return the tune.json report.

    With ``out``, writes ``out/tune.json``, ``out/rows.jsonl`` and ``out/tune.png``. ``kinds``
    limits the lever kinds (see ``KINDS``). ``runner`` replaces the child-process runner (tests).
    ``started`` is the ``time.perf_counter()`` the budget counts from (default: now).
    ``confirm_rounds`` (default ``measure.ROUNDS``) interleaved rounds confirm the winners
    against the baseline; ``session_factory`` replaces their child processes (tests; by default a
    given ``runner`` is used for them too). ``diagnose=False`` skips the baseline's diagnosis (the trials
    then keep the plan's order).
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
    confirm_rounds = measure.ROUNDS if confirm_rounds is None else confirm_rounds
    search = _Search(request, budget, runner or subprocess_runner, planned_steps, loss_tol, progress, started,
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
    confirmation: dict[str, Any] = {"word": "no candidate", "rounds": 0, "arms": []}
    if winners or near:
        if session_factory is None and runner is not None:
            session_factory = lambda reqs, timeout: RunnerSession(runner, reqs, timeout)  # noqa: E731
        confirmation = confirm(search, winners + near, kept, session_factory, confirm_rounds)
    search.bar.close()
    # the search's front-runner among what may be recommended (None: nothing to recommend): the kept
    # combination, else the best near miss
    front = kept if kept is not None else (near[0] if near else None)
    reason = confirm_arms.ONLY_HINTS_REASON if winners else confirm_arms.NO_WINNER_REASON
    best = confirm_arms.recommend(confirmation, base["total_s"], front, reason, _unmeasured(search, cands, confirmation))
    report = {**_report(search, model, dev, planned_steps, budget, kinds, confirmation, best), "diagnosis": diagnosis}
    if out is not None:
        tune_report.write_outputs(report, Path(out), chapter=chapter)
    return report


def _unmeasured(search: _Search, cands: list[dict[str, Any]], confirmation: dict[str, Any]) -> tuple[int, int]:
    """(N, M): N of the M levers that could be recommended the budget left unmeasured (never tried, or
    nominated and left out of the confirmation)."""
    labels = {label(c) for c in cands if not changes_training(c)}
    left = [x for x in search.skipped + (confirmation.get("left_out") or []) if x["label"] in labels
            and x.get("role", "candidate") == "candidate" and str(x["reason"]).startswith("budget")]
    return len({x["label"] for x in left}), len(labels)


def _report(search: _Search, model: str, dev: torch.device, planned_steps: int, budget: float,
            kinds: Sequence[str] | None, confirmation: dict[str, Any], best: dict[str, Any]) -> dict[str, Any]:
    base = search.trials[0]
    for t in search.trials:
        t["speedup"] = _speedup(base, t) or None
    return {"version": FORMAT_VERSION, "model": model, "device": devices.describe(dev),
            "planned_steps": planned_steps, "budget_s": budget,
            "elapsed_s": round(time.perf_counter() - search.start, 1),
            "guard_steps": search.request["guard_steps"], "loss_tol": search.loss_tol,
            "kinds": list(kinds) if kinds else list(KINDS), "torch": torch.__version__,
            "optimizer": search.base_raw.get("optimizer") if search.base_raw else None,
            "logical_cores": os.cpu_count(),
            "baseline": base, "trials": search.trials, "skipped": search.skipped,
            "confirmation": confirmation, "best": best}


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

