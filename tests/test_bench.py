import subprocess
import sys

import pytest
import torch
from torch import nn

from helpers import bench


def test_option_errors_list_choices():
    with pytest.raises(bench.BenchError, match="choose from alexnet, resnet18"):
        bench.check_options(["lenet"], "cpu", "fp32")
    with pytest.raises(bench.BenchError, match="Unknown device 'tpu'"):
        bench.check_options(["resnet18"], "tpu", "fp32")
    with pytest.raises(bench.BenchError, match="fp32, bf16, fp16"):
        bench.check_options(["resnet18"], "cpu", "int8")
    names, dev, dtype = bench.check_options(["resnet18"], "cpu", "bf16")
    assert names == ["resnet18"] and dev.type == "cpu" and dtype is torch.bfloat16
    with pytest.raises(bench.BenchError):
        bench.time_steps("resnet18", device=torch.device("cpu"), size=8)
    with pytest.raises(bench.BenchError):
        bench.time_steps("resnet18", device=torch.device("cpu"), size=32, steps=0)


def test_time_steps_phases_and_flops():
    t = bench.time_steps("resnet18", device=torch.device("cpu"), batch=2, size=32, warmup=1, steps=3)
    assert len(t.total) == 3 and list(t.phases) == list(bench.PHASES)
    assert all(len(v) == 3 for v in t.phases.values())
    assert sum(t.phases[p][0] for p in bench.PHASES) == pytest.approx(t.total[0], rel=1e-6)
    assert t.flops_per_step > 0 and t.mean_ms > 0
    table = bench.results_table([t], peak_flops=1e11)
    assert table.as_dicts()[0]["model"] == "resnet18" and table.as_dicts()[0]["% of matmul peak"] > 0


def test_agrees_with_torch_utils_benchmark():
    """The benchmark's clock readings vs torch.utils.benchmark.Timer on the very same step
    (same model, optimizer and batch), alternating step by step so that drifts of the
    machine's speed hit both alike."""
    import statistics

    from torch.utils.benchmark import Timer

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        step = bench.BenchStep("mobilenet", device=torch.device("cpu"), batch=4, size=64)
        bench.timed_steps(step, steps=10)
        # timeit switches Python's garbage collector off; a real training step runs with it on
        timer = Timer("step.run()", setup="import gc; gc.enable()", globals={"step": step})
        ours, ref = [], []
        for i in range(16):  # short blocks in A-B-B-A order: drifts and "who ran just before" cancel out
            for which in ((0, 1) if i % 2 == 0 else (1, 0)):
                if which == 0:
                    ours.append(statistics.fmean(bench.timed_steps(step, steps=5)[0]))
                else:
                    ref.append(timer.timeit(number=5).mean)
    finally:
        torch.set_num_threads(before)
    ratios = [a / b for a, b in zip(ours, ref)]  # each pair of blocks ran back to back
    assert statistics.median(ratios) == pytest.approx(1.0, abs=0.05), (statistics.median(ours), statistics.median(ref))


def test_published_ratios():
    fake = bench.StepTimes("resnet18", "cpu", [0.1, 0.1])
    table = bench.published_table([fake])
    row = next(r for r in table.as_dicts() if r["published setup"] == "pytorch/cuda | Nvidia rtx 2060s")
    assert row["resnet18"] == pytest.approx(38.624 / 100.0)
    assert len(table) == 10


def test_command_line(tmp_path):
    times = bench.main(["--models", "resnet18", "--size", "32", "--batch", "2", "--steps", "2", "--warmup", "1",
                        "--out", str(tmp_path)])
    assert times[0].model == "resnet18"
    assert len(list(tmp_path.glob("bench-*.csv"))) == 1 and len(list(tmp_path.glob("bench-*.json"))) == 1
    proc = subprocess.run([sys.executable, "-m", "helpers.bench", "--models", "lenet"], capture_output=True, text=True)
    assert proc.returncode == 2 and "choose from" in proc.stderr and "Traceback" not in proc.stderr
