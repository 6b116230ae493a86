"""Time bounds for responsiveness checks that hold on a busy machine too.

A check such as "Busy is answered at once" or "the server exits within about a second" bounds a wait that would
otherwise last a whole job (tens of seconds). On a 2-core machine that other programs keep busy, everything runs
slower by about the load per core, so the bound is scaled by it: it still tells "at once" from "after the job", and
a user's `make test` does not depend on how fast or idle their machine is."""

import os


def busy_factor() -> float:
    """How much slower than idle this machine runs now: the 1-minute load average per core, at least 1."""
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):  # no load average here (Windows)
        return 1.0
    return max(1.0, load / (os.cpu_count() or 1))


def within(seconds: float) -> float:
    """``seconds`` on an idle machine, scaled for how busy this one is now."""
    return seconds * busy_factor()
