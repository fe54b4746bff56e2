"""helpers.ddp_training: the learning-rate warm-up, the training loop, collectives' payloads (on the
training device, float32), and evaluation shared by all ranks. (Its checkpoints are the course's one
format: tests/test_checkpoints.py.)"""

import ast
import inspect
from pathlib import Path

import pytest
import torch

from helpers import ddp_training as T
from helpers import checkpoints, distributed, models, ranks

COLLECTIVES = ("all_reduce", "all_gather", "all_gather_into_tensor", "broadcast", "reduce", "gather", "scatter",
               "reduce_scatter", "reduce_scatter_tensor", "all_to_all", "all_to_all_single", "send", "recv")
AUDITED_MODULES = (T, distributed, ranks)  # every module of the distributed entry point


# ----- the learning rate: linear scaling with a linear warm-up ---------------------------------

def test_warmup_lr_rises_linearly_to_the_scaled_rate():
    lr = lambda step: T.warmup_lr(step, base_lr=0.1, peak_lr=0.4, warmup_steps=4)
    assert [round(lr(s), 6) for s in range(6)] == [0.1, 0.175, 0.25, 0.325, 0.4, 0.4]
    assert T.warmup_lr(0, base_lr=0.1, peak_lr=0.4, warmup_steps=0) == 0.4  # no warm-up
    with pytest.raises(ValueError, match="step must be >= 0"):
        lr(-1)
    a, b = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
    opt = torch.optim.Adam([{"params": a.parameters()}, {"params": b.parameters(), "lr": 0.3}], lr=0.1)
    T.set_lr(opt, 0.25)
    assert [g["lr"] for g in opt.param_groups] == [0.25, 0.25]


class _RecordingSGD(torch.optim.SGD):
    def __init__(self, params, lr):
        super().__init__(params, lr=lr)
        self.used = []

    def step(self, closure=None):
        self.used.append(self.param_groups[0]["lr"])
        return super().step(closure)


def _tiny_loader(samples=12, batch=4):
    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

    data = TensorDataset(torch.randn(samples, 3), torch.randint(0, 2, (samples,)))
    return DataLoader(data, batch_size=batch, sampler=DistributedSampler(data, num_replicas=1, rank=0, seed=0))


def test_train_ddp_applies_the_warmup_to_every_step_and_resumes_it():
    """train_ddp sets each step's rate from lr_at(global step), also after a resume mid-warm-up."""
    lr_at = lambda step: T.warmup_lr(step, base_lr=0.01, peak_lr=0.04, warmup_steps=4)
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    opt = _RecordingSGD(model.parameters(), lr=lr_at(0))
    done = T.train_ddp(model, _tiny_loader(), opt, epochs=2, device=torch.device("cpu"),
                       progress=checkpoints.fresh_progress(), lr_at=lr_at)
    assert done["step"] == 6 and opt.used == pytest.approx([0.01, 0.0175, 0.025, 0.0325, 0.04, 0.04])
    resumed = {**checkpoints.fresh_progress(), "epoch": 1, "step": 3}  # as restore returns it after epoch 0
    opt2 = _RecordingSGD(model.parameters(), lr=0.0)
    T.train_ddp(model, _tiny_loader(), opt2, epochs=2, device=torch.device("cpu"), progress=resumed, lr_at=lr_at)
    assert opt2.used == pytest.approx([0.0325, 0.04, 0.04])  # the schedule goes on from step 3


# ----- collectives: payloads on the training device, never float64 -----------------------------

class Recorder:
    """A stand-in for torch.distributed that records the device and dtype of every payload."""

    def __init__(self, world: int = 2):
        self.world, self.calls = world, []

    def get_world_size(self):
        return self.world

    def _record(self, name, tensors):
        self.calls += [(name, t.device, t.dtype) for t in tensors]

    def all_reduce(self, tensor, *args, **kwargs):
        self._record("all_reduce", [tensor])

    def all_gather(self, outputs, tensor, *args, **kwargs):
        self._record("all_gather", [tensor, *outputs])

    def broadcast(self, tensor, *args, **kwargs):
        self._record("broadcast", [tensor])

    def barrier(self, *args, device_ids=None, **kwargs):
        self.calls.append(("barrier", device_ids))


def _check_payloads(calls, device):
    calls = [c for c in calls if c[0] != "barrier"]
    assert calls, "no collective was called"
    bad = [c for c in calls if c[1] != device or c[2] == torch.float64]
    assert not bad, f"collective payloads not on the training device {device} or in float64: {bad}"


def _comm_functions():
    """The functions defined in the entry point's modules that take a collectives module."""
    return [f for module in AUDITED_MODULES for f in vars(module).values()
            if inspect.isfunction(f) and f.__module__ == module.__name__ and "comm" in inspect.signature(f).parameters]


def test_every_collective_payload_is_on_the_training_device():
    """Called with torch.device('meta'): a payload built on the CPU (or in float64) shows up
    even on a CPU-only machine -- nccl and xccl refuse CPU tensors, Intel Arc has no float64."""
    meta = torch.device("meta")
    with torch.device("meta"):
        model = models.book_cnn("fashionmnist")
    calls = {}
    for rank in (0, 1):
        comm = Recorder()
        T.handshake(rank, meta, comm)
        T.sum_across_ranks([3, 4.5, 1e9], meta, comm)
        T.replica_fingerprints(model, meta, comm)
        T.wait_for_all(meta, comm)
        _check_payloads(comm.calls, meta)
        calls[rank] = {c[0] for c in comm.calls}
    assert calls[0] == {"all_reduce", "all_gather", "barrier"}
    gpu = Recorder()
    T.wait_for_all(torch.device("cuda", 1), gpu)  # a device object only: nothing runs on it
    assert gpu.calls == [("barrier", [1])]  # nccl is told which GPU this rank uses
    tested = {"handshake", "sum_across_ranks", "replica_fingerprints", "evaluate_on_all_ranks", "wait_for_all"}
    assert {f.__name__ for f in _comm_functions()} <= tested, "a new function takes comm: add it to this test"


def test_no_collective_bypasses_the_audited_functions():
    """Every collective call in the entry point's modules goes through a function that takes
    ``comm`` and calls it on ``comm`` -- so the test above sees every payload the entry point sends."""
    problems = []
    functions = [(module.__name__, n) for module in AUDITED_MODULES
                 for n in ast.walk(ast.parse(Path(module.__file__).read_text())) if isinstance(n, ast.FunctionDef)]
    for where, fn in functions:
        params = {a.arg for a in fn.args.args + fn.args.kwonlyargs}
        for call in [n for n in ast.walk(fn) if isinstance(n, ast.Call)]:
            f = call.func
            if isinstance(f, ast.Attribute) and f.attr in COLLECTIVES:
                owner = f.value.id if isinstance(f.value, ast.Name) else ast.unparse(f.value)
                if owner != "comm" or "comm" not in params:
                    problems.append(f"{where}.{fn.name}() calls {owner}.{f.attr} directly (line {call.lineno})")
    assert not problems, "; ".join(problems)


# ----- evaluation on every rank ----------------------------------------------------------------

class _AddOtherRanks:
    """A stand-in for torch.distributed on one rank: all_reduce adds what the other ranks hold."""

    def __init__(self, others=()):
        self.others, self.sent = list(others), []

    def all_reduce(self, tensor, *args, **kwargs):
        self.sent.append(tensor.clone())
        for other in self.others:
            tensor += other


def test_evaluate_on_all_ranks_scores_each_share_and_sums_the_counts():
    from torch.utils.data import TensorDataset

    class AlwaysThree(torch.nn.Module):
        def forward(self, x):
            out = torch.zeros(len(x), 10)
            out[:, 3] = 1.0
            return out

    targets = torch.tensor([3, 3, 1, 3, 0, 3, 3, 2, 3, 3])
    test_set = TensorDataset(torch.zeros(10, 2), targets)
    model, cpu = AlwaysThree(), torch.device("cpu")
    rank1 = _AddOtherRanks()
    one = T.evaluate_on_all_ranks(model, test_set, ranks.RankInfo(1, 2, 1, 2, "torchrun"), cpu, rank1)
    assert one["count"] == 5 and one["accuracy"] == 80.0  # rank 1 scores samples 1, 3, 5, 7, 9
    rank0 = _AddOtherRanks(rank1.sent)
    both = T.evaluate_on_all_ranks(model, test_set, ranks.RankInfo(0, 2, 0, 2, "torchrun"), cpu, rank0)
    share_loss = torch.nn.functional.cross_entropy(model(torch.zeros(5, 2)), targets[0::2], reduction="sum").item()
    own = [1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0]  # per image: right on 0 and 6 (2 and 4 are 1, 0)
    own[8] = 1.0
    assert rank0.sent[0].tolist() == [3.0, 5.0, pytest.approx(share_loss), *own]  # 3 right of 0, 2, 4, 6, 8
    whole = torch.nn.functional.cross_entropy(model(torch.zeros(10, 2)), targets).item()
    assert both["count"] == 10 and both["accuracy"] == 70.0 and both["loss"] == pytest.approx(whole)
    assert both["correct"] == [t == 3 for t in targets.tolist()]  # per image, in test-set order
    assert model.training  # left in training mode
