"""The 8-bit KV cache's rows (``--kv q8``) in torch: what ``paged_torch.py`` and ``decoding/kv_cache.py`` write and
read, the same layout and rounding as the native kernels' (``cpu/paged_attention.h``: ``store_row``).

Each token's keys (or values) of one KV head, D numbers, are stored as D int8 followed by their scale in fp16
(2 bytes): a pool of ``[..., D + 2]`` int8 instead of ``[..., D]`` bf16, so the pages, the page tables, the prefix
cache and the disk pages keep one tensor per pool and need no second one for the scales. The scale is max|x| / 127
rounded to fp16 first, and each value is ``round(x · (1 / scale))`` clamped to ±127 (round half to even, as the
kernels' ``nearbyint``): the same bits from torch and from the kernels for the same fp32 input. A value is then
within half a step (scale / 2) of what was written, and the bytes are (D + 2) / 2D of bf16's (0.516 for D = 64).

Why one scale per token and head rather than GGUF's Q8_0 (one per 32 values): attention's two sums take the scale
out of their inner loops (a key's score is scale · q·k_int8; a value's softmax weight is multiplied by its scale
before the weighted sum), so the kernels read int8 where they read bf16 and multiply once per key; per-32 blocks
would cost a multiply per block inside both loops and 2 bytes more per 64 values.
"""

from __future__ import annotations

import torch

KV_FORMS = ("bf16", "q8")  # the KV cache's forms a user chooses (``--kv``); bf16 means the model's own dtype
SCALE_BYTES = 2  # an fp16 scale after each row's D int8
LEVELS = 127.0
F16_MAX = 65504.0


def check_form(form: str) -> str:
    """``form`` if it is a KV form Redline has, else ValueError naming the forms."""
    if form not in KV_FORMS:
        raise ValueError(f"the KV cache is kept as {' or '.join(KV_FORMS)}, not {form!r}")
    return form


def is_q8(pool: torch.Tensor) -> bool:
    """Whether ``pool`` holds 8-bit rows (int8, each row D values and its scale)."""
    return pool.dtype == torch.int8


def head_dim(pool: torch.Tensor) -> int:
    """The head size D of a pool whose last dimension is a row: D, or D + 2 for 8-bit rows."""
    return pool.shape[-1] - SCALE_BYTES if is_q8(pool) else pool.shape[-1]


def row_width(head_size: int, form: str) -> int:
    """The pool's last dimension for heads of ``head_size`` in ``form``."""
    return head_size + SCALE_BYTES if form == "q8" else head_size


def quantize_rows(x: torch.Tensor) -> torch.Tensor:
    """x [..., D] (any float dtype) → int8 [..., D + 2]: each row's D int8 and its fp16 scale's two bytes."""
    xf = x.float()
    amax = xf.abs().amax(dim=-1, keepdim=True)
    scale = (amax / LEVELS).clamp(max=F16_MAX).to(torch.float16)
    sf = scale.float()
    inv = torch.where(sf > 0, 1.0 / sf, torch.zeros_like(sf))
    q = torch.round(xf * inv).clamp(-LEVELS, LEVELS).to(torch.int8)
    return torch.cat([q, scale.view(torch.int8)], dim=-1)


def scales(rows: torch.Tensor) -> torch.Tensor:
    """The fp16 scales of 8-bit rows [..., D + 2] → [..., 1] (a view where the rows' strides allow it)."""
    tail = rows[..., -SCALE_BYTES:]
    try:
        return tail.view(torch.float16)
    except RuntimeError:  # an odd stride or offset: copy the two bytes first
        return tail.contiguous().view(torch.float16)


def dequantize_rows(rows: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """8-bit rows [..., D + 2] → [..., D] in ``dtype`` (the products in fp32, then converted)."""
    values = rows[..., : rows.shape[-1] - SCALE_BYTES]
    return (values.float() * scales(rows).float()).to(dtype)


def rows_as(x: torch.Tensor, pool: torch.Tensor) -> torch.Tensor:
    """``x`` [..., D] in the form ``pool`` stores: quantised for an 8-bit pool, else converted to its dtype."""
    return quantize_rows(x) if is_q8(pool) else x.to(pool.dtype)


def rows_from(pool_rows: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Rows read from a pool, in ``dtype``: dequantised from 8 bits, else converted."""
    return dequantize_rows(pool_rows, dtype) if is_q8(pool_rows) else pool_rows.to(dtype)
