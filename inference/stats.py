"""Statistics the whole project reports, defined once (docs/speed-lab.md#metrics): a reply's decode tokens/s,
its per-token latencies and their p50/p95 in the window, in ``redline chat --json`` and in the speed lab, a
request's TTFT and latency percentiles in the batch sweep and the concurrency bench, and the benchmark tools'
gaps. Two definitions had drifted apart: the window's nearest rank and the engine's interpolation gave one reply
two p95s."""

from __future__ import annotations

from itertools import groupby
from typing import Iterable, Optional


def percentile(values: Iterable[float], q: float) -> Optional[float]:
    """The ``q``-quantile (0 ≤ q ≤ 1; 0.95 for p95) of ``values``, interpolated linearly between the two nearest
    ranks: numpy's default (``method="linear"``) and ``statistics.quantiles(method="inclusive")``. It never
    reaches past the data (p100 is the largest value) and p50 is the median. None for no values."""
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"A percentile is asked for as a fraction from 0 to 1 (0.95 for p95), not {q!r}.")
    data = sorted(values)
    if not data:
        return None
    k = (len(data) - 1) * q
    lo = int(k)
    hi = min(lo + 1, len(data) - 1)
    return data[lo] + (data[hi] - data[lo]) * (k - lo)


def token_latencies_ms(arrivals: Iterable[float]) -> list[float]:
    """Per-token latency in ms from each new token's arrival (seconds since the generation started, in order): the
    time since the previous arrival; tokens that arrive together (one speculative step's accepted tokens) share
    that step's time equally. The first arrival has none (its wait is the TTFT)."""
    out: list[float] = []
    previous: Optional[float] = None
    for t, together in groupby(arrivals):
        n = sum(1 for _ in together)
        if previous is not None:
            out.extend([(t - previous) * 1000 / n] * n)
        previous = t
    return out


def decode_tokens_per_s(arrivals: Iterable[float]) -> Optional[float]:
    """Decode tokens/s from each new token's arrival (seconds, in order): the tokens after the first arrival over
    the time since it (prompt tokens and the wait for the first one never count). None with nothing after it."""
    times = list(arrivals)
    if not times:
        return None
    after_first = sum(1 for t in times if t > times[0])
    span = times[-1] - times[0]
    return after_first / span if span > 0 and after_first else None
