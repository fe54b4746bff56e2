"""Made-up facts, shaped like ``helpers.doctor.facts.gather()``'s, for the doctor's tests."""

import pytest


def _fake_facts(**over):
    facts = {
        "python": {"version": [3, 11, 7], "requires": ">=3.11,<3.14", "prefix": "/env", "course_env": True,
                   "executable": "/env/bin/python"},
        "pins": [{"name": "torch", "spec": "==2.8.0", "installed": "2.8.0", "matches": True}],
        "torch": {"version": "2.8.0", "cuda": None, "xpu": False},
        "fingerprint": {"cpu_model": "Fake CPU", "sockets": 1, "physical_cores": 4, "logical_cores": 8,
                        "numa_nodes": 1, "openmp": ["libgomp.so.1"], "versions": {"nni": "3.0", "torch-pruning": "1.6.1"}},
        "isa": {"avx2": True, "avx512": False, "native_bf16": False, "amx": False},
        "devices": [{"name": "cpu", "description": "cpu"}], "accelerators": [],
        "compiler": {"cxx_env": None, "cxx": "/usr/bin/g++", "runs": True, "version": "g++ 12.2.0", "include": "/inc",
                     "python_h": True, "python": "3.11"},
        "platform": {"system": "Linux", "machine": "x86_64", "macos": None, "wsl": False, "left_out": [],
                     "ipex_wheels": True},
        "ipex_env": {"python": None, "ok": False, "torch": None, "torchvision": None, "ipex": None,
                     "message": "the IPEX environment is not installed"},
        "ipex_pins": {"torch": "2.8.0", "intel-extension-for-pytorch": "2.8.0"},
        "imports": {"nni": None, "torch_pruning": None},
        "allocators": {"jemalloc": None, "tcmalloc": None}, "mpirun": (None, None), "kernel": {"same_env": True},
        "datasets": {"source": "standin", "cached": {"cifar10": False}, "online": None},
        "memory": {"available": 8 * 2**30, "total": 16 * 2**30}, "disk": {"results": 100 * 2**30}, "parity": [],
    }
    facts.update(over)
    return facts


#: What ``platform_facts`` says on the other platforms the course installs on (the pins' markers decide
#: ``left_out``; tests/doctor/test_facts.py checks these lists against the installed metadata).
FAKE_PLATFORMS = {
    "Linux aarch64": {"system": "Linux", "machine": "aarch64", "macos": None, "wsl": False,
                      "left_out": ["intel-openmp", "nni", "openvino"], "ipex_wheels": False},
    "macOS arm64": {"system": "Darwin", "machine": "arm64", "macos": "14.5", "wsl": False,
                    "left_out": ["intel-openmp", "nni"], "ipex_wheels": False},
    "Windows x86-64": {"system": "Windows", "machine": "AMD64", "macos": None, "wsl": False,
                       "left_out": ["intel-openmp"], "ipex_wheels": False},
}


@pytest.fixture
def fake_facts():
    """``fake_facts(**over)``: a healthy machine's facts, with ``over`` replacing some of them."""
    return _fake_facts


@pytest.fixture
def fake_platforms():
    """{label: platform facts} for Linux aarch64, macOS arm64 and Windows x86-64 (fresh copies)."""
    return {label: {**plat, "left_out": list(plat["left_out"])} for label, plat in FAKE_PLATFORMS.items()}
