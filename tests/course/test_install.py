"""helpers.course.install: the XPU and IPEX environments' install plans and commands, their keys, the
platform check (from pyproject.toml's pins, no network), and a build under its lock (stand-in builds: two at
once build once, a killed one leaves the next to build). The Makefile's use of it: tests/test_environment.py."""

import os
import re
import shutil
import signal
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from helpers.course import install

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def _project_requirements():
    project = PYPROJECT["project"]
    return list(project["dependencies"]) + [r for extra in project["optional-dependencies"].values() for r in extra]


TORCH = next(r for r in PYPROJECT["project"]["dependencies"] if r.startswith("torch=="))
VISION = next(r for r in PYPROJECT["project"]["dependencies"] if r.startswith("torchvision=="))


def test_xpu_plan_takes_torch_from_the_xpu_index_at_the_default_pins():
    torch_requirements, requirements = install.xpu_plan(ROOT / "pyproject.toml")
    assert torch_requirements == [TORCH, VISION] == ["torch==2.14.1", "torchvision==0.29.1"]  # same versions
    names = {install.parse_pin(r)[0]: r for r in requirements}
    assert not {"torch", "torchvision", "intel-extension-for-pytorch"} & set(names)
    every_other = {install.parse_pin(r)[0] for r in _project_requirements()} - {"torch", "torchvision"}
    assert set(names) == every_other  # nothing else dropped, the test extra included
    assert names["nni"].startswith("nni==3.0; ") and names["pytest"] == "pytest==9.2.0"
    assert names["intel-openmp"] == "intel-openmp; platform_system == 'Linux' and platform_machine == 'x86_64'"
    for req in requirements:
        Requirement(req)  # pip can read every line


def test_xpu_commands_in_order(tmp_path):
    cmds = install.xpu_commands("/venv/bin/python", tmp_path, project="/clone")
    req, con = tmp_path / "xpu-requirements.txt", tmp_path / "xpu-constraints.txt"
    assert [line for line in con.read_text().splitlines() if not line.startswith("#")] == [
        "torch==2.14.1+xpu", "torchvision==0.29.1+xpu"]
    assert any(line.startswith("nni==3.0") for line in req.read_text().splitlines())
    assert "intel-extension" not in req.read_text()
    for line in (req.read_text() + con.read_text()).splitlines():
        assert line.startswith("#") or Requirement(line)  # pip can read every line
    pip = ["/venv/bin/python", "-m", "pip", "install", "--quiet"]
    assert cmds[0] == pip + ["torch==2.14.1", "torchvision==0.29.1", "--index-url", "https://download.pytorch.org/whl/xpu"]
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


def test_pip_check_accepts_only_what_the_plan_left_out_on_purpose():
    expected = "accelerate-course-helpers 0.1.0 has requirement intel-openmp==2026.2.0, but you have intel-openmp 2025.1.1.\n"
    assert install.unexpected_pip_check_lines(expected) == []
    assert install.unexpected_pip_check_lines("No broken requirements found.") == []
    wrong = "accelerate-course-helpers 0.1.0 has requirement torch==2.14.1, but you have torch 2.15.0+xpu."
    other = "timm 1.0.31 requires torchvision, which is not installed."
    missing = "accelerate-course-helpers 0.1.0 requires intel-openmp, which is not installed."
    assert install.unexpected_pip_check_lines(expected + wrong + "\n" + other + "\n" + missing) == [wrong, other]


def test_install_runs_on_the_standard_library_alone(tmp_path):
    """make runs it with the new environment's Python before anything is installed there (-S: no site-packages)."""
    proc = subprocess.run([sys.executable, "-S", "-m", "helpers.course.install", "setup", "--device", "xpu", "--dry-run",
                           "--folder", str(tmp_path)], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert f"+ {sys.executable} -m pip install --quiet torch==2.14.1 torchvision==0.29.1 --index-url " \
           "https://download.pytorch.org/whl/xpu" in proc.stdout
    assert (tmp_path / "xpu-requirements.txt").is_file() and (tmp_path / "xpu-constraints.txt").is_file()
    bad = subprocess.run([sys.executable, "-S", "-m", "helpers.course.install", "setup", "--device", "directml"],
                         cwd=ROOT, capture_output=True, text=True)
    assert bad.returncode == 2 and "invalid choice: 'directml'" in bad.stderr


def test_normalize_and_course_requirements():
    assert install.normalize("Intel_Extension.for--PyTorch") == "intel-extension-for-pytorch"
    assert install.normalize("PyYAML") == "pyyaml"
    deps = list(PYPROJECT["project"]["dependencies"])
    assert install.course_requirements(ROOT / "pyproject.toml") == deps + PYPROJECT["project"]["optional-dependencies"]["test"]


def test_xpu_plan_and_pip_check_read_the_given_pyproject(tmp_path):
    def pyproject(*deps):
        path = tmp_path / "pyproject.toml"
        path.write_text('[project]\nname = "Course_X"\ndependencies = [' + ", ".join(f'"{d}"' for d in deps)
                        + ']\n[project.optional-dependencies]\ntest = ["pytest==9.2.0"]\n')
        return path

    assert install.xpu_plan(pyproject("Torch==2.8.0", "torchvision==0.23.0", "numpy==2.1.0")) == (
        ["torch==2.8.0", "torchvision==0.23.0"], ["numpy==2.1.0", "pytest==9.2.0"])
    project = pyproject("torch==2.8.0", "torchvision==0.23.0")
    planned = "course-x 0.1.0 has requirement intel-openmp==2026.2.0, but you have intel-openmp 2025.1.1."
    assert install.unexpected_pip_check_lines(planned, project) == []   # the project's own name, normalized


def test_main_check_accepts_the_planned_differences_only(monkeypatch, capsys):
    planned = ("accelerate-course-helpers 0.1.0 has requirement intel-openmp==2026.2.0, "
               "but you have intel-openmp 2025.1.1.\n")
    outputs = iter([planned, planned + "timm 1.0.31 requires torchvision, which is not installed.\n"])
    seen = []

    def fake_run(cmd, **kwargs):
        seen.append(cmd)
        return subprocess.CompletedProcess(cmd, 1, stdout=next(outputs), stderr="")

    monkeypatch.setattr("helpers.course.install.subprocess.run", fake_run)
    assert install.main(["check", "--device", "xpu"]) == 0
    assert seen[0] == [sys.executable, "-m", "pip", "check"]
    assert "pip check: ok for the XPU environment" in capsys.readouterr().out
    assert install.main(["check", "--device", "xpu"]) == 1
    assert capsys.readouterr().err == ("pip check found problems the XPU plan does not explain:\n"
                                       "  timm 1.0.31 requires torchvision, which is not installed.\n")


def test_ipex_environment_pins_key_and_commands(tmp_path):
    pins = install.ipex_pins()
    assert "torch==2.8.0" in pins and "intel-extension-for-pytorch==2.8.0" in pins
    assert install.ipex_venv(tmp_path).name == f"venv-ipex-{install.python_tag()}-{install.pins_key(pins)}"
    cmds = install.ipex_commands("/ipex/bin/python", pins, project="/clone")
    pip = ["/ipex/bin/python", "-m", "pip", "install", "--quiet"]
    assert cmds[0] == pip + pins and cmds[1] == pip + ["--no-deps", "-e", "/clone"]
    assert cmds[2][:2] == ["/ipex/bin/python", "-c"] and "intel-extension-for-pytorch" in cmds[2][2]
    loose = tmp_path / "pyproject.toml"
    loose.write_text('[project]\nname = "x"\n')
    with pytest.raises(KeyError):
        install.ipex_pins(loose)


def test_ipex_is_offered_on_linux_x86_64_only():
    assert install.ipex_supported("Linux", "x86_64")
    assert not install.ipex_supported("Linux", "aarch64") and not install.ipex_supported("Darwin", "arm64")
    assert not install.ipex_supported("Windows", "AMD64")


def test_platform_check_resolves_every_platform_and_python_and_reports_failures(monkeypatch, capsys):
    seen = []

    def fake_run(cmd, **kwargs):
        seen.append((cmd, kwargs["env"].get("MACOSX_DEPLOYMENT_TARGET"), kwargs["input"]))
        fails = cmd[cmd.index("--python-platform") + 1] == "aarch64-manylinux_2_28" and "3.13" in cmd
        return subprocess.CompletedProcess(cmd, 1 if fails else 0, stdout="",
                                           stderr="x\nBecause openvino has no wheels with a matching platform tag" if fails else "")

    monkeypatch.setattr("helpers.course.install.subprocess.run", fake_run)
    got = install.check_platforms("/venv/bin/python")
    versions = install.supported_pythons()
    assert versions == ["3.11", "3.12", "3.13"] and len(seen) == len(got) == 4 * 3 + 3
    assert [k for k in got if k[0] == "default"] == [("default", name, v) for v in versions for name in install.PLATFORMS]
    assert [k for k in got if k[0] == "IPEX"] == [("IPEX", "Linux x86-64", v) for v in versions]
    assert got[("default", "Linux aarch64", "3.13")].endswith("matching platform tag")
    assert [k for k, error in got.items() if error] == [("default", "Linux aarch64", "3.13")]
    cmd = seen[0][0]
    assert cmd[:5] == ["/venv/bin/python", "-m", "uv", "pip", "compile"] and "--only-binary" in cmd
    assert cmd[cmd.index("--python-version") + 1] == "3.11" and seen[0][1] == install.MACOS_TARGET
    assert seen[-1][0][seen[-1][0].index("--python-version") + 1] == "3.13"
    assert cmd[5] == "-" and seen[0][2].splitlines() == install.course_requirements()  # the pins on stdin
    assert seen[-1][2].splitlines() == install.ipex_pins()
    monkeypatch.setattr("helpers.course.install.check_platforms", lambda: got)
    assert install.main(["platforms"]) == 1
    out, err = capsys.readouterr()
    assert re.search(r"^default pins, +Linux aarch64 +Python 3.13 +FAILS$", out, re.M) and out.count("FAILS") == 1
    assert err.strip().endswith("Because openvino has no wheels with a matching platform tag")


def test_supported_pythons_key_every_environment(tmp_path):
    assert install.supported_pythons() == ["3.11", "3.12", "3.13"]
    loose = tmp_path / "pyproject.toml"
    loose.write_text('[project]\nname = "x"\nrequires-python = ">=3.12,<3.15"\ndependencies = []\n')
    assert install.supported_pythons(loose) == ["3.12", "3.13", "3.14"]
    loose.write_text('[project]\nname = "x"\nrequires-python = "~=3.11"\ndependencies = []\n')
    with pytest.raises(install.InstallError, match="requires-python must read"):
        install.supported_pythons(loose)
    assert install.python_tag((3, 12, 1)) == "py3.12" and install.python_tag() == f"py3.{sys.version_info[1]}"
    key11, key13 = install.env_key(version=(3, 11)), install.env_key(version=(3, 13, 0))
    assert key11.startswith("py3.11-") and key13.startswith("py3.13-") and key11[7:] == key13[7:]
    assert len(key11[7:]) == 12 and install.env_key() == install.env_key(version=sys.version_info)
    ipex11, ipex13 = install.ipex_venv(tmp_path, version=(3, 11)), install.ipex_venv(tmp_path, version=(3, 13))
    assert ipex11.name == f"venv-ipex-py3.11-{install.pins_key(install.ipex_pins())}" and ipex11 != ipex13


def test_env_key_follows_the_pins_only(tmp_path):
    text = (ROOT / "pyproject.toml").read_text()
    copy = tmp_path / "pyproject.toml"
    copy.write_text("# a comment\n" + text.replace('description = "', 'description = "Other: '))
    assert install.env_key(copy) == install.env_key()
    copy.write_text(text.replace('"tqdm==4.70.1"', '"tqdm==4.70.2"'))
    assert install.env_key(copy) != install.env_key()


def test_course_environments_are_listed_and_removed_with_their_size(tmp_path, capsys):
    for name in ("venv-aaa", "venv-ipex-bbb", "venv-xpu-ccc"):
        (tmp_path / name / "lib").mkdir(parents=True)
        with open(tmp_path / name / "lib" / "x.so", "wb") as f:
            f.truncate(10**8)   # 0.1 GB (sparse)
    (tmp_path / "not-an-env").mkdir()
    (tmp_path / "venv-aaa.lock").touch()                       # a build's lock file: not an environment
    (tmp_path / "venv-old-name").symlink_to(tmp_path / "venv-aaa")   # a renamed environment's old name
    assert install.main(["environments", "--cache", str(tmp_path / "absent")]) == 0
    assert capsys.readouterr().out == ""
    assert install.main(["environments", "--cache", str(tmp_path), "--keep", str(tmp_path / "venv-aaa")]) == 0
    out = capsys.readouterr().out
    assert "2 other course environment(s)" in out and "venv-ipex-bbb, venv-xpu-ccc" in out and "venv-aaa," not in out
    assert install.main(["environments", "--cache", str(tmp_path), "--remove"]) == 0
    assert "removed 4 course environment(s), 0.3 GB freed" in capsys.readouterr().out   # the link's target once
    assert sorted(p.name for p in tmp_path.iterdir()) == ["not-an-env", "venv-aaa.lock"]

# A stand-in for the 8 GB build: says it started, waits, counts itself, writes .installed (or fails: FAIL=1).
FAKE_BUILD = """
import os, pathlib, sys, time
venv, log = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
(log.parent / "started").touch()
while os.environ.get("HOLD") and not (log.parent / "release").exists():  # HOLD=1: build until the test says
    time.sleep(0.05)
with log.open("a") as f:
    f.write(f"built by {os.getpid()}\\n")
if os.environ.get("FAIL"):
    sys.exit(3)
venv.mkdir(parents=True, exist_ok=True)
(venv / ".installed").touch()
"""


def _build_locked(venv, log, python=sys.executable, flags=(), **env):
    return subprocess.Popen([python, *flags, "-m", "helpers.course.install", "lock", "--venv", str(venv),
                             "--cache", str(venv.parent), "--", sys.executable, "-c", FAKE_BUILD, str(venv), str(log)],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, **env}, start_new_session=True)


def first_line(proc, seconds=60.0):
    """The first line ``proc`` prints, failing after ``seconds`` instead of hanging."""
    import select

    ready, _, _ = select.select([proc.stdout], [], [], seconds)
    assert ready, f"no output within {seconds} s"
    return proc.stdout.readline()


def _wait_for(path, seconds=30.0):
    end = time.monotonic() + seconds
    while not path.exists():
        assert time.monotonic() < end, f"{path} never appeared"
        time.sleep(0.05)


def test_two_setups_at_once_build_the_environment_once_and_the_second_reuses_it(tmp_path):
    venv, log = tmp_path / "cache" / "venv-py3.11-abc", tmp_path / "builds.log"
    first = _build_locked(venv, log, HOLD="1")
    _wait_for(tmp_path / "started")           # the first one holds the lock and is building
    second = _build_locked(venv, log)
    said = first_line(second)           # the second one waits, and says so; then the first one finishes
    (tmp_path / "release").touch()
    out1, out2 = first.communicate(timeout=60)[0], said + second.communicate(timeout=60)[0]
    assert first.returncode == 0 and second.returncode == 0, out1 + out2
    assert len(log.read_text().splitlines()) == 1, "built twice"
    assert (venv / ".installed").is_file() and venv.with_name("venv-py3.11-abc.lock").is_file()
    assert "Another `make setup` is building" in out2 and "waiting for it to finish" in out2
    assert f"{venv} is ready (built by the other run): reusing it" in out2
    assert "waiting" not in out1 and said.startswith(f"Another `make setup` is building {venv} (process {first.pid} (`")
    assert said.rstrip().endswith("waiting for it to finish, then reusing it")


def test_a_failed_or_killed_build_leaves_the_next_one_to_build(tmp_path):
    venv, log = tmp_path / "venv-x", tmp_path / "builds.log"
    failing = _build_locked(venv, log, FAIL="1", HOLD="1")
    _wait_for(tmp_path / "started")
    waiting = _build_locked(venv, log)
    said = first_line(waiting)
    (tmp_path / "release").touch()
    out = said + waiting.communicate(timeout=60)[0]
    assert failing.wait(timeout=60) == 3 and waiting.returncode == 0, out
    assert "did not finish" in out and "building it here" in out and len(log.read_text().splitlines()) == 2
    # kill -9 in the middle of a build: the kernel drops the lock, the next build does not hang
    (tmp_path / "started").unlink()
    (tmp_path / "release").unlink()
    venv2 = tmp_path / "venv-y"
    killed = _build_locked(venv2, log, HOLD="1")
    _wait_for(tmp_path / "started")
    os.killpg(killed.pid, signal.SIGKILL)  # the build-locked process and its build, as a killed make's group
    killed.communicate(timeout=10)
    start, said = time.monotonic(), []
    rc = install.build_locked(venv2, [sys.executable, "-c", FAKE_BUILD, str(venv2), str(log)], say=said.append)
    assert rc == 0 and (venv2 / ".installed").is_file() and time.monotonic() - start < 30
    assert not any("waiting" in line for line in said), said


def test_build_locked_needs_a_command(tmp_path, capsys):
    with pytest.raises(install.InstallError, match="needs the build command"):
        install.main(["lock", "--venv", str(tmp_path / "v"), "--"])
    assert install.build_locked(tmp_path / "v", [sys.executable, "-c", "raise SystemExit(5)"], say=print) == 5


def _fake_lock_tool(folder):
    """A stand-in for the small filelock venv: a bin/python that runs this test's Python (which has filelock)."""
    python = folder / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text(f"#!/bin/sh\nexec {sys.executable} \"$@\"\n")
    python.chmod(0o755)


def test_a_python_without_filelock_takes_the_lock_through_the_lock_tool(tmp_path):
    """make runs build-locked with the system python3, which has no filelock (-S here: no site-packages)."""
    cache = tmp_path / "cache"
    _fake_lock_tool(cache / f".lock-tool-{install.python_tag()}")
    venv, log = cache / "venv-z", tmp_path / "builds.log"
    proc = _build_locked(venv, log, flags=("-S",))
    out = proc.communicate(timeout=60)[0]
    assert proc.returncode == 0, out
    assert (venv / ".installed").is_file() and len(log.read_text().splitlines()) == 1


def test_lock_tool_is_made_once_in_a_private_folder_and_renamed_into_place(tmp_path):
    made = []

    def make(folder):
        made.append(folder)
        assert folder.parent == tmp_path and folder.name.startswith(f".lock-tool-{install.python_tag()}.tmp-")
        _fake_lock_tool(folder)

    python = install.lock_tool(tmp_path, make=make)
    assert python == tmp_path / f".lock-tool-{install.python_tag()}" / "bin" / "python" and python.is_file()
    assert install.lock_tool(tmp_path, make=make) == python and len(made) == 1  # made once
    assert sorted(p.name for p in tmp_path.iterdir()) == [f".lock-tool-{install.python_tag()}"]  # nothing left over

    other = tmp_path / "other"

    def race(folder):  # another clone renames its copy into place while this one is making its own
        _fake_lock_tool(folder)
        _fake_lock_tool(other / f".lock-tool-{install.python_tag()}")
        os.rename(other / f".lock-tool-{install.python_tag()}", other / "won")

    shutil.rmtree(tmp_path / f".lock-tool-{install.python_tag()}")
    (tmp_path / f".lock-tool-{install.python_tag()}").mkdir()  # a broken one (no python): replaced
    assert install.lock_tool(tmp_path, make=race).is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == [f".lock-tool-{install.python_tag()}", "other"]


def test_a_lock_tool_that_cannot_be_made_says_why(monkeypatch, tmp_path):
    def fail(cmd, **kwargs):
        return subprocess.CompletedProcess(cmd, 1, stdout="", stderr="ERROR: No matching distribution found for filelock")

    monkeypatch.setattr("helpers.course.install.subprocess.run", fail)
    with pytest.raises(install.InstallError, match="could not make the lock tool .*No matching distribution.*network"):
        install.lock_tool(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == []   # the private folder is gone

