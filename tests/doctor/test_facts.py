"""helpers.doctor.facts: what ``gather`` collects on this machine, the pinned requirements read from
the installed metadata, and the import probe in a child process."""

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
    assert facts["torch"]["version"] == torch.__version__ and facts["torch"]["cuda"] == torch.version.cuda
    assert facts["fingerprint"]["physical_cores"] == system.topology().physical_cores
    assert facts["devices"][0]["name"] == "cpu" and len(facts["parity"]) == len(facts["accelerators"])
    assert facts["datasets"]["source"] == "standin" and facts["datasets"]["online"] is None
    assert facts["imports"] is None  # not tried
    assert 0 < facts["memory"]["available"] <= facts["memory"]["total"]
    assert [c.name for c in checks.judge(facts)][:3] == ["python", "pins", "torch build"]


def test_imports_are_tried_in_a_child_and_their_errors_reported():
    child = doctor._imports_in_child({"ok": "json", "missing": "no_such_module_xyz"})
    out = child.wait(60).output
    line = [ln for ln in out.splitlines() if ln.startswith("IMPORTS ")][-1]
    import json

    found = json.loads(line[len("IMPORTS "):])
    assert found["ok"] is None and found["missing"].startswith("ModuleNotFoundError")
