import subprocess
import sys
import time

import pytest

from helpers import cpu_meter


def spin(seconds):
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def test_own_work_is_not_interference():
    meter = cpu_meter.CpuMeter().start()
    spin(0.4)
    load = meter.stop()
    assert 0.35 < load.wall_s < 2
    assert load.other_cores < 0.5  # our own spinning core is not counted as someone else's


def test_a_child_we_started_is_our_own_work():
    meter = cpu_meter.CpuMeter().start()
    child = subprocess.Popen([sys.executable, "-c", "import time\nend=time.time()+0.5\nwhile time.time()<end: pass"])
    child.wait()
    load = meter.stop()
    assert load.other_cores < 0.5


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
        assert load.other_cores > 0.6 and load.disturbed()
    finally:
        cpu_meter.psutil.Process(pid).kill()


def test_disturbed_threshold():
    assert cpu_meter.Interference(0.3, 0.0, 1.0).disturbed(0.25)
    assert cpu_meter.Interference(0.1, 0.2, 1.0).disturbed(0.25)  # steal counts too
    assert not cpu_meter.Interference(0.1, 0.1, 1.0).disturbed(0.25)
    assert cpu_meter.Interference(0.1, 0.1, 1.0).cores == pytest.approx(0.2)
    with pytest.raises(RuntimeError):
        cpu_meter.CpuMeter().stop()
