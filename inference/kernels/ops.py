"""The operators the fast decode step calls: the native CPU kernel where it runs, torch's otherwise."""

from __future__ import annotations

import torch

from redline.inference.kernels import reference
from redline.inference.kernels.native import native
from redline.inference.loading.block_quant import BlockWeights

# From this many activation rows on, bf16 products run as fp32 matrix products through torch's BLAS (the
# weight converted to fp32 at every call). The fast path reads a prompt in chunks of at most 256 rows, so it
# never gets there: since the kernel reads a prompt in cache blocks (simd.h, dense_span) it beats converting the
# weight for BLAS at a 256-row chunk. Measured (2026-12-05, Zen 5, 2 cores; python tools/before_after.py --before
# <the commit with 128 here and no blocking> --configs fast:bf16 --prompts long --prompt-tokens N --new-tokens 4,
# 3 rounds): the 1B-shaped model's 300-token prompt read 1.69x sooner (avx512-vnni build; 1.16x with
# REDLINE_KERNELS_VARIANT=avx2 on both sides), the starter's 1,000-token one 1.15x. (Before the blocking, on a
# 2-core Zen 3, BLAS won from T = 192 on the starter's shapes, so the threshold was 128.)
BLAS_ROWS = 512
# The most rows the whole step takes at once (a short prompt read whole, a mixed step's chunk and decode rows):
# from here on a prompt is read operator by operator, whose attention runs through torch.
GEMM_ROWS = 128


def _native_for(x: torch.Tensor):
    return native() if x.device.type == "cpu" else None


def linear(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x @ w.T for a plain weight; fp32 activations stay fp32 (bf16 weights are read as they are)."""
    ops = _native_for(x)
    if ops is not None and w.dtype == torch.bfloat16 and x.dtype == torch.float32 and w.shape[1] % 8 == 0:
        if x.numel() // x.shape[-1] < BLAS_ROWS:
            return ops.linear_bf16(x, w)
        return torch.nn.functional.linear(x, w.to(torch.float32))
    return reference.linear(x, w)


def linear_blocks(x: torch.Tensor, blocks: BlockWeights) -> torch.Tensor:
    ops = _native_for(x)
    if ops is None:
        return reference.linear_blocks(x, blocks)
    if blocks.bits == 8:
        y = ops.linear_q8(x, blocks.qweight, blocks.scales)
    else:
        mins = blocks.mins if blocks.mins is not None else blocks.scales.new_empty(0)
        y = ops.linear_q4(x, blocks.qweight, blocks.scales, mins)
    return y if x.dtype == torch.float32 else y.to(x.dtype)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    ops = _native_for(x)
    if ops is not None and x.dtype == torch.float32 and weight.dtype == torch.float32 and x.shape[-1] % 8 == 0:
        return ops.rms_norm(x, weight, eps)
    return reference.rms_norm(x, weight, eps)


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    ops = _native_for(gate_up)
    if ops is not None and gate_up.dtype == torch.float32:
        return ops.silu_mul(gate_up)
    return reference.silu_mul(gate_up)


def attend(qkv, cos, sin, k_pool, v_pool, pages, pos, heads: int, kv_heads: int, scale: float) -> torch.Tensor:
    ops = _native_for(qkv)
    head_dim = k_pool.shape[-1]
    if (
        ops is not None
        and qkv.dtype == torch.float32
        and k_pool.dtype in (torch.float32, torch.bfloat16)
        and head_dim % 8 == 0
    ):
        return ops.attend(qkv, cos, sin, k_pool, v_pool, pages, pos, heads, kv_heads, scale)
    return reference.attend(qkv, cos, sin, k_pool, v_pool, pages, pos, heads, kv_heads, scale)


# -- products bound once to their weights, for the decode step's hot loop (no per-call dispatch) ----------
def bind_linear(w: torch.Tensor):
    """``x ↦ x @ w.T`` with the operator chosen now, for fp32 activations on this weight's device."""
    ops = native() if w.device.type == "cpu" else None
    if ops is None or w.dtype != torch.bfloat16 or w.dim() != 2 or w.shape[1] % 8 or w.stride(1) != 1:
        return lambda x: linear(x, w)
    gemv = ops.bind_bf16(w)

    def product(x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] < BLAS_ROWS and x.dim() == 2:
            return gemv(x)
        return linear(x, w)

    return product


def bind_blocks(blocks: BlockWeights):
    """``x ↦ x @ W.T`` for block-quantised weights, fp32 activations, the native operator when it runs."""
    ops = native() if blocks.qweight.device.type == "cpu" else None
    if ops is None:
        return lambda x: reference.linear_blocks(x, blocks)
    if blocks.bits == 8:
        return ops.bind_q8(blocks.qweight, blocks.scales)
    mins = blocks.mins if blocks.mins is not None else blocks.scales.new_empty(0)
    return ops.bind_q4(blocks.qweight, blocks.scales, mins)


def quantize_blocks(w: torch.Tensor, bits: int, symmetric: bool = False) -> BlockWeights:
    """``block_quant.quantize_q8`` / ``quantize_q4`` — in one parallel pass where the native kernels run."""
    from redline.inference.loading import block_quant

    ops = native() if w.device.type == "cpu" else None
    if ops is None or w.dtype not in (torch.float32, torch.bfloat16):
        return block_quant.quantize_q8(w) if bits == 8 else block_quant.quantize_q4(w, symmetric)
    if bits == 8:
        q, scales = ops.quantize_q8(w.detach())
        return BlockWeights(8, q, scales)
    packed, scales, mins = ops.quantize_q4(w.detach(), symmetric)
    return BlockWeights(4, packed, scales, None if symmetric else mins)
