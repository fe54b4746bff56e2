"""Made-up machines for the course tools' tests: a doctor's facts (shaped like ``doctor.gather()``'s) and
the result rows of synthetic machines for the workshop kit."""

import pytest


def _fake_facts(**over):
    facts = {
        "python": {"version": [3, 11, 7], "supported": ["3.11", "3.12", "3.13"], "prefix": "/env", "course_env": True,
                   "executable": "/env/bin/python"},
        "pins": [{"name": "torch", "spec": "==2.8.0", "installed": "2.8.0", "matches": True}],
        "torch": {"version": "2.8.0", "cuda": None, "xpu": False},
        "fingerprint": {"cpu_model": "Fake CPU", "sockets": 1, "physical_cores": 4, "logical_cores": 8,
                        "numa_nodes": 1, "openmp": ["libgomp.so.1"], "versions": {"nni": "3.0", "torch-pruning": "1.6.1"}},
        "isa": {"avx2": True, "avx512": False, "native_bf16": False, "amx": False},
        "devices": [],
        "compiler": {"cxx_env": None, "cxx": "/usr/bin/g++", "runs": True, "version": "g++ 12.2.0", "include": "/inc",
                     "python_h": True, "python": "3.11"},
        "platform": {"system": "Linux", "machine": "x86_64", "wsl": False, "left_out": [],
                     "ipex_wheels": True},
        "ipex_env": {"python": None, "ok": False, "torch": None, "torchvision": None, "ipex": None,
                     "message": "the IPEX environment is not installed"},
        "imports": {"nni": None, "torch_pruning": None},
        "allocators": {"jemalloc": None, "tcmalloc": None}, "mpirun": (None, None), "kernel": {"same_env": True},
        "memory": {"available": 8 * 2**30, "total": 16 * 2**30}, "disk": {"results": 100 * 2**30},
    }
    facts.update(over)
    return facts


#: What ``gather`` says of the platform on the other platforms the course installs on (the pins' markers decide
#: ``left_out``; test_doctor.py checks these lists against the installed metadata).
FAKE_PLATFORMS = {
    "Linux aarch64": {"system": "Linux", "machine": "aarch64", "wsl": False,
                      "left_out": ["intel-openmp", "nni", "openvino"], "ipex_wheels": False},
    "macOS arm64": {"system": "Darwin", "machine": "arm64", "wsl": False,
                    "left_out": ["intel-openmp", "nni"], "ipex_wheels": False},
    "Windows x86-64": {"system": "Windows", "machine": "AMD64", "wsl": False,
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


# One machine's result rows, as the workshop packs and pools them
# (test_workshop.py): synthetic machines, with the private names of a
# made-up user ("alice") left where a careless notebook might leave them.
FAKE_NAMES = {"home": "/home/alice", "user": "alice", "host": "alice-laptop.example.org", "host_short": "alice-laptop"}


@pytest.fixture()
def fake_names() -> dict[str, str]:
    """The private names (as ``workshop.private_names`` gives them) of a made-up user."""
    return dict(FAKE_NAMES)


def _fingerprint(i, cores, amx=False, gpu=None):
    return {"cpu_model": f"Test CPU {i}", "sockets": 1, "physical_cores": cores, "logical_cores": 2 * cores,
            "numa_nodes": 1, "bf16": {"avx2": True, "avx512": i > 0, "native_bf16": i > 0, "amx": amx},
            "accelerators": [gpu] if gpu else [], "openmp": ["libgomp.so.1"],
            "versions": {"torch": "2.8.0"}, "machine_id": f"{i:x}" * 16}


@pytest.fixture()
def fingerprint():
    """``fingerprint(i, cores, amx=False, gpu=None)``: machine ``i``'s fingerprint (machine id ``f"{i:x}" * 16``)."""
    return _fingerprint


@pytest.fixture()
def synthetic_rows(fake_names):
    """``synthetic_rows(i, cores, amx=False, gpu=None, slow=1.0, noisy=False)``: machine ``i``'s rows of
    two experiments (02/batch_size epoch_time over 8 rounds, b32 at 2 s and b256 at ``slow`` s; accuracy
    in one round), each row carrying a private path and user name in ``extra``."""
    from helpers import results

    def make(i, cores, amx=False, gpu=None, slow=1.0, noisy=False):
        fp = _fingerprint(i, cores, amx, gpu)
        # 8 interleaved rounds: a steady machine scales both variants alike in every round; on the noisy
        # one the rounds disturb the two variants in opposite directions (the verdict cannot call it)
        drift = [1.0, 0.98, 1.02, 1.0, 0.98, 1.02, 1.0, 1.0]
        if noisy:
            b32 = [2.0 + d for d in (0, -0.9, 0.9, 0, -0.9, 0.9, 0, 0)]
            b256 = [slow + d for d in (0, 0.9, -0.9, 0, 0.9, -0.9, 0, 0)]
        else:
            b32, b256 = [2.0 * d for d in drift], [slow * d for d in drift]
        rows = results.make_rows("02", "batch_size", {"b32": b32, "b256": b256},
                                 metric="epoch_time", unit="s", baseline="b32", published={"b32": 10.0, "b256": 4.0},
                                 published_source="book ch. 2", fingerprint=fp, profile="workshop", data="standin")
        rows += results.make_rows("02", "batch_size", {"b32": [80.0], "b256": [78.0]}, metric="accuracy", unit="%",
                                  baseline="b32", lower_is_better=False, fingerprint=fp, profile="workshop",
                                  data="standin")
        for r in rows:  # what a careless notebook might leave in a row
            r.extra = {"log": f"{fake_names['home']}/course/results/x.log", "who": fake_names["user"]}
        return rows

    return make


@pytest.fixture()
def write_submission(tmp_path, fake_names):
    """``write_submission(name, rows)``: ``workshop.pack(rows, fake_names)`` written to ``tmp_path / name``."""
    import json

    from helpers.course import workshop

    def write(name, rows):
        path = tmp_path / name
        path.write_text(json.dumps(workshop.pack(rows, fake_names)))
        return path

    return write


@pytest.fixture()
def reproduce_cell(tmp_path):
    """``reproduce_cell(code, name, others=())``: ``reproduce.run("smoke")`` over a notebook ``01_<name>`` of one code
    cell (plus empty notebooks named in ``others``) into ``tmp_path/results``; the run folder. The caller's
    environment comes back unchanged (asserted)."""
    def run(code: str, name: str, others: tuple[str, ...] = ()):
        import os

        import nbformat
        import threadpoolctl  # noqa: F401  -- sets KMP_DUPLICATE_LIB_OK on import: not reproduce's doing

        from helpers.course import reproduce

        nbs = tmp_path / "nbs"
        nbs.mkdir()
        nb = nbformat.v4.new_notebook()
        nb.cells = [nbformat.v4.new_code_cell(code)]
        nbformat.write(nb, nbs / f"01_{name}.ipynb")
        for other in others:
            nbformat.write(nbformat.v4.new_notebook(), nbs / other)
        before = dict(os.environ)
        folder = reproduce.run("smoke", root=tmp_path / "results", notebooks=nbs)
        assert dict(os.environ) == before  # nothing set, nothing changed in the caller
        return folder
    return run
