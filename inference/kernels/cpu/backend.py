"""The CPU's row of the device table (``ops.py``): Redline's native kernels where their library runs and the tensors
suit them, torch's operators (``reference.py``) for the rest (another dtype, a width that is not a multiple of 8).

Each operator asks ``library.native()`` when it is called, as the table has no say in it: the first call loads the
library (building it, once, in a source checkout), and where it cannot run (``REDLINE_NATIVE_KERNELS=0``, another
CPU, no library and no compiler) every call is the reference operator. The answer is the library's own
(``library.status()``), so a test that turns the kernels off for a while gets torch's operators for that while and the
native ones after it, whatever ran first."""

from __future__ import annotations

from typing import Callable

import torch

from .. import block_quant, reference
from ..block_quant import BlockWeights
from .library import native

# From this many activation rows on, bf16 products run as fp32 matrix products through torch's BLAS (the
# weight converted to fp32 at every call). The fast path reads a prompt in chunks of at most 256 rows, so it
# never gets there: since the kernel reads a prompt in cache blocks (simd.h, dense_span) it beats converting the
# weight for BLAS at a 256-row chunk. Measured (2026-12-05, Zen 5, 2 cores; python tools/experiments/before_after.py
# --before <the commit with 128 here and no blocking> --configs fast:bf16 --prompts long --prompt-tokens N
# --new-tokens 4, 3 rounds): the 1B-shaped model's 300-token prompt read 1.69x sooner (avx512-vnni build; 1.16x with
# REDLINE_KERNELS_VARIANT=avx2 on both sides), the starter's 1,000-token one 1.15x. (Before the blocking, on a
# 2-core Zen 3, BLAS won from T = 192 on the starter's shapes, so the threshold was 128.)
BLAS_ROWS = 512


def operators() -> dict[str, Callable]:
    """The CPU's operators by name (``ops.BACKENDS``); loads nothing until one is called."""
    return {
        "linear": linear,
        "linear_blocks": linear_blocks,
        "rms_norm": rms_norm,
        "silu_mul": silu_mul,
        "attend": attend,
        "bind_linear": bind_linear,
        "bind_blocks": bind_blocks,
        "quantize_blocks": quantize_blocks,
    }


def linear(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x @ w.T for a plain weight; fp32 activations stay fp32 (bf16 weights are read as they are)."""
    ops = native()
    if ops is not None and w.dtype == torch.bfloat16 and x.dtype == torch.float32 and w.shape[1] % 8 == 0:
        if x.numel() // x.shape[-1] < BLAS_ROWS:
            return ops.linear_bf16(x, w)
        return torch.nn.functional.linear(x, w.to(torch.float32))
    return reference.linear(x, w)


def linear_blocks(x: torch.Tensor, blocks: BlockWeights) -> torch.Tensor:
    ops = native()
    if ops is None:
        return reference.linear_blocks(x, blocks)
    if blocks.bits == 8:
        y = ops.linear_q8(x, blocks.qweight, blocks.scales)
    else:
        mins = blocks.mins if blocks.mins is not None else blocks.scales.new_empty(0)
        y = ops.linear_q4(x, blocks.qweight, blocks.scales, mins)
    return y if x.dtype == torch.float32 else y.to(x.dtype)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    ops = native()
    if ops is not None and x.dtype == torch.float32 and weight.dtype == torch.float32 and x.shape[-1] % 8 == 0:
        return ops.rms_norm(x, weight, eps)
    return reference.rms_norm(x, weight, eps)


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    ops = native()
    if ops is not None and gate_up.dtype == torch.float32:
        return ops.silu_mul(gate_up)
    return reference.silu_mul(gate_up)


def attend(qkv, cos, sin, k_pool, v_pool, pages, pos, heads: int, kv_heads: int, scale: float) -> torch.Tensor:
    ops = native()
    head_dim = k_pool.shape[-1] - (2 if k_pool.dtype == torch.int8 else 0)  # 8-bit rows carry a 2-byte scale
    if (
        ops is not None
        and qkv.dtype == torch.float32
        and k_pool.dtype in (torch.float32, torch.bfloat16, torch.int8)
        and head_dim % 8 == 0
    ):
        return ops.attend(qkv, cos, sin, k_pool, v_pool, pages, pos, heads, kv_heads, scale)
    return reference.attend(qkv, cos, sin, k_pool, v_pool, pages, pos, heads, kv_heads, scale)


# -- products bound once to their weights, for the decode step's hot loop (no per-call dispatch) ----------
def bind_linear(w: torch.Tensor):
    """``x ↦ x @ w.T`` with the operator chosen now, for fp32 activations on this weight."""
    ops = native()
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
    ops = native()
    if ops is None:
        return lambda x: reference.linear_blocks(x, blocks)
    if blocks.bits == 8:
        return ops.bind_q8(blocks.qweight, blocks.scales)
    mins = blocks.mins if blocks.mins is not None else blocks.scales.new_empty(0)
    return ops.bind_q4(blocks.qweight, blocks.scales, mins)


def quantize_blocks(w: torch.Tensor, bits: int, symmetric: bool = False) -> BlockWeights:
    """``block_quant.quantize_q8`` / ``quantize_q4`` — in one parallel pass where the native kernels run."""
    ops = native()
    if ops is None or w.dtype not in (torch.float32, torch.bfloat16):
        return block_quant.quantize_q8(w) if bits == 8 else block_quant.quantize_q4(w, symmetric)
    if bits == 8:
        q, scales = ops.quantize_q8(w.detach())
        return BlockWeights(8, q, scales)
    packed, scales, mins = ops.quantize_q4(w.detach(), symmetric)
    return BlockWeights(4, packed, scales, None if symmetric else mins)
