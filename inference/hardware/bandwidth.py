"""Memory bandwidth and the roofline it sets for decoding at batch 1.

Every decode step reads all weights once (plus the KV cache so far), so
tokens/s ≤ bandwidth ÷ bytes read per token. We measure the bandwidth on this
machine — a large reduction, which is how a matrix-vector product reads
memory — and cache it per device and thread count: the best of a few reads
taken while the machine was quiet (``measurements.py`` says when it reads again).
"""

from __future__ import annotations

import time
from typing import Optional

from .measurements import measured

MEASURE_BYTES = 512 * 1024 * 1024


def measure_bandwidth(device: str = "cpu", repeats: int = 8) -> float:
    """Bytes per second a full reduction over a 512 MiB buffer reaches (best of ``repeats``)."""
    # lazy: torch loads on the engine's thread, never at import
    import torch

    x = torch.ones(MEASURE_BYTES // 4, dtype=torch.float32, device=device)
    best = float("inf")
    for _ in range(repeats + 1):  # the first pass warms up (page faults, clocks)
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        t = time.perf_counter()
        x.sum()
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t)
    del x
    return MEASURE_BYTES / best


def bandwidth(device: str = "cpu", refresh: bool = False) -> float:
    """The measured bandwidth for ``device``, from the cache when it has a quiet read (``measurements.measured``)."""
    return measured("bandwidth", "bytes_per_s", device, measure_bandwidth, refresh)


def roofline_tokens_per_s(bytes_per_token: int, bytes_per_s: float) -> Optional[float]:
    return bytes_per_s / bytes_per_token if bytes_per_token else None
