"""helpers.doctor.facts: what ``gather`` collects on this machine, the pinned requirements read from
the installed metadata (and which of them each platform's markers leave out), the compiler and
Python headers, the IPEX environment, and the import probe in a child process."""

import os
import sys
import sysconfig

import pytest

from helpers import install
from helpers.doctor import checks, facts as doctor


def test_pins_are_read_from_installed_metadata():
    pins = doctor.pinned_requirements()
    names = {p["name"] for p in pins}
    assert {"torch", "torchvision", "nni"} <= names and "pytest" not in names  # extras are not base pins
    assert all(p["spec"].startswith("==") for p in pins)
    assert doctor.pinned_requirements("no-such-distribution-xyz") == []


def test_gather_collects_this_machines_facts(monkeypatch):
    import sys

    import torch

    from helpers import system

    monkeypatch.setenv("COURSE_DATA", "standin")  # no network probe for missing real data sets
    facts = doctor.gather(parity_steps=1, imports=False)
    assert facts["python"]["version"] == list(sys.version_info[:3]) and facts["python"]["prefix"] == sys.prefix
    assert facts["python"]["executable"] == sys.executable   # the doctor names the Python it found
    assert facts["torch"]["version"] == torch.__version__ and facts["torch"]["cuda"] == torch.version.cuda
    assert facts["fingerprint"]["physical_cores"] == system.topology().physical_cores
    assert facts["devices"][0]["name"] == "cpu" and len(facts["parity"]) == len(facts["accelerators"])
    assert facts["datasets"]["source"] == "standin" and facts["datasets"]["online"] is None
    assert facts["imports"] is None  # not tried
    assert facts["platform"]["system"] and facts["platform"]["machine"] and "left_out" in facts["platform"]
    assert set(facts["compiler"]) >= {"cxx", "python_h", "include"}
    assert set(facts["ipex_env"]) >= {"python", "ok", "torch", "ipex", "message"} and "ipex" not in facts
    assert "intel_extension_for_pytorch" not in sys.modules  # nothing in this environment imports IPEX
    assert 0 < facts["memory"]["available"] <= facts["memory"]["total"]
    assert [c.name for c in checks.judge(facts)][:3] == ["python", "pins", "torch build"]


def test_imports_are_tried_in_a_child_and_their_errors_reported():
    child = doctor._imports_in_child({"ok": "json", "missing": "no_such_module_xyz"})
    out = child.wait(60).output
    line = [ln for ln in out.splitlines() if ln.startswith("IMPORTS ")][-1]
    import json

    found = json.loads(line[len("IMPORTS "):])
    assert found["ok"] is None and found["missing"].startswith("ModuleNotFoundError")


def test_left_out_pins_per_platform_match_the_fakes_and_each_has_its_reason(fake_platforms):
    assert doctor.left_out_pins("Linux", "x86_64") == []
    for label, plat in fake_platforms.items():
        assert doctor.left_out_pins(plat["system"], plat["machine"]) == plat["left_out"], label
        assert not install.ipex_supported(plat["system"], plat["machine"]) and plat["ipex_wheels"] is False
        assert all(dist in checks.LEFT_OUT_LIMITS for dist in plat["left_out"])  # no generic line on these
    assert set(fake_platforms) | {"Linux x86-64"} == {checks.platform_label(p) for p in fake_platforms.values()} | {
        "Linux x86-64"} == {name.split(" (")[0] for name in install.PLATFORMS}
    assert doctor.left_out_pins("Linux", "aarch64", dist="no-such-distribution-xyz") == []


def test_platform_facts_of_this_machine_and_a_named_one():
    import platform

    here = doctor.platform_facts()
    assert (here["system"], here["machine"]) == (platform.system(), platform.machine())
    assert here["left_out"] == doctor.left_out_pins() and here["ipex_wheels"] == install.ipex_supported()
    arm = doctor.platform_facts("Linux", "aarch64")
    assert "openvino" in arm["left_out"] and arm["ipex_wheels"] is False


def test_imports_never_include_ipex_and_skip_left_out_pins():
    assert doctor.wanted_imports() == {"nni": "nni", "torch_pruning": "torch_pruning"}
    assert doctor.wanted_imports(["nni", "openvino"]) == {"torch_pruning": "torch_pruning"}
    assert not any("intel" in m for m in doctor.wanted_imports().values())


def _fake_compiler(folder, name):
    exe = folder / name
    exe.write_text("#!/bin/sh\necho 'fake c++ 1.0'\n")
    exe.chmod(0o755)
    return exe


@pytest.mark.skipif(os.name == "nt", reason="a shell-script compiler stand-in")
def test_compiler_facts_cxx_then_path(tmp_path):
    assert doctor.compiler_facts({})["cxx_env"] is None  # $CXX is read from the mapping given
    fake = _fake_compiler(tmp_path, "c++")
    found = doctor.compiler_facts({"CXX": str(fake)})
    assert found["cxx"] == str(fake) and found["version"] == "fake c++ 1.0" and found["cxx_env"] == str(fake)
    assert found["runs"] is True
    assert doctor.compiler_facts({"CXX": str(tmp_path / "g++-99")})["cxx"] is None
    broken = tmp_path / "shim"
    broken.write_text("#!/bin/sh\necho 'xcrun: error: invalid active developer path' >&2\nexit 1\n")
    broken.chmod(0o755)
    shim = doctor.compiler_facts({"CXX": str(broken)})
    assert shim["cxx"] == str(broken) and shim["runs"] is False and shim["version"].startswith("xcrun: error")
    include = sysconfig.get_paths()["include"]
    assert found["include"] == include and found["python_h"] == os.path.isfile(os.path.join(include, "Python.h"))


def test_compiler_facts_search_path(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    assert doctor.compiler_facts({})["cxx"] is None
    fake = _fake_compiler(tmp_path, "c++")
    assert doctor.compiler_facts({})["cxx"] == str(fake)
    gxx = _fake_compiler(tmp_path, "g++")
    assert doctor.compiler_facts({})["cxx"] == str(gxx)  # g++ first, as the doctor's docs say


def test_ipex_environment_absent(monkeypatch, tmp_path):
    monkeypatch.setenv("COURSE_IPEX_PYTHON", str(tmp_path / "no-such-python"))
    env = doctor.ipex_environment()
    assert env["python"] is None and env["ok"] is False and "make setup-ipex" in env["message"]
    pins = doctor.ipex_pins()
    assert pins["torch"].startswith("2.8.") and pins["intel-extension-for-pytorch"].startswith("2.8.")
