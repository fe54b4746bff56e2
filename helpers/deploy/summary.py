"""Chapter 14's reporting around ``deploy.compare``: the answers of every engine on a test set, the
published-vs-yours table and figure, the batch-1 against batch-N split of a call's cost, and the
one-line summary of a comparison's verdicts. Harness only: the engines themselves (export,
``InferenceSession``, ``compile_model``) stay written out in the chapter.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

import numpy as np

from ..tables import Table
from .rounds import EngineResult, verdict


def answers(engines: Mapping[str, Callable[[np.ndarray], np.ndarray]], loader: Any, *,
            reference: str | None = None) -> tuple[dict[str, float], dict[str, float], int]:
    """Run every batch of ``loader`` (images, labels) through every engine (a function from a NumPy batch to
    logits). Returns accuracy % per engine, % of images given the same class as ``reference`` (default: the
    first engine), and the number of images."""
    names = list(engines)
    ref = reference or names[0]
    correct, agree, n = dict.fromkeys(names, 0), dict.fromkeys(names, 0), 0
    for images, labels in loader:
        b = images.numpy()
        y = np.asarray(labels)
        base = np.asarray(engines[ref](b)).argmax(1)
        for name in names:
            pred = base if name == ref else np.asarray(engines[name](b)).argmax(1)
            correct[name] += int((pred == y).sum())
            agree[name] += int((pred == base).sum())
        n += len(y)
    if n == 0:
        raise ValueError("the loader gave no images")
    return ({k: 100 * v / n for k, v in correct.items()}, {k: 100 * v / n for k, v in agree.items()}, n)


def answers_table(accuracy: Mapping[str, float], same: Mapping[str, float], n: int, title: str = "") -> Table:
    """The table of :func:`answers`."""
    return Table(["engine", "accuracy %", "same class as eager %"], [[k, accuracy[k], same[k]] for k in accuracy],
                 title=title or f"Answers on {n:,} test images")


def verdicts_line(runs: Sequence[EngineResult]) -> str:
    """Each engine against the first: 'name ratio [interval] word; ...', then the largest difference from eager
    and the lowest top-1 agreement."""
    line = "; ".join(f"{r.name} {v.ratio:.2f}x [{v.interval}] {v.word}"
                     for r, v in ((r, verdict(runs, r.name)) for r in runs[1:]))
    worst = max(runs, key=lambda r: r.max_abs_diff)
    return (f"{line}\n  max |diff| {worst.max_abs_diff:.1e} ({worst.name}); lowest top-1 agreement "
            f"{min(100 * r.top1_agreement for r in runs):.0f}% on {runs[0].agreement_n} inputs")


def batch_split(big: Sequence[EngineResult], one: Sequence[EngineResult], batch: int) -> Table:
    """Latency(b) ~ fixed + b * per image: two batch sizes (``batch`` and 1), measured in two separate runs,
    give both parts per engine. Described, not given a verdict (a fixed cost below 0 is clipped to 0: noise)."""
    if batch < 2:
        raise ValueError("the larger batch must hold at least 2 images")
    by = {r.name: r for r in big}
    rows = []
    for r in one:
        b = by[r.name]
        per_image = (b.latency_ms - r.latency_ms) / (batch - 1)
        rows.append([r.name, b.throughput, r.throughput, b.throughput / r.throughput, per_image,
                     max(0.0, r.latency_ms - per_image)])
    return Table(["engine", f"images/s b{batch}", "images/s b1", f"throughput b{batch}/b1 (x)", "per image ms",
                  "fixed ms per call"], rows,
                 title=f"Batch {batch} and batch 1: two separate runs, described, not given a verdict")


def published_vs_yours(runs: Sequence[EngineResult], published_rows: Sequence[Any], baseline: str) -> Table:
    """The Arc blog's frames per second (``published_rows``, ratios to ``baseline``'s) beside ``runs`` (ratios to
    the first engine, with its interval and word)."""
    pub = {r.variant: r for r in published_rows}
    base = pub[baseline]
    table = Table(["side", "variant", "frames/s", "ratio to own baseline", "baseline"],
                  title="Arc blog's setting: published vs yours",
                  note=f"Published: {base.source} ({base.note}: read off a demo that includes "
                       f"pre- and post-processing). Yours: the stand-in above, batch 1.")
    for name, r in pub.items():
        table.add("published", f"{name} ({r.hardware})", r.value, r.value / base.value, baseline)
    for r in runs:
        v = verdict(runs, r.name)
        table.add("yours", f"{r.name} ({r.precision})", r.throughput, v.ratio,
                  runs[0].name if r is runs[0] else f"{runs[0].name} ({v.interval}: {v.word})")
    return table


def ratio_bars(ax: Any, runs: Sequence[EngineResult], title: str, published_ratios: Mapping[str, float] | None = None,
               published_label: str = "") -> None:
    """Bars of each engine's speed-up over the first (the verdict's ratio with its 95% interval), and the
    published ratios beside them when given."""
    vs = [verdict(runs, r.name) for r in runs]
    names = [f"{r.name}\n({r.precision})\n{v.word if r is not runs[0] else 'baseline'}" for r, v in zip(runs, vs)]
    ax.bar(names, [v.ratio for v in vs], yerr=[[v.ratio - v.low for v in vs], [v.high - v.ratio for v in vs]],
           capsize=4, color="tab:blue", label=f"yours: speed-up over {runs[0].name} (estimate, 95% interval)")
    if published_ratios:
        ax.bar(list(published_ratios), list(published_ratios.values()), color="tab:orange", alpha=0.8,
               label=published_label)
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_ylabel("ratio to own baseline")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=7)
