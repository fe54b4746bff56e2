import time

import pytest
import torch
from torch import nn

from helpers import measure


def test_stats():
    s = measure.Stats.of([3.0, 1.0, 2.0, 10.0])
    assert (s.median, s.minimum, s.maximum, s.n) == (2.5, 1.0, 10.0, 4)
    assert s.q1 <= s.median <= s.q3
    assert measure.Stats.of([2.0]).spread == 0.0
    assert "n=4" in str(s)
    with pytest.raises(ValueError):
        measure.Stats.of([])


def test_time_fn_counts_and_separates_warmup():
    calls = []
    res = measure.time_fn(lambda: (calls.append(1), time.sleep(0.002)), repeats=4, warmup=2, name="sleep")
    assert len(calls) == 6 and len(res.samples) == 4 and len(res.warmup) == 2
    assert res.stats.minimum >= 0.002
    with pytest.raises(ValueError):
        measure.time_fn(lambda: None, repeats=0)


def test_speedup_table_ratio():
    base = measure.Result("base", [2.0, 2.0, 2.0], warmup=[3.0], metrics={"accuracy": 90.0})
    fast = measure.Result("fast", [1.0, 1.0, 1.0], warmup=[1.5], metrics={"accuracy": 89.0})
    t = measure.speedup_table([base, fast], baseline="base", metrics=["accuracy"])
    rows = t.as_dicts()
    assert rows[1]["speed-up"] == pytest.approx(2.0) and rows[1]["accuracy"] == 89.0
    assert rows[0]["warm-up s"] == 3.0
    with pytest.raises(ValueError):
        measure.speedup_table([base], baseline="nope")


def test_save_and_load_results(tmp_path):
    r = measure.Result("a", [1.0, 2.0], [0.5], {"accuracy": 50.0}, {"batch": 64})
    path = measure.save_results([r], tmp_path / "out" / "run", chapter=1)
    assert path.suffix == ".json" and path.with_suffix(".csv").exists()
    back = measure.load_results(path)
    assert back[0].samples == [1.0, 2.0] and back[0].settings == {"batch": 64}
    import json

    payload = json.loads(path.read_text())
    assert payload["context"] == {"chapter": 1} and "cpu_model" in payload["machine"]


def test_training_step_flops_linear():
    model = nn.Linear(8, 4, bias=False)
    x, y = torch.randn(16, 8), torch.randint(0, 4, (16,))
    flops = measure.training_step_flops(model, x, y, nn.CrossEntropyLoss())
    # forward 2*16*8*4; backward: grad of weight only (input needs no grad) 2*16*8*4
    assert flops == 2 * (2 * 16 * 8 * 4)
    assert model.weight.grad is None


def test_matmul_throughput_positive():
    assert measure.matmul_flops_per_second(n=128, repeats=2) > 1e6


def test_phase_times():
    model = nn.Sequential(nn.Flatten(), nn.Linear(784, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(8, 1, 28, 28), torch.randint(0, 10, (8,))
    phases = measure.phase_times(model, x, y, nn.CrossEntropyLoss(), opt, steps=3, warmup=1)
    assert list(phases) == ["forward", "loss", "backward", "update"]
    assert all(p.n == 3 and p.median > 0 for p in phases.values())
    with pytest.raises(ValueError):
        measure.phase_times(model, x, y, nn.CrossEntropyLoss(), opt, steps=0)


def test_loader_time_counts_images():
    loader = [(torch.zeros(4, 2), None)] * 3
    res = measure.loader_time(loader, epochs=2, warmup=1, name="list")
    assert res.name == "list" and len(res.samples) == 2 and res.metrics["images_per_s"] > 0
    capped = measure.loader_time(loader, epochs=1, warmup=0, max_batches=1)
    assert capped.metrics["images_per_s"] == pytest.approx(4 / capped.stats.median)
    with pytest.raises(ValueError):
        measure.loader_time(loader, epochs=0)


def test_matmul_peak_is_the_best_repeat_in_its_mode():
    import torch

    peak = measure.matmul_peak("cpu", "fp32", n=128, repeats=3)
    assert peak and peak.mode == "fp32" and peak.repeats == 3
    median = measure.matmul_flops_per_second(n=128, repeats=3)
    assert peak.flops > 0 and median > 0
    assert measure.math_mode("cpu", torch.float32) == "fp32"
    assert not measure.MatmulPeak(0.0, "fp32")
