"""The pinned environment: pyproject.toml and environment.yml must agree."""

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _pins(requirements):
    out = {}
    for req in requirements:
        req = req.split(";")[0].strip()
        m = re.fullmatch(r"([A-Za-z0-9_.\-]+)==([^\s]+)", req)
        if m:
            out[m.group(1).lower()] = m.group(2)
    return out


def test_pyproject_and_environment_yml_pin_the_same_versions():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = list(project["dependencies"]) + [r for extra in project["optional-dependencies"].values() for r in extra]
    py_pins = _pins(reqs)
    assert len(py_pins) == len(reqs), "every dependency in pyproject.toml must be pinned with =="
    yml_lines = [ln.strip()[2:] for ln in (ROOT / "environment.yml").read_text().splitlines()
                 if ln.strip().startswith("- ") and "==" in ln]
    assert _pins(yml_lines) == py_pins


def test_the_book_stack_is_pinned():
    pins = _pins(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"])
    assert pins["torch"] == "2.8.0" and pins["torchvision"] == "0.23.0"
    assert pins["intel-extension-for-pytorch"] == "2.8.0" and pins["nni"] == "3.0"


def test_ci_calls_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    assert "make test" in readme and "make lab" in readme
    assert re.search(r"^make test$", ci, re.M)
