import time

import pytest
import torch

from helpers import measure, roofs

KINDS = ("read", "write", "triad")


@pytest.fixture(autouse=True)
def smoke(monkeypatch):
    monkeypatch.setenv("COURSE_PROFILE", "smoke")


def test_a_roof_orders_its_spread_and_its_best_round_is_a_ceiling():
    rate = roofs.Roof.of("triad", "B/s", [3.0, 1.0, 2.0], 1024)
    assert (rate.low, rate.median, rate.high, rate.size) == (1.0, 2.0, 3.0, 1024)
    assert rate.best == 3.0  # the highest rate: other processes only slow a round down
    assert roofs.Roof.of("overhead", "s", [3e-6, 1e-6, 2e-6]).best == 1e-6  # a time: the shortest


def test_matmul_peak_is_the_best_repeat_in_its_mode(monkeypatch):
    timed = []
    real_time_fn = roofs.time_fn
    monkeypatch.setattr(roofs, "time_fn", lambda *a, **kw: timed.append(real_time_fn(*a, **kw)) or timed[-1])
    peak = roofs.matmul_peak("cpu", "fp32", n=128, repeats=3)
    assert peak.flops > 0 and peak.mode == "fp32" and peak.repeats == 3 and len(timed[0].samples) == 3
    assert peak.flops == pytest.approx(2 * 128**3 / timed[0].stats.minimum)
    assert sorted(peak.rates) == sorted(2 * 128**3 / s for s in timed[0].samples)
    # the best (shortest) repeat decides, not the median
    monkeypatch.setattr(roofs, "time_fn", lambda fn, **kw: measure.Result("mm", [0.4, 0.1, 0.2]))
    assert roofs.matmul_peak("cpu", "fp32", n=100).flops == pytest.approx(2 * 100 ** 3 / 0.1)
    with pytest.raises(ValueError, match="unknown math mode"):
        roofs.matmul_peak("cpu", "int4")
    assert roofs.math_mode("cpu", torch.float32) == "fp32"


def test_rates_are_work_per_second_per_round(monkeypatch):
    monkeypatch.setattr(roofs, "time_fn", lambda fn, repeats, **kw: measure.Result("r", [0.1, 0.2, 0.4][:repeats]))
    assert roofs.rates(lambda: None, 5.0, "cpu", rounds=3, seconds=0.05) == pytest.approx([50, 25, 12.5])  # 1 call
    called = []

    def one_ms_per_call(fn, repeats, **kw):  # a clock that reads 1 ms per call of the measured function
        called.clear()
        fn()
        return measure.Result("r", [1e-3 * len(called)] * repeats)

    monkeypatch.setattr(roofs, "time_fn", one_ms_per_call)
    # calibration doubles the calls until a round lasts 10 ms: 16 calls, 16 ms
    assert roofs.rates(lambda: called.append(1), 3.0, "cpu", rounds=2, seconds=0.01) == pytest.approx([3000, 3000])
    assert len(called) == 16


def test_cache_levels_grow_and_the_memory_roof_follows_the_working_set():
    levels = roofs.cache_levels("cpu")
    sizes = list(levels.values())
    assert sizes and all(s > 0 for s in sizes) and sizes == sorted(sizes)
    assert roofs.cache_levels("meta") == {}
    flat = {k: roofs.Roof(k, "B/s", 1.0, 1.0, 1.0) for k in KINDS}
    fake = roofs.Roofs("cpu", "fp32", roofs.Roof("mm", "FLOP/s", 1, 1, 1), {"L2": flat, "L3": flat, "DRAM": flat},
                       {"L2": 1 << 20, "L3": 32 << 20}, roofs.Roof("op", "s", 1e-6, 1e-6, 1e-6))
    assert fake.memory_roof(100)[0] == "L2" and fake.memory_roof(2 << 20)[0] == "L3"
    assert fake.memory_roof(1 << 30, "read") == ("DRAM", flat["read"])
    stalled = {k: roofs.Roof(k, "B/s", 0.1, 0.1, 0.1) for k in KINDS}
    fake.bandwidth["L2"] = stalled  # a cache level measured below DRAM gets DRAM's roof
    assert fake.memory_roof(100) == ("L2", flat["triad"])


def test_bandwidth_measures_read_write_and_triad_on_the_working_set():
    bw = roofs.bandwidth("cpu", 1 << 20, rounds=2, seconds=0.002)
    assert set(bw) == set(KINDS)
    for roof in bw.values():
        assert roof.unit == "B/s" and 0 < roof.low <= roof.median <= roof.high
        assert abs(roof.size - (1 << 20)) < 16


def test_smoke_roofs_are_complete_positive_and_quick():
    start = time.perf_counter()
    r = roofs.measure_roofs("cpu", "fp32")
    took = time.perf_counter() - start
    assert took < 10, f"smoke roofs took {took:.1f} s"  # about 1 s on a quiet 2-core machine
    assert r.matmul.unit == "FLOP/s" and 0 < r.matmul.low <= r.matmul.median <= r.matmul.high
    assert list(r.bandwidth)[-1] == "DRAM" and list(r.bandwidth)[:-1] == list(r.capacity)
    for kinds in r.bandwidth.values():
        assert all(0 < k.low <= k.median <= k.high for k in kinds.values())
    assert r.bandwidth["DRAM"]["triad"].size >= 2 * max(r.capacity.values()) - 16  # DRAM's set fits no cache
    assert 0 < r.overhead.low <= r.overhead.median <= r.overhead.high < 1e-3
    assert r.launch is None and r.h2d == [] and "no launch latency or host-to-device copy" in " ".join(r.notes)
    table = r.table()
    assert len(table) == 2 + 3 * len(r.bandwidth) and set(table.column("unit")) == {"GFLOP/s", "GB/s", "µs"}


def test_roofs_are_measured_once_per_process(monkeypatch):
    measured = []
    monkeypatch.setattr(roofs, "measure_roofs", lambda device, mode: measured.append((device, mode)) or object())
    roofs._cached.cache_clear()
    try:
        assert roofs.cached_roofs("cpu", "bf16") is roofs.cached_roofs(torch.device("cpu"), "bf16")
        assert measured == [("cpu", "bf16")]
    finally:
        roofs._cached.cache_clear()


@pytest.mark.requires_gpu
def test_gpu_roofs_have_launch_latency_and_host_copies():
    r = roofs.measure_roofs("cuda", "tf32")
    assert r.launch is not None and r.launch.median > 0
    assert [h.name.split(", ")[1] for h in r.h2d] == ["pageable", "pinned"] and all(h.median > 0 for h in r.h2d)
    assert "L2" in r.capacity


def test_math_mode_reads_the_fp32_precision_api():
    matmul, conv = torch.backends.cuda.matmul.fp32_precision, torch.backends.cudnn.conv.fp32_precision
    try:
        torch.backends.cuda.matmul.fp32_precision, torch.backends.cudnn.conv.fp32_precision = "ieee", "ieee"
        assert roofs.math_mode("cuda") == "fp32"
        torch.backends.cuda.matmul.fp32_precision = "tf32"
        assert roofs.math_mode("cuda") == "tf32" and roofs.math_mode("cuda", torch.bfloat16) == "bf16"
    finally:
        torch.backends.cuda.matmul.fp32_precision, torch.backends.cudnn.conv.fp32_precision = matmul, conv
