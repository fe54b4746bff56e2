"""The pinned environment and the package build: pyproject.toml, environment.yml, the Makefile."""

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import yaml
from packaging.requirements import Requirement

from helpers import install

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def _pins(requirements):
    """{name: (exact version, marker or '')} -- markers included, so a platform guard cannot get lost."""
    out = {}
    for line in requirements:
        req = Requirement(line)
        specs = list(req.specifier)
        assert len(specs) == 1 and specs[0].operator == "==", f"pin {line!r} with =="
        out[req.name.lower()] = (specs[0].version, str(req.marker or ""))
    return out


def _project_requirements():
    project = PYPROJECT["project"]
    return list(project["dependencies"]) + [r for extra in project["optional-dependencies"].values() for r in extra]


def _yml_pip_requirements():
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict) and "pip" in d)
    return env, [r for r in pip if not r.startswith("-")], [r for r in pip if r.startswith("-")]


def test_pyproject_and_environment_yml_pin_the_same_versions_and_markers():
    env, yml, options = _yml_pip_requirements()
    assert _pins(yml) == _pins(_project_requirements())
    assert "python=3.11" in env["dependencies"] and "-e ." in options


def test_markers_guard_the_linux_only_wheels():
    pins = _pins(_project_requirements())
    for name in ("intel-extension-for-pytorch", "intel-openmp"):
        assert "platform_system == \"Linux\"" in pins[name][1] and "x86_64" in pins[name][1]
    assert Requirement(next(r for r in _yml_pip_requirements()[1] if r.startswith("intel-openmp"))).marker.evaluate(
        {"platform_system": "Darwin", "platform_machine": "arm64"}) is False


def test_the_book_stack_is_pinned():
    pins = _pins(PYPROJECT["project"]["dependencies"])
    assert pins["torch"][0] == "2.8.0" and pins["torchvision"][0] == "0.23.0"
    assert pins["intel-extension-for-pytorch"][0] == "2.8.0" and pins["nni"][0] == "3.0"


def test_every_helpers_folder_is_packaged_with_its_data():
    setuptools = PYPROJECT["tool"]["setuptools"]
    folders = {".".join(p.relative_to(ROOT).parts) for p in (ROOT / "helpers").rglob("*")
               if p.is_dir() and p.name != "__pycache__" and "__pycache__" not in p.parts}
    assert set(setuptools["packages"]) >= {"helpers"} | folders, "add new helpers/ folders to [tool.setuptools] packages"
    data_dir = ROOT / setuptools["package-dir"]["helpers.published_data"]
    assert data_dir == ROOT / "data" / "published" and (data_dir / "__init__.py").is_file()
    assert "*.csv" in setuptools["package-data"]["helpers.published_data"] and list(data_dir.glob("*.csv"))
    assert any(pattern.startswith("launchers") for pattern in setuptools["package-data"]["helpers"])


def test_venv_is_keyed_by_the_pins_not_by_file_dates():
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^VENV \?= \$\(CACHE\)/venv-\$\(PINS_HASH\)$", makefile, re.M)
    assert re.search(r"^VENV \?= \$\(CACHE\)/venv-xpu-\$\(PINS_HASH\)$", makefile, re.M)
    installed = re.search(r"^\$\(VENV\)/\.installed:(.*)$", makefile, re.M)
    assert installed and installed.group(1).strip() == "", "the environment must not depend on any file's date"


def test_ci_calls_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    assert "make test" in readme and "make lab" in readme
    assert re.search(r"^make test$", ci, re.M)
    assert re.search(r"^export CI=", ci, re.M), "CI runs are strict about skipped tests (tests/conftest.py)"


# ---- the Intel GPU (xpu) environment: make setup DEVICE=xpu -> helpers/install.py (no network here) ----

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


def _make_n(tmp_path, *args):
    return subprocess.run(["make", "-n", "setup", f"CACHE={tmp_path}", *args], cwd=ROOT, capture_output=True, text=True)


def test_make_setup_device_xpu_uses_its_own_venv_and_the_install_plan(tmp_path):
    xpu = _make_n(tmp_path, "DEVICE=xpu")
    assert xpu.returncode == 0, xpu.stderr
    assert f"{tmp_path}/venv-xpu-" in xpu.stdout
    assert "-m helpers.install setup --device xpu" in xpu.stdout and "-m helpers.install check --device xpu" in xpu.stdout
    assert '.[test]' not in xpu.stdout and "-m pip check" not in xpu.stdout
    default = _make_n(tmp_path)
    assert default.returncode == 0 and "-m pip install --quiet -e \".[test]\"" in default.stdout
    assert "helpers.install" not in default.stdout and "venv-xpu-" not in default.stdout
    key = re.search(r"venv-xpu-([0-9a-f]{12})", xpu.stdout).group(1)
    assert f"{tmp_path}/venv-{key}" in default.stdout  # same pins, different environment
    wrong = _make_n(tmp_path, "DEVICE=rocm")
    assert wrong.returncode != 0 and "DEVICE=rocm has no course environment" in wrong.stderr
