"""helpers.doctor.checks: each check judges made-up facts -- every status, the fix it names -- and
``judge`` runs them all."""

import math

import pytest

from helpers import parity
from helpers.doctor import checks as doctor


def statuses(check):
    return check.status, check.message, check.fix


def test_python_each_status():
    ok = doctor.check_python((3, 13, 0), ">=3.11,<3.14", executable="/c/venv-py3.13-x/bin/python")
    assert statuses(ok) == ("ok", "Python 3.13.0 (/c/venv-py3.13-x/bin/python), supported (the course supports "
                                  "3.11, 3.12 or 3.13)", "")
    assert doctor.check_python((3, 11, 7), ">=3.11,<3.14").status == "ok"
    warn = doctor.check_python((3, 14, 0), ">=3.11,<3.14", executable="/usr/bin/python3")
    assert statuses(warn) == ("warn", "Python 3.14.0 (/usr/bin/python3) is not supported: the course's pins install "
                                      "on Python 3.11, 3.12 or 3.13 (requires-python >=3.11,<3.14)",
                              "install Python 3.11, 3.12 or 3.13 (the README's Prerequisites: on Ubuntu 24.04 and "
                              "Debian 12/13 the system python3) and run `make setup`")
    other_env = doctor.check_python((3, 12, 3), ">=3.11,<3.14", "/usr", course_env=False)
    assert other_env.status == "warn" and "Python 3.12.3, supported (not the course environment: /usr)" == other_env.message
    fail = doctor.check_python((3, 8, 10), ">=3.11,<3.14")
    assert fail.status == "fail" and "too old" in fail.message and "3.11, 3.12 or 3.13" in fail.fix


def test_supported_minors_follow_requires_python():
    checks = doctor
    assert checks.supported_minors(">=3.11,<3.14") == ["3.11", "3.12", "3.13"]
    assert checks.supported_minors(">=3.11,<3.12") == ["3.11"] and checks.supported_minors(None) == []
    assert checks.supported_minors(">=3.12")[:2] == ["3.12", "3.13"]


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


LINUX = {"system": "Linux", "machine": "x86_64", "left_out": [], "ipex_wheels": True}
PINS = {"torch": "2.8.0", "intel-extension-for-pytorch": "2.8.0"}


def ipex(env, plat=LINUX, pins=PINS):
    from helpers.ipex_support import RETIREMENT_NOTE, SETUP_COMMAND

    return doctor.check_ipex(env, plat, RETIREMENT_NOTE, SETUP_COMMAND, pins)


def test_ipex_environment_absent_present_mismatched_always_retired(fake_platforms):
    absent = ipex({"python": None, "ok": False, "message": "not installed"})
    assert absent.status == "warn" and "make setup-ipex" in absent.fix and "skips its IPEX arms" in absent.message
    ready = ipex({"python": "/c/venv-ipex/bin/python", "ok": True, "torch": "2.8.0", "ipex": "2.8.0"})
    assert ready.status == "ok" and "torch 2.8.0 + IPEX 2.8.0" in ready.message and ready.fix == ""
    broken = ipex({"python": "/c/venv-ipex/bin/python", "ok": False, "torch": "2.14.1", "ipex": "2.8.0",
                   "message": "the IPEX environment at /c is incomplete (torch 2.14.1, IPEX 2.8.0, "
                              "course package None)"})
    assert broken.status == "warn" and "torch 2.14.1" in broken.message and "make setup-ipex" in broken.fix
    drift = ipex({"python": "/c/venv-ipex/bin/python", "ok": True, "torch": "2.8.1+cpu", "ipex": "2.8.1"})
    assert drift.status == "warn" and "torch 2.8.1+cpu (pinned 2.8.0)" in drift.message
    assert "make setup-ipex" in drift.fix
    assert ipex({"python": "/p", "ok": True, "torch": "2.8.0+cpu", "ipex": "2.8.0"}).status == "ok"  # local tag
    elsewhere = [ipex({"python": None, "ok": False}, plat) for plat in fake_platforms.values()]
    for label, c in zip(fake_platforms, elsewhere):
        assert c.status == "warn" and f"no IPEX wheel for {label}" in c.message and "Linux x86-64" in c.fix
        assert "setup-ipex" not in c.message + c.fix  # the command cannot work there: not suggested
    for c in [absent, ready, broken, drift] + elsewhere:
        assert "is retired" in c.message and "2.8 is its last release" in c.message and c.status != "fail"


def test_every_line_is_one_line(fake_platforms, fake_facts):
    for plat in [LINUX, *fake_platforms.values()]:
        facts = fake_facts(platform=plat, accelerators=["mps"] if plat["system"] == "Darwin" else [])
        for c in doctor.judge(facts):
            assert "\n" not in c.message + c.fix, c.name


def test_isa_on_arm_does_not_ask_for_avx2():
    arm = doctor.check_isa({"avx2": False}, "aarch64")
    assert arm.status == "ok" and "x86 instruction sets" in arm.message and "slow" not in arm.message
    assert doctor.check_isa({"avx2": False}, "x86_64").status == "warn"
    windows = doctor.check_isa({"avx2": False}, "AMD64", "Windows")  # no /proc/cpuinfo: unknown, not absent
    assert windows.status == "ok" and "not read on Windows" in windows.message


def test_pruning_allocators_mpirun_kernel():
    assert doctor.check_pruning({"nni": None, "torch_pruning": None}, {"nni": "3.0", "torch-pruning": "1.6.1"}).status == "ok"
    bad = doctor.check_pruning({"nni": "ImportError: x", "torch_pruning": None}, {})
    assert bad.status == "warn" and "nni does not import" in bad.message
    assert doctor.check_pruning({}, {"nni": "not installed", "torch-pruning": "1.6.1"}, tried=False).status == "warn"
    # NNI not pinned on this platform: Torch-Pruning alone is enough
    arm = doctor.check_pruning({"torch_pruning": None}, {"nni": "not installed", "torch-pruning": "1.6.1"},
                               left_out=["nni"])
    assert arm.status == "ok" and "NNI is not pinned on this platform" in arm.message
    untried = doctor.check_pruning({}, {"nni": "not installed", "torch-pruning": "1.6.1"}, tried=False,
                                   left_out=["nni"])
    assert untried.status == "ok" and "Torch-Pruning 1.6.1 is installed (import not tried)" in untried.message
    no_tp = doctor.check_pruning({"torch_pruning": "ModuleNotFoundError: x"}, {}, left_out=["nni"])
    assert no_tp.status == "warn" and "Torch-Pruning" in no_tp.fix
    assert doctor.check_allocators({"jemalloc": "/lib/libjemalloc.so.2", "tcmalloc": None}).message.startswith("found jemalloc")
    none = doctor.check_allocators({"jemalloc": None, "tcmalloc": None})
    apt = "Debian/Ubuntu: `sudo apt-get install openmpi-bin libjemalloc2 libtcmalloc-minimal4`"
    assert none.status == "warn" and none.fix == apt
    assert doctor.check_allocators({"jemalloc": None, "tcmalloc": None}, "Darwin").status == "ok"
    missing = doctor.check_mpirun(None, None)
    assert missing.status == "warn" and missing.fix == apt
    assert "brew install open-mpi" in doctor.check_mpirun(None, None, "Darwin").fix
    assert doctor.check_mpirun(None, None, "Windows").fix == f"use WSL2 (Ubuntu) and, there, {apt[len('Debian/Ubuntu: '):]}"
    assert "Open MPI" in doctor.check_mpirun("/usr/bin/mpirun", "mpirun (Open MPI) 4.1.4").message
    mpich = doctor.check_mpirun("/usr/bin/mpirun", "HYDRA build details:")
    assert mpich.status == "warn" and "not Open MPI" in mpich.message and "OMPI_COMM_WORLD" in mpich.message
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
    for expected in ("python", "pins", "torch build", "device cpu", "cpu", "instruction sets", "openmp",
                     "c++ compiler", "platform", "ipex", "nni + torch-pruning", "allocators", "mpirun",
                     "jupyter kernel", "datasets", "memory", "disk", "parity"):
        assert expected in names
    assert not any(n.startswith("limit") for n in names)  # the fake machine is Linux x86-64
    low = doctor.judge(fake_facts(memory={"available": 2**28, "total": 2**30}))
    assert any(c.status == "fail" for c in low)
    no_cxx = doctor.judge(fake_facts(compiler={**fake_facts()["compiler"], "cxx": None}))
    assert [c.status for c in no_cxx if c.name == "c++ compiler"] == ["fail"]
    # torch broken: only the first checks, and a failure
    broken = doctor.judge({"python": fake_facts()["python"], "pins": [], "torch": {"error": "ImportError: x"}})
    assert [c.name for c in broken] == ["python", "pins", "torch build"] and broken[-1].status == "fail"


def test_judge_on_a_fake_aarch64_and_a_fake_mac(fake_facts, fake_platforms):
    arm = {c.name: c for c in doctor.judge(fake_facts(platform=fake_platforms["Linux aarch64"],
                                                       isa={"avx2": False}, imports={"torch_pruning": None}))}
    assert {"limit openvino", "limit nni", "limit intel-openmp"} <= set(arm)
    assert arm["instruction sets"].status == "ok" and arm["nni + torch-pruning"].status == "ok"
    assert "no IPEX wheel for Linux aarch64" in arm["ipex"].message
    mac = {c.name: c for c in doctor.judge(fake_facts(platform=fake_platforms["macOS arm64"], accelerators=["mps"],
                                                       parity=["RuntimeError: x"], compiler={"cxx": None},
                                                       isa={}))}
    assert {"limit LD_PRELOAD", "limit torchrun", "limit mps"} <= set(mac) and "limit openvino" not in mac
    assert mac["c++ compiler"].status == "fail" and "xcode-select --install" in mac["c++ compiler"].fix
    assert mac["allocators"].status == "ok" and "brew install open-mpi" in mac["mpirun"].fix
