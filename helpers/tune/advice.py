"""What the tuner tells the reader about one run, each sentence computed from its numbers: the
diagnosis, the confirmation (a sentence and a table), the recommendation (or PyTorch's defaults, or
"inconclusive (budget)") and why, throughput hints, break-even steps and a line per trial."""

from __future__ import annotations

import math
from typing import Any

from .. import measure, system
from ..tables import Table
from . import confirm as confirm_arms
from .levers import NO_LEVER_SHARE, attacks

# Why a search sends nothing to confirmation (search.py stores it; confirmation_line prints it).
NO_CANDIDATE_REASON = confirm_arms.NO_WINNER_REASON


def short_name(report: dict[str, Any]) -> str:
    """The model as ``file.py:FUNC`` without its folder (no machine paths in tables)."""
    return str(report["model"]).replace("\\", "/").rsplit("/", 1)[-1]


def busy_note(report: dict[str, Any]) -> str:
    """A warning when other processes took CPU time during the confirmation rounds ('' otherwise)."""
    conf = report["best"].get("confirmed") or {}
    if not conf.get("reruns"):
        return ""
    return (f"Note: {conf['reruns']} confirmation round(s) were measured again because other processes took "
            "CPU time while they ran; on a quiet machine the verdict is more often decisive.")


def confirmation_ran(report: dict[str, Any]) -> bool:
    """True when interleaved confirmation rounds were measured (for any setting, hints included)."""
    conf = report.get("confirmation") or {}
    return bool(conf.get("arms")) and int(conf.get("rounds") or 0) > 0


def _interval(v: dict[str, Any]) -> str:
    return f"no interval: {v['reason']}" if v.get("reason") else f"95% interval {v['low']:.2f}-{v['high']:.2f}"


def confirmation_line(report: dict[str, Any]) -> str:
    """One sentence: what the interleaved confirmation found for the recommendation (or the
    front-runner), or why nothing that could be recommended was confirmed."""
    best = report["best"]
    conf = best.get("confirmed") or {}
    if conf.get("word") == confirm_arms.INCONCLUSIVE:
        conf = conf.get("front") or {}
    if conf.get("word") in (None, "no candidate"):
        reason = conf.get("reason") or NO_CANDIDATE_REASON
        return reason[0].upper() + reason[1:] + (": nothing to confirm." if reason == NO_CANDIDATE_REASON
                                                 else ": nothing that could be recommended to confirm.")
    if conf.get("word") == "not confirmed":
        return f"Not confirmed: {conf.get('reason', '')}"
    name = best["label"] if best["levers"] else (best.get("unconfirmed") or {}).get("label", "the candidate")
    return (f"Confirmation: {name} vs the baseline in {conf['rounds']} interleaved rounds, each a new process with an "
            f"empty compile cache: {conf['ratio']:.2f}x ({_interval(conf)}): {conf['word']}.")


def confirmation_table(report: dict[str, Any]) -> Table:
    """Every setting sent to confirmation: its role, its search speed-up, the confirmed ratio, its
    interval and verdict (``measure.DISTURBED`` for all when the A/A arm got a verdict), and those left out."""
    conf = report.get("confirmation") or {}
    t = Table(["setting", "role", "search speed-up (x)", "confirmed speed-up (x)", "95% interval (x)", "verdict",
               "cold warm-up (s)", "step (ms)"],
              title=f"Confirmation of {short_name(report)}: interleaved rounds against the baseline, "
                    f"totals for {report['planned_steps']} planned steps")
    disturbed = bool(conf.get("disturbed"))
    for arm in conf.get("arms") or []:
        interval = "-" if arm.get("reason") else f"{arm['low']:.2f}-{arm['high']:.2f}"
        t.add(arm["label"], arm["role"], arm.get("search_speedup"), arm["ratio"], interval,
              arm["word"], arm.get("warmup_s"), arm.get("step_ms"))
    if conf.get("aa"):
        aa = conf["aa"]
        t.add(confirm_arms.AA, "check", None, aa["ratio"], "-" if aa.get("reason") else f"{aa['low']:.2f}-{aa['high']:.2f}",
              aa["word"], None, None)
    for arm in conf.get("left_out") or []:
        trial = next((x for x in report["trials"] if x["label"] == arm["label"]), {})
        t.add(arm["label"], arm.get("role", "-"), trial.get("speedup"), None, "-",
              f"not measured: {arm['reason']}", None, None)
    notes = []
    if conf.get("rounds"):
        notes.append(f"{conf['rounds']} interleaved rounds, each setting a new process with an empty compile cache "
                     "every round (the baseline's cold warm-up: "
                     f"{conf.get('baseline_warmup_s') or 0:.2f} s, its step {conf.get('baseline_step_ms') or 0:.3g} ms; "
                     "medians over rounds); verdict by helpers.measure.verdict.")
    if conf.get("attempts", 1) > 1:
        notes.append(f"{conf['attempts']} attempts: the A/A arm gave a verdict, so the comparison was measured again "
                     "as a whole.")
    if disturbed:
        notes.append("Disturbed: the A/A arm still gave a verdict, so no conclusion from this run.")
    notes.append("Roles: " + "; ".join(f"{k}: {v}" for k, v in confirm_arms.ROLES.items()) + ".")
    t.note = " ".join(notes)
    return t


def recommendation_line(report: dict[str, Any]) -> str:
    """One sentence: the recommendation, or PyTorch's defaults and why (the front-runner named as
    unconfirmed). "Nothing was confirmed faster" is said only when confirmation rounds ran."""
    best = report["best"]
    if best["levers"]:
        line = (f"Recommendation: {best['label']}, {best['speedup']:.2f}x faster than the baseline over "
                f"{report['planned_steps']} planned steps (confirmed; warm-up and compile included).")
        fewer = best.get("fewer_levers")
        if fewer:
            line += (f" It has fewer levers than {fewer['over']}, which was not measurably faster than it "
                     f"({fewer['ratio']:.2f}x, 95% interval {fewer['low']:.2f}-{fewer['high']:.2f}).")
        return line
    conf = report.get("confirmation") or {}
    cand = best.get("unconfirmed")
    line = "Recommendation: keep PyTorch's defaults on this machine"
    if (best.get("confirmed") or {}).get("word") == confirm_arms.INCONCLUSIVE:
        line = (f"Recommendation: {confirm_arms.INCONCLUSIVE}: {best['confirmed']['reason']}; give --budget more "
                "seconds before reading it as \"keep PyTorch's defaults\".")
    elif conf.get("disturbed"):
        line += ": the confirmation rounds were disturbed, so they give no conclusion."
    elif confirmation_ran(report) and cand:
        line += ": nothing that could be recommended was confirmed faster."
    else:
        line += "."
    if cand:
        line += (f" The search's front-runner, {cand['label']} ({cand['search_speedup']:.2f}x in the search), "
                 "is unconfirmed: not recommended.")
    return line


def hint_lines(report: dict[str, Any]) -> list[str]:
    """The levers that change the training (a bigger batch): throughput hints with their caveat, never
    a recommendation. Their steps are counted as what they are: fewer, bigger ones."""
    conf = report.get("confirmation") or {}
    measured = {a["label"]: a for a in conf.get("arms") or [] if a["role"] == "hint"}
    left = {a["label"]: a for a in conf.get("left_out") or [] if a.get("role") == "hint"}
    planned = report["planned_steps"]
    base_batch = report["baseline"].get("batch_size")
    out = []
    for t in report["trials"]:
        if t["stage"] != "single" or not t["ok"] or "batch" not in t["levers"]:
            continue
        if t["label"] not in measured and t["label"] not in left and (t["speedup"] or 0) < 1 + measure.MIN_EFFECT:
            continue  # not faster in the search: no hint at all
        k = int(t["levers"]["batch"])
        steps = f"{math.ceil(planned / k):,} steps of batch {t.get('batch_size')}"
        same = f"the samples of {planned:,} steps of batch {base_batch}"
        if t["label"] in measured:
            arm = measured[t["label"]]
            what = (f"{arm['ratio']:.2f}x ({_interval(arm)}): {arm['word']} in {arm['rounds']} interleaved rounds, "
                    f"over {steps} ({same})")
        else:
            why = left[t["label"]]["reason"] if t["label"] in left else "no confirmation ran"
            what = f"{t['speedup'] or 0:.2f}x in its one search trial over {steps} ({same}); not confirmed ({why})"
        out.append(f"Throughput hint, not a recommendation: {t['label']}: {what}. A {k}x batch takes {k}x fewer "
                   "optimizer steps and changes the optimisation: re-tune the learning rate and check accuracy "
                   "on your data before keeping it.")
    return out


def break_even_steps(base: dict[str, Any], trial: dict[str, Any]) -> float | None:
    """Planned steps (of the planned batch) after which ``trial`` beats ``base``; None if never.

    0 when the trial is ahead from the start (no extra warm-up and faster steps).
    """
    if not (base.get("ok") and trial.get("ok")):
        return None
    # A trial with a k-times batch needs k times fewer steps: compare per step of the planned batch.
    per_step = trial["step_ms"] / int(trial["levers"].get("batch", 1))
    extra_warm = trial["warmup_s"] - base["warmup_s"]
    saved_per_step = (base["step_ms"] / int(base["levers"].get("batch", 1)) - per_step) / 1000
    if saved_per_step <= 0:
        return None
    return max(0.0, extra_warm / saved_per_step)


def explain(report: dict[str, Any]) -> list[str]:
    """Sentences about this run, each computed from its numbers. Reasons why a lever helps are
    given only for a recommendation the confirmation found "faster"; single search trials are
    described as what they are (one measurement each) next to their confirmation, if they had one."""
    base = report["baseline"]
    best = report["best"]
    planned = report["planned_steps"]
    conf = report.get("confirmation") or {}
    arms = {a["label"]: a for a in conf.get("arms") or []}
    left = {a["label"]: a for a in conf.get("left_out") or []}
    out = [confirmation_line(report)]
    if (best.get("confirmed") or {}).get("word") == confirm_arms.INCONCLUSIVE:
        out.append(f"Recommended: nothing yet: {confirm_arms.INCONCLUSIVE}, {best['confirmed']['reason']}.")
    elif best["levers"]:
        out.append(f"Recommended: {best['label']}, {best['speedup']:.2f}x over {planned} planned steps (confirmed).")
    elif conf.get("disturbed"):
        out.append("Recommended: PyTorch's defaults (the confirmation was disturbed: no conclusion from this run).")
    elif confirmation_ran(report):
        out.append("Recommended: PyTorch's defaults (nothing that could be recommended was confirmed faster on "
                   "this machine).")
    elif conf.get("word") == "not confirmed":
        out.append(f"Recommended: PyTorch's defaults (no confirmation ran: {conf.get('reason', '')}).")
    else:
        out.append("Recommended: PyTorch's defaults (no lever was at least 2% faster in the search, or near enough "
                   "to be worth confirming, so nothing went to confirmation).")
    if busy_note(report):
        out.append(busy_note(report))
    won = set(best["levers"])
    for t in report["trials"]:
        if t["stage"] != "single":
            continue
        kind = next(iter(t["levers"]))
        if not t["ok"]:
            out.append(f"{t['label']} failed and was left out: {t['error'][:120]}")
            continue
        sp = t["speedup"] or 0.0
        k = int(t["levers"].get("batch", 1))
        step = (f"step {t['step_ms']:.3g} vs {base['step_ms']:.3g} ms" if k == 1 else
                f"one step of {k}x the samples {t['step_ms']:.3g} ms vs {base['step_ms']:.3g} ms, {k}x fewer steps")
        line = (f"{t['label']}: {sp:.2f}x in its one search trial ({step}, "
                f"warm-up {t['warmup_s']:.1f} vs {base['warmup_s']:.1f} s)")
        in_best = kind in won and best["levers"].get(kind) == t["levers"][kind]
        alone = in_best and len(best["levers"]) == 1
        arm = arms.get(t["label"])
        if arm is not None:
            line += f"; confirmed alone: {arm['ratio']:.2f}x ({_interval(arm)}): {arm['word']}"
        line += ("; it is the recommendation." if alone else
                 "; part of the confirmed recommendation." if in_best else
                 "; it changes the training: a throughput hint, not a recommendation." if kind == "batch"
                 and (arm is not None or t["label"] in left or sp >= 1 + measure.MIN_EFFECT) else
                 "; the combination step did not keep it, so it is not recommended." if arm is not None
                 and arm["role"] == "not kept" else
                 "; another confirmed setting was chosen as the recommendation." if arm is not None and best["levers"]
                 and arm["word"] == "faster" else
                 "." if arm is not None else
                 f"; not confirmed ({left[t['label']]['reason']}), so no conclusion." if t["label"] in left else
                 "; not at least 2% faster in the search, nor near enough to be worth confirming, so not sent to "
                 "confirmation." if sp < 1 + measure.MIN_EFFECT else
                 "; not confirmed, so no conclusion.")
        if kind == "compile":
            be = break_even_steps(base, t)
            line += (f" If its faster steps hold, it pays for its compile after about {be:,.0f} steps." if be is not None
                     else " Its steady steps were not faster, so its compile time would never be paid back.")
        elif kind == "batch":
            line += f" Accuracy guard: {BATCH_NOTE}."
        elif kind == "autocast" and alone:
            line += _autocast_note(t, sp, report["device"])
        out.append(line)
    return out


BATCH_NOTE = ("untested (the batch lever repeats your one batch, so its loss matches the baseline's by construction); "
              "a bigger batch changes training dynamics: re-check the learning rate and accuracy")


def _autocast_note(trial: dict[str, Any], speedup: float, device: str) -> str:
    if not device.startswith("cpu"):
        return (" (16-bit matrix units such as tensor cores do the heavy layers.)" if speedup >= 1.02 else
                " (the model is too small, or launch-bound, for 16-bit arithmetic to matter.)")
    flags = system.cpu_bf16_support()
    if trial["levers"].get("autocast") == "bf16":
        hw = ("this CPU has AMX" if flags.get("amx") else "this CPU has AVX512-BF16 but no AMX"
              if flags.get("native_bf16") else "this CPU has no native bf16 instructions")
        return f" ({hw}; half the bytes per value and bf16 arithmetic in hardware.)" if flags.get("native_bf16") or \
        flags.get("amx") else f" ({hw}: a bf16 win here comes from moving half the bytes.)"
    return ""


def diagnosis_lines(report: dict[str, Any]) -> list[str]:
    """The diagnosis, the lever tried first, regimes no lever attacks (with the chapter), and whether the
    recommendation attacks the regime the diagnosis named."""
    diag = report.get("diagnosis") or {}
    if not diag.get("shares"):
        return [f"Diagnosis: none ({diag.get('error') or 'not recorded'}); the trials kept the plan's order."]
    out = [f"Diagnosis of the baseline step: {diag.get('line')}."]
    if diag.get("first_trial"):
        out.append(f"The first trial after the baseline, {diag['first_trial']}, attacks "
                   f"{diag['attacks'][diag['first_trial']]}.")
    no_lever = diag.get("no_lever") or {}
    big = [r for r in no_lever if diag["shares"].get(r, 0.0) >= NO_LEVER_SHARE]
    out += [f"{r.capitalize()} takes {diag['shares'][r]:.0%} of the step and no tuner lever attacks it: see "
            f"{no_lever[r]}." for r in big]
    rest = [r for r in no_lever if r not in big]
    if rest:
        out.append(f"No tuner lever attacks {' or '.join(rest)} (its trials time one batch in memory, in one process): "
                   + "; ".join(f"{r}: {no_lever[r]}" for r in rest) + ".")
    best = report["best"]
    if best["levers"] and diag.get("top") and diag["top"] not in attacks(best["levers"]):
        out.append(f"The recommended {best['label']} attacks {', '.join(sorted(attacks(best['levers'])))}, not "
                   f"{diag['top']}, the regime the diagnosis named.")
    return out
