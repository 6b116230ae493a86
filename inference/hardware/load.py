"""How busy the machine is: what other programs take of the CPU's cores while Redline measures something.

A measurement taken while another program kept the cores busy (a build, a browser, a second model) says how fast
this machine was then, not how fast it is: a reply measured so must not teach the speed model as a quiet one does,
nor must the bandwidth and FLOP/s every prediction starts from be read then.

Two readings, both from psutil:

- ``others_share``: of all the machine's cores, the share other processes used over an interval — the machine's
  busy CPU time minus this process's own, over the wall time × the cores. It is the figure that tells: Redline's
  own threads, which the 1-minute load average counts too (a reply that kept 2 cores busy for 30 s lifts it by
  about 0.8), are taken out;
- ``load_average``: the 1-minute load average (``psutil.getloadavg``), kept beside it for the record and used where
  no interval was watched. Above the number of cores, something besides Redline wants them: Redline's threads
  alone never number more than the cores.
"""

from __future__ import annotations

import os
import time
from typing import Optional

BUSY_SHARE = 0.25  # others used more than a quarter of the cores while it was measured: the reading was contended
BUSY_LOAD_PER_CORE = 1.25  # the fallback: more runnable threads than cores by a quarter
MIN_INTERVAL_S = 0.2  # shorter than this, the counters' 10 ms ticks say too little


def cpu_count() -> int:
    return os.cpu_count() or 1


def load_average() -> Optional[float]:
    """The 1-minute load average, or None where it cannot be read."""
    try:
        # lazy: it may be missing or fail to load here, which the handler below says
        import psutil

        return round(float(psutil.getloadavg()[0]), 2)
    except (ImportError, OSError, AttributeError):
        return None


def _busy_seconds() -> Optional[tuple[float, float]]:
    """(CPU seconds the whole machine spent busy, CPU seconds this process spent) since boot / its start."""
    try:
        # lazy: it may be missing or fail to load here, which the handler below says
        import psutil

        t = psutil.cpu_times()
        total = sum(t)
        idle = t.idle + getattr(t, "iowait", 0.0)
        # Linux counts a guest's time inside user (and guest_nice inside nice): not twice.
        total -= getattr(t, "guest", 0.0) + getattr(t, "guest_nice", 0.0)
        own = psutil.Process().cpu_times()
        mine = own.user + own.system + getattr(own, "children_user", 0.0) + getattr(own, "children_system", 0.0)
        return total - idle, mine
    except (ImportError, OSError, AttributeError):
        return None


class CpuLoad:
    """Watches the machine from its creation: ``read()`` gives (others' share of the cores since then, the load
    average now)."""

    def __init__(self):
        self.started = time.perf_counter()
        self.counters = _busy_seconds()

    def others_share(self) -> Optional[float]:
        end = _busy_seconds()
        wall = time.perf_counter() - self.started
        if end is None or self.counters is None or wall < MIN_INTERVAL_S:
            return None
        busy = (end[0] - self.counters[0]) - (end[1] - self.counters[1])
        return round(min(1.0, max(0.0, busy / (wall * cpu_count()))), 3)

    def read(self) -> tuple[Optional[float], Optional[float]]:
        return self.others_share(), load_average()


def others_share_now(interval_s: float = 0.3) -> Optional[float]:
    """Others' share of the cores over the next ``interval_s`` (this thread sleeps meanwhile)."""
    watch = CpuLoad()
    time.sleep(max(interval_s, MIN_INTERVAL_S))
    return watch.others_share()


def busy(others_cpu_share: Optional[float], load: Optional[float], cpus: Optional[int] = None) -> bool:
    """Whether a measurement taken with these readings was contended: others' share of the cores when it was
    watched, else the load average against the cores. Neither known: not busy (nothing says it was)."""
    if others_cpu_share is not None:
        return others_cpu_share > BUSY_SHARE
    if load is not None:
        return load > BUSY_LOAD_PER_CORE * (cpus or cpu_count())
    return False
