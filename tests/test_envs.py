import sys
import tomllib

import pytest

from helpers import envs


def test_python_tag_and_pins_key():
    assert envs.python_tag((3, 12, 1)) == "py3.12" and envs.python_tag() == f"py3.{sys.version_info[1]}"
    pins = ["torch==2.8.0", "six==1.16.0"]
    assert envs.pins_key(pins) == envs.pins_key(list(reversed(pins))) != envs.pins_key(pins[:1])
    assert len(envs.pins_key(pins)) == 12


def test_ipex_venv_is_keyed_by_its_pins_and_the_python(tmp_path):
    pins = tomllib.loads((envs.ROOT / "pyproject.toml").read_text())["tool"]["course"]["ipex-environment"]["dependencies"]
    folder = envs.ipex_venv(tmp_path, version=(3, 11))
    assert folder == tmp_path / f"venv-ipex-py3.11-{envs.pins_key(pins)}" != envs.ipex_venv(tmp_path, version=(3, 13))
    assert envs.ipex_venv().parent == envs.DEFAULT_CACHE
    bare = tmp_path / "pyproject.toml"
    bare.write_text('[project]\nname = "x"\n')
    with pytest.raises(KeyError):
        envs.ipex_venv(tmp_path, bare)
