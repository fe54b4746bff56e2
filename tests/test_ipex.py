import importlib.util
import sys

import pytest
import torch

from helpers import ipex


def test_mismatch_is_refused_before_import(monkeypatch):
    monkeypatch.setattr(ipex.metadata, "version", lambda name: "2.3.0+cpu")
    with pytest.raises(ipex.IPEXUnavailable, match="needs torch 2.3.* but .* would end this Python process"):
        ipex.load()


def test_missing_ipex(monkeypatch):
    def missing(name):
        raise ipex.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(ipex.metadata, "version", missing)
    with pytest.raises(ipex.IPEXUnavailable, match="not installed"):
        ipex.load()


def tiny_batches(n=2, size=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [(torch.rand(size, 3, 32, 32, generator=g), torch.randint(0, 10, (size,), generator=g)) for _ in range(n)]


def test_variants_name_what_they_change():
    assert ipex.variant("stock_fp32") == ipex.Variant()
    assert ipex.variant("stock_bf16_cl") == ipex.Variant(channels_last=True, bf16=True)
    assert ipex.variant("ipex_fp32").ipex and ipex.variant("inductor").compile == "inductor"
    with pytest.raises(ValueError, match="unknown variant 'ipex_fp16'.*stock_fp32"):
        ipex.variant("ipex_fp16")


def test_prepare_stock_variants_layout_optimizer_and_autocast():
    model, opt, dtype, cl = ipex.prepare("stock_fp32")
    assert model.training and dtype is None and not cl and not opt.defaults["fused"]
    assert torch.equal(model.layer1[0].weight, ipex.prepare("stock_fp32")[0].layer1[0].weight)  # seeded
    fused = ipex.prepare("stock_cl_fused", lr=0.5)[1]
    assert fused.defaults["fused"] and fused.defaults["lr"] == 0.5
    model, opt, dtype, cl = ipex.prepare("stock_bf16_cl")
    assert dtype == torch.bfloat16 and cl
    assert model.layer1[0].weight.is_contiguous(memory_format=torch.channels_last)
    assert model.layer1[0].weight.dtype == torch.float32  # autocast casts per operator; the weights stay fp32


def test_train_round_is_seeded_and_reports_its_metrics():
    batches, test = tiny_batches(), tiny_batches(1, seed=1)
    a = ipex.train_round("stock_fp32", batches, test, warmup_steps=1)
    b = ipex.train_round("stock_fp32", batches, test, warmup_steps=1)
    assert a["value"] > 0 and a["metrics"]["loss"] == b["metrics"]["loss"]  # a fresh seeded model every round
    assert set(a["metrics"]) == {"accuracy", "loss", "warmup_s", "prepare_s", "steps", "page_faults_per_step"}
    assert a["metrics"]["steps"] == 2 and 0 <= a["metrics"]["accuracy"] <= 100
    cl = ipex.train_round("stock_fp32_cl", batches, test, warmup_steps=1)
    assert cl["metrics"]["loss"] == pytest.approx(a["metrics"]["loss"], rel=1e-3)  # same math, another layout
    with pytest.raises(ValueError, match="at least one batch"):
        ipex.train_round("stock_fp32", [], test)


def test_profile_ops_and_groups():
    x, y = tiny_batches(1)[0]
    ops = ipex.profile_ops("stock_fp32", x, y, steps=1, warmup=1)
    keys = {op["key"] for op in ops}
    assert {"aten::max_pool2d_with_indices", "aten::max_pool2d_with_indices_backward"} <= keys
    assert all(op["calls"] >= 1 and op["self_ms"] > 0 for op in ops)
    groups = ipex.op_groups(ops)
    assert groups["max-pool"] > 0 and groups["convolution"] > 0 and groups["linear (mm, addmm)"] > 0
    assert sum(groups.values()) == pytest.approx(sum(op["self_ms"] for op in ops))


def test_op_groups_sorts_by_name():
    rows = [{"key": "aten::max_pool2d_with_indices", "self_ms": 3.0},
            {"key": "torch_ipex::convolution_backward", "self_ms": 2.0},
            {"key": "aten::addmm", "self_ms": 1.0}, {"key": "aten::mm", "self_ms": 1.5},
            {"key": "torch_ipex::adam_fused_step", "self_ms": 0.5}, {"key": "aten::copy_", "self_ms": 0.25},
            {"key": "aten::relu", "self_ms": 0.125}]
    assert ipex.op_groups(rows) == {"max-pool": 3.0, "convolution": 2.0, "linear (mm, addmm)": 2.5,
                                            "optimizer update": 0.5, "layout / dtype copies": 0.25, "other": 0.125}


def test_serve_argv_checks_the_variant():
    argv = ipex.serve_argv("ipex_fp32", train_size=64, lr=3e-4)
    assert argv[1:5] == ["-m", "helpers.ipex", "--serve", "ipex_fp32"]
    assert argv[argv.index("--train-size") + 1] == "64" and argv[argv.index("--lr") + 1] == "0.0003"
    with pytest.raises(ValueError, match="unknown variant"):
        ipex.serve_argv("nope")


def test_children_serve_variants_and_only_ipex_ones_import_ipex():
    """IPEX runs only in a child of its own (its import replaces kernels of the process that imports it)."""
    from helpers import processes

    ipex_here = importlib.util.find_spec("intel_extension_for_pytorch") is not None  # the IPEX environment
    names = ["stock_fp32"] + (["ipex_fp32"] if ipex_here else [])
    cmds = {n: (ipex.serve_argv(n, train_size=16, test_size=8, batch_size=8, warmup_steps=1),
                {"COURSE_DATA": "standin"}) for n in names}
    with processes.Children(cmds) as kids:
        got = kids.ask("stock_fp32", {})
        assert got["value"] > 0 and got["metrics"]["steps"] == 2
        ops = kids.ask("stock_fp32", {"profile": True, "steps": 1})["ops"]
        assert any(op["key"] == "aten::max_pool2d_with_indices" for op in ops)
        assert not any("torch_ipex::" in op["key"] for op in ops)
        if "ipex_fp32" in names:
            ipex_ops = kids.ask("ipex_fp32", {"profile": True, "steps": 1})["ops"]
            assert any("torch_ipex::" in op["key"] for op in ipex_ops)
            trained = kids.ask("ipex_fp32", {})  # ipex.optimize'd model and optimizer: the same training, in fp32
            assert trained["metrics"]["loss"] == pytest.approx(got["metrics"]["loss"], rel=1e-3)
            assert "AutocastCPU" in kids.stderr("ipex_fp32")  # its import says it replaced autocast kernels
            assert "AutocastCPU" not in kids.stderr("stock_fp32")


def test_bf16_prepack_supported_reads_the_cpu_flags(monkeypatch):
    from helpers import system

    for flag in (True, False):
        monkeypatch.setattr(system, "cpu_bf16_support", lambda flag=flag: {"ipex_bf16_prepack": flag, "amx": False})
        assert ipex.bf16_prepack_supported() is flag


def test_round_commands_and_value():
    cmds = ipex.round_commands({"a": ("stock_cl_fused", None), "b": ("stock_fp32", "/x/python")},
                                       env={"OMP_NUM_THREADS": "1"}, train_size=64)
    assert cmds["a"][0][1:4] == ["-m", "helpers.ipex", "--serve"] and "stock_cl_fused" in cmds["a"][0]
    assert cmds["b"][0][0] == "/x/python" and cmds["b"][1] == {"OMP_NUM_THREADS": "1"}
    assert cmds["a"][0][cmds["a"][0].index("--train-size") + 1] == "64"
    assert ipex.variant("stock_cl_fused") == ipex.Variant(channels_last=True, fused=True)
    assert ipex.round_value({"value": 0.5, "metrics": {"loss": 1.0}}) == (0.5, {"loss": 1.0})


def test_ipex_python_and_environment(monkeypatch, tmp_path):
    monkeypatch.setenv(ipex.IPEX_PYTHON_ENV, str(tmp_path / "missing"))
    assert ipex.ipex_python() is None
    env = ipex.environment()
    assert env["python"] is None and not env["ok"] and ipex.SETUP_COMMAND in env["message"]
    monkeypatch.setenv(ipex.IPEX_PYTHON_ENV, sys.executable)
    assert ipex.ipex_python() == sys.executable
    here = ipex.environment()  # this environment: torch, no IPEX (or IPEX's own, when run there)
    assert here["python"] == sys.executable and here["torch"]
    assert here["ok"] == bool(here["ipex"]) and (here["ok"] or ipex.SETUP_COMMAND in here["message"])


def _fake_python(tmp_path, helpers_at):
    """A stand-in for the IPEX environment's Python: answers the probe with fixed package versions."""
    import json
    import sys

    answer = {"python": "3.11.7", "torch": "2.8.0+cpu", "torchvision": "0.23.0+cpu", "ipex": "2.8.0+cpu",
              "helpers": "0.1.0", "helpers_at": helpers_at}
    script = tmp_path / "python"
    script.write_text(f"#!{sys.executable}\nprint({json.dumps(json.dumps(answer))})\n")
    script.chmod(0o755)
    return str(script)


def test_environment_needs_this_clones_course_package(tmp_path):
    here = str(ipex.Path(ipex.__file__).resolve().parent / "__init__.py")
    assert ipex.environment(_fake_python(tmp_path, here))["ok"] is True
    elsewhere = ipex.environment(_fake_python(tmp_path, "/elsewhere/helpers/__init__.py"))
    assert elsewhere["ok"] is False and "not this clone's" in elsewhere["message"] and "make setup-ipex" in elsewhere["message"]
    gone = ipex.environment(_fake_python(tmp_path, None))
    assert gone["ok"] is False and "not importable" in gone["message"]
