import contextlib

import pytest
import torch
from torch import nn

from helpers import compiling


def tiny():
    return nn.Sequential(nn.Flatten(), nn.Linear(16, 8), nn.ReLU(), nn.Linear(8, 3))


X, Y = torch.randn(4, 1, 4, 4), torch.tensor([0, 1, 2, 0])


def test_graph_breaks_are_counted():
    def broken(x):
        y = x * 2
        print("side effect")  # Dynamo cannot trace print: the graph breaks here
        return y + 1

    info = compiling.graph_breaks(broken, torch.ones(3))
    assert info["breaks"] == 1 and info["graphs"] == 2 and len(info["reasons"]) == 1
    assert info["ops_per_graph"] == [1, 1]  # x * 2 before the print, y + 1 after it
    clean = compiling.graph_breaks(lambda x: torch.relu(x) * 2, torch.ones(3))
    assert clean["breaks"] == 0 and clean["graphs"] == 1


_IMPORT_PROBE = r"""
import json, logging, os
import matplotlib, torch
env = dict(os.environ)
levels = lambda: {name: getattr(lg, "level", 0) for name, lg in logging.root.manager.loggerDict.items()}
before_levels, backend = levels(), dict.__getitem__(matplotlib.rcParams, "backend")
import helpers.compiling, helpers.plots, helpers.profiling
after_levels = levels()
print(json.dumps({
    "env": sorted(set(os.environ.items()) ^ set(env.items())),
    "levels": sorted(k for k in after_levels if after_levels[k] != before_levels.get(k, 0)),
    "backend_changed": dict.__getitem__(matplotlib.rcParams, "backend") is not backend,
}))
"""


def test_importing_plots_profiling_compiling_changes_no_global_state():
    import json
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k not in ("MPLBACKEND", "KINETO_LOG_LEVEL")}
    proc = subprocess.run([sys.executable, "-c", _IMPORT_PROBE], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    changes = json.loads(proc.stdout.strip().splitlines()[-1])
    assert changes == {"env": [], "levels": [], "backend_changed": False}


def test_cold_compile_gives_an_empty_cache_and_restores_the_environment(monkeypatch):
    import os

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "/somewhere/kept")
    monkeypatch.delenv("TRITON_CACHE_DIR", raising=False)
    with compiling.cold_compile() as cache:
        assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == cache and os.listdir(cache) == []
        assert os.environ["TRITON_CACHE_DIR"].startswith(cache)
        step = compiling.new_training_step(tiny, X, Y, backend="eager")  # Dynamo capture, no code generation
        step()
    assert not os.path.exists(cache)
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == "/somewhere/kept" and "TRITON_CACHE_DIR" not in os.environ


def test_first_steps_child_times_five_steps():
    # the child's body in this process (eager: nothing to compile, so it stays fast)
    times = compiling._first_steps_main(["eager", "cpu", "4", "2"])
    assert len(times) == 5 and all(t > 0 for t in times)


def test_first_steps_reports_a_failing_child(monkeypatch):
    import subprocess

    monkeypatch.setattr(subprocess, "run", lambda argv, **kw: subprocess.CompletedProcess(argv, 1, "", "boom"))
    with pytest.raises(RuntimeError, match="boom"):
        compiling.first_steps("default")
    ok = subprocess.CompletedProcess([], 0, "noise\n9 1 2 3 1\n", "")
    monkeypatch.setattr(subprocess, "run", lambda argv, **kw: ok if argv[2:4] == ["helpers.compiling", "first-steps"] else None)
    assert compiling.first_steps("default") == dict(zip(compiling.FIRST_STEPS, (9.0, 1.0, 2.0, 3.0, 1.0, 8.0, 0.0)))


def test_new_training_step_is_seeded_and_trains():
    a = compiling.new_training_step(tiny, X, Y, backend=None)
    b = compiling.new_training_step(tiny, X, Y, backend=None)
    losses_a, losses_b = [a() for _ in range(3)], [b() for _ in range(3)]
    assert all(torch.equal(p, q) for p, q in zip(losses_a, losses_b))  # same seed, same steps
    assert losses_a[2] < losses_a[0]  # the optimizer step is taken
    dyn = compiling.new_training_step(tiny, X, Y, backend="eager")  # Dynamo capture, no code generation
    assert torch.allclose(torch.stack([dyn() for _ in range(3)]), torch.stack(losses_a))
    torch._dynamo.reset()


def test_generated_code_compares_kernels_and_library_calls(tmp_path):
    def fill(root, kernel, call):
        (root / "ab").mkdir(parents=True)
        (root / "ab" / "cabc.main.cpp").write_text(kernel)
        (root / "ab" / "cwrap.py").write_text(f"# AOT ID: ['0_forward']\n# {call}(not a call)\n"
                                               f"    {call}(buf0, buf1, out=buf2)\n    torch.ops.aten.convolution_backward.default(x)\n")

    fill(tmp_path / "a", "void k(){}", "extern_kernels.addmm")
    fill(tmp_path / "b", "void k(){}", "extern_kernels.addmm")
    fill(tmp_path / "c", "void k(){ /* other */ }", "extern_kernels.mm")
    a, b, c = (compiling.generated_code(tmp_path / n) for n in "abc")
    assert a and a.same_as(b) and not a.same_as(c)
    assert a.library_calls == {"extern_kernels.addmm": 1, "torch.ops.aten.convolution_backward": 1}
    assert len(a.kernels) == 1 and a.kernels != c.kernels
    assert not compiling.generated_code(tmp_path / "missing")


def test_self_ms_per_step_divides_the_profile_by_the_steps():
    model = tiny()
    with torch.profiler.profile() as prof:
        for _ in range(2):
            model(X).sum().backward()
    per_step = compiling.self_ms_per_step(prof, 2)
    total_ms = sum(e.self_cpu_time_total for e in prof.key_averages()) / 1000.0
    addmm = next(e for e in prof.key_averages() if e.key == "aten::addmm")
    assert per_step["aten::addmm"] == pytest.approx(addmm.self_cpu_time_total / 1000.0 / 2)
    assert sum(per_step.values()) == pytest.approx(total_ms / 2)


def test_timed_counts_calls():
    calls = []
    assert compiling.timed(lambda: calls.append(1), 3) >= 0 and len(calls) == 3


def test_round_arm_times_first_step_apart_and_builds_afresh(monkeypatch):
    built = []

    def new_step():
        built.append(1)
        return lambda: None

    run = compiling.round_arm(new_step, steps=4, cold=False)
    value, metrics = run()
    run()
    assert len(built) == 2 and value >= 0 and set(metrics) == {"first step s"}
    entered = []

    @contextlib.contextmanager
    def fake_cold():
        entered.append(1)
        yield "cache"

    monkeypatch.setattr(compiling, "cold_compile", fake_cold)
    compiling.round_arm(new_step, steps=1)()
    assert entered == [1]


def test_recompile_reasons_reads_the_first_failed_guard():
    log = ("V1 [0/1] [__recompiles] Recompiling function forward in model.py:10\n"
           "V1 [0/1] [__recompiles]     triggered by the following guard failure(s):\n"
           "V1 [0/1] [__recompiles]     - 0/0: tensor 'x' size mismatch at index 0. expected 64, actual 32  # x.size()[0]\n"
           "V1 [0/2] [__recompiles]     triggered by the following guard failure(s):\n"
           "V1 [0/2] [__recompiles]     - 0/1: 16 <= x.size()[0]  # mkldnn\n")
    assert compiling.recompile_reasons(log) == ["tensor 'x' size mismatch at index 0. expected 64, actual 32",
                                                "16 <= x.size()[0]"]
    assert compiling.recompile_reasons("") == []


def test_try_backends_skips_runs_and_reports_failures():
    def one_step(name):
        if name == "broken":
            raise ImportError("Please install the broken backend\nmore text")
        compiling.new_training_step(tiny, X, Y, backend=name)()

    table, working = compiling.try_backends(["inductor", "eager", "broken"], one_step,
                                            skip={"inductor": "measured above"}, title="t")
    rows = {r["backend"]: r["status"] for r in table.as_dicts()}
    assert working == ["eager"]
    assert rows == {"inductor": "measured above", "eager": "works: measured below",
                    "broken": "ImportError: Please install the broken backend"}


def test_payback_text_only_for_a_faster_verdict():
    from types import SimpleNamespace as V

    assert compiling.payback_text(V(won=False, ratio=0.8), 0.1, 20.0, 9.0, 938) is None
    # 1.25x faster at 0.1 s: 0.02 s saved a step; 20 s of compile -> 1,000 steps, past the recompile at 938 -> 1,500
    assert compiling.payback_text(V(won=True, ratio=1.25), 0.1, 20.0, 10.0, 938) == "after about 1,500 steps (1.6 epochs)"
    # two significant digits: 1.25x at 0.1 s with 23.73 s of compile and no recompile -> 1,186.5 steps -> 1,200
    text = compiling.payback_text(V(won=True, ratio=1.25), 0.1, 23.73, 0.0, 938)
    assert text == "after about 1,200 steps (1.3 epochs)"
    # 0.02 s saved a step: caught up at step 50, still ahead after paying a 5 s recompile at step 938
    assert compiling.payback_text(V(won=True, ratio=1.25), 0.1, 1.0, 5.0, 938) == "after about 50 steps (0.053 epochs)"
    # caught up at 50, but the recompile (18 s) costs more than the 17.76 s gained by step 938: both costs count
    assert compiling.payback_text(V(won=True, ratio=1.25), 0.1, 1.0, 18.0, 938) == "after about 950 steps (1 epochs)"
    assert compiling.payback_text(V(won=True, ratio=1.0), 0.1, 1.0, 0.0, 938) is None  # nothing saved a step
