"""Tests of helpers.system: topology, bf16 flags, runtimes, versions, fingerprint and the private machine id."""

import platform
import re
import sys
from importlib import metadata
from pathlib import Path

from helpers import system


def make_sysfs(root: Path, layout: list[tuple[int, int, int]]) -> Path:
    cpu_dir = root / "cpu"
    for cpu, core, socket in layout:
        topo = cpu_dir / f"cpu{cpu}" / "topology"
        topo.mkdir(parents=True)
        (topo / "core_id").write_text(f"{core}\n")
        (topo / "physical_package_id").write_text(f"{socket}\n")
    (root / "node" / "node0").mkdir(parents=True)
    return cpu_dir


def test_topology_from_sysfs(tmp_path, monkeypatch):
    monkeypatch.setattr(system.os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    sysfs = make_sysfs(tmp_path, [(0, 0, 0), (1, 1, 0), (2, 0, 0), (3, 1, 0)])
    topo = system.topology(sysfs)
    assert (topo.logical_cores, topo.physical_cores, topo.sockets, topo.threads_per_core) == (4, 2, 1, 2)
    assert topo.one_cpu_per_core() == [0, 1]
    assert topo.smt_siblings() == [[0, 2], [1, 3]]
    assert topo.numa_nodes == 1


def test_real_topology_is_consistent():
    topo = system.topology()
    assert 1 <= topo.physical_cores <= topo.logical_cores
    assert len(topo.one_cpu_per_core()) == topo.physical_cores


def test_bf16_support_from_flags():
    assert system.cpu_bf16_support(frozenset({"avx2"})) == {
        "native_bf16": False, "amx": False, "ipex_bf16_prepack": False, "avx2": True, "avx512": False}
    spr = system.cpu_bf16_support(frozenset({"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_bf16", "amx_bf16"}))
    assert spr["native_bf16"] and spr["amx"] and spr["ipex_bf16_prepack"]


def test_openmp_runtimes_lists_torchs_runtime_and_nothing_else():
    import torch

    runtimes = system.openmp_runtimes()
    assert runtimes and all(set(rt) == {"library", "internal_api", "version", "num_threads"} for rt in runtimes)
    assert all("omp" in rt["library"] for rt in runtimes), "only OpenMP runtimes (numpy's OpenBLAS is loaded too)"
    if sys.platform == "linux":  # PyPI's torch links GNU OpenMP; its thread count is torch's
        gomp = [rt for rt in runtimes if rt["library"].startswith("libgomp")]
        assert gomp and gomp[0]["num_threads"] == str(torch.get_num_threads())


def test_fingerprint_and_report():
    import torch

    fp = system.fingerprint()
    for key in ("cpu_model", "physical_cores", "logical_cores", "openmp", "versions", "bf16"):
        assert key in fp
    assert fp["versions"]["torch"] == torch.__version__
    assert fp["openmp"] == [rt["library"] for rt in system.openmp_runtimes()]
    assert torch.__version__ in system.env_report()


def test_library_versions_come_from_metadata_and_the_build(monkeypatch):
    import torch

    versions = system.library_versions()
    for dist in ("torchvision", "nni", "torch-pruning"):
        assert versions[dist] == metadata.version(dist)
    assert versions["python"] == platform.python_version() and versions["torch"] == torch.__version__
    config = torch.__config__.show()
    if "MKL-DNN" in config or "oneDNN" in config:
        assert re.fullmatch(r"\d+\.\d+(\.\d+)*", versions["onednn"]), versions["onednn"]
    if "Math Kernel Library" in config:
        assert re.fullmatch(r"\d{4}\.\d+(\.\d+)*", versions["mkl"]), versions["mkl"]
    real = metadata.version

    def without_nni(dist):
        if dist == "nni":
            raise metadata.PackageNotFoundError(dist)
        return real(dist)

    monkeypatch.setattr(system.metadata, "version", without_nni)
    assert system.library_versions()["nni"] == "not installed"


def test_build_versions_parse_torchs_config_text():
    text = ("  - Intel(R) oneAPI Math Kernel Library Version 2024.2-Product Build 20240605 for Intel(R) 64 "
            "architecture applications\n  - Intel(R) MKL-DNN v3.7.1 (Git Hash 8d263e693366ef8db40acc569cc7d8edf644556d)\n"
            "  - OpenMP 201511 (a.k.a. OpenMP 4.5)\n")
    assert system.build_versions(text) == {"mkl": "2024.2", "onednn": "3.7.1"}
    assert system.build_versions("  - oneDNN v3.9 (Git Hash abc)") == {"onednn": "3.9"}
    assert system.build_versions("  - GCC 13.3") == {}


def test_machine_id_is_stable_per_salt_and_kept_in_the_cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    assert system.cache_dir() == tmp_path / ".cache" / "accelerate-course"
    assert system.machine_id() == system.machine_id() and (system.cache_dir() / "machine-salt").exists()
    a = system.machine_id(tmp_path / "one")
    assert a == system.machine_id(tmp_path / "one") and len(a) == 16
    assert system.machine_id(tmp_path / "two") != a  # another salt, another id
    (tmp_path / "three").mkdir()
    (tmp_path / "three" / "machine-salt").write_text("fixed\n")
    assert system.machine_id(tmp_path / "three") == system.machine_id(tmp_path / "three")


def test_machine_id_is_a_hash_of_salt_machine_and_host(tmp_path, monkeypatch):
    import hashlib

    (tmp_path / "machine-salt").write_text("pepper\n")
    monkeypatch.setattr("helpers.system._machine_identity", lambda: "machine-1")
    monkeypatch.setattr("helpers.system.socket.gethostname", lambda: "node01")
    assert system.machine_id(tmp_path) == hashlib.sha256(b"pepper|machine-1|node01").hexdigest()[:16]
    monkeypatch.setattr("helpers.system.socket.gethostname", lambda: "node02")  # a cluster's nodes share a home folder
    assert system.machine_id(tmp_path) == hashlib.sha256(b"pepper|machine-1|node02").hexdigest()[:16]
    unwritable = tmp_path / "a-file"
    unwritable.write_text("")  # the cache 'folder' is a file: no salt can be kept, the id still works
    assert len(system.machine_id(unwritable)) == 16 and unwritable.read_text() == ""
