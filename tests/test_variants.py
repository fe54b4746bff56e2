"""Tests of helpers.variants: a variant measured with the course protocol (fresh seeded model per
repeat, first epoch apart), the fresh-process command line, and variants in fresh processes taking
turns in interleaved rounds."""

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
                               make_optimizer=lambda p: torch.optim.SGD(p, lr=0.05), progress=False)
    assert "accuracy" not in res.metrics
    again = variants.run_variant("no-test", small_model, tiny_loaders[0], None, epochs=2, repeats=1,
                                 make_optimizer=lambda p: torch.optim.SGD(p, lr=0.05), progress=False)
    assert res.metrics["loss"] == again.metrics["loss"]  # the same seed: the same model, the same last-epoch loss
    with pytest.raises(ValueError, match="repeats >= 1"):
        variants.run_variant("x", small_model, *tiny_loaders, epochs=2, repeats=0)


def test_fresh_rounds_check_options_and_build_each_command_line(monkeypatch):
    seen = {}
    monkeypatch.setattr(variants, "fresh_process_rounds", lambda commands, *a, **kw: seen.update(commands))
    variants.fresh_rounds({"x": {"E": "1"}}, rounds=1, batch_size=64, train_size=None)
    assert seen["x"][0][1:] == ["-m", "helpers.variants", "--name", "x", "--batch-size", "64"]
    assert seen["x"][1] == {"E": "1"}
    with pytest.raises(ValueError, match="unknown option"):  # checked before any process starts
        variants.fresh_rounds({"a": None}, rounds=1, epochz=2)


STANDIN = ("import json, os, sys\n"
           "print('child-ready', flush=True)\n"
           "for line in sys.stdin:\n"
           "    if line.strip() == 'STOP': break\n"
           "    cache = os.environ.get('TORCHINDUCTOR_CACHE_DIR')\n"
           "    print('RESULT ' + json.dumps({'pid': os.getpid(), 'cache': cache, 'empty': not os.listdir(cache) if cache else None,"
           " 'arm': os.environ['ARM']}), flush=True)\n")


def test_fresh_process_rounds_start_a_new_process_per_arm_and_round(monkeypatch):
    """A stand-in child (no torch): every arm gets a new process in every round, each with its own empty cache,
    removed afterwards; the A/A arm re-measures with new processes too."""
    import os
    import sys

    monkeypatch.setenv("COURSE_PROFILE", "smoke")
    seen = []

    def value(payload):
        seen.append(payload)
        return 1.0

    cmds = {name: ([sys.executable, "-c", STANDIN], {"ARM": name}) for name in ("a", "b", measure.aa_name("a"))}
    got, facts = variants.fresh_process_rounds(cmds, rounds=3, value=value, progress=False, fresh_cache=True)
    assert got.rounds == 3 and len(seen) == 9
    assert len({p["pid"] for p in seen}) == 9            # nine processes for three arms over three rounds
    assert all(p["empty"] for p in seen) and len({p["cache"] for p in seen}) == 9
    assert not any(os.path.exists(p["cache"]) for p in seen)  # every cache removed after its round
    assert [o for o in got.orders] == [list(o) for o in
                                       ([["a", "b", "A/A: a again"], ["b", "A/A: a again", "a"], ["A/A: a again", "a", "b"]])]
    assert facts["b"]["arm"] == "b"


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


def test_diagnose_levers_applies_the_levers_and_hands_the_step_to_diagnose(monkeypatch):
    import helpers.diagnose

    seen = {}

    def fake(model, inputs, targets, loss_fn, optimizer, **options):
        seen.update(model=model, inputs=inputs, optimizer=optimizer, options=options)
        return "diagnosis"

    monkeypatch.setattr(helpers.diagnose, "diagnose_step", fake)
    rgb = lambda: nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.Flatten(), nn.Linear(4 * 64, 10))  # noqa: E731
    x, y = torch.randn(4, 3, 8, 8), torch.randint(0, 10, (4,))
    assert variants.diagnose_levers(rgb(), x, y, steps=2) == "diagnosis"
    assert seen["options"] == {"steps": 2} and isinstance(seen["inputs"], tuple)
    assert seen["inputs"][0].is_contiguous() and not seen["optimizer"].defaults.get("fused")
    variants.diagnose_levers(rgb(), x, y, channels_last=True, adam={"fused": True}, lr=0.01)
    assert seen["inputs"][0].is_contiguous(memory_format=torch.channels_last) and not seen["inputs"][0].is_contiguous()
    assert seen["model"][0].weight.is_contiguous(memory_format=torch.channels_last)
    assert not seen["model"][0].weight.is_contiguous()
    assert seen["optimizer"].defaults["fused"] is True and seen["optimizer"].defaults["lr"] == 0.01


def test_decoded_takes_a_seeded_subset_once_into_tensors(monkeypatch):
    import helpers.data

    images = [(torch.full((1, 2, 2), float(i)), i % 10) for i in range(20)]
    monkeypatch.setattr(helpers.data, "load_dataset", lambda name, train=True: images)
    got = variants.decoded("fashionmnist", True, 5, seed=3)
    assert len(got) == 5 and got.tensors[0].shape == (5, 1, 2, 2) and got.tensors[1].dtype == torch.int64
    assert [int(x[0, 0, 0]) % 10 for x in got.tensors[0]] == got.tensors[1].tolist()  # each label stays with its image
    again = variants.decoded("fashionmnist", True, 5, seed=3)
    assert torch.equal(got.tensors[0], again.tensors[0])                              # the same seed, the same subset
    assert len(variants.decoded("fashionmnist", False, None, seed=0)) == 20
