"""helpers.course.doctor: each check judged from made-up facts (a fake Linux aarch64, macOS and Windows
included), what ``gather`` collects on this machine, the report's shape and the command."""

import json
import math
import os
import sysconfig

import pytest

from helpers import arc_workloads as parity
from helpers.course import doctor, install


def test_run_writes_the_documented_report_and_prints_every_check(tmp_path, fake_facts, monkeypatch):
    monkeypatch.setattr("helpers.course.doctor.gather", lambda imports: fake_facts())
    found, payload, path = doctor.run(tmp_path / "doctor.json")
    saved = json.loads(path.read_text())
    assert set(saved) >= {"version", "fingerprint", "checks"} and saved["version"] == doctor.DOCTOR_VERSION
    assert saved["fingerprint"]["cpu_model"] == "Fake CPU" and len(saved["fingerprint"]["machine_id"]) == 16
    assert all(set(c) == {"name", "status", "message", "fix"} and c["status"] in doctor.STATUSES
               for c in saved["checks"])
    text = doctor.format_checks(found)
    assert "[WARN] mpirun" in text and "fix: Debian" in text and text.splitlines()[-1] == f"{len(found) - 3} ok, 3 warning(s), 0 failure(s)"


def test_real_doctor_run(tmp_path, capsys):
    code = doctor.main(["--out", str(tmp_path / "doctor.json"), "--no-imports"])
    out = capsys.readouterr().out
    saved = json.loads((tmp_path / "doctor.json").read_text())
    assert code == 0 and not any(c["status"] == "fail" for c in saved["checks"])  # this machine can run the course
    for name in ("python", "pins", "torch build", "cpu", "instruction sets", "c++ compiler", "platform",
                 "ipex", "memory", "disk"):
        assert any(c["name"] == name for c in saved["checks"]), name
        assert f"] {name}" in out
    from helpers import system

    assert saved["fingerprint"]["physical_cores"] == system.topology().physical_cores and "wrote" in out


def test_ok_has_nothing_to_fix():
    c = doctor._ok("python", "3.11.7")
    assert (c.name, c.status, c.message, c.fix) == ("python", "ok", "3.11.7", "")


SUPPORTED = ["3.11", "3.12", "3.13"]


def statuses(check):
    return check.status, check.message, check.fix


def test_python_each_status():
    ok = doctor.check_python((3, 13, 0), SUPPORTED, executable="/c/venv-py3.13-x/bin/python")
    assert statuses(ok) == ("ok", "Python 3.13.0 (/c/venv-py3.13-x/bin/python), supported (the course supports "
                                  "3.11, 3.12 or 3.13)", "")
    assert doctor.check_python((3, 11, 7), SUPPORTED).status == "ok"
    warn = doctor.check_python((3, 14, 0), SUPPORTED, executable="/usr/bin/python3")
    assert statuses(warn) == ("warn", "Python 3.14.0 (/usr/bin/python3) is not supported: the course's pins install "
                                      "on Python 3.11, 3.12 or 3.13",
                              "install Python 3.11, 3.12 or 3.13 (the README's Prerequisites: on Ubuntu 24.04 and "
                              "Debian 12/13 the system python3) and run `make setup`")
    other_env = doctor.check_python((3, 12, 3), SUPPORTED, "/usr", course_env=False)
    assert other_env.status == "warn" and "Python 3.12.3, supported (not the course environment: /usr)" == other_env.message
    fail = doctor.check_python((3, 8, 10), SUPPORTED)
    assert fail.status == "fail" and "too old" in fail.message and "3.11, 3.12 or 3.13" in fail.fix
    assert "install Python 3.12 (" in doctor.check_python((3, 11, 7), ["3.12"]).fix


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


def test_torch_build():
    assert doctor.check_torch_build({"error": "ImportError: libcudart"}).status == "fail"
    c = doctor.check_torch_build({"version": "2.8.0", "cuda": "12.8", "xpu": False})
    assert c.status == "ok" and c.message.startswith("torch 2.8.0, CUDA 12.8, no XPU build")


def test_cpu_and_isa():
    fp = {"cpu_model": "Xeon", "sockets": 2, "physical_cores": 56, "logical_cores": 112, "numa_nodes": 2,
          "openmp": ["libgomp.so.1", "libiomp5.so"]}
    c = doctor.check_cpu(fp)
    assert c.status == "ok" and "2 socket(s), 56 physical / 112 logical cores, 2 NUMA node(s)" in c.message
    assert c.message.endswith("OpenMP: libgomp.so.1, libiomp5.so")
    assert doctor.check_cpu({**fp, "openmp": []}).message.endswith("OpenMP: none found")
    assert doctor.check_cpu({**fp, "physical_cores": 1}).status == "warn"
    amx = doctor.check_isa({"avx2": True, "avx512": True, "native_bf16": True, "amx": True, "ipex_bf16_prepack": True})
    assert amx.status == "ok" and "AMX" in amx.message and "lacks" not in amx.message
    avx2 = doctor.check_isa({"avx2": True})
    assert avx2.status == "ok" and "emulated" in avx2.message
    assert doctor.check_isa({}).status == "warn"


LINUX = {"system": "Linux", "machine": "x86_64", "left_out": [], "ipex_wheels": True}


def ipex(env, plat=LINUX):
    return doctor.check_ipex(env, plat)


def test_ipex_environment_absent_present_broken_always_retired(fake_platforms):
    absent = ipex({"python": None, "ok": False, "message": "the IPEX environment is not installed"})
    assert absent.status == "warn" and "make setup-ipex" in absent.fix and "skips its IPEX arms" in absent.message
    ready = ipex({"python": "/c/venv-ipex/bin/python", "ok": True, "torch": "2.8.0", "ipex": "2.8.0"})
    assert ready.status == "ok" and "torch 2.8.0 + IPEX 2.8.0" in ready.message and ready.fix == ""
    broken = ipex({"python": "/c/venv-ipex/bin/python", "ok": False, "torch": "2.14.1", "ipex": "2.8.0",
                   "message": "the IPEX environment at /c is incomplete (torch 2.14.1, IPEX 2.8.0, "
                              "course package None)"})
    assert broken.status == "warn" and "torch 2.14.1" in broken.message and "make setup-ipex" in broken.fix
    elsewhere = [ipex({"python": None, "ok": False}, plat) for plat in fake_platforms.values()]
    for label, c in zip(fake_platforms, elsewhere):
        assert c.status == "warn" and f"no IPEX wheel for {label}" in c.message and "Linux x86-64" in c.fix
        assert "setup-ipex" not in c.message + c.fix  # the command cannot work there: not suggested
    for c in [absent, ready, broken] + elsewhere:
        assert "is retired" in c.message and "2.8 is its last release" in c.message and c.status != "fail"


def test_every_line_is_one_line(fake_platforms, fake_facts):
    for plat in [LINUX, *fake_platforms.values()]:
        facts = fake_facts(platform=plat, devices=[{"name": "mps", "error": "x"}] if plat["system"] == "Darwin" else [])
        for c in doctor.judge(facts):
            assert "\n" not in c.message + c.fix, c.name


def test_isa_on_arm_does_not_ask_for_avx2():
    arm = doctor.check_isa({"avx2": False}, "aarch64")
    assert arm.status == "ok" and "x86 instruction sets" in arm.message and "slow" not in arm.message
    assert doctor.check_isa({"avx2": False}, "x86_64").status == "warn"
    windows = doctor.check_isa({"avx2": False}, "AMD64", "Windows")  # no /proc/cpuinfo: unknown, not absent
    assert windows.status == "ok" and "not read on Windows" in windows.message


def test_pruning_allocators_mpirun_kernel():
    both = doctor.check_pruning({"nni": None, "torch_pruning": None}, {"nni": "3.0", "torch-pruning": "1.6.1"})
    assert statuses(both) == ("ok", "nni 3.0 and torch-pruning 1.6.1 import", "")
    bad = doctor.check_pruning({"nni": "ImportError: x", "torch_pruning": None}, {})
    assert bad.status == "warn" and "nni does not import: ImportError: x" == bad.message and "both" in bad.fix
    # NNI not pinned on this platform (a limit says so): Torch-Pruning alone is enough
    untried = doctor.check_pruning(None, {"nni": "not installed", "torch-pruning": "1.6.1"}, left_out=["nni"])
    assert statuses(untried) == ("ok", "torch-pruning 1.6.1 (import not tried)", "")
    no_tp = doctor.check_pruning({"torch_pruning": "ModuleNotFoundError: x"}, {}, left_out=["nni"])
    assert no_tp.status == "warn" and "Torch-Pruning" in no_tp.fix
    assert doctor.check_allocators({"jemalloc": "/lib/libjemalloc.so.2", "tcmalloc": None}).message.startswith("found jemalloc")
    none = doctor.check_allocators({"jemalloc": None, "tcmalloc": None})
    apt = "Debian/Ubuntu: `sudo apt-get install openmpi-bin libjemalloc2 libtcmalloc-minimal4`"
    assert none.status == "warn" and none.fix == apt
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


def test_memory_disk():
    gb = 2**30
    assert [doctor.check_memory(a * gb, 16 * gb).status for a in (8, 2, 0.5)] == ["ok", "warn", "fail"]
    assert [doctor.check_disk({"results": a * gb}).status for a in (50, 2, 0.1)] == ["ok", "warn", "fail"]


def test_devices_each_with_its_parity():
    assert doctor.check_devices([])[0].status == "ok"
    good = parity.ParityResult("cuda:0", 1e-4, [2.3, 2.2], [2.3, 2.2], True, 1e-2)
    bad = parity.ParityResult("xpu:0", math.inf, [2.3, 2.2], [2.3, float("nan")], False, 1e-2)
    checks = doctor.check_devices([{"name": "cuda:0", "description": "cuda:0 (H100), 79.6 GB", "parity": good},
                                   {"name": "xpu:0", "description": "xpu:0 (Arc)", "parity": bad},
                                   {"name": "xpu:1", "error": "RuntimeError: no kernel image"}])
    assert [(c.name, c.status) for c in checks] == [("device cuda:0", "ok"), ("device xpu:0", "fail"),
                                                    ("device xpu:1", "fail")]
    assert "79.6 GB" in checks[0].message and "agrees" in checks[0].message
    assert "DISAGREES" in checks[1].message and "--device cpu" in checks[1].fix
    assert "no kernel image" in checks[2].message and "driver" in checks[2].fix


def test_accelerators_each_with_its_parity_probe_or_error(monkeypatch):
    monkeypatch.setattr("helpers.devices.is_available", lambda kind: kind == "mps")
    monkeypatch.setattr("helpers.arc_workloads.parity_check", lambda device: f"probed {device}")
    assert doctor._accelerators() == [{"name": "mps", "description": "mps", "parity": "probed mps"}]

    def broken(device):
        raise RuntimeError("no kernel image\nmore")

    monkeypatch.setattr("helpers.arc_workloads.parity_check", broken)
    assert doctor._accelerators() == [{"name": "mps", "description": "mps", "error": "RuntimeError: no kernel image"}]


def test_judge_runs_every_check_on_faked_findings(fake_facts):
    checks = doctor.judge(fake_facts())
    names = [c.name for c in checks]
    for expected in ("python", "pins", "torch build", "devices", "cpu", "instruction sets", "c++ compiler",
                     "platform", "ipex", "nni + torch-pruning", "allocators", "mpirun", "jupyter kernel", "memory",
                     "disk"):
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
    mac = {c.name: c for c in doctor.judge(fake_facts(platform=fake_platforms["macOS arm64"], compiler={"cxx": None},
                                                       devices=[{"name": "mps", "error": "RuntimeError: x"}],
                                                       isa={}))}
    assert {"limit LD_PRELOAD", "limit torchrun"} <= set(mac) and "limit openvino" not in mac
    assert mac["c++ compiler"].status == "fail" and "xcode-select --install" in mac["c++ compiler"].fix
    assert "allocators" not in mac and "brew install open-mpi" in mac["mpirun"].fix  # limit LD_PRELOAD says it
    assert mac["device mps"].status == "fail"


def test_compiler_each_platform_and_state():
    good = {"cxx_env": None, "cxx": "/usr/bin/g++", "version": "g++ 12.2.0", "include": "/inc", "python_h": True,
            "python": "3.11"}
    ok = doctor.check_compiler(good)
    assert ok.status == "ok" and "/usr/bin/g++" in ok.message and "from PATH" in ok.message
    assert "from $CXX" in doctor.check_compiler({**good, "cxx_env": "clang++", "cxx": "/usr/bin/clang++"}).message
    none = doctor.check_compiler({**good, "cxx": None})
    assert none.status == "fail" and "no C++ compiler" in none.message
    assert none.fix.startswith("Debian/Ubuntu: `sudo apt-get install g++ python3.11-dev`")
    assert "xcode-select --install" in doctor.check_compiler({**good, "cxx": None}, "Darwin").fix
    assert "WSL2" in doctor.check_compiler({**good, "cxx": None}, "Windows").fix
    shim = doctor.check_compiler({**good, "cxx": "/usr/bin/g++", "runs": False,
                                  "version": "xcrun: error: invalid active developer path"}, "Darwin")
    assert shim.status == "fail" and "does not run (xcrun" in shim.message and "xcode-select" in shim.fix
    stale = doctor.check_compiler({**good, "cxx_env": "g++-99", "cxx": None})
    assert stale.status == "fail" and "$CXX is 'g++-99'" in stale.message and "unset" in stale.fix
    headers = doctor.check_compiler({**good, "python_h": False, "python": "3.12"})
    assert headers.status == "fail" and "Python.h is missing from /inc" in headers.message
    assert "python3.12-dev" in headers.fix
    assert "brew install python@3.11" in doctor.check_compiler({**good, "python_h": False}, "Darwin").fix


def test_platform_limits_linux_x86_has_none():
    checks = doctor.check_platform(LINUX)
    assert [(c.name, c.status) for c in checks] == [("platform", "ok")]
    assert checks[0].message == "Linux x86-64: no platform limit(s)"
    assert "(WSL2)" in doctor.check_platform({**LINUX, "wsl": True})[0].message


def test_platform_limits_linux_aarch64(fake_platforms):
    checks = doctor.check_platform(fake_platforms["Linux aarch64"])
    by = {c.name: c for c in checks}
    assert list(by) == ["platform", "limit intel-openmp", "limit nni", "limit openvino"]
    assert statuses(by["platform"]) == ("ok", "Linux aarch64: 3 platform limit(s), listed below", "")
    assert "no OpenVINO wheel for Linux aarch64" in by["limit openvino"].message
    assert "chapter 14 measures eager PyTorch and ONNX Runtime only" in by["limit openvino"].message
    assert "chapter 06 computes the same L1-norm masks with Torch-Pruning" in by["limit nni"].message
    assert "chapters 02 and 04 skip their Intel OpenMP arms" in by["limit intel-openmp"].message
    assert all(c.status == "warn" and c.fix for c in checks[1:])


def test_platform_limits_macos(fake_platforms):
    mac = fake_platforms["macOS arm64"]
    by = {c.name: c for c in doctor.check_platform(mac)}
    assert list(by) == ["platform", "limit intel-openmp", "limit nni", "limit LD_PRELOAD", "limit torchrun"]
    assert "limit openvino" not in by  # OpenVINO has macOS arm64 wheels
    assert "jemalloc or tcmalloc" in by["limit LD_PRELOAD"].message and "02 and 04" in by["limit LD_PRELOAD"].message
    assert "gloo" in by["limit torchrun"].message


def test_platform_limits_windows_and_unknown(fake_platforms):
    by = {c.name: c for c in doctor.check_platform(fake_platforms["Windows x86-64"])}
    assert list(by) == ["platform", "limit intel-openmp", "limit windows"] and "WSL2" in by["limit windows"].fix
    assert "make" in by["limit windows"].message and "mpirun" in by["limit windows"].message
    odd = doctor.check_platform({"system": "Linux", "machine": "ppc64le", "left_out": ["openvino"]})
    assert odd[0].status == "warn" and "Linux ppc64le is not one of the platforms" in odd[0].message
    assert "make platforms" in odd[0].fix
    assert "some-new-pin is not installed on Linux x86-64" in doctor.check_platform(
        {"system": "Linux", "machine": "x86_64", "left_out": ["some-new-pin"]})[1].message


def test_pins_are_read_from_installed_metadata():
    pins = doctor.pinned_requirements()
    names = {p["name"] for p in pins}
    assert {"torch", "torchvision", "nni"} <= names and "pytest" not in names  # extras are not base pins
    assert all(p["spec"].startswith("==") for p in pins)
    assert doctor.pinned_requirements("no-such-distribution-xyz") == []


def test_gather_collects_this_machines_facts():
    import platform
    import sys

    import torch

    from helpers import system

    facts = doctor.gather(imports=False)
    assert facts["python"]["version"] == list(sys.version_info[:3]) and facts["python"]["prefix"] == sys.prefix
    assert facts["python"]["supported"] == install.supported_pythons()
    assert set(facts["kernel"]) in ({"error"}, {"python", "same_env"})
    assert facts["python"]["executable"] == sys.executable   # the doctor names the Python it found
    assert facts["torch"]["version"] == torch.__version__ and facts["torch"]["cuda"] == torch.version.cuda
    assert facts["fingerprint"]["physical_cores"] == system.topology().physical_cores
    assert all(("parity" in d) != ("error" in d) for d in facts["devices"])
    assert facts["imports"] is None  # not tried
    here = facts["platform"]
    assert (here["system"], here["machine"]) == (platform.system(), platform.machine())
    assert here["left_out"] == doctor.left_out_pins() and here["ipex_wheels"] == install.ipex_supported()
    assert set(facts["compiler"]) >= {"cxx", "python_h", "include"}
    assert set(facts["ipex_env"]) >= {"python", "ok", "torch", "ipex", "message"} and "ipex" not in facts
    assert "intel_extension_for_pytorch" not in sys.modules  # nothing in this environment imports IPEX
    assert 0 < facts["memory"]["available"] <= facts["memory"]["total"]
    assert [c.name for c in doctor.judge(facts)][:3] == ["python", "pins", "torch build"]


def test_imports_are_tried_in_a_child_and_their_errors_reported():
    found = doctor._import_errors(doctor._imports_in_child(["json", "no_such_module_xyz"]))
    assert found["json"] is None and found["no_such_module_xyz"].startswith("ModuleNotFoundError")


def test_left_out_pins_per_platform_match_the_fakes_and_each_has_its_reason(fake_platforms):
    assert doctor.left_out_pins("Linux", "x86_64") == []
    for label, plat in fake_platforms.items():
        assert doctor.left_out_pins(plat["system"], plat["machine"]) == plat["left_out"], label
        assert not install.ipex_supported(plat["system"], plat["machine"]) and plat["ipex_wheels"] is False
        assert all(dist in doctor.LEFT_OUT_LIMITS for dist in plat["left_out"])  # no generic line on these
    assert set(fake_platforms) | {"Linux x86-64"} == {doctor.platform_label(p) for p in fake_platforms.values()} | {
        "Linux x86-64"} == {name.split(" (")[0] for name in install.PLATFORMS}
    assert doctor.left_out_pins("Linux", "aarch64", dist="no-such-distribution-xyz") == []


def test_imports_never_include_ipex_and_skip_left_out_pins():
    assert doctor.wanted_imports() == ["nni", "torch_pruning"]
    assert doctor.wanted_imports(["nni", "openvino"]) == ["torch_pruning"]
    assert not any("intel" in m for m in doctor.wanted_imports())


def _fake_compiler(folder, name):
    exe = folder / name
    exe.write_text("#!/bin/sh\necho 'fake c++ 1.0'\n")
    exe.chmod(0o755)
    return exe


@pytest.mark.skipif(os.name == "nt", reason="a shell-script compiler stand-in")
def test_compiler_facts_cxx_then_path(tmp_path, monkeypatch):
    def facts(cxx):
        monkeypatch.setenv("CXX", cxx)
        return doctor.compiler_facts()

    monkeypatch.delenv("CXX", raising=False)
    assert doctor.compiler_facts()["cxx_env"] is None
    fake = _fake_compiler(tmp_path, "c++")
    found = facts(str(fake))
    assert found["cxx"] == str(fake) and found["version"] == "fake c++ 1.0" and found["cxx_env"] == str(fake)
    assert found["runs"] is True
    assert facts(str(tmp_path / "g++-99"))["cxx"] is None
    broken = tmp_path / "shim"
    broken.write_text("#!/bin/sh\necho 'xcrun: error: invalid active developer path' >&2\nexit 1\n")
    broken.chmod(0o755)
    shim = facts(str(broken))
    assert shim["cxx"] == str(broken) and shim["runs"] is False and shim["version"].startswith("xcrun: error")
    include = sysconfig.get_paths()["include"]
    assert found["include"] == include and found["python_h"] == os.path.isfile(os.path.join(include, "Python.h"))


def test_compiler_facts_search_path(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("CXX", raising=False)
    assert doctor.compiler_facts()["cxx"] is None
    fake = _fake_compiler(tmp_path, "c++")
    assert doctor.compiler_facts()["cxx"] == str(fake)
    gxx = _fake_compiler(tmp_path, "g++")
    assert doctor.compiler_facts()["cxx"] == str(gxx)  # g++ first, as the doctor's docs say

