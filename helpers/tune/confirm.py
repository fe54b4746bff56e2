"""The tuner's confirmation: the search only nominates, interleaved rounds decide (docs/tools.md).

``order_arms`` and ``fit_arms`` pick the best few arms the budget holds; ``measure_arms`` times them
against the baseline (and an A/A arm) in a new process per arm and round; ``recommend`` names only a
setting the rounds call "faster", else PyTorch's defaults, or "inconclusive (budget)" when levers went unmeasured."""

from __future__ import annotations

from typing import Any, Callable, Sequence

from .. import children, measure
from .levers import changes_training
from .sessions import Session, SessionFactory
from .trial import TuneError

AA = measure.aa_name("baseline")  # the A/A arm: the baseline again, in a process of its own
MAX_ARMS = 4          # arms besides the baseline (and the A/A arm) in one confirmation
ROLES = {"candidate": "may be recommended",
         "not kept": "the combination step did not keep it: not recommended",
         "hint": "changes the training (the batch size): a throughput hint, never the recommendation"}
INCONCLUSIVE = "inconclusive (budget)"  # best.confirmed.word when the budget left candidate levers unmeasured
NO_WINNER_REASON = "no lever was at least 2% faster than the baseline in its search trial, or a near miss"
ONLY_HINTS_REASON = ("no lever that leaves the training unchanged was at least 2% faster than the baseline in its "
                     "search trial, or a near miss")


def role(levers: dict[str, Any], kept: dict[str, Any] | None, near_miss: bool = False) -> str:
    """``hint`` (changes training), ``candidate`` (all its levers are in the kept combination, or a
    near miss: a single lever the combination step never judged) or ``not kept`` (the combination
    step judged it and dropped it)."""
    if changes_training(levers):
        return "hint"
    kept = kept or {}
    if near_miss and len(levers) == 1:
        return "candidate"
    return "candidate" if levers and all(kept.get(k) == v for k, v in levers.items()) else "not kept"


def arm_role(trial: dict[str, Any], kept: dict[str, Any] | None) -> str:
    """``role`` of a search trial sent to confirmation (its ``near_miss`` mark included)."""
    return role(trial["levers"], kept, bool(trial.get("near_miss")))


def order_arms(winners: Sequence[dict[str, Any]], kept: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The trials to confirm, best first: those that may be recommended, then the others, each
    group by projected total (lowest first). ``winners`` are the search trials (single levers and
    the kept combination) that were at least ``MIN_GAIN`` faster, and near misses (marked
    ``near_miss``); ``kept`` the combination's levers."""
    seen: set[str] = set()
    arms = []
    for t in winners:
        if t["label"] not in seen:
            seen.add(t["label"])
            arms.append(t)
    return sorted(arms, key=lambda t: (arm_role(t, kept) != "candidate", t["total_s"]))


def round_s(arms: Sequence[dict[str, Any]], base_s: float) -> float:
    """Seconds one round's timed trials take: the baseline, every arm (its search trial's time) and, with
    two or more arms, the A/A arm (the processes' start-up not counted)."""
    return base_s * (2 if len(arms) >= 2 else 1) + sum(float(a.get("child_s") or a.get("wall_s") or base_s)
                                                        for a in arms)


def processes(arms: Sequence[dict[str, Any]]) -> int:
    """Child processes a confirmation of ``arms`` starts: the baseline, each arm, the A/A arm with two or more."""
    return 1 + len(arms) + (1 if len(arms) >= 2 else 0)


def fit_arms(arms: Sequence[dict[str, Any]], base_s: float, left_s: float, rounds: int,
             startup: Callable[[int], float] = lambda n: 0.0) -> tuple[list[dict[str, Any]], list[dict[str, Any]], int]:
    """The best few arms the budget holds: ``(chosen, left_out, rounds)``.

    The first arm needs room for ``min(rounds, MIN_ROUNDS)`` rounds (the fewest that can give a
    verdict); each further arm is added only if all ``rounds`` still fit, so a second arm never
    costs the first its rounds. At most ``MAX_ARMS``. ``startup(n)`` is the seconds ``n`` processes
    take to start side by side, paid every round (not timed, but from the budget). ``left_out`` entries are
    ``{"label", "levers", "reason"}``; ``rounds`` is what the chosen arms can afford (at most ``rounds``).
    """
    chosen: list[dict[str, Any]] = []
    left_out: list[dict[str, Any]] = []

    def afford(trial: Sequence[dict[str, Any]]) -> tuple[int, float]:
        per = round_s(trial, base_s) + startup(processes(trial))
        return (int(left_s // per) if per > 0 else rounds), per

    for arm in arms:
        if len(chosen) >= MAX_ARMS:
            reason = f"a confirmation measures the best {MAX_ARMS} arms at most"
        else:
            can, per = afford([*chosen, arm])
            need = min(rounds, measure.MIN_ROUNDS) if not chosen else rounds
            if can >= need:
                chosen.append(arm)
                continue
            reason = (f"budget: {need} rounds with it would take about {need * per:.0f} s, "
                      f"{max(left_s, 0):.0f} s were left")
        left_out.append({"label": arm["label"], "levers": dict(arm["levers"]), "reason": reason})
    return chosen, left_out, min(rounds, afford(chosen)[0]) if chosen else 0


def _verdict(v: measure.Verdict) -> dict[str, Any]:
    return {"ratio": v.ratio, "low": v.low, "high": v.high, "word": v.word, "rounds": v.rounds, "reason": v.reason}


def measure_arms(arms: Sequence[dict[str, Any]], request: dict[str, Any], *, rounds: int, kept: dict[str, Any] | None,
                 factory: SessionFactory, timeout: float, total: Callable[[dict[str, Any], dict[str, Any]], float],
                 attempts: int | None = None) -> dict[str, Any]:
    """Measure the baseline and ``arms`` in ``rounds`` interleaved rounds (see the module's docstring).

    ``total(levers, raw)`` turns a child's raw trial into the projected total for the planned steps
    (warm-up included), the value compared. ``factory`` gives a session with a new process per arm
    and round (``sessions.RoundSession``). With two or more arms the A/A arm rides along; ``attempts``
    bounds how often ``helpers.measure.interleaved`` measures the whole comparison while that arm gets
    a verdict (None: its default). Returns ``{"rounds", "attempts", "reruns", "disturbed", "aa",
    "baseline_s", "baseline_warmup_s", "baseline_step_ms", "arms": [{"label", "levers", "role",
    "search_speedup", "ratio", "low", "high", "word", "rounds", "reason", "totals_s", "warmup_s",
    "step_ms"}]}`` (``warmup_s``: the median cold warm-up, compile included; ``step_ms``: the median steady step; a
    disturbed run's words are ``measure.DISTURBED``), or one with ``"word": "not confirmed"`` and a
    ``"reason"`` when a child failed.
    """
    requests = {"baseline": {**request, "levers": {}}}
    requests.update({a["label"]: {**request, "levers": dict(a["levers"])} for a in arms})
    if len(arms) >= 2:
        requests[AA] = {**request, "levers": {}}

    def timed(name: str, session: Session) -> Callable[[], tuple[float, dict[str, float]]]:
        def run() -> tuple[float, dict[str, float]]:
            raw = session.ask(name)
            if not raw.get("ok"):
                raise TuneError(f"confirmation: the {name} trial failed: {raw.get('error')}")
            return float(total(requests[name]["levers"], raw)), {"warmup_s": float(raw["warmup_s"]),
                                                                  "step_ms": float(raw["step_ms"])}
        return run

    try:
        session = factory(requests, timeout)
    except children.ChildError as exc:
        return {"word": "not confirmed", "rounds": 0, "reason": f"the confirmation processes failed: {exc}"}
    try:
        # a round's processes start side by side before it, untimed, and what is left closes after it
        got = measure.interleaved({n: timed(n, session) for n in requests}, rounds, progress=False, attempts=attempts,
                                  before_round=getattr(session, "begin", None), after_round=session.close)
    except (TuneError, children.ChildError) as exc:
        return {"word": "not confirmed", "rounds": 0, "reason": str(exc)}
    finally:
        session.close()
    aa = got.aa_verdict()
    out = []
    for a in arms:
        v = _verdict(got.verdict(a["label"], "baseline"))
        out.append({"label": a["label"], "levers": dict(a["levers"]), "role": arm_role(a, kept),
                    "search_speedup": a.get("speedup"), **v, "totals_s": list(got.samples[a["label"]]),
                    **got.result(a["label"]).metrics})
    base = got.result("baseline").metrics
    return {"rounds": got.rounds, "attempts": got.attempts, "reruns": got.reruns, "disturbed": got.aa_failed,
            "aa": None if aa is None else _verdict(aa), "baseline_s": list(got.samples["baseline"]),
            "baseline_warmup_s": base.get("warmup_s"), "baseline_step_ms": base.get("step_ms"), "arms": out}


def recommend(confirmation: dict[str, Any], base_total: float, front: dict[str, Any] | None,
              no_candidate_reason: str = NO_WINNER_REASON, unmeasured: tuple[int, int] = (0, 0)) -> dict[str, Any]:
    """tune.json's ``best`` from a confirmation (``measure_arms``'s record, or one that did not run).

    Only an arm of role ``candidate`` whose verdict is "faster", in an undisturbed confirmation,
    can be recommended; of those, the one with the fewest levers that the fastest is not
    measurably faster than. ``front`` is the search's front-runner (the first candidate arm),
    named as unconfirmed when nothing is recommended. ``unmeasured`` is ``(N, M)``: N of the M
    candidate levers the budget left unmeasured; with N > 0 and nothing recommended (and no
    disturbance) the word is ``INCONCLUSIVE``, the front-runner's own record kept under ``"front"``.
    """
    arms = confirmation.get("arms") or []
    disturbed = bool(confirmation.get("disturbed"))
    faster = [a for a in arms if a["role"] == "candidate" and a["word"] == "faster" and not disturbed]
    if faster:
        top = max(faster, key=lambda a: a["ratio"])
        pick = top
        for a in sorted(faster, key=lambda a: (len(a["levers"]), -a["ratio"])):
            if a is top or measure.verdict(a["totals_s"], top["totals_s"]).word != "faster":
                pick = a
                break
        best = {"label": pick["label"], "levers": dict(pick["levers"]), "speedup": pick["ratio"],
                "total_s": base_total / pick["ratio"], "confirmed": _record(pick, confirmation)}
        if pick is not top:
            v = measure.verdict(pick["totals_s"], top["totals_s"])
            best["fewer_levers"] = {"over": top["label"], "ratio": v.ratio, "low": v.low, "high": v.high,
                                    "word": v.word, "rounds": v.rounds}
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
    return {"ratio": arm["ratio"], "low": arm["low"], "high": arm["high"], "word": arm["word"],
            "rounds": arm["rounds"], "reason": arm.get("reason", ""), "reruns": confirmation.get("reruns", 0),
            "attempts": confirmation.get("attempts", 1)}
