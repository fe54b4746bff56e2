"""Figures several chapters share (speed-up bars, per-round ratios); importing it leaves matplotlib's backend alone."""

from __future__ import annotations

from typing import Sequence

import matplotlib.pyplot as plt
from matplotlib.figure import Figure

from .measure import MIN_EFFECT, Result, Rounds, reading, verdict


def speedup_bars(results: Sequence[Result] | Rounds, baseline: str | None = None, title: str = "",
                 published: dict[str, float] | None = None) -> Figure:
    """Bars of the speed-up (verdict ratio, 95% interval) per variant, published beside; grey if the A/A arm failed."""
    disturbed = isinstance(results, Rounds) and results.aa_failed
    if isinstance(results, Rounds):
        results = [results.result(n) for n in results.names]
    if not results:
        raise ValueError("no results to plot")
    base = next((r for r in results if r.name == baseline), results[0])
    names = [r.name for r in results]
    vs = [verdict(base.samples, r.samples) for r in results]
    med = [v.ratio for v in vs]
    lo = [v.ratio - v.low for v in vs]
    hi = [v.high - v.ratio for v in vs]
    what = "yours (median over rounds, 95% interval)"
    if disturbed:
        what += "; A/A failed: no verdict"
        title = (title + "\n" if title else "") + "DISTURBED: the A/A arm differed from its baseline, no verdict"
    fig, ax = plt.subplots(figsize=(7, 3.5))
    x = range(len(results))
    width = 0.38 if published else 0.6
    ax.bar([i - (width / 2 if published else 0) for i in x], med, width, yerr=[lo, hi], capsize=4,
           label=what, **({"color": "lightgrey", "hatch": "//", "edgecolor": "grey"} if disturbed else {}))
    if published:
        ax.bar([i + width / 2 for i in x], [published.get(n, 0.0) for n in names], width,
               label="published", alpha=0.7)
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xticks(list(x), names, rotation=20, ha="right")
    ax.set_ylabel(f"speed-up vs {base.name}")
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    return fig


def round_ratios(rounds: Rounds, variants: Sequence[str] | None = None, baseline: str | None = None, *,
                 title: str = "") -> Figure:
    """One dot per round (baseline/variant in that round alone), the verdict's ratio and 95% band per variant."""
    base = baseline or (rounds.names[0] if rounds.names else None)
    if base not in rounds.names:
        raise ValueError(f"baseline {base!r} is not among the measured variants {rounds.names}")
    names = [n for n in rounds.names if n != base] if variants is None else list(variants)
    unknown = [n for n in names if n not in rounds.names or n == base]
    if not names or unknown:
        raise ValueError(f"name variants other than the baseline {base!r} among {rounds.names}"
                         + (f"; not usable: {unknown}" if unknown else ""))
    fig, ax = plt.subplots(figsize=(7, 3.5))
    ax.axhline(1.0, color="grey", lw=0.8)
    for edge in (1 - MIN_EFFECT, 1 + MIN_EFFECT):
        ax.axhline(edge, color="grey", lw=0.8, ls=":")
    n = rounds.rounds
    for k, name in enumerate(names):
        ratios = [b / v for b, v in zip(rounds.samples[base], rounds.samples[name])]
        shift = (k - (len(names) - 1) / 2) * 0.12
        v = rounds.verdict(name, base)
        dots = ax.scatter([i + 1 + shift for i in range(n)], ratios, zorder=3,
                          label=f"{name}: {v.ratio:.2f}x, interval {v.interval}, {reading(name, v)}")
        color = dots.get_facecolor()[0]
        ax.axhline(v.ratio, color=color, lw=1.2)
        if not v.reason:
            ax.axhspan(v.low, v.high, color=color, alpha=0.15, lw=0)
    ax.set_xlabel("round (each dot: what that round alone would say)")
    ax.set_ylabel(f"{base} / variant (x)")
    ax.set_xticks(range(1, n + 1))
    ax.set_title(title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig
