"""What the tuner tells the reader (chapter 13), each sentence computed from the run's numbers: the tables, the
recommendation and the lines that apply it, the figure, result rows, ``tune.json`` and projections."""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import sys
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt

from .. import measure, openmp, results, system
from ..files import atomic_write_text
from ..tables import Table
from .levers import NO_LEVER_SHARE, attacks

AA = measure.aa_name("baseline")  # the A/A arm: the baseline again, in a process of its own
ROLES = {"candidate": "may be recommended",
         "not kept": "the combination step did not keep it: not recommended",
         "hint": "changes the training (the batch size): a throughput hint, never the recommendation"}
INCONCLUSIVE = "inconclusive (budget)"  # best.confirmed.word when the budget left candidate levers unmeasured
NO_CANDIDATE_REASON = "no lever was at least 2% faster than the baseline in its search trial, or a near miss"
ONLY_HINTS_REASON = ("no lever that leaves the training unchanged was at least 2% faster than the baseline in its "
                     "search trial, or a near miss")


def projected_s(t: dict[str, Any], planned_steps: int, guard_steps: int, step_ms: float | None = None) -> float:
    """Seconds a trial (or a child's result) takes for ``planned_steps``: its cold warm-up, then the steps after the
    guard's at ``step_ms`` (default: its median); a k-times batch takes k times fewer steps."""
    k = int(t.get("batch_factor") or t.get("levers", {}).get("batch", 1))
    step_ms = t["step_ms"] if step_ms is None else step_ms
    return t["warmup_s"] + step_ms / 1000 * max(0, math.ceil(planned_steps / k) - guard_steps)


def short_name(report: dict[str, Any]) -> str:
    """The model as ``file.py:FUNC`` without its folder (no machine paths in tables)."""
    return str(report["model"]).replace("\\", "/").rsplit("/", 1)[-1]


def verdict_of(v: dict[str, Any]) -> measure.Verdict:
    """A verdict stored in tune.json (``dataclasses.asdict``) as the object that words it (``label``, ``interval``)."""
    return measure.Verdict(**{f.name: v[f.name] for f in dataclasses.fields(measure.Verdict) if f.name in v})


def _word(v: dict[str, Any]) -> str:
    """The verdict's word, with the effect the run could see after "no measurable difference"."""
    return verdict_of(v).label


def _span(v: dict[str, Any]) -> str:
    return "-" if v.get("reason") else verdict_of(v).interval


def _interval(v: dict[str, Any]) -> str:
    return f"no interval: {v['reason']}" if v.get("reason") else f"95% interval {_span(v)}"


def confirmation_line(report: dict[str, Any]) -> str:
    """What the confirmation found for the recommendation (or the front-runner), or why nothing was confirmed."""
    best = report["best"]
    conf = best.get("confirmed") or {}
    if conf.get("word") == INCONCLUSIVE:
        conf = conf.get("front") or {}
    if conf.get("word") in (None, "no candidate"):
        reason = conf.get("reason") or NO_CANDIDATE_REASON
        return reason[0].upper() + reason[1:] + (": nothing to confirm." if reason == NO_CANDIDATE_REASON
                                                 else ": nothing that could be recommended to confirm.")
    if conf.get("word") == "not confirmed":
        return f"Not confirmed: {conf.get('reason', '')}"
    name = best["label"] if best["levers"] else (best.get("unconfirmed") or {}).get("label", "the candidate")
    return (f"Confirmation: {name} vs the baseline in {conf['rounds']} interleaved rounds, each a new process with an "
            f"empty compile cache: {conf['ratio']:.2f}x ({_interval(conf)}): {_word(conf)}.")


def confirmation_table(report: dict[str, Any]) -> Table:
    """Every setting sent to confirmation (role, search speed-up, confirmed ratio, interval, verdict), and those left out."""
    conf = report.get("confirmation") or {}
    t = Table(["setting", "role", "search speed-up (x)", "confirmed speed-up (x)", "95% interval (x)", "verdict",
               "cold warm-up (s)", "step (ms)"],
              title=f"Confirmation of {short_name(report)}: interleaved rounds against the baseline, "
                    f"totals for {report['planned_steps']} planned steps")
    for arm in conf.get("arms") or []:
        t.add(arm["label"], arm["role"], arm.get("search_speedup"), arm["ratio"], _span(arm), _word(arm),
              arm.get("warmup_s"), arm.get("step_ms"))
    if conf.get("aa"):
        t.add(AA, "check", None, conf["aa"]["ratio"], _span(conf["aa"]), measure.aa_word(verdict_of(conf["aa"])),
              None, None)
    for arm in conf.get("left_out") or []:
        trial = next((x for x in report["trials"] if x["label"] == arm["label"]), {})
        t.add(arm["label"], arm.get("role", "-"), trial.get("speedup"), None, "-",
              f"not measured: {arm['reason']}", None, None)
    notes = []
    if conf.get("rounds"):
        design = f", {measure.design_text(conf['rounds'], conf['design'])}" if conf.get("design") else ""
        notes.append(f"{conf['rounds']} interleaved rounds{design}, each setting a new process with an empty compile "
                     "cache every round (the baseline's cold warm-up: "
                     f"{conf.get('baseline_warmup_s') or 0:.2f} s, its step {conf.get('baseline_step_ms') or 0:.3g} ms; "
                     "medians over rounds); verdict by helpers.measure.verdict.")
    if conf.get("attempts", 1) > 1:
        notes.append(f"{conf['attempts']} attempts: the A/A arm gave a verdict, so the comparison was measured again "
                     "as a whole.")
    if conf.get("disturbed"):
        notes.append("Disturbed: the A/A arm still gave a verdict, so no conclusion from this run.")
    notes.append("Roles: " + "; ".join(f"{k}: {v}" for k, v in ROLES.items()) + ".")
    t.note = " ".join(notes)
    return t


def recommendation_line(report: dict[str, Any]) -> str:
    """The recommendation, or PyTorch's defaults and why (the front-runner named as unconfirmed)."""
    best = report["best"]
    if best["levers"]:
        line = (f"Recommendation: {best['label']}, {best['speedup']:.2f}x faster than the baseline over "
                f"{report['planned_steps']} planned steps (confirmed; warm-up and compile included).")
        fewer = best.get("fewer_levers")
        if fewer:
            line += (f" It has fewer levers than {fewer['over']}, which was not measurably faster than it "
                     f"({fewer['ratio']:.2f}x, {_interval(fewer)}).")
        return line
    conf = report.get("confirmation") or {}
    cand = best.get("unconfirmed")
    line = "Recommendation: keep PyTorch's defaults on this machine"
    if (best.get("confirmed") or {}).get("word") == INCONCLUSIVE:
        line = (f"Recommendation: {INCONCLUSIVE}: {best['confirmed']['reason']}; give --budget more "
                "seconds before reading it as \"keep PyTorch's defaults\".")
    elif conf.get("disturbed"):
        line += ": the confirmation rounds were disturbed, so they give no conclusion."
    elif conf.get("arms") and conf.get("rounds") and cand:  # confirmation rounds ran, hints included
        line += ": nothing that could be recommended was confirmed faster."
    else:
        line += "."
    if cand:
        line += (f" The search's front-runner, {cand['label']} ({cand['search_speedup']:.2f}x in the search), "
                 "is unconfirmed: not recommended.")
    return line


def hint_lines(report: dict[str, Any]) -> list[str]:
    """Throughput hints with their caveat: the levers that change the training (fewer, bigger steps)."""
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
            what = (f"{arm['ratio']:.2f}x ({_interval(arm)}): {_word(arm)} in {arm['rounds']} interleaved rounds, "
                    f"over {steps} ({same})")
        else:
            why = left[t["label"]]["reason"] if t["label"] in left else "no confirmation ran"
            what = f"{t['speedup'] or 0:.2f}x in its one search trial over {steps} ({same}); not confirmed ({why})"
        out.append(f"Throughput hint, not a recommendation: {t['label']}: {what}. A {k}x batch takes {k}x fewer "
                   "optimizer steps and changes the optimisation: re-tune the learning rate and check accuracy "
                   "on your data before keeping it.")
    return out


def break_even_steps(base: dict[str, Any], trial: dict[str, Any]) -> float | None:
    """Planned steps (of the planned batch) after which ``trial`` beats ``base`` (0: from the start); None if never."""
    if not (base.get("ok") and trial.get("ok")):
        return None
    base_s, trial_s = (t["step_ms"] / 1000 / int(t["levers"].get("batch", 1)) for t in (base, trial))
    saved = base_s - trial_s
    return max(0.0, (trial["warmup_s"] - base["warmup_s"]) / saved) if saved > 0 else None


def diagnosis_lines(report: dict[str, Any]) -> list[str]:
    """The diagnosis, the lever tried first, regimes no lever attacks, and the regime the recommendation attacks."""
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


def table(report: dict[str, Any], *, with_confirmation: bool = True) -> Table:
    """Every trial: levers, ok, step time (median, spread), warm-up, projected total, speed-up, loss check; the
    note ends with the confirmation's line unless ``with_confirmation`` is False."""
    t = Table(["trial", "stage", "ok", "batch", "step (ms)", "spread (ms)", "warm-up (s)",
               f"total for {report['planned_steps']} steps (s)", "search speed-up (x)", "loss diff (% of start)", "error"],
              title=f"Tuning {short_name(report)} on {report['device']}")
    for tr in report["trials"]:
        t.add(tr["label"], tr["stage"], "yes" if tr["ok"] else "no", tr.get("batch_size"), tr["step_ms"],
              tr["spread_ms"], tr["warmup_s"], tr["total_s"], tr.get("speedup"),
              "untested" if str(tr.get("guard", "")).startswith("untested")
              else None if tr["loss_diff"] is None else 100 * tr["loss_diff"], tr["error"][:80])
    t.note = ("search speed-up: one trial each, not a verdict; only the confirmation below decides."
              + (" " + confirmation_line(report) if with_confirmation else ""))
    return t


def figure(report: dict[str, Any]) -> Any:
    """Horizontal bars: speed-up over the planned steps of every trial (min-max of the repeats); failures marked."""
    trials = report["trials"]
    base_total = report["baseline"]["total_s"]
    fig, ax = plt.subplots(figsize=(7.5, 0.38 * len(trials) + 1.4))
    best = report["best"]["label"]
    for i, tr in enumerate(trials):
        if tr["ok"] and tr.get("totals_s"):
            lo, hi = base_total / max(tr["totals_s"]), base_total / min(tr["totals_s"])
            value = tr["speedup"]
            color = "tab:green" if tr["label"] == best else ("tab:blue" if tr["stage"] != "combined" else "tab:purple")
            ax.barh(i, value, color=color, xerr=[[value - lo], [hi - value]], capsize=3)
            ax.text(value, i, f" {value:.2f}x", va="center", fontsize=8)
        else:
            ax.barh(i, 0.02, color="tab:red")
            ax.text(0.03, i, " failed: " + tr["error"][:45], va="center", fontsize=7, color="tab:red")
    ax.axvline(1.0, color="black", lw=0.8, ls="--")
    ax.set_yticks(range(len(trials)), [t["label"] for t in trials], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel(f"speed-up over {report['planned_steps']} planned steps, warm-up/compile included (x)")
    ax.set_title(f"{short_name(report)} on {report['device']}: green = recommended (confirmed), purple = combined", fontsize=9)
    fig.tight_layout()
    return fig


def _env_path(path: str) -> str:
    """A library path written relative to the active environment ($VIRTUAL_ENV) when it lies inside it."""
    inside = Path(path).is_relative_to(sys.prefix)
    return "$VIRTUAL_ENV/" + str(Path(path).relative_to(sys.prefix)) if inside else path


def apply_lines(levers: dict[str, Any], device: str = "cpu", optimizer: str = "Adam") -> dict[str, list[str]]:
    """The environment variables and the code lines that switch on ``levers`` in a training script."""
    dev = device.split(" ")[0].split(":")[0]
    env: list[str] = []
    code: list[str] = []
    if levers.get("omp"):
        threads = levers.get("threads") or system.topology().physical_cores
        for k, v in openmp.openmp_env(levers["omp"], int(threads)).items():
            v = _env_path(v) if k == "LD_PRELOAD" else v
            env.append(f'{k}="{v}"' if " " in v else f"{k}={v}")
    elif levers.get("threads"):
        env.append(f"OMP_NUM_THREADS={levers['threads']}")
    if levers.get("threads"):
        code.append(f"torch.set_num_threads({levers['threads']})")
    if levers.get("batch"):
        code.append(f"loader = DataLoader(dataset, batch_size={levers['batch']} * batch_size, ...)"
                    f"  # {levers['batch']}x fewer steps: re-check the learning rate and accuracy")
    if levers.get("channels_last"):
        code += ["model = model.to(memory_format=torch.channels_last)",
                 "inputs = inputs.contiguous(memory_format=torch.channels_last)  # each batch"]
    if levers.get("optimizer"):
        code.append(f"optimizer = torch.optim.{optimizer}(model.parameters(), ..., {levers['optimizer']}=True)"
                    "  # your settings, plus this flag")
    dtype = {"bf16": "torch.bfloat16", "fp16": "torch.float16"}.get(levers.get("autocast", ""))
    if levers.get("compile"):
        mode = levers["compile"]
        code.append("model = torch.compile(model" + ("" if mode == "default" else f', mode="{mode}"') + ")")
    scaler = levers.get("autocast") == "fp16" and dev == "cuda"
    if scaler:
        code.append('scaler = torch.amp.GradScaler("cuda")')
    if dtype:
        code += [f'with torch.autocast("{dev}", dtype={dtype}):', "    loss = loss_fn(model(inputs), targets)"]
        code += (["scaler.scale(loss).backward()", "scaler.step(optimizer)", "scaler.update()"] if scaler
                 else ["loss.backward()", "optimizer.step()"])
    return {"env": env, "code": code}


def summary(report: dict[str, Any]) -> str:
    """The trial table, the confirmation, the recommendation beside the diagnosis, and the lines to apply it."""
    best = report["best"]
    lines = [str(table(report, with_confirmation=False)), "", *(f"skipped {s['label']}: {s['reason']}"
                                                                 for s in report["skipped"])]
    by_budget = sum(str(s["reason"]).startswith("budget") for s in report["skipped"])
    if by_budget:
        lines.append(f"{by_budget} lever setting(s) skipped for lack of budget: give --budget more seconds to try them.")
    conf = report.get("confirmation") or {}
    if conf.get("arms") or conf.get("left_out"):
        lines += ["", str(confirmation_table(report))]
    reruns = (best.get("confirmed") or {}).get("reruns")
    busy = [f"Note: {reruns} confirmation round(s) were measured again because other processes took CPU time while "
            "they ran; on a quiet machine the verdict is more often decisive."] if reruns else []
    lines += ["", confirmation_line(report), *busy, recommendation_line(report)]
    lines += diagnosis_lines(report) + hint_lines(report)
    how = apply_lines(best["levers"], report["device"], report.get("optimizer") or "Adam")
    if how["env"]:
        lines += ["\nenvironment (set before Python starts):", *("  export " + e for e in how["env"])]
    if how["code"]:
        lines += ["\ncode:", *("  " + c for c in how["code"])]
    return "\n".join(lines)


def result_rows(report: dict[str, Any], chapter: str = "tune") -> list[results.Row]:
    """helpers.results rows: projected total time (s) and step time (ms) of every successful trial."""
    ok = [t for t in report["trials"] if t["ok"]]
    experiment = f"tune {short_name(report)}"
    extra = {t["label"]: {"levers": t["levers"], "warmup_s": t["warmup_s"], "loss_diff": t["loss_diff"],
                          "planned_steps": report["planned_steps"], "device": report["device"]} for t in ok}
    rows = results.make_rows(chapter, experiment, {t["label"]: t["totals_s"] for t in ok},
                             metric="planned_total_time", unit="s", baseline="baseline", extra=extra, data="none")
    ctx = {"fingerprint": rows[0].fingerprint, "profile": rows[0].profile, "data": "none"}
    rows += results.make_rows(chapter, experiment, {t["label"]: t["samples_ms"] for t in ok},
                              metric="step_time", unit="ms", baseline="baseline", **ctx)
    return rows


def write_outputs(report: dict[str, Any], out: Path, chapter: str = "tune") -> Path:
    """Write ``out/tune.json``, ``out/rows.jsonl`` and ``out/tune.png``; returns the tune.json path."""
    out.mkdir(parents=True, exist_ok=True)
    path = atomic_write_text(out / "tune.json", json.dumps(report, indent=1, default=str) + "\n")
    results.append_rows(result_rows(report, chapter), out / results.ROWS_FILE)
    fig = figure(report)
    fig.savefig(out / "tune.png", dpi=110)
    plt.close(fig)
    return path


def rescore(report: dict[str, Any], planned_steps: int) -> Table:
    """The measured trials projected to another number of planned steps (warm-up plus median steps; no new measurement)."""
    guard = int(report.get("guard_steps", 10))
    base = report["baseline"]
    total = functools.partial(projected_s, planned_steps=planned_steps, guard_steps=guard)
    t = Table(["trial", f"total for {planned_steps} steps (s)", "speed-up (x)"],
              title=f"{short_name(report)} projected to {planned_steps} planned steps")
    for tr in sorted((x for x in report["trials"] if x["ok"]), key=total):
        t.add(tr["label"], total(tr), total(base) / total(tr))
    return t
