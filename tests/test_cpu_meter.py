import subprocess
import sys
import time

import pytest

from helpers import cpu_meter


def spin(seconds):
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def scripted(monkeypatch, machine, own, clock):
    """Replace the three readings CpuMeter takes with scripted sequences (start, stop)."""
    m, o, c = iter(machine), iter(own), iter(clock)
    monkeypatch.setattr(cpu_meter, "machine_cpu_seconds", lambda: next(m))
    monkeypatch.setattr(cpu_meter, "own_cpu_seconds", lambda: next(o))
    monkeypatch.setattr(cpu_meter.time, "perf_counter", lambda: next(c))


def test_own_work_is_not_interference(monkeypatch):
    # the machine spent 1.8 CPU-seconds in 1 s; 1.7 of them were ours (this process and its children)
    scripted(monkeypatch, machine=[(100.0, 5.0), (101.8, 5.0)], own=[10.0, 11.7], clock=[0.0, 1.0])
    load = cpu_meter.CpuMeter().start().stop()
    assert load.other_cores == pytest.approx(0.1) and load.steal_cores == 0.0 and not load.disturbed()


def test_someone_elses_work_and_steal_are_interference(monkeypatch):
    scripted(monkeypatch, machine=[(100.0, 5.0), (103.0, 5.5)], own=[10.0, 11.0], clock=[0.0, 2.0])
    load = cpu_meter.CpuMeter().start().stop()
    assert load.other_cores == pytest.approx(1.0) and load.steal_cores == pytest.approx(0.25)
    assert load.cores == pytest.approx(1.25) and load.disturbed() and load.wall_s == pytest.approx(2.0)


def test_our_spinning_shows_as_own_cpu_time():
    # spin until this process has used 0.3 s of CPU (whatever else the machine is doing)
    before = cpu_meter.own_cpu_seconds()
    end = time.process_time() + 0.3
    while time.process_time() < end:
        pass
    assert cpu_meter.own_cpu_seconds() - before >= 0.25  # psutil reads whole clock ticks (10 ms)


def test_a_foreign_process_is_interference():
    # a process outside our tree (the shell that starts it exits, so it is re-parented): someone else
    code = "import time\nend = time.time() + 4\nwhile time.time() < end: pass"
    pid = int(subprocess.run(["sh", "-c", f'{sys.executable} -c "{code}" >/dev/null 2>&1 & echo $!'],
                             capture_output=True, text=True, check=True).stdout)
    try:
        time.sleep(0.3)
        meter = cpu_meter.CpuMeter().start()
        time.sleep(1.0)
        load = meter.stop()
        assert load.other_cores > 0.3 and load.disturbed()  # the hog's core (shared, on a loaded machine)
    finally:
        cpu_meter.psutil.Process(pid).kill()


def test_disturbed_threshold():
    assert cpu_meter.Interference(0.3, 0.0, 1.0).disturbed(0.25)
    assert cpu_meter.Interference(0.1, 0.2, 1.0).disturbed(0.25)  # steal counts too
    assert not cpu_meter.Interference(0.1, 0.1, 1.0).disturbed(0.25)
    assert cpu_meter.Interference(0.1, 0.1, 1.0).cores == pytest.approx(0.2)


def test_machine_cpu_seconds_adds_busy_states_and_keeps_steal_apart(monkeypatch):
    from collections import namedtuple

    Times = namedtuple("Times", "user nice system idle iowait irq softirq steal")
    monkeypatch.setattr(cpu_meter.psutil, "cpu_times", lambda: Times(10.0, 1.0, 5.0, 100.0, 7.0, 0.5, 0.25, 3.0))
    assert cpu_meter.machine_cpu_seconds() == (16.75, 3.0)  # idle and iowait are not busy
    Mac = namedtuple("Mac", "user nice system idle")  # platforms without irq or steal
    monkeypatch.setattr(cpu_meter.psutil, "cpu_times", lambda: Mac(10.0, 1.0, 5.0, 100.0))
    assert cpu_meter.machine_cpu_seconds() == (16.0, 0.0)


def test_own_cpu_seconds_counts_children_we_waited_for():
    code = "import time\nend = time.process_time() + 0.3\nwhile time.process_time() < end: pass\nprint(time.process_time())"
    before = cpu_meter.own_cpu_seconds()
    used = float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)
    after = cpu_meter.own_cpu_seconds()
    assert after - before >= used - 0.02  # the child's CPU time (0.3 s of spinning, whatever the machine's load)
