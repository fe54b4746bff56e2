"""Made-up facts, shaped like ``helpers.doctor.facts.gather()``'s, for the doctor's tests."""

import pytest


def _fake_facts(**over):
    facts = {
        "python": {"version": [3, 11, 7], "requires": ">=3.11,<3.12", "prefix": "/env", "course_env": True},
        "pins": [{"name": "torch", "spec": "==2.8.0", "installed": "2.8.0", "matches": True}],
        "torch": {"version": "2.8.0", "cuda": None, "xpu": False},
        "fingerprint": {"cpu_model": "Fake CPU", "sockets": 1, "physical_cores": 4, "logical_cores": 8,
                        "numa_nodes": 1, "openmp": ["libgomp.so.1"], "versions": {"nni": "3.0", "torch-pruning": "1.6.1"}},
        "isa": {"avx2": True, "avx512": False, "native_bf16": False, "amx": False},
        "devices": [{"name": "cpu", "description": "cpu"}], "accelerators": [],
        "ipex": {"installed": None}, "imports": {"nni": None, "torch_pruning": None},
        "allocators": {"jemalloc": None, "tcmalloc": None}, "mpirun": (None, None), "kernel": {"same_env": True},
        "datasets": {"source": "standin", "cached": {"cifar10": False}, "online": None},
        "memory": {"available": 8 * 2**30, "total": 16 * 2**30}, "disk": {"results": 100 * 2**30}, "parity": [],
    }
    facts.update(over)
    return facts


@pytest.fixture
def fake_facts():
    """``fake_facts(**over)``: a healthy machine's facts, with ``over`` replacing some of them."""
    return _fake_facts
