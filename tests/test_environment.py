"""The pinned environment and the package build: pyproject.toml, environment.yml, the Makefile."""

import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import yaml
from packaging.requirements import Requirement

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
    assert "-e ." in options
    # conda's Python: the versions requires-python admits
    assert PYPROJECT["project"]["requires-python"] == ">=3.11,<3.14" and "python>=3.11,<3.14" in env["dependencies"]


PLATFORMS = {  # marker values of the four platforms the pins must install on
    "Linux x86-64": {"platform_system": "Linux", "platform_machine": "x86_64", "sys_platform": "linux"},
    "Linux aarch64": {"platform_system": "Linux", "platform_machine": "aarch64", "sys_platform": "linux"},
    "macOS arm64": {"platform_system": "Darwin", "platform_machine": "arm64", "sys_platform": "darwin"},
    "Windows x86-64": {"platform_system": "Windows", "platform_machine": "AMD64", "sys_platform": "win32"},
}


def _installed_on(platform):
    env = {**PLATFORMS[platform], "python_version": "3.11", "python_full_version": "3.11.7", "os_name": "posix",
           "implementation_name": "cpython", "platform_python_implementation": "CPython", "extra": ""}
    return {Requirement(r).name.lower() for r in _project_requirements()
            if Requirement(r).marker is None or Requirement(r).marker.evaluate(env)}


def test_markers_leave_out_exactly_the_packages_without_wheels_there():
    everything = {Requirement(r).name.lower() for r in _project_requirements()}
    assert _installed_on("Linux x86-64") == everything
    assert everything - _installed_on("Linux aarch64") == {"nni", "openvino", "intel-openmp"}
    assert everything - _installed_on("macOS arm64") == {"nni", "intel-openmp"}
    assert everything - _installed_on("Windows x86-64") == {"intel-openmp"}
    assert Requirement(next(r for r in _yml_pip_requirements()[1] if r.startswith("intel-openmp"))).marker.evaluate(
        {"platform_system": "Darwin", "platform_machine": "arm64"}) is False


def test_current_torch_in_the_default_environment_and_ipex_in_its_own():
    pins = _pins(PYPROJECT["project"]["dependencies"])
    major, minor = (int(x) for x in pins["torch"][0].split(".")[:2])
    assert (major, minor) >= (2, 14) and pins["torchvision"][0] == "0.29.1"
    assert "intel-extension-for-pytorch" not in pins and pins["nni"][0] == "3.0" and "onnxscript" in pins
    ipex = _pins(PYPROJECT["tool"]["course"]["ipex-environment"]["dependencies"])
    assert ipex["torch"][0] == "2.8.0" and ipex["torchvision"][0] == "0.23.0"
    assert ipex["intel-extension-for-pytorch"][0] == "2.8.0"


def test_ipex_environment_is_keyed_by_its_pins_and_built_by_make():
    from helpers.course import install

    makefile = (ROOT / "Makefile").read_text()
    assert "helpers.course.install ipex-venv" in makefile and re.search(r"^setup-ipex: \$\(IPEX_VENV\)/\.installed", makefile, re.M)
    assert re.search(r"^test: setup student \$\(if \$\(WANT_IPEX\),setup-ipex\)", makefile, re.M)
    pins = install.ipex_pins()
    folder = install.ipex_venv("/cache")
    assert folder.parent == Path("/cache") and folder.name == f"venv-ipex-{install.python_tag()}-{install.pins_key(pins)}"
    assert install.pins_key(list(reversed(pins))) == install.pins_key(pins)
    assert install.pins_key(pins + ["six==1.16.0"]) != install.pins_key(pins)


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
    assert re.search(r"^VENV \?= \$\(CACHE\)/venv-\$\(ENV_KEY\)$", makefile, re.M)
    assert re.search(r"^VENV \?= \$\(CACHE\)/venv-xpu-\$\(ENV_KEY\)$", makefile, re.M)
    assert re.search(r"^ENV_KEY := \$\(shell \$\(PYTHON\) -m helpers.course.install env-key ", makefile, re.M)
    installed = re.search(r"^\$\(VENV\)/\.installed:(.*)$", makefile, re.M)
    assert installed and installed.group(1).strip() == "", "the environment must not depend on any file's date"


def test_ci_calls_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    assert "make test" in readme and "make lab" in readme
    assert re.search(r"^make test$", ci, re.M)
    assert re.search(r"^export CI=", ci, re.M), "CI runs are strict about skipped tests (tests/conftest.py)"


# ---- make setup DEVICE=xpu (the install plan itself: test_install.py) ----

def _make_n(tmp_path, *args, target="setup"):
    return subprocess.run(["make", "-n", target, f"CACHE={tmp_path}", *args], cwd=ROOT, capture_output=True, text=True)


def test_make_setup_device_xpu_uses_its_own_venv_and_the_install_plan(tmp_path):
    import sys

    from helpers.course import install

    xpu = _make_n(tmp_path, "DEVICE=xpu", f"PYTHON={sys.executable}")   # env_key() below: this Python's key
    assert xpu.returncode == 0, xpu.stderr
    key = install.env_key()
    assert f"--venv \"{tmp_path}/venv-xpu-{key}\"" in xpu.stdout and "-m helpers.course.install check --device xpu" in xpu.stdout
    build = _make_n(tmp_path, "DEVICE=xpu", target="_build-venv")
    assert "-m helpers.course.install setup --device xpu" in build.stdout and '.[test]' not in build.stdout
    assert "-m pip check" not in xpu.stdout
    default = _make_n(tmp_path, f"PYTHON={sys.executable}")
    assert default.returncode == 0 and f"{tmp_path}/venv-{key}" in default.stdout  # same pins, different environment
    assert "-m pip install --quiet -e \".[test]\"" in _make_n(tmp_path, target="_build-venv").stdout
    assert "helpers.course.install setup" not in default.stdout and "venv-xpu-" not in default.stdout
    assert "helpers.course.install environments" in default.stdout   # setup names older environments it finds
    wrong = _make_n(tmp_path, "DEVICE=rocm")
    assert wrong.returncode != 0 and "DEVICE=rocm has no course environment" in wrong.stderr


# ---- the Python that builds the environments, and the build's lock ----

def test_makefile_supports_the_pythons_of_requires_python():
    from helpers.course import install

    makefile = (ROOT / "Makefile").read_text()
    supported = re.search(r"^SUPPORTED_PYTHONS := (.*)$", makefile, re.M).group(1).split()
    assert supported == install.supported_pythons() == ["3.11", "3.12", "3.13"]
    assert "3, 11)" not in makefile and "needs-python3.11" not in makefile  # no assert left that pins one version
    # both builds check the Python first, then run under their lock
    for target, internal in (("$(VENV)", "_build-venv"), ("$(IPEX_VENV)", "_build-ipex")):
        recipe = makefile.split(f"\n{target}/.installed:\n", 1)[1].split("\n\n", 1)[0]
        assert recipe.splitlines()[0] == "\t@$(CHECK_PYTHON)", recipe
        assert f"-m helpers.course.install lock --venv \"{target}\"" in recipe and f"$(SUBMAKE) --no-print-directory {internal}" in recipe
    assert re.search(r"^\trm -rf \"\$\(VENV\)\"$", makefile, re.M).start() > makefile.index("\n_build-venv:")


def _make(tmp_path, path, *args, target="setup"):
    """make -n with PATH=path only (make and bash by their full paths)."""
    return subprocess.run(["/usr/bin/env", "-i", f"HOME={tmp_path}", f"PATH={path}", shutil.which("make"), "-n", target,
                           f"CACHE={tmp_path}", *args], cwd=ROOT, capture_output=True, text=True)


def _fake_python(folder, name, version):
    """A python named ``name`` in ``folder`` that says it is ``version`` (a sitecustomize sets sys.version_info)."""
    import sys

    site = folder / f"site-{version[0]}.{version[1]}"
    site.mkdir(parents=True, exist_ok=True)
    (site / "sitecustomize.py").write_text(f"import sys\nsys.version_info = {(*version, 0, 'final', 0)!r}\n"
                                           f"sys.version = '{version[0]}.{version[1]}.0 (stand-in)'\n")
    script = folder / name
    script.write_text(f"#!/bin/sh\nPYTHONPATH={site} exec {sys.executable} \"$@\"\n")
    script.chmod(0o755)
    return script


def test_make_picks_python3_when_supported_else_the_newest_python3_x_else_says_what_to_install(tmp_path):
    bins = tmp_path / "bin"
    for tool in ("bash", "sed", "cat", "env"):
        bins.mkdir(exist_ok=True)
        (bins / tool).symlink_to(shutil.which(tool))
    _fake_python(bins, "python3", (3, 12))
    _fake_python(bins, "python3.11", (3, 11))
    picked = _make(tmp_path, bins)
    assert picked.returncode == 0, picked.stderr
    assert f"{bins}/python3 -m helpers.course.install lock" in picked.stdout
    _fake_python(bins, "python3", (3, 10))    # Ubuntu 22.04: python3 is 3.10, python3.11 installed beside it
    picked = _make(tmp_path, bins)
    assert picked.returncode == 0 and f"{bins}/python3.11 -m helpers.course.install lock" in picked.stdout
    (bins / "python3.11").unlink()
    none = _make(tmp_path, bins)
    assert none.returncode != 0 and "No supported Python found: the course needs Python 3.11, 3.12 or 3.13" in none.stderr
    assert "sudo apt-get install python3 python3-venv python3-dev" in none.stderr and "make PYTHON=" in none.stderr


def test_an_unsupported_python_given_by_hand_stops_the_build_with_the_fix(tmp_path):
    old = _fake_python(tmp_path / "bin", "python3", (3, 10))
    for target in ("setup", "setup-ipex"):
        proc = subprocess.run(["make", target, f"PYTHON={old}", f"CACHE={tmp_path / 'cache'}"], cwd=ROOT,
                              capture_output=True, text=True)
        assert proc.returncode != 0 and f"Python 3.10.0 ({old}) is not supported: the course needs 3.11, 3.12 or 3.13; " \
            "install one -- Ubuntu 24.04, Debian 12/13: sudo apt-get install python3 python3-venv python3-dev" in proc.stderr
        assert not (tmp_path / "cache").exists()   # stopped before anything was made


def test_two_make_setups_at_once_build_one_environment(tmp_path):
    """The real recipe of $(VENV)/.installed, twice at once, with a stand-in for the 8 GB build (SUBMAKE)."""
    import sys
    import time

    fake = tmp_path / "fake_build.py"
    fake.write_text("import pathlib, sys, time\n"
                    "args = dict(a.split('=', 1) for a in sys.argv[1:] if '=' in a)\n"
                    "assert '_build-venv' in sys.argv, sys.argv\n"
                    "venv = pathlib.Path(args['VENV'])\n"
                    f"pathlib.Path({str(tmp_path / 'started')!r}).touch()\n"
                    f"while not pathlib.Path({str(tmp_path / 'release')!r}).exists(): time.sleep(0.05)\n"
                    f"open({str(tmp_path / 'builds.log')!r}, 'a').write('built\\n')\n"
                    "venv.mkdir(parents=True, exist_ok=True)\n"
                    "(venv / '.installed').touch()\n")
    venv = tmp_path / "cache" / "venv-shared"

    def make():
        return subprocess.Popen(["make", "--no-print-directory", f"{venv}/.installed", f"VENV={venv}",
                                 f"CACHE={tmp_path / 'cache'}", f"PYTHON={sys.executable}",
                                 f"SUBMAKE={sys.executable} {fake}"], cwd=ROOT, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)

    first = make()
    end = time.monotonic() + 60
    while not (tmp_path / "started").exists():
        assert time.monotonic() < end and first.poll() is None, first.communicate()[0]
        time.sleep(0.05)
    second = make()
    import select

    assert select.select([second.stdout], [], [], 60)[0], "the second make said nothing within 60 s"
    said = second.stdout.readline()     # the second one waits for the first's build, and says so ...
    (tmp_path / "release").touch()      # ... then the first one's build ends
    out1, out2 = first.communicate(timeout=120)[0], said + second.communicate(timeout=120)[0]
    assert first.returncode == 0 and second.returncode == 0, out1 + out2
    assert (tmp_path / "builds.log").read_text() == "built\n" and (venv / ".installed").is_file()
    assert said.startswith(f"Another `make setup` is building {venv} (process ") and "waiting for it to finish" in said, out2
    assert f"{venv} is ready (built by the other run): reusing it" in out2
