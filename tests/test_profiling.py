import torch

from helpers import models, profiling


def test_profile_fn_profiles_only_the_steps():
    model = models.book_cnn()
    x = torch.randn(16, 1, 28, 28)
    with torch.no_grad():
        prof = profiling.profile_fn(lambda: model(x), warmup=1, steps=2)
    calls = {e.key: e.count for e in prof.key_averages()}
    assert calls["aten::max_pool2d"] == 4   # two steps of two pools: the warm-up is not in the profile
    assert any("conv" in k for k in calls)


def test_quiet_kineto_is_scoped(monkeypatch):
    import os

    monkeypatch.delenv("KINETO_LOG_LEVEL", raising=False)
    with profiling.quiet_kineto():
        assert os.environ["KINETO_LOG_LEVEL"] == "6"
    assert "KINETO_LOG_LEVEL" not in os.environ
    monkeypatch.setenv("KINETO_LOG_LEVEL", "2")  # the user's own choice wins and stays
    with profiling.quiet_kineto():
        assert os.environ["KINETO_LOG_LEVEL"] == "2"
    assert os.environ["KINETO_LOG_LEVEL"] == "2"


def test_matmul_owner_names_layer_and_pass():
    model = models.book_cnn("cifar10")                   # fc1: Linear(4096->512), fc2: Linear(512->10)
    assert profiling.matmul_owner(model, [[512], [32, 4096], [4096, 512], [], []]) == "fc1: Linear(4096->512), forward"
    assert profiling.matmul_owner(model, [[32, 512], [512, 4096]]) == "fc1: Linear(4096->512), backward: input gradient"
    assert profiling.matmul_owner(model, [[512, 32], [32, 4096]]) == "fc1: Linear(4096->512), backward: weight gradient"
    assert profiling.matmul_owner(model, [[10, 32], [32, 512]]) == "fc2: Linear(512->10), backward: weight gradient"
    assert profiling.matmul_owner(model, [[64, 288], [288, 256]]).startswith("layer2.0: Conv2d(32->64, kernel 3x3)")
    assert profiling.matmul_owner(model, [[7, 5], [5, 3]]) is None            # no such layer
    assert profiling.matmul_owner(model, [[32, 512], [4096, 512]]) is None    # not a matrix product
    assert profiling.matmul_owner(model, [[32, 4096]]) is None


def test_matmul_owner_on_a_real_profile():
    from torch.profiler import ProfilerActivity, profile

    model = models.book_cnn("cifar10")
    x, y = torch.randn(8, 3, 32, 32), torch.randint(0, 10, (8,))
    with profiling.quiet_kineto(), profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        torch.nn.functional.cross_entropy(model(x), y).backward()
    owners = {profiling.matmul_owner(model, e.input_shapes) for e in prof.key_averages(group_by_input_shape=True)
              if e.key in ("aten::mm", "aten::addmm")}
    assert "fc1: Linear(4096->512), forward" in owners
    assert "fc1: Linear(4096->512), backward: input gradient" in owners
    assert "fc1: Linear(4096->512), backward: weight gradient" in owners
