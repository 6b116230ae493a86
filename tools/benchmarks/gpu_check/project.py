"""A figure measured on the lent card, carried over to a consumer card by memory bandwidth.

A decode step at batch 1 is its kernels (bound by the bytes they read: weights and the KV cache) plus the time
the GPU waits between them (launches, the host's work, the token read back). So, measured here:

    kernel time on the card  = kernel time here × bandwidth here ÷ bandwidth of the card
    step on the card         = that + (wall time per step here − kernel time here)

Both bandwidths are published figures (the same kind of number on both sides), so the kernels are assumed to
reach the same share of their card's bandwidth as they did here. The host's part is kept as measured: a desktop
CPU may launch faster or slower than the lent machine's, and L2 cache sizes differ (an H100 holds 50 MB, a 4090
72 MB, a 4070 36 MB), so a projection is an estimate to within perhaps ±20 %, not a measurement.
"""

from __future__ import annotations

from typing import Optional

# Published memory bandwidth (GB/s) of the cards a lent machine may have, matched in the device's name.
DATACENTER_GB_S = (
    ("H200", 4800.0),
    ("H100 NVL", 3900.0),
    ("H100 PCIE", 2039.0),
    ("H100", 3350.0),  # SXM5 (80GB HBM3)
    ("A100-SXM4-80GB", 2039.0),
    ("A100 80GB PCIE", 1935.0),
    ("A100", 1555.0),
    ("L40S", 864.0),
    ("L4", 300.0),
)

# The consumer cards a projection is written for: (name as inference/hardware/gpus.py lists it).
TARGETS = ("RTX 4090 24GB", "RTX 4070 12GB")


def nominal_gb_s(device_name: str) -> Optional[float]:
    name = device_name.upper()
    for key, gb_s in DATACENTER_GB_S:
        if key in name:
            return gb_s
    from redline.inference.hardware.gpus import CONSUMER_GPUS

    for card in CONSUMER_GPUS:
        short = card.name.upper().rsplit(" ", 1)[0]  # "RTX 4090"
        if short in name:
            return card.bandwidth_gb_s
    return None


def here_gb_s(device_name: str, measured_bytes_per_s: Optional[float]) -> tuple[Optional[float], str]:
    """The bandwidth to scale from, and what it is: the card's published figure, else the measured one."""
    nominal = nominal_gb_s(device_name)
    if nominal:
        return nominal, f"{device_name}'s published {nominal:,.0f} GB/s"
    if measured_bytes_per_s:
        gb_s = measured_bytes_per_s / 1e9
        return gb_s, f"{gb_s:,.0f} GB/s measured here (no published figure known for {device_name})"
    return None, "no bandwidth known"


def fits(config: dict, precision: str, card, context: int = 4096) -> tuple[bool, str]:
    """Whether the estimator says the model fits the card at ``context`` (the fast path, batch 1)."""
    from gpu_check.models import llama_config
    from redline.inference.estimate.estimator import estimate, shape_from_config
    from redline.inference.precision import parse_precision

    shape = shape_from_config(llama_config(config), "projection")
    e = estimate(
        shape, parse_precision(precision), context, 1, "cuda", available_bytes=card.memory_bytes, strategy="fast"
    )
    need = (e.total_bytes + e.margin_bytes) / 2**30  # with the estimator's own margin, as its fit rule counts
    return bool(e.fits), f"needs ~{need:.1f} GiB with the estimate's margin, of {card.memory_bytes / 2**30:.0f} GiB"


def project(cell: dict, here: Optional[float], card) -> Optional[dict]:
    """tokens/s on ``card`` (a GpuModel) for a measured cell (wall_ms, kernel_ms or gpu_span_ms), with the sum."""
    wall = cell.get("wall_ms")
    kernel = cell.get("kernel_ms") or None
    source = "kernel time"
    if not kernel and cell.get("gpu_span_ms"):
        kernel, source = cell["gpu_span_ms"], "GPU span (no kernel time)"
    if not wall or not kernel or not here:
        return None
    kernel = min(kernel, wall)
    scaled = kernel * here / card.bandwidth_gb_s
    overhead = max(0.0, wall - kernel)
    tok_s = 1000.0 / (scaled + overhead)
    text = (
        f"{card.name}: {source} {kernel:.2f} ms × {here:,.0f} / {card.bandwidth_gb_s:,.0f} GB/s = {scaled:.2f} ms, "
        f"+ {overhead:.2f} ms outside the kernels = {scaled + overhead:.2f} ms → {tok_s:.1f} tok/s"
    )
    if cell.get("bytes_per_step"):
        roof = card.bandwidth_gb_s * 1e9 / cell["bytes_per_step"]
        text += f" (its roofline: {card.bandwidth_gb_s:,.0f} GB/s ÷ {cell['bytes_per_step'] / 1e9:.2f} GB = {roof:.0f})"
    return {"tokens_per_s": tok_s, "text": text}
