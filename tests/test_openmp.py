"""Tests of helpers.openmp: each variant's environment from the topology, and which runtime served torch
(and how it bound its threads) as read in fresh probe processes."""

import pytest

from helpers import openmp, system


def fake_topology(n_cores: int, smt: int) -> system.Topology:
    # Linux numbering: cpus 0..n-1 are the first threads of each core, n..2n-1 their siblings
    cpus = [system.LogicalCPU(cpu=t * n_cores + c, core=c, socket=0) for t in range(smt) for c in range(n_cores)]
    return system.Topology(cpus=tuple(cpus))


def test_kmp_affinity():
    assert openmp.kmp_affinity([1, 3]) == "granularity=fine,proclist=[1,3],explicit"


def test_openmp_env_binds_one_thread_per_core_first(monkeypatch):
    topo = fake_topology(4, 2)
    assert openmp.openmp_env("gnu-default", 3, topo) == {"OMP_NUM_THREADS": "3"}
    bound = openmp.openmp_env("gnu-bound", 6, topo)
    assert bound["GOMP_CPU_AFFINITY"] == "0 1 2 3 4 5"  # 4 cores first, then 2 SMT siblings
    assert bound["OMP_PROC_BIND"] == "TRUE"
    assert "OMP_SCHEDULE" not in bound  # read only by schedule(runtime) loops, which PyTorch's are not
    with pytest.raises(ValueError, match="9 threads"):
        openmp.openmp_env("gnu-bound", 9, topo)
    with pytest.raises(ValueError, match="Unknown OpenMP variant"):
        openmp.openmp_env("tbb", 2, topo)


def test_openmp_env_intel(monkeypatch, tmp_path):
    lib = tmp_path / "lib" / "libiomp5.so"
    lib.parent.mkdir()
    lib.write_bytes(b"")
    monkeypatch.setattr("helpers.openmp.sys.prefix", str(tmp_path))
    env = openmp.openmp_env("intel", 2, fake_topology(2, 1))
    assert env["LD_PRELOAD"] == str(lib)
    assert env["KMP_AFFINITY"].endswith("proclist=[0,1],explicit") and env["KMP_BLOCKTIME"] == "0"
    monkeypatch.setattr("helpers.openmp.sys.prefix", str(tmp_path / "none"))
    monkeypatch.setattr("helpers.openmp.sys.base_prefix", str(tmp_path / "none"))
    assert openmp.intel_openmp_library() is None
    with pytest.raises(RuntimeError, match="pip install intel-openmp"):
        openmp.openmp_env("intel", 2, fake_topology(2, 1))


def test_openmp_in_fresh_process_default_is_gnu():
    topo = system.topology()
    n = min(2, topo.physical_cores)
    probes = openmp.openmp_in_fresh_processes({"two": {"OMP_NUM_THREADS": "2"}, "one": {"OMP_NUM_THREADS": "1"},
                                               "bound": openmp.openmp_env("gnu-bound", n, topo)})
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
    assert openmp.openmp_in_fresh_processes({}) == {}


@pytest.mark.skipif(openmp.intel_openmp_library() is None, reason="intel-openmp is not installed (Linux x86-64 only)")
def test_openmp_in_fresh_process_sees_intel_with_preload():
    topo = system.topology()
    n = min(2, topo.physical_cores)
    probe = openmp.openmp_in_fresh_processes({"intel": openmp.openmp_env("intel", n, topo)})["intel"]
    assert probe["served_by"] == "Intel OpenMP (libiomp5)"
    assert probe["settings"]["KMP_BLOCKTIME"] in ("0", "0ms")
    assert probe["settings"]["OMP_PROC_BIND"] == "intel"  # Intel's own settings, not GNU's 'FALSE'
    assert probe["gnu_settings"]["OMP_PROC_BIND"] == "FALSE"  # libgomp is loaded too, but idle
    if n == 2:  # KMP_AFFINITY's proclist, as the runtime applied it
        assert probe["bound_to"] == [str(c) for c in topo.one_cpu_per_core()[:2]]


def test_openmp_in_fresh_process_reports_failures(monkeypatch):
    monkeypatch.setattr("helpers.openmp._PROBE", ("-c", "raise SystemExit(3)"))
    with pytest.raises(RuntimeError, match="exit 3"):
        openmp.openmp_in_fresh_processes({"a": None, "b": {"OMP_NUM_THREADS": "1"}})


def test_parse_openmp_display_keeps_each_runtime_apart():
    gnu = openmp.parse_openmp_display(GNU_DISPLAY + "level 1 thread 0x7f affinity 0-1\nlevel 1 thread 0x7e affinity 0-1\n")
    assert gnu["served_by"] == "GNU OpenMP (libgomp)" and gnu["settings"]["OMP_PROC_BIND"] == "FALSE"
    assert gnu["bound_to"] == ["0-1", "0-1"] and gnu["binding"] == "not pinned: every thread may run on CPUs 0-1"
    both = openmp.parse_openmp_display(GNU_DISPLAY + INTEL_DISPLAY)
    assert both["served_by"] == "Intel OpenMP (libiomp5)" and both["intel_initialised"] and both["gnu_settings"]
    assert both["settings"]["OMP_PROC_BIND"] == "intel" and both["gnu_settings"]["OMP_PROC_BIND"] == "FALSE"
    assert both["settings"]["KMP_BLOCKTIME"] == "0ms" and both["settings"]["_OPENMP"] == "202111"
    assert "OMP_NESTED: deprecated; max-active-levels-var" not in both["settings"]
    assert both["bound_to"] == ["0", "1"]
    assert openmp.parse_openmp_display("")["served_by"] == "unknown"


def test_binding_summary():
    assert openmp.binding_summary(["0", "1"]) == "pinned, one CPU each: thread 0 on 0, thread 1 on 1"
    assert openmp.binding_summary(["0-3", "0-3"]) == "not pinned: every thread may run on CPUs 0-3"
    assert openmp.binding_summary(["0,2", "1,3"]) == "thread 0 on 0,2; thread 1 on 1,3"
    assert openmp.binding_summary(["0", "0"]) == "not pinned: every thread may run on CPUs 0"
    assert openmp.binding_summary([]).startswith("not reported")


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
