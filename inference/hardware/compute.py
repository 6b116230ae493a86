"""Measured compute: the matrix-multiply FLOP/s this machine reaches, for predicting prefill.

Prefill (the prompt's forward pass) multiplies a block of tokens by every weight, so unlike a decode step
it is bound by arithmetic rather than by memory. We time a square matrix product — the shape of a prefill's
linear layers — per device and thread count, keep the best of a few repeats, and cache it beside the
measured bandwidth (``bandwidth.py``), read again until a read was taken while the machine was quiet
(``measurements.py``).
"""

from __future__ import annotations

import json
import time

from ..paths import cache_dir
from .measurements import measured
from .probe import cpu_name

CPU_SIZE = 1024  # 2·1024³ ≈ 2.1 GFLOP per product: a few hundred ms on a small CPU
CUDA_SIZE = 4096


def measure_flops(device: str = "cpu", repeats: int = 3) -> float:
    """Floating-point operations per second of a square fp32 (CPU) or bf16 (CUDA) matrix product."""
    # lazy: torch loads on the engine's thread, never at import
    import torch

    cuda = device.startswith("cuda")
    n = CUDA_SIZE if cuda else CPU_SIZE
    dtype = torch.bfloat16 if cuda else torch.float32
    a = torch.randn(n, n, dtype=dtype, device=device)
    b = torch.randn(n, n, dtype=dtype, device=device)
    best = float("inf")
    with torch.inference_mode():
        for _ in range(repeats + 1):  # the first product warms up (allocation, thread pool, clocks)
            if cuda:
                torch.cuda.synchronize()
            t = time.perf_counter()
            torch.mm(a, b)
            if cuda:
                torch.cuda.synchronize()
            best = min(best, time.perf_counter() - t)
    return 2.0 * n**3 / best


def flops(device: str = "cpu", refresh: bool = False) -> float:
    """The measured FLOP/s for ``device``, from the cache when it has a quiet read (``measurements.measured``)."""
    return measured("compute", "flops", device, measure_flops, refresh)


def cached(name: str, device: str):
    """A cached figure (``bandwidth`` or ``compute``) for ``device`` without importing torch, or None.

    The cache keys name the CPU and torch's thread count; without torch we cannot know the thread count,
    so on a CPU the entry measured with the most threads for this CPU is used (what torch uses by default).
    """

    path = cache_dir() / f"{name}.json"
    field = "bytes_per_s" if name == "bandwidth" else "flops"
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if device.startswith("cuda"):
        hits = [v for k, v in data.items() if k.startswith("cuda:")]
    else:
        prefix = f"cpu:{cpu_name()}:threads="
        by_threads = [(k[len(prefix) :], v) for k, v in data.items() if k.startswith(prefix)]
        hits = [v for t, v in sorted(by_threads, key=lambda kv: int(kv[0]) if kv[0].isdigit() else 0)]
    try:
        return float(hits[-1][field]) if hits else None
    except (KeyError, TypeError, ValueError):
        return None
