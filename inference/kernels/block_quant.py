"""Block-quantised weights: int8 and int4 in blocks of 32 along a row, one fp16 scale per block.

The layout is GGUF's own (llama.cpp's Q8_0, Q4_0 and Q4_1), so a GGUF file's quantised tensors load
without re-quantising, and Redline's own ``q8``/``q4`` quantisation produces the same blocks:

- 8 bits: ``qweight`` int8 [N, K], ``scales`` fp16 [N, K/32]; ``w = scale * q`` (Q8_0).
- 4 bits: ``qweight`` uint8 [N, K/2], ``scales`` fp16 [N, K/32], and either no ``mins`` (``w = scale * (q - 8)``,
  Q4_0) or ``mins`` fp16 [N, K/32] (``w = scale * q + min``, Q4_1). Within each block of 32 a row holds 16
  bytes: byte j keeps element j in its low nibble and element j + 16 in its high nibble (GGUF's order).

Quantisation rounds as llama.cpp's reference quantisers do (``quantize_row_q8_0_ref`` and friends), so
quantising a GGUF's de-quantised weights gives its blocks back.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

BLOCK = 32


@dataclass
class BlockWeights:
    bits: int  # 8 or 4
    qweight: torch.Tensor  # int8 [N, K] (8 bits) or uint8 [N, K // 2] (4 bits, GGUF nibble order)
    scales: torch.Tensor  # fp16 [N, K // BLOCK]
    mins: Optional[torch.Tensor] = None  # fp16 [N, K // BLOCK]: 4-bit asymmetric (Q4_1) only

    @property
    def out_features(self) -> int:
        return self.qweight.shape[0]

    @property
    def in_features(self) -> int:
        return self.scales.shape[1] * BLOCK

    @property
    def nbytes(self) -> int:
        tensors = [self.qweight, self.scales] + ([self.mins] if self.mins is not None else [])
        return sum(t.numel() * t.element_size() for t in tensors)

    def to(self, device) -> "BlockWeights":
        return BlockWeights(
            self.bits,
            self.qweight.to(device),
            self.scales.to(device),
            None if self.mins is None else self.mins.to(device),
        )


def _blocks(w: torch.Tensor) -> torch.Tensor:
    n, k = w.shape
    if k % BLOCK:
        raise ValueError(f"in_features {k} is not a multiple of the block size {BLOCK}")
    return w.detach().to(torch.float32).reshape(n, k // BLOCK, BLOCK)


def quantize_q8(w: torch.Tensor) -> BlockWeights:
    """Symmetric int8 per block of 32 (GGUF Q8_0): d = max|w| / 127, q = round(w / d)."""
    g = _blocks(w)
    d = g.abs().amax(dim=-1) / 127.0
    inv = torch.where(d > 0, 1.0 / d, torch.zeros_like(d))
    q = torch.round(g * inv[..., None]).clamp(-127, 127).to(torch.int8)
    return BlockWeights(8, q.reshape(w.shape), d.to(torch.float16))


def quantize_q4(w: torch.Tensor, symmetric: bool = False) -> BlockWeights:
    """int4 per block of 32. Asymmetric (GGUF Q4_1, the default: min and max of each block map to 0 and 15)
    or symmetric (Q4_0: the value of largest magnitude maps to -8)."""
    g = _blocks(w)
    if symmetric:
        idx = g.abs().argmax(dim=-1, keepdim=True)
        d = (torch.gather(g, -1, idx) / -8.0)[..., 0]
        inv = torch.where(d != 0, 1.0 / d, torch.zeros_like(d))
        q = torch.clamp(torch.floor(g * inv[..., None] + 8.5), 0, 15)
        mins = None
    else:
        lo, hi = g.amin(dim=-1), g.amax(dim=-1)
        d = (hi - lo) / 15.0
        inv = torch.where(d > 0, 1.0 / d, torch.zeros_like(d))
        q = torch.clamp(torch.floor((g - lo[..., None]) * inv[..., None] + 0.5), 0, 15)
        mins = lo.to(torch.float16)
    return BlockWeights(4, pack_nibbles(q.to(torch.uint8).reshape(w.shape)), d.to(torch.float16), mins)


def pack_nibbles(q: torch.Tensor) -> torch.Tensor:
    """uint8 [N, K] of values 0..15 → uint8 [N, K/2] in GGUF's order (j low, j + 16 high, per block)."""
    n, k = q.shape
    g = q.reshape(n, k // BLOCK, BLOCK)
    return (g[..., :16] | (g[..., 16:] << 4)).reshape(n, k // 2)


def unpack_nibbles(packed: torch.Tensor) -> torch.Tensor:
    """The inverse of ``pack_nibbles``: uint8 [N, K/2] → uint8 [N, K] of values 0..15."""
    n, half = packed.shape
    g = packed.reshape(n, half // 16, 16)
    return torch.cat([g & 0x0F, g >> 4], dim=-1).reshape(n, half * 2)


def dequantize(bw: BlockWeights, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The full weight matrix [N, K] these blocks stand for."""
    n, k = bw.out_features, bw.in_features
    if bw.bits == 8:
        q = bw.qweight.to(torch.float32).reshape(n, k // BLOCK, BLOCK)
        w = q * bw.scales.to(torch.float32)[..., None]
    else:
        q = unpack_nibbles(bw.qweight).to(torch.float32).reshape(n, k // BLOCK, BLOCK)
        d = bw.scales.to(torch.float32)[..., None]
        w = q * d + bw.mins.to(torch.float32)[..., None] if bw.mins is not None else (q - 8.0) * d
    return w.reshape(n, k).to(dtype)
