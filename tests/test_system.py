import platform
import re
import sys
from importlib import metadata
from pathlib import Path

import pytest

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


def fake_topology(n_cores: int, smt: int) -> system.Topology:
    # Linux numbering: cpus 0..n-1 are the first threads of each core, n..2n-1 their siblings
    cpus = [system.LogicalCPU(cpu=t * n_cores + c, core=c, socket=0) for t in range(smt) for c in range(n_cores)]
    return system.Topology(cpus=tuple(cpus))


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


def test_affinity_strings():
    assert system.gomp_cpu_affinity([0, 2, 4]) == "0 2 4"
    assert system.kmp_affinity([1, 3]) == "granularity=fine,proclist=[1,3],explicit"
    with pytest.raises(ValueError):
        system.gomp_cpu_affinity([])


def test_openmp_env_binds_one_thread_per_core_first(monkeypatch):
    topo = fake_topology(4, 2)
    assert system.openmp_env("gnu-default", 3, topo) == {"OMP_NUM_THREADS": "3"}
    bound = system.openmp_env("gnu-bound", 6, topo)
    assert bound["GOMP_CPU_AFFINITY"] == "0 1 2 3 4 5"  # 4 cores first, then 2 SMT siblings
    assert bound["OMP_PROC_BIND"] == "TRUE"
    assert "OMP_SCHEDULE" not in bound  # read only by schedule(runtime) loops, which PyTorch's are not
    with pytest.raises(ValueError, match="9 threads"):
        system.openmp_env("gnu-bound", 9, topo)
    with pytest.raises(ValueError, match="Unknown OpenMP variant"):
        system.openmp_env("tbb", 2, topo)


def test_openmp_env_intel(monkeypatch, tmp_path):
    lib = tmp_path / "lib" / "libiomp5.so"
    lib.parent.mkdir()
    lib.write_bytes(b"")
    monkeypatch.setattr(system.sys, "prefix", str(tmp_path))
    env = system.openmp_env("intel", 2, fake_topology(2, 1))
    assert env["LD_PRELOAD"] == str(lib)
    assert env["KMP_AFFINITY"].endswith("proclist=[0,1],explicit") and env["KMP_BLOCKTIME"] == "0"
    monkeypatch.setattr(system.sys, "prefix", str(tmp_path / "none"))
    monkeypatch.setattr(system.sys, "base_prefix", str(tmp_path / "none"))
    assert system.intel_openmp_library() is None
    with pytest.raises(RuntimeError, match="pip install intel-openmp"):
        system.openmp_env("intel", 2, fake_topology(2, 1))


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


def test_openmp_in_fresh_process_default_is_gnu():
    topo = system.topology()
    n = min(2, topo.physical_cores)
    probes = system.openmp_in_fresh_processes({"two": {"OMP_NUM_THREADS": "2"}, "one": {"OMP_NUM_THREADS": "1"},
                                               "bound": system.openmp_env("gnu-bound", n, topo)})
    assert list(probes) == ["two", "one", "bound"]  # keyed and ordered like the request
    for name, threads in (("two", 2), ("one", 1), ("bound", n)):
        probe = probes[name]
        assert probe["served_by"] == "GNU OpenMP (libgomp)" and not probe["intel_initialised"]
        assert probe["settings"]["OMP_NUM_THREADS"] == str(threads)  # each process got its own variables
        assert probe["torch_threads"] == threads
    # one affinity line per thread of a team; one thread opens no parallel region, so reports none
    assert len(probes["two"]["bound_to"]) == 2 and probes["one"]["bound_to"] == []
    assert probes["one"]["binding"].startswith("not reported")
    assert probes["bound"]["settings"]["OMP_PROC_BIND"] == "TRUE"
    if n == 2:  # pinned where GOMP_CPU_AFFINITY said
        assert probes["bound"]["bound_to"] == [str(c) for c in topo.one_cpu_per_core()[:2]]
        assert probes["bound"]["binding"].startswith("pinned, one CPU each")
    assert system.openmp_in_fresh_processes({}) == {}


@pytest.mark.skipif(system.intel_openmp_library() is None, reason="intel-openmp is not installed (Linux x86-64 only)")
def test_openmp_in_fresh_process_sees_intel_with_preload():
    topo = system.topology()
    n = min(2, topo.physical_cores)
    probe = system.openmp_in_fresh_process(system.openmp_env("intel", n, topo))
    assert probe["served_by"] == "Intel OpenMP (libiomp5)"
    assert probe["settings"]["KMP_BLOCKTIME"] in ("0", "0ms")
    assert probe["settings"]["OMP_PROC_BIND"] == "intel"  # Intel's own settings, not GNU's 'FALSE'
    assert probe["gnu_settings"]["OMP_PROC_BIND"] == "FALSE"  # libgomp is loaded too, but idle
    if n == 2:  # KMP_AFFINITY's proclist, as the runtime applied it
        assert probe["bound_to"] == [str(c) for c in topo.one_cpu_per_core()[:2]]


def test_openmp_in_fresh_process_reports_failures(monkeypatch):
    monkeypatch.setattr(system, "_PROBE", "raise SystemExit(3)")
    with pytest.raises(RuntimeError, match="exit 3"):
        system.openmp_in_fresh_process()
    with pytest.raises(RuntimeError, match="exit 3"):
        system.openmp_in_fresh_processes({"a": None, "b": {"OMP_NUM_THREADS": "1"}})


GNU_DISPLAY = """
OPENMP DISPLAY ENVIRONMENT BEGIN
  _OPENMP = '201511'
  OMP_NUM_THREADS = '2'
  OMP_PROC_BIND = 'FALSE'
  GOMP_CPU_AFFINITY = ''
OPENMP DISPLAY ENVIRONMENT END
"""
INTEL_DISPLAY = """
OPENMP DISPLAY ENVIRONMENT BEGIN
   _OPENMP='202111'
  [host] KMP_BLOCKTIME='0ms
  [host] OMP_NESTED: deprecated; max-active-levels-var=1
  [host] OMP_NUM_THREADS='2'
  [host] OMP_PROC_BIND='intel'
  [host] KMP_AFFINITY='noverbose,warnings,granularity=thread,proclist=[0,1],explicit'
OPENMP DISPLAY ENVIRONMENT END
OMP: pid 11 tid 11 thread 0 bound to OS proc set {0}
OMP: pid 11 tid 12 thread 1 bound to OS proc set {1}
"""


def test_parse_openmp_display_keeps_each_runtime_apart():
    gnu = system.parse_openmp_display(GNU_DISPLAY + "level 1 thread 0x7f affinity 0-1\nlevel 1 thread 0x7e affinity 0-1\n")
    assert gnu["served_by"] == "GNU OpenMP (libgomp)" and gnu["settings"]["OMP_PROC_BIND"] == "FALSE"
    assert gnu["bound_to"] == ["0-1", "0-1"] and gnu["binding"] == "not pinned: every thread may run on CPUs 0-1"
    both = system.parse_openmp_display(GNU_DISPLAY + INTEL_DISPLAY)
    assert both["served_by"] == "Intel OpenMP (libiomp5)" and both["intel_initialised"] and both["gnu_loaded"]
    assert both["settings"]["OMP_PROC_BIND"] == "intel" and both["gnu_settings"]["OMP_PROC_BIND"] == "FALSE"
    assert both["settings"]["KMP_BLOCKTIME"] == "0ms" and both["settings"]["_OPENMP"] == "202111"
    assert "OMP_NESTED: deprecated; max-active-levels-var" not in both["settings"]
    assert both["bound_to"] == ["0", "1"]
    assert system.parse_openmp_display("")["served_by"] == "unknown"


def test_binding_summary():
    assert system.binding_summary(["0", "1"]) == "pinned, one CPU each: thread 0 on 0, thread 1 on 1"
    assert system.binding_summary(["0-3", "0-3"]) == "not pinned: every thread may run on CPUs 0-3"
    assert system.binding_summary(["0,2", "1,3"]) == "thread 0 on 0,2; thread 1 on 1,3"
    assert system.binding_summary(["0", "0"]) == "not pinned: every thread may run on CPUs 0"
    assert system.binding_summary([]).startswith("not reported")
