"""Tests of helpers.install: the Intel GPU (xpu) environment's install plan and commands, made from
pyproject.toml's pins (no network here). The Makefile's use of it: test_environment.py."""

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from helpers import install

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def _project_requirements():
    project = PYPROJECT["project"]
    return list(project["dependencies"]) + [r for extra in project["optional-dependencies"].values() for r in extra]


def test_xpu_plan_takes_torch_from_the_xpu_index_and_leaves_the_cpu_ipex_out():
    plan = install.xpu_plan(ROOT / "pyproject.toml")
    assert plan.torch_requirements == ["torch==2.8.0", "torchvision==0.23.0"]  # the pinned versions
    assert plan.constraints == ["torch==2.8.0+xpu", "torchvision==0.23.0+xpu"]
    assert plan.left_out == ["intel-extension-for-pytorch"]
    names = {install.parse_pin(r)[0]: r for r in plan.requirements}
    assert not {"torch", "torchvision", "intel-extension-for-pytorch"} & set(names)
    every_other = {install.parse_pin(r)[0] for r in _project_requirements()} - {
        "torch", "torchvision", "intel-extension-for-pytorch"}
    assert set(names) == every_other  # nothing else dropped, the test extra included
    assert names["nni"] == "nni==3.0" and names["pytest"] == "pytest==9.2.0"
    assert names["intel-openmp"] == "intel-openmp; platform_system == 'Linux' and platform_machine == 'x86_64'"
    for req in plan.requirements + plan.constraints:
        Requirement(req)  # pip can read every line


def test_xpu_commands_in_order(tmp_path):
    plan = install.xpu_plan()
    req, con = install.write_files(plan, tmp_path)
    assert "torch==2.8.0+xpu" in con.read_text().splitlines()
    assert "nni==3.0" in req.read_text().splitlines() and "intel-extension" not in req.read_text()
    cmds = install.xpu_commands(plan, "/venv/bin/python", tmp_path, project="/clone")
    pip = ["/venv/bin/python", "-m", "pip", "install", "--quiet"]
    assert cmds[0] == pip + ["torch==2.8.0", "torchvision==0.23.0", "--index-url", "https://download.pytorch.org/whl/xpu"]
    assert cmds[1] == pip + ["-r", str(req), "-c", str(con)]
    assert cmds[2] == pip + ["--no-deps", "-e", "/clone"]
    assert cmds[3][:2] == ["/venv/bin/python", "-c"] and "+xpu" in cmds[3][2]
    assert not any("--extra-index-url" in c for cmd in cmds for c in cmd)  # never mix the two indexes


def test_parse_pin_and_its_error():
    assert install.parse_pin("Intel_Extension.for-PyTorch==2.8.0; platform_system == 'Linux'") == (
        "intel-extension-for-pytorch", "2.8.0", "platform_system == 'Linux'")
    assert install.parse_pin("jupyterlab") == ("jupyterlab", None, "")
    with pytest.raises(install.InstallError, match="name==version"):
        install.parse_pin("torch>=2; ")
    with pytest.raises(install.InstallError, match="no extra docs"):
        install.course_requirements(ROOT / "pyproject.toml", extras=("docs",))


def test_pip_check_accepts_only_what_the_plan_left_out_on_purpose():
    plan = install.xpu_plan()
    expected = ("accelerate-course-helpers 0.1.0 requires intel-extension-for-pytorch, which is not installed.\n"
                "accelerate-course-helpers 0.1.0 has requirement intel-openmp==2026.2.0, but you have intel-openmp 2025.1.1.\n")
    assert install.unexpected_pip_check_lines(expected, plan) == []
    assert install.unexpected_pip_check_lines("No broken requirements found.", plan) == []
    wrong = "accelerate-course-helpers 0.1.0 has requirement torch==2.8.0, but you have torch 2.9.0+xpu."
    other = "timm 1.0.31 requires torchvision, which is not installed."
    assert install.unexpected_pip_check_lines(expected + wrong + "\n" + other, plan) == [wrong, other]


def test_install_runs_on_the_standard_library_alone(tmp_path):
    """make runs it with the new environment's Python before anything is installed there (-S: no site-packages)."""
    proc = subprocess.run([sys.executable, "-S", "-m", "helpers.install", "setup", "--device", "xpu", "--dry-run",
                           "--folder", str(tmp_path), "--python", "/venv/bin/python"],
                          cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "+ /venv/bin/python -m pip install --quiet torch==2.8.0 torchvision==0.23.0 --index-url " \
           "https://download.pytorch.org/whl/xpu" in proc.stdout
    assert (tmp_path / install.REQUIREMENTS_FILE).is_file() and (tmp_path / install.CONSTRAINTS_FILE).is_file()
    bad = subprocess.run([sys.executable, "-S", "-m", "helpers.install", "setup", "--device", "directml"],
                         cwd=ROOT, capture_output=True, text=True)
    assert bad.returncode == 2 and "invalid choice: 'directml'" in bad.stderr


def test_normalize_and_course_requirements():
    assert install.normalize("Intel_Extension.for--PyTorch") == "intel-extension-for-pytorch"
    assert install.normalize("PyYAML") == "pyyaml"
    deps = list(PYPROJECT["project"]["dependencies"])
    assert install.course_requirements(ROOT / "pyproject.toml") == deps + PYPROJECT["project"]["optional-dependencies"]["test"]
    assert install.course_requirements(ROOT / "pyproject.toml", extras=()) == deps


def test_xpu_plan_needs_torch_and_torchvision_pinned(tmp_path):
    def pyproject(*deps):
        path = tmp_path / "pyproject.toml"
        path.write_text('[project]\nname = "Course_X"\ndependencies = [' + ", ".join(f'"{d}"' for d in deps)
                        + ']\n[project.optional-dependencies]\ntest = ["pytest==9.2.0"]\n')
        return path

    plan = install.xpu_plan(pyproject("torch==2.8.0", "torchvision==0.23.0", "numpy==2.1.0"))
    assert plan.requirements == ["numpy==2.1.0", "pytest==9.2.0"] and plan.project_name == "course-x"
    with pytest.raises(install.InstallError, match="torch must be pinned with =="):
        install.xpu_plan(pyproject("torch", "torchvision==0.23.0"))
    with pytest.raises(install.InstallError, match="pins no torchvision"):
        install.xpu_plan(pyproject("torch==2.8.0"))


def test_main_check_accepts_the_planned_differences_only(monkeypatch, capsys):
    plan = install.xpu_plan()
    planned = f"{plan.project_name} 0.1.0 requires intel-extension-for-pytorch, which is not installed.\n"
    outputs = iter([planned, planned + "timm 1.0.31 requires torchvision, which is not installed.\n"])
    seen = []

    def fake_run(cmd, **kwargs):
        seen.append(cmd)
        return subprocess.CompletedProcess(cmd, 1, stdout=next(outputs), stderr="")

    monkeypatch.setattr(install.subprocess, "run", fake_run)
    assert install.main(["check", "--device", "xpu", "--python", "/venv/bin/python"]) == 0
    assert seen[0] == ["/venv/bin/python", "-m", "pip", "check"]
    assert "pip check: ok for the XPU environment (intel-extension-for-pytorch left out on purpose)" in capsys.readouterr().out
    assert install.main(["check", "--device", "xpu", "--python", "/venv/bin/python"]) == 1
    assert capsys.readouterr().err == ("pip check found problems the XPU plan does not explain:\n"
                                       "  timm 1.0.31 requires torchvision, which is not installed.\n")
