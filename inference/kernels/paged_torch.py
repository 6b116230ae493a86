"""Paged decode attention written with torch's operators: what a GPU runs, and a CPU without Redline's native
kernels, over the same pages the native kernel reads (``decoding/kv_cache.py``: a pool ``[pages, kv_heads,
page, head_dim]`` per layer and a page table per sequence).

Two ways to read the pages, both of them only the pages each sequence uses, with grouped KV heads read as they
are (the query heads of one KV head stand as that head's query rows: no copy of K/V per query head) and the
cache in its own dtype (no fp32 copy of it):

- ``attend`` (eager): per sequence, its pages gathered (``index_select``, a view where one page holds it) and
  one ``scaled_dot_product_attention`` without a mask, so every backend is open to it (a boolean mask with
  ``enable_gqa`` has only torch's math kernel, which copied K/V to fp32 with every head expanded). It needs
  the sequences' lengths on the host (the caller knows them: no device-to-host read).
- ``attend_static`` (a graph: ``torch.compile``, CUDA graphs): static shapes whatever the lengths, FlexAttention
  with a block mask built from the page table, so its kernel visits only the blocks listed (a sequence's pages
  for that KV head); the layer's pool is seen as one long sequence of ``pages · kv_heads`` blocks of a page each
  (a view, no copy), a row of the batch per (sequence, KV head). Eager FlexAttention (tests, a capture backend)
  computes the same numbers densely.

``write`` stores each sequence's new key and value at its position through the page table, with no host
synchronisation (a graph can hold it).

An 8-bit cache (``--kv q8``: int8 pools whose rows carry their scale, ``kv_quant.py``) is written quantised and,
eagerly, read dequantised page by page as each sequence's pages are gathered: only the pages a sequence uses become
floats, for its attention, never the pool. ``attend_static`` does not read 8-bit pools (FlexAttention has no place
for a value's scale): a compiled step over them fails to compile, with that reason, and the eager step runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import torch
import torch.nn.functional as F

from . import kv_quant, reference


@dataclass
class StepPages:
    """One decode step's view of the pages: the page table [B, W] and positions [B] on the device, and for
    the eager path, each sequence's length and the pages it uses (a device tensor, or one page's number)."""

    pages: torch.Tensor
    pos: torch.Tensor
    lengths: Optional[list[int]] = None
    used: Optional[list] = None

    @classmethod
    def build(cls, pages: torch.Tensor, pos: torch.Tensor, tables: Sequence[Sequence[int]], positions, page: int):
        """From the host's page lists and positions (``PagedKV.tables``): nothing is read back from the device."""
        lengths = [int(p) + 1 for p in positions]
        used = []
        for b, (table, n) in enumerate(zip(tables, lengths)):
            count = -(-n // page)
            if count == 1:
                used.append(int(table[0]))
            elif pages.device.type == "cpu":
                # A CPU copies the pages one by one (see ``attend``): their numbers, from the host's table.
                used.append([int(p) for p in table[:count]])
            else:
                used.append(pages[b, :count])
        return cls(pages, pos, lengths, used)


def rotary_rows(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, pos: torch.Tensor):
    """q [B, H, D], k [B, Hkv, D] rotated to their rows' positions (tables [T, D] fp32)."""
    c = cos.index_select(0, pos)[:, None].to(q.dtype)
    s = sin.index_select(0, pos)[:, None].to(q.dtype)
    return reference.rotate(q, c, s), reference.rotate(k, c, s)


def write(k_pool: torch.Tensor, v_pool: torch.Tensor, pages: torch.Tensor, pos: torch.Tensor, k, v) -> None:
    """k, v [B, Hkv, D] stored at each row's position of one layer's pool [P, Hkv, page, D]."""
    page = k_pool.shape[2]
    slot = pages.gather(1, torch.div(pos, page, rounding_mode="floor")[:, None].to(torch.int64))[:, 0].long()
    off = pos.remainder(page)
    k_pool[slot, :, off] = kv_quant.rows_as(k, k_pool)
    v_pool[slot, :, off] = kv_quant.rows_as(v, v_pool)


def attend(q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor, step: StepPages, scale: float) -> torch.Tensor:
    """q [B, H, D] against each sequence's first ``lengths[b]`` positions; [B, H, D] in q's dtype."""
    B, H, D = q.shape
    kv_heads, page, row = k_pool.shape[1], k_pool.shape[2], k_pool.shape[3]
    rep = H // kv_heads
    out = []
    for b in range(B):
        n, used = step.lengths[b], step.used[b]
        if isinstance(used, int):  # one page: a view of it
            keys, values = k_pool[used, :, :n], v_pool[used, :, :n]
        elif isinstance(used, list):
            # On a CPU, the pages laid end to end by one cat of their views, already heads first: index_select's
            # parallel copy waited on its other thread at every call on a busy machine (20 ms against 0.8 ms for a
            # 4,000-token sequence's keys on this 2-core machine at a load average of 7, medians of 15 interleaved
            # calls); a GPU gathers with one index_select kernel instead of a Python list of pages.
            keys = torch.cat([k_pool[p] for p in used], 1)[:, :n]
            values = torch.cat([v_pool[p] for p in used], 1)[:, :n]
        else:
            count = used.shape[0]
            keys = k_pool.index_select(0, used).transpose(0, 1).reshape(kv_heads, count * page, row)[:, :n]
            values = v_pool.index_select(0, used).transpose(0, 1).reshape(kv_heads, count * page, row)[:, :n]
        qb = q[b].reshape(1, kv_heads, rep, D)  # a KV head's query heads as its rows
        # The sequence's own pages in q's dtype (8-bit rows dequantised here: this sequence's, not the pool).
        keys, values = kv_quant.rows_from(keys, q.dtype), kv_quant.rows_from(values, q.dtype)
        o = F.scaled_dot_product_attention(qb, keys[None], values[None], scale=scale)
        out.append(o.reshape(H, D))
    return torch.stack(out)


def attend_static(q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor, pages, pos, scale: float):
    """The same attention with static shapes (page table [B, W], positions [B] on the device): FlexAttention
    over the blocks the page table lists. [B, H, D]."""
    # lazy: torch loads on the engine's thread, never at import
    from torch.nn.attention.flex_attention import BlockMask, flex_attention

    if kv_quant.is_q8(k_pool):
        raise ValueError(
            "the 8-bit KV cache is read by the eager step only (FlexAttention cannot apply each value's scale); "
            "use --kv bf16 to compile the step"
        )
    B, H, D = q.shape
    P, kv_heads, page, _ = k_pool.shape
    rep, width, blocks_total = H // kv_heads, pages.shape[1], P * kv_heads
    device = q.device
    used = torch.div(pos, page, rounding_mode="floor") + 1  # [B] pages in use
    i = torch.arange(width, device=device)
    live = i[None] < used[:, None]  # [B, W]
    heads = torch.arange(kv_heads, device=device)
    # The block of (sequence b, KV head g, its i-th page) in the flattened pool: page · kv_heads + g.
    blocks = pages.long()[:, None, :] * kv_heads + heads[None, :, None]  # [B, Hkv, W]
    # For the mask: each block's place in row b's sequence (its logical page), -1 for another sequence's block.
    logical = torch.full((B, blocks_total + 1), -1, dtype=torch.int32, device=device)
    cols = torch.where(live[:, None, :], blocks, blocks_total).reshape(B, kv_heads * width)
    logical.scatter_(1, cols, i.to(torch.int32).repeat(kv_heads)[None].expand(B, -1).contiguous())
    logical = logical[:, :blocks_total]

    def mask_mod(row, h, q_idx, kv_idx):
        b, block = row // kv_heads, kv_idx // page
        at = logical[b, block]
        return (block % kv_heads == row % kv_heads) & (at >= 0) & (at * page + kv_idx % page <= pos[b])

    # Block lists as wide as the flattened pool (FlexAttention's CPU kernel wants them to cover every key), or the
    # page table where that is wider (a compiled step's table spans its whole context).
    kv_indices = torch.zeros(B * kv_heads, 1, 1, max(blocks_total, width), dtype=torch.int32, device=device)
    kv_indices[:, 0, 0, :width] = blocks.reshape(B * kv_heads, width).to(torch.int32)
    counts = used.to(torch.int32).repeat_interleave(kv_heads)[:, None, None]
    mask = BlockMask.from_kv_blocks(
        counts,
        kv_indices,
        BLOCK_SIZE=(128, page),
        mask_mod=mask_mod,
        seq_lengths=(1, blocks_total * page),
        compute_q_blocks=False,
    )
    if k_pool.dtype != q.dtype:  # a conversion here would copy the whole pool every step
        raise ValueError(f"the KV cache is {k_pool.dtype} and the queries {q.dtype}: they must match")
    keys = k_pool.reshape(1, 1, blocks_total * page, D).expand(B * kv_heads, 1, -1, -1)
    values = v_pool.reshape(1, 1, blocks_total * page, D).expand(B * kv_heads, 1, -1, -1)
    out = flex_attention(
        q.reshape(B * kv_heads, rep, 1, D),
        keys,
        values,
        block_mask=mask,
        scale=scale,
        enable_gqa=True,
    )
    return out.reshape(B, H, D)
