"""Who else used the CPU while we measured: ``CpuMeter`` (machine CPU time, steal included, minus our own)."""

from __future__ import annotations

import time
from contextlib import suppress
from dataclasses import dataclass

import psutil

LIMIT = 0.25  # cores taken by others (on average over a round) above which the round is disturbed


@dataclass(frozen=True)
class Interference:
    """CPU taken by others during one measured interval, in cores (1.0 = one whole core)."""

    other_cores: float
    steal_cores: float
    wall_s: float

    @property
    def cores(self) -> float:
        """Cores taken by other processes and by the hypervisor together."""
        return self.other_cores + self.steal_cores

    def disturbed(self, limit: float = LIMIT) -> bool:
        return self.cores > limit


def machine_cpu_seconds() -> tuple[float, float]:
    """(busy, steal) CPU seconds of the whole machine since boot, all cores added up."""
    t = psutil.cpu_times()
    busy = t.user + t.system + getattr(t, "nice", 0.0) + getattr(t, "irq", 0.0) + getattr(t, "softirq", 0.0)
    return busy, getattr(t, "steal", 0.0)


def own_cpu_seconds() -> float:
    """CPU seconds of this process, the children it waited for and its live descendants."""
    proc = psutil.Process()
    total = 0.0
    for p in [proc, *proc.children(recursive=True)]:
        with suppress(psutil.Error):  # ended between the listing and the reading
            t = p.cpu_times()
            total += t.user + t.system + t.children_user + t.children_system
    return total


class CpuMeter:
    """``start()`` then ``stop()`` -> the ``Interference`` of the interval between them."""

    def start(self) -> "CpuMeter":
        busy, steal = machine_cpu_seconds()
        self._start = (time.perf_counter(), busy, steal, own_cpu_seconds())
        return self

    def stop(self) -> Interference:
        t0, busy0, steal0, own0 = self._start
        busy, steal = machine_cpu_seconds()
        wall = max(time.perf_counter() - t0, 1e-9)
        other = max(0.0, (busy - busy0) - (own_cpu_seconds() - own0))
        return Interference(other / wall, max(0.0, steal - steal0) / wall, wall)
