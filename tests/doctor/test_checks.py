"""helpers.doctor.checks: each check judges made-up facts -- every status, the fix it names -- and
``judge`` runs them all."""

import math

import pytest

from helpers import parity
from helpers.doctor import checks as doctor


def statuses(check):
    return check.status, check.message, check.fix


def test_check_rejects_unknown_status():
    with pytest.raises(ValueError, match="ok"):
        doctor.Check("x", "maybe", "m")


def test_python_each_status():
    assert doctor.check_python((3, 11, 7), ">=3.11,<3.12").status == "ok"
    warn = doctor.check_python((3, 12, 1), ">=3.11,<3.12")
    assert warn.status == "warn" and "3.12.1" in warn.message and "3.11" in warn.fix
    assert doctor.check_python((3, 11, 7), ">=3.11", "/usr", course_env=False).status == "warn"
    fail = doctor.check_python((3, 8, 10), ">=3.11")
    assert fail.status == "fail" and "too old" in fail.message


def test_pins_each_status():
    good = [{"name": "torch", "spec": "==2.8.0", "installed": "2.8.0", "matches": True}]
    assert doctor.check_pins(good).status == "ok"
    other = good + [{"name": "nni", "spec": "==3.0", "installed": "2.10", "matches": False}]
    c = doctor.check_pins(other)
    assert c.status == "warn" and "nni 2.10 (pinned ==3.0)" in c.message
    gone = good + [{"name": "timm", "spec": "==1.0.31", "installed": None, "matches": False}]
    assert doctor.check_pins(gone).status == "warn" and "missing: timm" in doctor.check_pins(gone).message
    core = [{"name": "torch", "spec": "==2.8.0", "installed": None, "matches": False}]
    assert doctor.check_pins(core).status == "fail" and "make setup" in doctor.check_pins(core).fix
    assert doctor.check_pins([]).status == "warn"


def test_torch_build_and_devices():
    assert doctor.check_torch_build({"error": "ImportError: libcudart"}).status == "fail"
    c = doctor.check_torch_build({"version": "2.8.0", "cuda": "12.8", "xpu": False, "cuda_devices": 0})
    assert c.status == "ok" and "CUDA 12.8" in c.message and "no NVIDIA GPU visible" in c.message
    checks = doctor.check_devices([{"name": "cpu", "description": "cpu"},
                                   {"name": "cuda:0", "description": "cuda:0 (H100)", "memory_gb": 79.6},
                                   {"name": "xpu:0", "error": "driver too old"}])
    assert [c.status for c in checks] == ["ok", "ok", "warn"]
    assert "79.6 GB" in checks[1].message and "driver" in checks[2].fix


def test_cpu_isa_openmp():
    fp = {"cpu_model": "Xeon", "sockets": 2, "physical_cores": 56, "logical_cores": 112, "numa_nodes": 2}
    c = doctor.check_cpu(fp)
    assert c.status == "ok" and "2 socket(s), 56 physical / 112 logical cores, 2 NUMA node(s)" in c.message
    assert doctor.check_cpu({**fp, "physical_cores": 1}).status == "warn"
    amx = doctor.check_isa({"avx2": True, "avx512": True, "native_bf16": True, "amx": True, "ipex_bf16_prepack": True})
    assert amx.status == "ok" and "AMX" in amx.message and "lacks" not in amx.message
    avx2 = doctor.check_isa({"avx2": True})
    assert avx2.status == "ok" and "emulated" in avx2.message and "prepacking" in avx2.message
    assert doctor.check_isa({}).status == "warn"
    assert "Intel (libiomp5)" in doctor.check_openmp(["libgomp.so.1", "libiomp5.so"]).message
    assert doctor.check_openmp([]).status == "warn"


def test_ipex_always_names_its_retirement():
    note = "retired, archived, known security issues"
    matched = doctor.check_ipex({"installed": "2.8.0", "torch": "2.8.0", "compatible": True}, None, note)
    assert matched.status == "warn" and "imports" in matched.message and note in matched.message
    assert "not tried" in doctor.check_ipex({"installed": "2.8.0", "torch": "2.8.0", "compatible": True},
                                            None, note, tried=False).message
    broken = doctor.check_ipex({"installed": "2.8.0", "torch": "2.8.0", "compatible": True}, "OSError: lib", note)
    assert "fails to import: OSError" in broken.message
    mismatch = doctor.check_ipex({"installed": "2.8.0", "compatible": False, "message": "needs torch 2.8.*"}, None, note)
    assert mismatch.status == "warn" and "needs torch 2.8" in mismatch.message
    assert "not installed" in doctor.check_ipex({"installed": None}, None, note).message
    # never a failure: the course runs without IPEX
    assert all(c.status != "fail" for c in (matched, broken, mismatch))


def test_pruning_allocators_mpirun_kernel():
    assert doctor.check_pruning({"nni": None, "torch_pruning": None}, {"nni": "3.0", "torch-pruning": "1.6.1"}).status == "ok"
    bad = doctor.check_pruning({"nni": "ImportError: x", "torch_pruning": None}, {})
    assert bad.status == "warn" and "nni does not import" in bad.message
    assert doctor.check_pruning({}, {"nni": "not installed", "torch-pruning": "1.6.1"}, tried=False).status == "warn"
    assert doctor.check_allocators({"jemalloc": "/lib/libjemalloc.so.2", "tcmalloc": None}).message.startswith("found jemalloc")
    assert doctor.check_allocators({"jemalloc": None, "tcmalloc": None}).status == "warn"
    assert doctor.check_mpirun(None, None).status == "warn"
    assert "Open MPI" in doctor.check_mpirun("/usr/bin/mpirun", "mpirun (Open MPI) 4.1.4").message
    assert doctor.check_kernel({"same_env": True}).status == "ok"
    stray = doctor.check_kernel({"python": "/usr/bin/python3", "same_env": False})
    assert stray.status == "warn" and "kernelspec" in stray.fix
    assert doctor.check_kernel({"error": "no kernel named python3"}).status == "warn"


def test_datasets_memory_disk():
    assert doctor.check_datasets("real", {"cifar10": True, "fashionmnist": True}, None).status == "ok"
    assert doctor.check_datasets("standin", {"cifar10": False}, False).status == "ok"
    assert "download on first use" in doctor.check_datasets("real", {"cifar10": False}, True).message
    off = doctor.check_datasets("real", {"cifar10": False, "fashionmnist": True}, False)
    assert off.status == "warn" and "COURSE_DATA=standin" in off.fix and "cifar10" in off.message
    gb = 2**30
    assert [doctor.check_memory(a * gb, 16 * gb).status for a in (8, 2, 0.5)] == ["ok", "warn", "fail"]
    assert [doctor.check_disk({"results": a * gb}).status for a in (50, 2, 0.1)] == ["ok", "warn", "fail"]


def test_parity_checks():
    assert doctor.check_parity([], [])[0].status == "ok"
    good = parity.ParityResult("cuda:0", 1e-4, [2.3, 2.2], [2.3, 2.2], True, 1e-2)
    bad = parity.ParityResult("xpu:0", math.inf, [2.3, 2.2], [2.3, float("nan")], False, 1e-2)
    checks = doctor.check_parity([good, bad, "RuntimeError: no kernel image"], ["cuda:0", "xpu:0", "xpu:1"])
    assert [c.status for c in checks] == ["ok", "fail", "fail"]
    assert "DISAGREES" in checks[1].message and "--device cpu" in checks[1].fix
    assert "no kernel image" in checks[2].message


def test_judge_runs_every_check_on_faked_findings(fake_facts):
    checks = doctor.judge(fake_facts())
    names = [c.name for c in checks]
    for expected in ("python", "pins", "torch build", "device cpu", "cpu", "instruction sets", "openmp", "ipex",
                     "nni + torch-pruning", "allocators", "mpirun", "jupyter kernel", "datasets", "memory", "disk",
                     "parity"):
        assert expected in names
    low = doctor.judge(fake_facts(memory={"available": 2**28, "total": 2**30}))
    assert any(c.status == "fail" for c in low)
    # torch broken: only the first checks, and a failure
    broken = doctor.judge({"python": fake_facts()["python"], "pins": [], "torch": {"error": "ImportError: x"}})
    assert [c.name for c in broken] == ["python", "pins", "torch build"] and broken[-1].status == "fail"
