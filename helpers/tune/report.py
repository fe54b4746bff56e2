"""What ``helpers.tune`` shows and writes: the trial table, the figure, the summary (the sentences of
``helpers.tune.advice`` with the lines that apply the recommendation), result rows (``helpers.results``),
``DIR/tune.json``, and the measured trials projected to another run length."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

from .. import results, system
from ..files import atomic_write_text
from ..tables import Table
from .advice import (BATCH_NOTE, NO_CANDIDATE_REASON, break_even_steps, busy_note,  # noqa: F401  (chapter 13, tests)
                     confirmation_line, confirmation_ran, confirmation_table, diagnosis_lines, explain,
                     hint_lines, recommendation_line, short_name)


def table(report: dict[str, Any], *, with_confirmation: bool = True) -> Table:
    """Every trial: levers, ok, step time (median, spread), warm-up, projected total, speed-up, loss check.
    The note ends with the confirmation's line unless ``with_confirmation`` is False (``summary`` prints it
    after the confirmation table instead)."""
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
    import matplotlib.pyplot as plt  # noqa: PLC0415

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
    prefix = Path(sys.prefix)
    try:
        return "$VIRTUAL_ENV/" + str(Path(path).relative_to(prefix))
    except ValueError:
        return path


def apply_lines(levers: dict[str, Any], device: str = "cpu", optimizer: str = "Adam") -> dict[str, list[str]]:
    """The environment variables and the code lines that switch on ``levers`` in a training script."""
    dev = device.split(" ")[0].split(":")[0]
    env: list[str] = []
    code: list[str] = []
    if levers.get("omp"):
        threads = levers.get("threads") or system.topology().physical_cores
        for k, v in system.openmp_env(levers["omp"], int(threads)).items():
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
    lines = [str(table(report, with_confirmation=False)), ""]
    for s in report["skipped"]:
        lines.append(f"skipped {s['label']}: {s['reason']}")
    by_budget = sum(str(s["reason"]).startswith("budget") for s in report["skipped"])
    if by_budget:
        lines.append(f"{by_budget} lever setting(s) skipped for lack of budget: give --budget more seconds to try them.")
    conf = report.get("confirmation") or {}
    if conf.get("arms") or conf.get("left_out"):
        lines += ["", str(confirmation_table(report))]
    lines.append("")
    lines.append(confirmation_line(report))
    if busy_note(report):
        lines.append(busy_note(report))
    lines.append(recommendation_line(report))
    lines += diagnosis_lines(report)
    lines += hint_lines(report)
    if not best["levers"]:
        return "\n".join(lines)
    how = apply_lines(best["levers"], report["device"], report.get("optimizer") or "Adam")
    if how["env"]:
        lines += ["\nenvironment (set before Python starts):", *("  export " + e for e in how["env"])]
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
    import matplotlib.pyplot as plt  # noqa: PLC0415

    out.mkdir(parents=True, exist_ok=True)
    path = atomic_write_text(out / "tune.json", json.dumps(report, indent=1, default=str) + "\n")
    results.append_rows(result_rows(report, chapter), out / results.ROWS_FILE)
    fig = figure(report)
    fig.savefig(out / "tune.png", dpi=110)
    plt.close(fig)
    return path


def rescore(report: dict[str, Any], planned_steps: int) -> Table:
    """The measured trials projected to another number of planned steps (no new measurement).

    A trial's total is its warm-up plus its median step time for the remaining steps, so a
    lever with a big warm-up (compilation) can lose over a short run and win over a long one.
    """
    guard = int(report.get("guard_steps", 10))
    base = report["baseline"]

    def total(t: dict[str, Any]) -> float:
        k = int(t["levers"].get("batch", 1))
        return t["warmup_s"] + t["step_ms"] / 1000 * max(0, math.ceil(planned_steps / k) - guard)

    t = Table(["trial", f"total for {planned_steps} steps (s)", "speed-up (x)"],
              title=f"{short_name(report)} projected to {planned_steps} planned steps")
    for tr in sorted((x for x in report["trials"] if x["ok"]), key=total):
        t.add(tr["label"], total(tr), total(base) / total(tr))
    return t
