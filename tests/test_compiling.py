import pytest
import torch
from torch import nn

from helpers import compiling


def tiny():
    return nn.Sequential(nn.Flatten(), nn.Linear(16, 8), nn.ReLU(), nn.Linear(8, 3))


X, Y = torch.randn(4, 1, 4, 4), torch.tensor([0, 1, 2, 0])


def test_list_backends_has_inductor():
    assert "inductor" in compiling.list_backends()


def test_eager_and_dynamo_only_backend_are_timed():
    eager = compiling.time_training_steps(tiny, X, Y, backend=None, steps=3, warmup=1)
    dyn = compiling.time_training_steps(tiny, X, Y, backend="eager", steps=3, warmup=1)  # Dynamo capture, no codegen
    assert eager.ok and dyn.ok and eager.backend == "eager"
    assert eager.steady.n == 3 and dyn.first_step_s > 0
    table = compiling.outcomes_table([eager, dyn])
    assert table.as_dicts()[0]["speed-up"] == pytest.approx(1.0)


def test_failing_backend_becomes_a_row():
    bad = compiling.time_training_steps(tiny, X, Y, backend="no_such_backend", steps=1, warmup=0)
    assert not bad.ok and bad.error
    row = compiling.outcomes_table([bad]).as_dicts()[0]
    assert row["status"] == bad.error and row["steady step ms"] is None
    with pytest.raises(ValueError, match="reduce-overhead"):
        compiling.time_training_steps(tiny, X, Y, mode="fastest")


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


def test_cudagraphs_on_cpu_is_noted_not_printed(capfd):
    out = compiling.time_training_steps(tiny, X, Y, backend="cudagraphs", steps=1, warmup=0)
    assert out.ok and "cudagraphs not applied" in out.note and "cpu" in out.note
    assert "skipping cudagraphs" not in capfd.readouterr().err
    assert compiling.outcomes_table([out]).as_dicts()[0]["status"].startswith("ok; cudagraphs not applied")


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


def test_compiler_output_goes_to_the_outcome_log(capfd):
    import logging

    level = logging.getLogger("torch.utils.cpp_extension").level
    out = compiling.time_training_steps(tiny, X, Y, backend="eager", steps=1, warmup=0)
    assert out.ok and isinstance(out.log, str)
    assert logging.getLogger("torch.utils.cpp_extension").level == level  # restored after compiling
    noisy = compiling.time_training_steps(
        lambda: Noisy(), X, Y, backend=None, steps=1, warmup=0)
    assert "kernel timing table" in noisy.log and "kernel timing table" not in capfd.readouterr().err


class Noisy(nn.Module):
    """Writes to stderr in forward, as Inductor's max-autotune does while it benchmarks kernels."""

    def __init__(self):
        super().__init__()
        self.net = tiny()

    def forward(self, x):
        import sys

        sys.stderr.write("AUTOTUNE mm(4x16, 16x8): kernel timing table\n")
        return self.net(x)


def test_new_training_step_is_seeded_and_trains():
    a = compiling.new_training_step(tiny, X, Y, backend=None)
    b = compiling.new_training_step(tiny, X, Y, backend=None)
    losses_a, losses_b = [a() for _ in range(3)], [b() for _ in range(3)]
    assert all(torch.equal(p, q) for p, q in zip(losses_a, losses_b))  # same seed, same steps
    assert losses_a[2] < losses_a[0]  # the optimizer step is taken
    other = compiling.new_training_step(tiny, X, Y, backend=None, seed=1)
    assert not torch.equal(other(), losses_a[0])
    dyn = compiling.new_training_step(tiny, X, Y, backend="eager")  # Dynamo capture, no code generation
    assert torch.allclose(torch.stack([dyn() for _ in range(3)]), torch.stack(losses_a))
    torch._dynamo.reset()
    with pytest.raises(ValueError, match="max-autotune"):
        compiling.new_training_step(tiny, X, Y, mode="fast")


def test_payback_steps_counts_the_recompile_when_the_run_falls_behind_again():
    assert compiling.payback_steps(10.0, 0.01) == pytest.approx(1000)
    assert compiling.payback_steps(10.0, 0.0) is None and compiling.payback_steps(10.0, -0.01) is None
    # caught up at step 1000, behind again at the recompile (step 938 < 1000): pays back after both costs
    assert compiling.payback_steps(10.0, 0.01, recompile_s=5.0, recompile_at=938) == pytest.approx(1500)
    # caught up at step 100, still ahead after paying the recompile at step 938: the first crossing holds
    assert compiling.payback_steps(1.0, 0.01, recompile_s=5.0, recompile_at=938) == pytest.approx(100)
    # caught up at 100, but the recompile (9 s) costs more than the 8.38 s gained by step 938
    assert compiling.payback_steps(1.0, 0.01, recompile_s=9.0, recompile_at=938) == pytest.approx(1000)
    with pytest.raises(ValueError):
        compiling.payback_steps(-1.0, 0.01)


def test_significant_rounds_to_two_digits():
    assert compiling.significant(1923.4) == 1900.0
    assert compiling.significant(1186) == 1200.0
    assert compiling.significant(0.04567, 3) == pytest.approx(0.0457)
    assert compiling.significant(0.0) == 0.0 and compiling.significant(-1550) == -1600.0
    with pytest.raises(ValueError):
        compiling.significant(5.0, 0)


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
    with pytest.raises(ValueError):
        compiling.self_ms_per_step(prof, 0)


def test_copies_by_caller_names_who_asked_for_the_copy():
    t = torch.randn(8, 16, 32, 32)
    with torch.profiler.profile() as prof:
        for _ in range(2):
            with torch.profiler.record_function("layout_change"):
                t.to(memory_format=torch.channels_last)
            t.clone()
    copies = compiling.copies_by_caller(prof, 2)
    assert set(copies) == {"layout_change", "(top level)"}
    assert all(ms > 0 for ms in copies.values())
    with pytest.raises(ValueError):
        compiling.copies_by_caller(prof, 0)
