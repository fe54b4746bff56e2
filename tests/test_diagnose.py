"""Synthetic steps whose regime is known by construction, and the parts of the diagnosis one at a time.

The steps run on one thread: on a shared 2-core machine OpenMP's second thread is often descheduled, which makes
every parallel operator wait for it; the classification margins below hold on such a machine."""

import json
import os
import re
import time
from types import SimpleNamespace

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from helpers import cpu_meter, diagnose, measure, roofs


@pytest.fixture(autouse=True)
def smoke(monkeypatch):
    monkeypatch.setenv("COURSE_PROFILE", "smoke")


@pytest.fixture(scope="module")
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def cpu_roofs(one_thread):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("COURSE_PROFILE", "smoke")
        return roofs.measure_roofs("cpu", "fp32")


class Scaled(nn.Module):
    """x * w, ``repeat`` times, with one scalar weight: every operator pointwise."""

    def __init__(self, repeat: int):
        super().__init__()
        self.w, self.repeat = nn.Parameter(torch.ones(1)), repeat

    def forward(self, x):
        for _ in range(self.repeat):
            x = (x * self.w + self.w).relu()
        return x


def mean_loss(out, targets):
    return out.mean()


def run(model, x, y, loss_fn, cpu_roofs, **kw):
    opt = torch.optim.SGD(model.parameters(), lr=1e-6)
    return diagnose.diagnose_step(model, x, y, loss_fn, opt, roofs=cpu_roofs, steps=3, **kw)


def test_a_large_matmul_is_compute_bound(cpu_roofs):
    d = run(nn.Linear(384, 384, bias=False), torch.randn(384, 384), torch.randn(384, 384), F.mse_loss, cpu_roofs)
    assert d.top == "compute" and d.shares["compute"] > 0.5, d.line()
    assert {op.name for op in d.ops if op.regime == "compute"} >= {"aten::mm"}


def test_pointwise_operators_on_a_dram_sized_tensor_are_memory_bound(cpu_roofs):
    x = torch.randn(max(cpu_roofs.capacity.values()) // 4)  # input and output: twice the largest cache
    d = run(Scaled(1), x, None, mean_loss, cpu_roofs)
    assert d.top == "memory" and d.shares["memory"] > 0.5, d.line()
    assert all(op.level == "DRAM" for op in d.ops if op.regime == "memory" and op.seconds > 0.05 * d.step_s)


def test_a_thousand_operators_on_tiny_tensors_are_overhead_bound(cpu_roofs):
    d = run(Scaled(120), torch.randn(4), None, mean_loss, cpu_roofs)  # 360 forward operators, twice that backward
    assert d.top == "overhead" and d.shares["overhead"] > 0.6, d.line()


class SleepyLoader:
    def __init__(self, batches, nap):
        self.batches, self.nap = batches, nap

    def __iter__(self):
        for batch in self.batches:
            time.sleep(self.nap)
            yield batch


class Busy:  # a CPU meter that saw other processes take one and a half cores
    def start(self):
        return self

    def stop(self):
        return cpu_meter.Interference(1.5, 0.0, 1.0)


def test_a_loader_that_sleeps_makes_the_step_input_bound(cpu_roofs, monkeypatch):
    monkeypatch.setattr(diagnose, "CpuMeter", Busy)
    x, y = torch.randn(8, 4), torch.randint(0, 3, (8,))
    stepped = []
    wait = diagnose.loader_wait(SleepyLoader([(x, y)] * 4, 0.05), step=stepped.append, batches=3)
    assert wait >= 0.05 and len(stepped) == 3
    d = run(nn.Linear(4, 3), x, y, F.cross_entropy, cpu_roofs, input_wait_s=wait)
    assert d.top == "input" and d.shares["input"] > 0.6, d.line()
    assert "chapter 05" in d.findings[0]
    assert d.findings[-2].startswith("other processes took 1.5 cores while the step was measured")
    with pytest.raises(ValueError, match="no batch"):
        diagnose.loader_wait([])


class BigParameter(nn.Module):
    """A tiny model with a large parameter it barely uses: a large all-reduce for almost no work."""

    def __init__(self):
        super().__init__()
        self.fc, self.big = nn.Linear(4, 3), nn.Parameter(torch.zeros(4 << 20))

    def forward(self, x):
        return self.fc(x) + self.big[:1]


def _rank(rank, folder):
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    torch.set_num_threads(1)
    os.environ["COURSE_PROFILE"] = "smoke"
    dist.init_process_group("gloo", init_method=f"file://{folder}/store", rank=rank, world_size=2)
    torch.manual_seed(0)
    ddp = DistributedDataParallel(BigParameter())
    x, y = torch.randn(8, 4), torch.randint(0, 3, (8,))
    opt = torch.optim.SGD(ddp.module.fc.parameters(), lr=0.1)
    comm = diagnose.exposed_comm(ddp, x, y, F.cross_entropy, opt, steps=3)
    dist.destroy_process_group()
    if rank == 0:
        d = diagnose.diagnose_step(ddp.module, x, y, F.cross_entropy, opt, comm_s=comm, steps=2)
        (folder / "out.json").write_text(json.dumps({"comm": comm, **d.to_dict()}))
    os._exit(0)  # skip the interpreter's teardown: gloo's thread may still hold the last tensor (docs/testing.md)


def test_a_large_all_reduce_beside_a_tiny_model_is_communication_bound(tmp_path):
    """The one slow test: two gloo ranks; the DDP step minus the same step under no_sync is exposed communication.
    The ranks are spawned, each with one thread: a fork fails once this process has run autograd's threads
    ("Unable to handle autograd's threading in combination with fork-based multiprocessing")."""
    import multiprocessing

    ranks = [multiprocessing.get_context("spawn").Process(target=_rank, args=(r, tmp_path)) for r in (0, 1)]
    for rank in ranks:
        rank.start()
    for rank in ranks:
        rank.join(120)
    assert [rank.exitcode for rank in ranks] == [0, 0]
    out = json.loads((tmp_path / "out.json").read_text())
    assert out["comm"] > 0
    assert out["top"] == "communication" and out["shares"]["communication"] > 0.5, out


def test_flops_and_bytes_belong_to_the_kernel_not_the_dispatcher(cpu_roofs):
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 14 * 14, 10))
    x, y = torch.randn(4, 3, 16, 16), torch.randint(0, 10, (4,))
    d = run(model, x, y, F.cross_entropy, cpu_roofs)
    parents = [op for op in d.ops if op.name in {"aten::conv2d", "aten::convolution", "aten::relu"}]
    assert not any(op.flops or op.bytes for op in parents)  # a parent keeps only its own dispatch time
    conv = [op for op in d.ops if op.flops and "conv" in op.name and "backward" not in op.name]
    assert len(conv) == 1 and conv[0].name != "aten::convolution" and conv[0].seconds > 0
    assert sum(op.flops for op in d.ops) == diagnose.training_step_flops(model, x, y, F.cross_entropy)


def test_counted_calls_see_bytes_and_flops_and_views_move_nothing():
    a, b = torch.randn(16, 8), torch.randn(8, 4)
    ones = [torch.ones(3), torch.ones(5)]
    calls = diagnose.count_calls(lambda: (a @ b, a.t(), a.add_(1.0), torch._foreach_mul_(ones, 2.0)))
    mm, view, add, foreach = calls
    assert mm == ("aten::mm", 2 * 16 * 8 * 4, (16 * 8 + 8 * 4) * 4, 16 * 4 * 4)
    assert view[0] == "aten::t" and view[2:] == (0, 0)
    assert add[0] == "aten::add_" and add[2:] == (16 * 8 * 4, 16 * 8 * 4)  # in place: read and written
    assert foreach == ("aten::_foreach_mul_", 0, 8 * 4, 8 * 4)  # returns nothing, writes its first argument


def _event(name, cpu_us, children=(), device_us=0.0):
    event = SimpleNamespace(name=name, self_cpu_time_total=cpu_us, self_device_time_total=device_us,
                            cpu_children=list(children), cpu_parent=None, device_type=diagnose.DeviceType.CPU)
    for child in children:
        child.cpu_parent = event
    return event


def _tree(*roots):
    events = []

    def walk(e):
        events.append(e)
        for c in e.cpu_children:
            walk(c)

    for r in roots:
        walk(r)
    return SimpleNamespace(events=lambda: events)


def test_the_kernel_owns_its_dispatchers_time():
    step = _tree(_event("aten::conv2d", 1.0, [_event("aten::convolution", 2.0, [
        _event("aten::mkldnn_convolution", 90.0, [_event("aten::empty", 3.0)])])]), _event("autograd::engine", 7.0))
    steps, calls, kernel = diagnose.kernel_times(step, {"aten::convolution"})
    assert kernel == {"aten::convolution": "aten::mkldnn_convolution"} and list(steps) == [None]  # no step marks
    assert steps[None] == pytest.approx({"aten::conv2d": 1e-6, "aten::mkldnn_convolution": 95e-6,
                                         "autograd::engine": 7e-6})
    assert calls["aten::mkldnn_convolution"] == 1 and calls["aten::empty"] == 1
    marked = [_event(diagnose.STEP, 0.0, [_event("aten::mm", us)]) for us in (5.0, 50.0)]
    for start, mark in zip((10, 20), marked):
        mark.time_range = SimpleNamespace(start=start)
    steps, _, _ = diagnose.kernel_times(_tree(*marked), {"aten::mm"})
    assert steps == {10: {"aten::mm": 5e-6}, 20: {"aten::mm": 50e-6}}  # one Counter per step, by its start


def _diagnosis(**seconds):
    rows = [diagnose.OpCost("aten::mkldnn_convolution", 2, seconds["compute"], flops=1e9, bytes=1e7, level="L3",
                            ideal={"compute": 0.9 * seconds["compute"], "memory": 0.0, "overhead": 0.0}),
            diagnose.OpCost("aten::max_pool2d_with_indices", 2, seconds["memory"], bytes=2e7, level="L3",
                            ideal={"compute": 0.0, "memory": 0.1 * seconds["memory"], "overhead": 0.0}),
            diagnose.OpCost("autograd::engine", 40, seconds["overhead"])]
    fake = roofs.Roofs("cpu", "fp32", roofs.Roof("mm", "FLOP/s", 1e11, 1e11, 1e11), {},
                       {}, roofs.Roof("op", "s", 1e-6, 1e-6, 1e-6))
    return diagnose._diagnosis(rows, sum(seconds.values()), fake)


def test_shares_sum_to_one_and_the_line_leads_with_the_largest():
    d = _diagnosis(compute=0.037, memory=0.044, overhead=0.019)
    assert sum(d.shares.values()) == pytest.approx(1.0) and set(d.shares) == set(diagnose.REGIMES)
    assert d.top == "memory" and d.shares["input"] == 0.0
    assert re.fullmatch(r"memory 44%, compute 37%, overhead 19%; top finding: aten::max_pool2d_with_indices "
                        r"is memory-bound at 10% of its L3 bandwidth roof \(44% of the step\).*", d.line())
    assert any("memory bounds the step (44%): channels-last" in f for f in d.findings)
    assert d.findings[-1] == diagnose.LOWER_BOUNDS and "lower bounds" in d.table().note
    assert json.loads(json.dumps(d.to_dict()))["top"] == "memory"
    table = d.table()
    assert table.column("operator")[0] == "aten::max_pool2d_with_indices" and table.column("regime")[0] == "memory"
    assert table.column("% of roof")[1] == pytest.approx(90.0)
    assert set(diagnose.REGIME_LEVERS) == set(diagnose.REGIMES)


def test_an_operator_near_its_roof_is_no_finding():
    d = _diagnosis(compute=0.08, memory=0.001, overhead=0.019)
    assert d.top == "compute" and d.findings[0].startswith("compute bounds the step (80%): bf16")
    assert not any("max_pool" in f for f in d.findings)  # under 5% of the step


def test_training_step_flops_count_the_hidden_input_gradient():
    model = nn.Sequential(nn.Linear(8, 6), nn.ReLU(), nn.Linear(6, 4))
    x, y = torch.randn(16, 8), torch.randint(0, 4, (16,))
    flops = diagnose.training_step_flops(model, x, y, nn.CrossEntropyLoss())
    # first layer: forward + weight gradient (the images need no gradient); second layer: forward, weight
    # gradient and the gradient of its input (the hidden activations); biases and ReLU are not matmuls
    assert flops == 2 * (2 * 16 * 8 * 6) + 3 * (2 * 16 * 6 * 4)
    assert all(p.grad is None for p in model.parameters())


NAPS = {"forward": 0.03, "loss": 0.01, "backward": 0.05, "update": 0.02}


class _SleepThrough(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        time.sleep(NAPS["forward"])
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        time.sleep(NAPS["backward"])
        return grad


class _SleepyNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 3)

    def forward(self, x):
        return _SleepThrough.apply(self.fc(x))


class _SleepySGD(torch.optim.SGD):
    def step(self, closure=None):
        time.sleep(NAPS["update"])
        return super().step(closure)


def _sleepy_loss(out, targets):
    time.sleep(NAPS["loss"])
    return F.cross_entropy(out, targets)


def test_phase_times_attributes_known_sleeps_to_their_phase():
    """Each phase sleeps a known time, so a phase timed in the wrong slot (or not at all) fails:
    lower bounds are exact on any machine, and the 50 ms backward is the largest by 20 ms."""
    model = _SleepyNet()
    opt = _SleepySGD(model.parameters(), lr=0.1)
    x, y = torch.randn(2, 4), torch.tensor([0, 2])
    before = model.fc.weight.detach().clone()
    start = time.perf_counter()
    phases = diagnose.phase_times(model, x, y, _sleepy_loss, opt, steps=3, warmup=1)
    wall = time.perf_counter() - start
    assert list(phases) == ["forward", "loss", "backward", "update"]
    assert all(isinstance(s, measure.Stats) and s.n == 3 for s in phases.values())
    for name, nap in NAPS.items():
        assert phases[name].minimum >= nap, name
    assert max(phases, key=lambda k: phases[k].median) == "backward"
    per_step = sum(s.median for s in phases.values())
    assert sum(NAPS.values()) <= per_step <= wall / 3  # the four phases make up the step, and no more
    assert not torch.equal(before, model.fc.weight)  # the update phase did update
    with pytest.raises(ValueError):
        diagnose.phase_times(model, x, y, _sleepy_loss, opt, steps=0)
