"""Common consumer GPUs, for "what if I had…" estimates.

Memory is the card's total VRAM (the marketed "12 GB" is 12 GiB); bandwidth is
NVIDIA's published memory bandwidth. ``bf16`` says whether the card computes in
bfloat16 (Ampere and newer); older cards load half precision as fp16.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional

from ..errors import UnsupportedConfiguration

GIB = 1 << 30


@dataclass(frozen=True)
class GpuModel:
    name: str
    memory_bytes: int
    bandwidth_gb_s: float
    bf16: bool = True

    @property
    def memory_gb_label(self) -> str:
        return f"{self.memory_bytes // GIB} GB"

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "memory_bytes": self.memory_bytes,
            "bandwidth_gb_s": self.bandwidth_gb_s,
            "bf16": self.bf16,
        }


def _g(name: str, gib: int, bandwidth: float, bf16: bool = True) -> GpuModel:
    return GpuModel(name, gib * GIB, bandwidth, bf16)


CONSUMER_GPUS: tuple[GpuModel, ...] = (
    _g("GTX 1080 Ti 11GB", 11, 484, bf16=False),
    _g("RTX 2060 6GB", 6, 336, bf16=False),
    _g("RTX 2080 Ti 11GB", 11, 616, bf16=False),
    _g("RTX 3060 12GB", 12, 360),
    _g("RTX 3060 Ti 8GB", 8, 448),
    _g("RTX 3070 8GB", 8, 448),
    _g("RTX 3080 10GB", 10, 760),
    _g("RTX 3080 12GB", 12, 912),
    _g("RTX 3090 24GB", 24, 936),
    _g("RTX 3090 Ti 24GB", 24, 1008),
    _g("RTX 4060 8GB", 8, 272),
    _g("RTX 4060 Ti 8GB", 8, 288),
    _g("RTX 4060 Ti 16GB", 16, 288),
    _g("RTX 4070 12GB", 12, 504),
    _g("RTX 4070 Super 12GB", 12, 504),
    _g("RTX 4070 Ti 12GB", 12, 504),
    _g("RTX 4070 Ti Super 16GB", 16, 672),
    _g("RTX 4080 16GB", 16, 717),
    _g("RTX 4080 Super 16GB", 16, 736),
    _g("RTX 4090 24GB", 24, 1008),
    _g("RTX 5060 Ti 16GB", 16, 448),
    _g("RTX 5070 12GB", 12, 672),
    _g("RTX 5070 Ti 16GB", 16, 896),
    _g("RTX 5080 16GB", 16, 960),
    _g("RTX 5090 32GB", 32, 1792),
)


def _key(text: str) -> str:
    text = text.lower().replace("geforce", "").replace("nvidia", "")
    return re.sub(r"[^a-z0-9]", "", text.replace("gib", "gb"))


def find_gpu(name: str) -> GpuModel:
    """Look up a card by a loose name: "4090", "rtx 4060 ti 16", "RTX 3080 10GB".

    An exact (normalised) match wins; otherwise the query must match exactly one
    card as a prefix, else the error lists the candidates.
    """
    query = _key(name)
    if not query:
        raise UnsupportedConfiguration("No GPU name given.", "Run `redline estimate --list-gpus` to see the list.")
    keys = {gpu: _key(gpu.name) for gpu in CONSUMER_GPUS}
    for gpu, key in keys.items():
        if key == query or key.removeprefix("rtx").removeprefix("gtx") == query:
            return gpu
    # "3060" or "RTX 4090": the name without its memory suffix, when only one card has that name.
    bare_keys = {gpu: _key(re.sub(r"\s*\d+GB$", "", gpu.name)) for gpu in CONSUMER_GPUS}
    bare = [gpu for gpu, key in bare_keys.items() if query in (key, key.removeprefix("rtx").removeprefix("gtx"))]
    if len(bare) == 1:
        return bare[0]
    hits = [
        gpu
        for gpu, key in keys.items()
        if key.startswith(query) or key.removeprefix("rtx").removeprefix("gtx").startswith(query)
    ]
    if len(hits) == 1:
        return hits[0]
    # "4060 ti 16" should find "RTX 4060 Ti 16GB": allow a missing "gb" suffix.
    hits_gb = [gpu for gpu in hits if keys[gpu].endswith(query.removeprefix("rtx") + "gb")]
    if len(hits_gb) == 1:
        return hits_gb[0]
    names = ", ".join(g.name for g in (hits or CONSUMER_GPUS))
    what = "matches several cards" if hits else "is not in the built-in list"
    raise UnsupportedConfiguration(f"GPU {name!r} {what}.", f"Choose one of: {names}; or pass --free-gb.")


def gpu_for_memory(needed_bytes: int) -> Optional[GpuModel]:
    """The cheapest-class card (least memory, then least bandwidth) with at least ``needed_bytes``."""
    fitting = [g for g in CONSUMER_GPUS if g.memory_bytes >= needed_bytes and g.bf16]
    return min(fitting, key=lambda g: (g.memory_bytes, g.bandwidth_gb_s), default=None)
