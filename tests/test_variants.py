"""Tests of helpers.variants: a variant measured with the course protocol (fresh seeded model per
repeat, first epoch apart), the fresh-process command line, and variants in fresh processes taking
turns in interleaved rounds."""

from dataclasses import asdict

import pytest
import torch
from torch import nn

from helpers import measure, variants


def small_model():
    return nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.MaxPool2d(4), nn.Flatten(), nn.Linear(4 * 49, 10))


def test_run_variant_protocol(tiny_loaders):
    res = variants.run_variant("tiny", small_model, *tiny_loaders, epochs=2, repeats=2,
                               make_optimizer=lambda p: torch.optim.SGD(p, lr=0.05), progress=False)
    assert len(res.samples) == 2 and len(res.warmup) == 2
    assert set(res.metrics) == {"total_s", "steps", "loss", "accuracy", "data_wait_s"} and res.metrics["steps"] == 16
    with pytest.raises(ValueError, match="epochs >= 2"):
        variants.run_variant("x", small_model, *tiny_loaders, epochs=1)


def test_run_variant_without_a_test_set_reports_the_training_loss(tiny_loaders):
    res = variants.run_variant("no-test", small_model, tiny_loaders[0], None, epochs=2, repeats=1,
                               make_optimizer=lambda p: torch.optim.SGD(p, lr=0.05), progress=False,
                               settings={"lr": 0.05})
    assert "accuracy" not in res.metrics and res.settings == {"lr": 0.05}
    again = variants.run_variant("no-test", small_model, tiny_loaders[0], None, epochs=2, repeats=1,
                                 make_optimizer=lambda p: torch.optim.SGD(p, lr=0.05), progress=False)
    assert res.metrics["loss"] == again.metrics["loss"]  # the same seed: the same model, the same last-epoch loss
    with pytest.raises(ValueError, match="repeats must be >= 1"):
        variants.run_variant("x", small_model, *tiny_loaders, epochs=2, repeats=0)


def test_fresh_argv_checks_options():
    argv = variants.fresh_argv({"name": "x", "batch_size": 64, "no_bias": True, "threads": None})
    assert argv[1:] == ["-m", "helpers.variants", "--name", "x", "--batch-size", "64", "--no-bias"]
    with pytest.raises(ValueError, match="unknown option"):  # checked before any process starts
        variants.run_in_fresh_process(epochz=2)


def test_result_from_payload_rebuilds_the_result():
    res = measure.Result("a", [1.0, 2.0], [3.0], {"accuracy": 50.0}, {"threads": 1})
    back = variants.result_from_payload({"result": asdict(res), "torch_threads": 1})
    assert back == res


def test_fresh_rounds_take_turns_in_rotated_rounds_each_with_its_environment():
    standin = {"COURSE_DATA": "standin", "COURSE_PROFILE": "smoke"}
    rounds, facts = variants.fresh_rounds(
        {"one": {**standin, "OMP_NUM_THREADS": "1"}, "two": {**standin, "OMP_NUM_THREADS": "2"}}, rounds=2,
        epochs=2, train_size=64, test_size=32, batch_size=32, progress=False)
    assert [f["torch_threads"] for f in facts.values()] == [1, 2]  # each process got its own environment
    assert all(f["standin"] is True for f in facts.values())
    assert rounds.rounds == 2 and all(len(v) == 2 for v in rounds.samples.values())
    res = rounds.result("two")
    assert len(res.warmup) == 2 and 0 <= res.metrics["accuracy"] <= 100
    with pytest.raises(ValueError, match="named by the keys"):
        variants.fresh_rounds({"a": None}, name="x")
    payload = variants.run_in_fresh_process({**standin, "OMP_NUM_THREADS": "1"}, name="solo", epochs=2,
                                            train_size=16, test_size=8)
    assert variants.result_from_payload(payload).name == "solo" and payload["torch_threads"] == 1
    with pytest.raises(RuntimeError, match="'bad': the child process ended before it was ready"):
        variants.run_in_fresh_process({"COURSE_PROFILE": "bogus"}, name="bad", epochs=2)
