import subprocess
import sys
import time

import pytest
import torch

from helpers import bench, results, roofs
from helpers.measure import Result


def step_times(model, device, total, phases=None, flops_per_step=0):
    """A Result shaped like ``bench.time_steps``'s."""
    return Result(model, list(total), [], {"flops_per_step": flops_per_step},
                  {"device": device, "phases": dict(phases or {}), "phase_method": "clock"})


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
    phases = t.settings["phases"]
    assert t.name == "resnet18" and t.settings["device"] == "cpu" and t.settings["phase_method"] == "clock"
    assert len(t.samples) == 3 and list(phases) == list(bench.PHASES) and all(len(v) == 3 for v in phases.values())
    assert sum(phases[p][0] for p in bench.PHASES) == pytest.approx(t.samples[0], rel=1e-6)
    # forward + backward: every convolution and matmul three times (forward, input and weight gradient), except
    # the input gradient of the first convolution (the images need none) -- the forward counted here on its own
    from torch.utils.flop_counter import FlopCounterMode

    from helpers import models

    counter = FlopCounterMode(display=False)
    with counter, torch.no_grad():
        models.torchvision_model("resnet18", num_classes=1000)(torch.randn(2, 3, 32, 32))
    conv1 = 2 * 2 * (64 * 16 * 16) * (3 * 7 * 7)  # batch 2, 64 channels of 16x16 outputs, 3x7x7 inputs each
    assert t.metrics["flops_per_step"] == 3 * counter.get_total_flops() - conv1
    table = bench.results_table([t], peak=roofs.MatmulPeak(1e15, "fp32", 1024, 5))
    row = table.as_dicts()[0]
    assert row["model"] == "resnet18" and 0 < row["% of fp32 matmul peak"] < 100
    assert "ms/step" in table.columns[1] and "Above 100%" not in table.note


class SleepyStep:
    """Stands in for BenchStep: phase k of bench.PHASES sleeps ``naps[k]`` seconds, so the true times
    are known. It marks its phases as BenchStep does: start, copy, then train_step's phases (the
    loss, counted with forward, takes no time)."""

    device = torch.device("cpu")

    def __init__(self, naps):
        self.naps = dict(zip(bench.PHASES, naps))

    def run(self, mark):
        mark("start")
        for phase in ("copy", "zero_grad", "forward", "loss", "backward", "update"):
            time.sleep(self.naps.get(phase, 0.0))
            mark(phase)


def test_clock_attributes_time_to_the_right_phase():
    """Known sleeps instead of a tolerance around another timer: lower bounds are exact on any machine,
    and a 0.1 s phase among instant ones is the largest unless the machine stalls for 0.1 s."""
    naps = [0.0, 0.0, 0.1, 0.0, 0.02]
    totals, phases = bench.timed_steps(SleepyStep(naps), steps=3, warmup=1)
    assert len(totals) == 3 and all(t >= sum(naps) for t in totals)
    for name, nap in zip(bench.PHASES, naps):
        assert all(v >= nap for v in phases[name]), name
    assert all(max(bench.PHASES, key=lambda p: phases[p][i]) == "forward" for i in range(3))
    assert sum(phases[p][0] for p in bench.PHASES) == pytest.approx(totals[0], rel=1e-9)


class FakeEvent:
    def __init__(self):
        self.t = time.perf_counter()

    def elapsed_time(self, other):  # milliseconds, like torch.Event
        return 1e3 * (other.t - self.t)


def test_device_events_give_phases_and_the_host_clock_the_step():
    naps = [0.0, 0.01, 0.05, 0.0, 0.0]
    totals, phases = bench.timed_steps(SleepyStep(naps), steps=2, clock=FakeEvent)
    assert all(v >= 0.05 for v in phases["forward"]) and all(v >= 0.01 for v in phases["copy"])
    assert all(t >= sum(naps) for t in totals)
    assert bench.event_clock(torch.device("cpu")) is None  # the CPU has no events: its clock is exact


def test_peak_in_the_same_math_mode(monkeypatch):
    assert roofs.math_mode("cpu") == "fp32"
    assert roofs.math_mode("cpu", torch.bfloat16) == "bf16" and roofs.math_mode("cpu", torch.float16) == "fp16"
    before = torch.backends.cudnn.allow_tf32
    try:
        torch.backends.cudnn.allow_tf32 = True
        assert roofs.math_mode("cuda") == "tf32"  # cuDNN convolutions use TF32 by default
        torch.backends.cudnn.allow_tf32 = False
        assert roofs.math_mode("cuda") == ("tf32" if torch.backends.cuda.matmul.allow_tf32 else "fp32")
    finally:
        torch.backends.cudnn.allow_tf32 = before
    timed = []
    real_time_fn = roofs.time_fn
    monkeypatch.setattr(roofs, "time_fn", lambda *a, **kw: timed.append(real_time_fn(*a, **kw)) or timed[-1])
    peak = roofs.matmul_peak("cpu", "bf16", n=128, repeats=2)
    assert peak.mode == "bf16" and peak.n == 128 and len(timed) == 1 and len(timed[0].samples) == 2
    assert peak.flops == pytest.approx(2 * 128**3 / timed[0].stats.minimum)  # the best of the 2 timed matmuls
    monkeypatch.setattr(roofs, "time_fn", real_time_fn)
    tf32_before = torch.backends.cuda.matmul.allow_tf32
    roofs.matmul_peak("cpu", "tf32", n=64, repeats=1)
    assert torch.backends.cuda.matmul.allow_tf32 == tf32_before  # restored
    with pytest.raises(ValueError, match="unknown math mode"):
        roofs.matmul_peak("cpu", "int8")


def test_share_above_peak_is_explained_and_rows_carry_it():
    fake = step_times("resnet18", "cpu", [0.010, 0.011, 0.012], {p: [0.002] * 3 for p in bench.PHASES},
                            flops_per_step=int(2e9))
    table = bench.results_table([fake], peak=roofs.MatmulPeak(1e11, "bf16", 1024, 5))
    assert table.as_dicts()[0]["% of bf16 matmul peak"] == pytest.approx(100 * 2e9 / 0.011 / 1e11)
    assert "Above 100% (resnet18)" in table.note and "bf16 matmul" in table.note
    rows = bench.bench_rows([fake], batch=16, size=224, dtype="fp32",
                            peak=roofs.MatmulPeak(1e11, "bf16"), fingerprint={"cpu_model": "x"}, profile="workshop",
                            data="none")
    by_metric = {r.metric: r for r in rows}
    step = by_metric["step_time"]
    assert step.unit == "ms" and step.median == pytest.approx(11.0) and step.repeats == 3
    assert step.experiment == "train_step b16 224x224 fp32" and step.published == pytest.approx(38.624)
    assert "zero_grad_step_time" in by_metric and by_metric["achieved_throughput"].unit == "TFLOP/s"
    assert by_metric["share_of_bf16_matmul_peak"].median == pytest.approx(100 * 2e9 / 0.011 / 1e11)
    other = bench.bench_rows([fake], batch=2, size=32, dtype="bf16", peak=None,
                             fingerprint={"cpu_model": "x"}, profile="workshop", data="none")
    assert other[0].experiment == "train_step b2 32x32 bf16"
    assert other[0].published is None  # not the blog's settings: no published value beside it


def test_published_ratios_use_your_median_not_the_mean():
    # One 9.7 s step among 0.9 s steps: the mean triples, the median stays (the chapter's workshop run).
    fake = step_times("resnet18", "cpu", [0.9] * 19 + [9.7])
    table = bench.published_table([fake])
    row = next(r for r in table.as_dicts() if r["published setup"] == "pytorch/cuda | Nvidia rtx 2060s")
    assert row["resnet18 (x)"] == pytest.approx(38.624 / 900.0)
    assert len(table) == 10
    assert "median 900.0 ms" in table.note and "mean 1340.0 ms, the blog's statistic" in table.note


def test_results_table_leads_with_the_median_and_labels_the_mean():
    fake = step_times("resnet18", "cpu", [0.9, 0.9, 9.7], {p: [0.1, 0.1, 5.0] for p in bench.PHASES})
    table = bench.results_table([fake])
    assert table.columns[1] == "median ms/step" and "mean ms/step (blog's statistic)" in table.columns
    row = table.as_dicts()[0]
    assert row["median ms/step"] == pytest.approx(900.0)
    assert row["mean ms/step (blog's statistic)"] == pytest.approx(3833.33, rel=1e-4)
    assert row["forward median ms"] == pytest.approx(100.0)  # phases: medians too
    assert "median: the course's statistic" in table.note


def test_command_line(tmp_path):
    times = bench.main(["--models", "resnet18", "--size", "32", "--batch", "2", "--steps", "2", "--warmup", "1",
                        "--out", str(tmp_path)])
    assert times[0].name == "resnet18"
    (folder,) = list(tmp_path.iterdir())
    assert folder.name.endswith("-cpu")
    rows = results.read_rows(folder / results.ROWS_FILE)
    assert {r.variant for r in rows} == {"resnet18"} and rows[0].chapter == "bench"
    csv_lines = (folder / "bench.csv").read_text().splitlines()
    assert len(csv_lines) == 2 and csv_lines[0].startswith("model,median ms/step,min ms/step")  # the printed table
    md = (folder / "bench.md").read_text()
    assert "| model | median ms/step |" in md and "**Published ms per step / your median ms per step" in md
    help_text = subprocess.run([sys.executable, "-m", "helpers.bench", "--help"], capture_output=True, text=True).stdout
    assert "--dtype" in help_text and "--no-optimizer" not in help_text and "2024" not in help_text
    proc = subprocess.run([sys.executable, "-m", "helpers.bench", "--models", "lenet"], capture_output=True, text=True)
    assert proc.returncode == 2 and "choose from" in proc.stderr and "Traceback" not in proc.stderr


def test_bench_step_marks_every_phase_and_updates_the_weights():
    step = bench.BenchStep("alexnet", device=torch.device("cpu"), batch=1, size=64)
    seen = []
    before = next(step.net.parameters()).detach().clone()
    step.run(seen.append)
    assert seen == ["start", "copy", "zero_grad", "forward", "loss", "backward", "update"]
    assert not torch.equal(before, next(step.net.parameters()))
