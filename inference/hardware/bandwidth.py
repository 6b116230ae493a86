"""Memory bandwidth and the roofline it sets for decoding at batch 1.

Every decode step reads all weights once (plus the KV cache so far), so
tokens/s ≤ bandwidth ÷ bytes read per token. We measure the bandwidth on this
machine once — a large reduction, which is how a matrix-vector product reads
memory — and cache it per device and thread count.
"""

from __future__ import annotations

import time
from typing import Optional

from redline.inference.hardware.measurements import measured

MEASURE_BYTES = 512 * 1024 * 1024


def measure_bandwidth(device: str = "cpu", repeats: int = 8) -> float:
    """Bytes per second a full reduction over a 512 MiB buffer reaches (best of ``repeats``)."""
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
    """The measured bandwidth for ``device``, from the cache when it has one."""
    return measured("bandwidth", "bytes_per_s", device, measure_bandwidth, refresh)


def weight_bytes_read(model) -> int:
    """Weight bytes one decode step of a loaded model reads, counted from its tensors: every weight except
    embedding tables (one row each), quantised layers at their packed bytes (blocks included). What the cost
    module predicts from the shape alone (``cost.weights_read_bytes``; a test checks both agree); the KV cache a
    step reads is the cost module's too (``cost.kv_read_bytes``, at the cache's dtype and window)."""
    import torch

    embeddings = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Embedding)}
    head = getattr(model, "lm_head", None)
    head_weight = getattr(head, "weight", None)
    total = 0
    seen = set()
    for t in list(model.parameters()) + list(model.buffers()):
        if id(t) in seen:
            continue
        seen.add(id(t))
        if id(t) in embeddings and (head_weight is None or t is not head_weight):
            total += t.shape[-1] * t.element_size() if t.dim() == 2 else 0
            continue
        total += t.numel() * t.element_size()
    # Block-quantised layers (q8/q4 on the CPU's native kernels) keep their weights in a BlockWeights,
    # which is neither a parameter nor a buffer.
    for m in model.modules():
        blocks = getattr(m, "blocks", None)
        if blocks is not None and hasattr(blocks, "nbytes"):
            total += int(blocks.nbytes)
    return int(total)


def bytes_read_per_token(loaded, strategy: str, context_tokens: int) -> int:
    """Bytes one decode step of ``loaded`` (a LoadedModel) reads with ``context_tokens`` positions cached: its
    weights as held, and the KV cache at the dtype and window the strategy's code path keeps it."""
    from redline.inference.cost import code_path, kv_read_bytes
    from redline.inference.memory.calibration import loaded_shape

    shape = loaded_shape(loaded)
    path, _ = code_path(strategy, loaded.precision, shape, loaded.device)
    return weight_bytes_read(loaded.model) + kv_read_bytes(shape, loaded.precision, loaded.device, path, context_tokens)


def roofline_tokens_per_s(bytes_per_token: int, bytes_per_s: float) -> Optional[float]:
    return bytes_per_s / bytes_per_token if bytes_per_token else None
