"""The kernels' computations written with torch operators: every device's row of the device table (``ops.py``)
starts from them (a CPU without a kernel build, CUDA), and tests compare the native kernels against them."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from . import kv_quant
from .block_quant import BlockWeights, dequantize, quantize_q4, quantize_q8


def linear(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return F.linear(x, w if w.dtype == x.dtype else w.to(x.dtype))


def linear_blocks(x: torch.Tensor, blocks: BlockWeights) -> torch.Tensor:
    return F.linear(x.to(torch.float32), dequantize(blocks)).to(x.dtype)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    # As transformers' LlamaRMSNorm: the variance in fp32, the weight applied in the input's dtype.
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight.to(x.dtype) * h.to(x.dtype)


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding, rotate-half convention (transformers' Llama): x·cos + rotate_half(x)·sin."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


def split_qkv(qkv: torch.Tensor, heads: int, kv_heads: int, head_dim: int):
    q_size, kv_size = heads * head_dim, kv_heads * head_dim
    shape = qkv.shape[:-1]
    q = qkv[..., :q_size].reshape(*shape, heads, head_dim)
    k = qkv[..., q_size : q_size + kv_size].reshape(*shape, kv_heads, head_dim)
    v = qkv[..., q_size + kv_size :].reshape(*shape, kv_heads, head_dim)
    return q, k, v


def attend(qkv, cos, sin, k_pool, v_pool, pages, pos, heads: int, kv_heads: int, scale: float) -> torch.Tensor:
    """One decode step over a paged KV cache, as ``redline::attend`` (see cpu_kernels.cpp): for each of the
    B sequences, rotary on q and k, k and v written at ``pos``, attention over positions 0..pos. [B, H·D]"""
    page, head_dim = k_pool.shape[2], kv_quant.head_dim(k_pool)  # 8-bit rows: D int8 and a scale
    q, k, v = split_qkv(qkv, heads, kv_heads, head_dim)  # [B, H, D], [B, Hkv, D]
    out = []
    for b in range(q.shape[0]):
        p = int(pos[b])
        c, s = cos[p].to(q.dtype), sin[p].to(q.dtype)
        qb, kb = rotate(q[b], c, s), rotate(k[b], c, s)
        pid, off = int(pages[b, p // page]), p % page
        k_pool[pid, :, off] = kv_quant.rows_as(kb, k_pool)
        v_pool[pid, :, off] = kv_quant.rows_as(v[b], v_pool)
        used = pages[b, : p // page + 1].long()
        row = k_pool.shape[3]
        keys = kv_quant.rows_from(k_pool[used].transpose(0, 1).reshape(kv_heads, -1, row)[:, : p + 1], q.dtype)
        values = kv_quant.rows_from(v_pool[used].transpose(0, 1).reshape(kv_heads, -1, row)[:, : p + 1], q.dtype)
        o = F.scaled_dot_product_attention(
            qb[:, None], keys, values, scale=scale, enable_gqa=heads != kv_heads
        )  # [H, 1, D]
        out.append(o.reshape(heads * head_dim))
    return torch.stack(out)


def attend_static(qkv, cos, sin, k_cache, v_cache, pos, heads: int, kv_heads: int, scale: float) -> torch.Tensor:
    """The same step over a cache of one page per sequence ([B, Hkv, S, D]), with static shapes and no host
    synchronisation, so it can be captured in a CUDA graph: the positions past ``pos`` are masked."""
    head_dim = k_cache.shape[-1]
    q, k, v = split_qkv(qkv, heads, kv_heads, head_dim)  # [B, H, D]
    c, s = cos[pos][:, None].to(q.dtype), sin[pos][:, None].to(q.dtype)  # [B, 1, D]
    q, k = rotate(q, c, s), rotate(k, c, s)
    rows = torch.arange(q.shape[0], device=q.device)
    k_cache[rows, :, pos] = k.to(k_cache.dtype)
    v_cache[rows, :, pos] = v.to(v_cache.dtype)
    mask = torch.arange(k_cache.shape[2], device=q.device)[None, :] <= pos[:, None]  # [B, S]
    o = F.scaled_dot_product_attention(
        q[:, :, None],
        k_cache.to(q.dtype),
        v_cache.to(q.dtype),
        attn_mask=mask[:, None, None, :],
        scale=scale,
        enable_gqa=heads != kv_heads,
    )  # [B, H, 1, D]
    return o.reshape(q.shape[0], heads * head_dim)


def quantize_blocks(w: torch.Tensor, bits: int, symmetric: bool = False) -> BlockWeights:
    """``block_quant.quantize_q8`` / ``quantize_q4``: the table's operator where no backend quantises faster."""
    return quantize_q8(w) if bits == 8 else quantize_q4(w, symmetric)
