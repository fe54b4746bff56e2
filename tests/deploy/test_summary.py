"""helpers.deploy.summary: chapter 14's answers table, batch split, published-vs-yours table, figure and summary
line, on hand-made engine results (no engine imported)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from helpers import published
from helpers.deploy import rounds, summary as report


def result(name, latencies, batch=4, diff=0.0, agree=1.0):
    return rounds.EngineResult(name=name, engine=name.split(":")[0], device="cpu", precision="f32", batch=batch,
                               latencies=list(latencies), warmup=[0.1], export_s=0.0, load_s=0.0,
                               max_abs_diff=diff, top1_agreement=agree, agreement_n=32)


def test_answers_count_accuracy_and_agreement_per_engine():
    x = torch.zeros(6, 2)
    labels = torch.tensor([0, 1, 0, 1, 0, 1])
    loader = [(x[:3], labels[:3]), (x[3:], labels[3:])]
    engines = {"eager": lambda b: np.tile([1.0, 0.0], (len(b), 1)),      # always class 0
               "other": lambda b: np.tile([0.0, 1.0], (len(b), 1))}      # always class 1
    acc, same, n = report.answers(engines, loader)
    assert n == 6 and acc == {"eager": 50.0, "other": 50.0} and same == {"eager": 100.0, "other": 0.0}
    table = report.answers_table(acc, same, n)
    assert "Answers on 6 test images" in str(table)
    with pytest.raises(ValueError):
        report.answers(engines, [])


def test_batch_split_recovers_fixed_and_per_image_cost():
    # latency = 1 ms fixed + 0.5 ms per image: batch 9 takes 5.5 ms, batch 1 takes 1.5 ms
    big, one = [result("eager", [5.5e-3] * 3, batch=9)], [result("eager", [1.5e-3] * 3, batch=1)]
    text = str(report.batch_split(big, one, 9))
    row = next(line for line in text.splitlines() if line.startswith("eager"))
    assert [float(v) for v in row.split()[-2:]] == pytest.approx([0.5, 1.0])
    with pytest.raises(ValueError):
        report.batch_split(big, one, 1)


def test_published_vs_yours_and_summary_line():
    runs = [result("eager", [1.0, 1.1, 0.9, 1.05, 0.95, 1.0]), result("onnxruntime", [0.5, 0.55, 0.45, 0.5, 0.52, 0.48],
                                                                     diff=2e-6)]
    pub = published.select(published.load("arc_blog"), experiment="yolox_tiny_inference_directml")
    text = str(report.published_vs_yours(runs, pub, "titan_rtx"))
    assert "published" in text and "yours" in text and "onnxruntime (f32)" in text and "faster" in text
    line = report.verdicts_line(runs)
    assert line.startswith("onnxruntime 2.") and "faster" in line and "max |diff| 2.0e-06 (onnxruntime)" in line


def test_ratio_bars_draws_one_bar_per_engine_and_published():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = [result("eager", [1.0, 1.1, 0.9, 1.05, 0.95, 1.0]), result("openvino", [0.5, 0.55, 0.45, 0.5, 0.52, 0.48])]
    fig, ax = plt.subplots()
    report.ratio_bars(ax, runs, "t", {"published\nx": 0.8}, "published")
    assert len(ax.patches) == 3
    plt.close(fig)
