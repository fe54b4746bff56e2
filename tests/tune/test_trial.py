"""Tests of helpers.tune.trial: loading a reader's model (``FILE.py:FUNC``),
checking what FUNC returns, one trial in this process, and the one-line errors a failing trial
reports. The model file (``model_file``) is a fixture of tests/conftest.py; the child process that runs
trials is tested through helpers.tune in test_search.py."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from helpers.tune import trial as tune_trial


# --- loading a reader's model -------------------------------------------------------------

def test_load_function_and_checks(model_file: Path) -> None:
    work = tune_trial.load_workload(f"{model_file}:build")
    assert work.input_dims == 3 and work.batch_size == 32
    assert isinstance(work.make_optimizer(work.model.parameters()), torch.optim.Adam)  # Adam by default
    for spec, words in [(str(model_file), "FUNC"), (f"{model_file.parent}/missing.py:build", "does not exist"),
                        (f"{model_file}:nothing", "no function"), (f"{model_file}:three", "tuple of 3 items"),
                        (f"{model_file}:not_a_model", "torch.nn.Module"), (f"{model_file}:bad-name", "FILE.py:FUNC")]:
        with pytest.raises(tune_trial.TuneError, match=words):
            tune_trial.load_workload(spec)


def test_load_function_import_failures(tmp_path: Path) -> None:
    with pytest.raises(tune_trial.TuneError, match="'no_such_course_module' does not exist"):
        tune_trial.load_function("no_such_course_module:build")
    with pytest.raises(tune_trial.TuneError, match="has no ':FUNC' part"):
        tune_trial.load_function("helpers.tune.trial")
    broken = tmp_path / "broken.py"
    broken.write_text("raise ImportError('needs a package you do not have')\n")
    with pytest.raises(tune_trial.TuneError, match="importing .*broken.py' failed: ImportError: needs a package"):
        tune_trial.load_function(f"{broken}:build")
    failing = tmp_path / "failing.py"
    failing.write_text("def build():\n    raise ValueError('no data here')\n")
    with pytest.raises(tune_trial.TuneError, match=r"build\(\) raised ValueError: no data here"):
        tune_trial.load_workload(f"{failing}:build")


def test_check_workload_wraps_what_func_returned_and_names_what_is_wrong() -> None:
    model, x, x2, y, loss = nn.Linear(3, 2), torch.zeros(4, 3), torch.zeros(4, 1), torch.zeros(4, dtype=torch.long), \
        nn.CrossEntropyLoss()
    work = tune_trial.check_workload((model, [x, x2], y, loss), "mine")
    assert work.inputs == (x, x2) and work.model is model and work.targets is y and work.loss_fn is loss
    assert work.make_optimizer is tune_trial.default_optimizer and work.input_dims == 2 and work.batch_size == 4
    sgd = lambda params: torch.optim.SGD(params, lr=0.1)
    assert tune_trial.check_workload([model, x, y, loss, sgd]).make_optimizer is sgd  # a list does as well
    assert tune_trial.check_workload((model, torch.tensor(1.0), y, loss)).batch_size == 1  # a 0-d input: one sample
    for returned, words in [("model", r"mine\(\) returned a str\."),
                            ((model, x, y), r"mine\(\) returned a tuple of 3 items"),
                            ((model, "x", y, loss), "item 2 \\(inputs\\) must be a tensor"),
                            ((model, (), y, loss), "item 2 \\(inputs\\)"),
                            ((model, x, [0, 1], loss), "item 3 \\(targets\\) must be a tensor, got list"),
                            ((model, x, y, "cross-entropy"), "item 4 \\(loss_fn\\) must be callable"),
                            ((model, x, y, loss, "adam"), "item 5 must be a function params -> optimizer")]:
        with pytest.raises(tune_trial.TuneError, match=words):
            tune_trial.check_workload(returned, "mine")


def test_default_optimizer_is_adam_at_1e_3() -> None:
    opt = tune_trial.default_optimizer([nn.Parameter(torch.zeros(2))])
    assert type(opt) is torch.optim.Adam and opt.defaults["lr"] == 1e-3


# --- one trial ---------------------------------------------------------------------------------

def test_run_trial_in_process_applies_levers(model_file: Path) -> None:
    raw = tune_trial.run_trial(f"{model_file}:image", {"channels_last": True, "optimizer": "foreach", "batch": 2},
                               guard_steps=2, repeats=2, block_s=0.001)
    assert raw["ok"] and raw["batch_size"] == 8 and len(raw["samples_ms"]) == 2 and raw["optimizer"] == "Adam"
    opt = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(2))], lr=0.1, weight_decay=0.05)
    fused = tune_trial._rebuild_optimizer(opt, "fused")  # AdamW's defaults hold a key its __init__ refuses
    assert type(fused) is torch.optim.AdamW and fused.defaults["fused"] and fused.defaults["weight_decay"] == 0.05


def test_a_loss_that_is_not_finite_fails_the_trial(tmp_path: Path) -> None:
    nan_model = tmp_path / "nan_model.py"
    nan_model.write_text("import torch\nfrom torch import nn\n"
                         "def build():\n"
                         "    return nn.Linear(2, 1), torch.full((4, 2), float('nan')), torch.zeros(4, 1), nn.MSELoss()\n")
    raw = tune_trial.run_trial(f"{nan_model}:build", {}, guard_steps=2, repeats=1, block_s=0.001)
    assert not raw["ok"] and raw["error"] == "loss is not finite after 2 steps (nan)" and "warmup_s" in raw


def test_handle_turns_a_request_into_a_result_and_a_failure_into_one_line(model_file: Path) -> None:
    good = tune_trial.handle({"model": f"{model_file}:build", "guard_steps": 2, "repeats": 1, "block_s": 0.001})
    assert good["ok"] and len(good["samples_ms"]) == 1 and good["batch_size"] == 32 and good["child_s"] > 0
    bad = tune_trial.handle({"model": f"{model_file}:three"})
    assert not bad["ok"] and bad["error"].startswith("TuneError: three() returned a tuple of 3 items")
    assert "\n" not in bad["error"] and "Traceback" in bad["trace"] and isinstance(bad["child_s"], float)


def test_short_error_is_the_first_line_of_the_real_reason() -> None:
    assert tune_trial.short_error(RuntimeError("\nfirst line\nsecond line")) == "RuntimeError: first line"
    assert tune_trial.short_error(ValueError()) == "ValueError"  # no message: just the type
    assert tune_trial.short_error(ValueError("x" * 500)) == "ValueError: " + "x" * 300

    class Wrapped(Exception):  # what torch.compile raises around the backend's own error
        inner_exception = MemoryError("out of memory in the compiler")

    assert tune_trial.short_error(Wrapped("backend failed")) == "MemoryError: out of memory in the compiler"


class FakeDiagnosis:
    shares = {"compute": 0.2, "memory": 0.7, "overhead": 0.1, "input": 0.0, "communication": 0.0}
    top, findings = "memory", ["max_pool2d runs at 10% of its roof"]

    def line(self):
        return "memory 70%, compute 20%, overhead 10%"

    def to_dict(self):
        return {"shares": self.shares, "ops": []}


def test_the_baseline_request_returns_the_diagnosis(model_file: Path, monkeypatch) -> None:
    import sys
    import types

    import helpers

    seen = {}
    fake = types.ModuleType("helpers.diagnose")
    fake.diagnose_step = lambda model, inputs, targets, loss_fn, optimizer, **kw: seen.update(kw) or FakeDiagnosis()
    monkeypatch.setitem(sys.modules, "helpers.diagnose", fake)
    monkeypatch.setattr(helpers, "diagnose", fake, raising=False)
    req = {"model": f"{model_file}:build", "levers": {}, "guard_steps": 2, "repeats": 1, "block_s": 0.001}
    got = tune_trial.handle({**req, "diagnose": True})
    assert got["ok"] and got["diagnosis"]["top"] == "memory" and got["diagnosis"]["line"].startswith("memory 70%")
    assert got["diagnosis"]["detail"] == {"shares": FakeDiagnosis.shares, "ops": []} and seen["device"] == "cpu"
    assert got["diagnosis_s"] >= 0 and "diagnosis" not in tune_trial.handle(req)  # only the baseline asks
    fake.diagnose_step = lambda *args, **kw: 1 / 0  # a failing diagnosis: an error, never a crash
    assert "the diagnosis failed: ZeroDivisionError" in tune_trial.handle({**req, "diagnose": True})["diagnosis"]["error"]


def test_the_worker_hook_answers_every_request_with_one_trial() -> None:
    assert tune_trial.worker([]) is tune_trial.handle  # python -m helpers.tune.trial (helpers.processes.worker_main)
