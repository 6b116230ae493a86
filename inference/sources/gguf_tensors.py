"""One GGUF tensor at a time: what it becomes in a converted folder, and the conversion itself.

A quantised GGUF tensor that feeds a linear layer keeps its quantisation where Redline has a kernel
(``inference/kernels/block_quant.py``: blocks of 32, fp16 scales, optional fp16 mins):

- ``Q8_0`` → 8-bit blocks, bytes copied (exact);
- ``Q4_0`` / ``Q4_1`` → 4-bit blocks, bytes copied (exact);
- ``Q4_K`` → 4-bit asymmetric blocks: each 32-value sub-block of a 256-value super-block is exactly a
  Q4_1 block with scale ``d·sc`` and min ``−dmin·m``; the only change is rounding those two products to
  fp16 (docs/models.md has the measured error);
- every other quantised type (``Q5_K``, ``Q6_K``, ``Q5_0``, ``Q5_1``, ``Q2_K``, ``Q3_K``, the IQ types …) →
  8-bit blocks re-quantised from the ``gguf`` package's own de-quantisation: one 8-bit step is a quarter or
  less of these types' own steps (measured error in docs/models.md), at about half of bf16's bytes.

Everything else (embeddings, norms, biases, float tensors) is de-quantised with ``gguf.quants.dequantize``
and stored as a float tensor.
"""

from __future__ import annotations

from typing import Optional

import numpy as np

from ..cost import packed_layer_bytes
from ..kernels.block_quant import BLOCK, BlockWeights, pack_nibbles, quantize_q8

QK_K = 256  # a K-quant super-block

# How each quantised type is kept: (bits, how). Types not listed and not float go to 8 bits, re-quantised.
EXACT = "bytes copied"
PER_BLOCK = "per 32-block, scale and min rounded to fp16"
REQUANTISED = "re-quantised to 8 bits from gguf's de-quantisation"


def _types():
    # lazy: the GGUF reader loads only for GGUF files
    from gguf import GGMLQuantizationType as T

    return T


def float_types() -> set:
    T = _types()
    return {T.F32, T.F16, T.BF16, T.F64}


def kept_as(qtype) -> tuple[int, str]:
    """(bits, how) for a quantised GGUF type kept quantised."""
    T = _types()
    if qtype == T.Q8_0:
        return 8, EXACT
    if qtype in (T.Q4_0, T.Q4_1):
        return 4, EXACT
    if qtype == T.Q4_K:
        return 4, PER_BLOCK
    return 8, REQUANTISED


def is_quantised(qtype) -> bool:
    T = _types()
    return qtype not in float_types() and qtype not in (T.I8, T.I16, T.I32, T.I64)


def asymmetric(qtype) -> bool:
    """Whether the kept 4-bit blocks carry mins (Q4_1, Q4_K)."""
    T = _types()
    return qtype in (T.Q4_1, T.Q4_K)


def block_weights_bytes(qtype, rows: int, cols: int) -> int:
    """Bytes of the BlockWeights a quantised tensor of ``rows`` × ``cols`` becomes (qweight, scales, mins)."""
    bits, _ = kept_as(qtype)
    return packed_layer_bytes(bits, cols, rows, "bfloat16", blocks=True, mins=asymmetric(qtype))  # the estimator's


def can_keep(qtype, rows: int, cols: int) -> bool:
    """A quantised 2-D tensor whose rows split into blocks of 32 (K-quants: 256)."""
    # lazy: the GGUF reader loads only for GGUF files
    from gguf import GGML_QUANT_SIZES

    if not is_quantised(qtype) or cols % BLOCK:
        return False
    block_size, _ = GGML_QUANT_SIZES[qtype]
    return cols % block_size == 0


def _fields(raw: np.ndarray, sizes: list[int]) -> list[np.ndarray]:
    """Split [rows, blocks, bytes] into contiguous byte fields of the given widths."""
    out, start = [], 0
    for size in sizes:
        out.append(np.ascontiguousarray(raw[..., start : start + size]))
        start += size
    return out


def to_blocks(data: np.ndarray, qtype, rows: int, cols: int) -> BlockWeights:
    """The GGUF tensor ``data`` (its raw bytes, [rows, bytes per row]) as Redline's blocks."""
    # lazy: torch loads on the engine's thread, never at import
    import torch

    T = _types()
    raw = np.asarray(data).reshape(rows, -1)
    nb = cols // BLOCK
    if qtype == T.Q8_0:
        d, q = _fields(raw.reshape(rows, nb, 34), [2, 32])
        return BlockWeights(
            8, torch.from_numpy(q.view(np.int8).reshape(rows, cols)), torch.from_numpy(d.view(np.float16)[..., 0])
        )
    if qtype == T.Q4_0:
        d, qs = _fields(raw.reshape(rows, nb, 18), [2, 16])
        return BlockWeights(
            4, torch.from_numpy(qs.reshape(rows, cols // 2)), torch.from_numpy(d.view(np.float16)[..., 0])
        )
    if qtype == T.Q4_1:
        d, m, qs = _fields(raw.reshape(rows, nb, 20), [2, 2, 16])
        return BlockWeights(
            4,
            torch.from_numpy(qs.reshape(rows, cols // 2)),
            torch.from_numpy(d.view(np.float16)[..., 0]),
            torch.from_numpy(m.view(np.float16)[..., 0]),
        )
    if qtype == T.Q4_K:
        # lazy: the GGUF reader loads only for GGUF files
        from gguf.quants import Q4_K

        nsb = cols // QK_K
        d, dmin, sc_bytes, qs = _fields(raw.reshape(rows * nsb, 144), [2, 2, 12, 128])
        sc, m = Q4_K.get_scale_min(sc_bytes)  # the package's own unpacking of the 6-bit scales and mins
        scale = (d.view(np.float16).astype(np.float32) * sc.astype(np.float32)).astype(np.float16)
        mins = (-(dmin.view(np.float16).astype(np.float32) * m.astype(np.float32))).astype(np.float16)
        # qs: 4 chunks of 32 bytes; chunk i holds sub-block 2i in its low nibbles and 2i + 1 in its high ones.
        chunks = qs.reshape(rows * nsb, 4, 1, 32) >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 2, 1)
        values = (chunks & 0x0F).reshape(rows, cols)
        return BlockWeights(
            4,
            pack_nibbles(torch.from_numpy(values)),
            torch.from_numpy(scale.reshape(rows, nb)),
            torch.from_numpy(mins.reshape(rows, nb)),
        )
    return quantize_q8(torch.from_numpy(dequantize(data, qtype).reshape(rows, cols)))


def dequantize(data: np.ndarray, qtype) -> np.ndarray:
    """float32 values of a GGUF tensor (the ``gguf`` package's de-quantisers)."""
    # lazy: the GGUF reader loads only for GGUF files
    from gguf.quants import dequantize as gguf_dequantize

    return gguf_dequantize(np.asarray(data), qtype)


def llama_row_permutation(rows: int, n_head: int) -> np.ndarray:
    """Row order that undoes llama.cpp's Q/K permutation (``convert_hf_to_gguf.py``'s ``permute``), as
    transformers' ``LlamaTensorProcessor._reverse_permute_weights`` does: HF row ``[h, a, b]`` of shape
    (heads, 2, dim/2) is GGUF row ``[h, b, a]`` of shape (heads, dim/2, 2)."""
    dim = rows // n_head // 2
    return np.arange(rows).reshape(n_head, dim, 2).swapaxes(1, 2).reshape(-1)


def permute_rows(bw: BlockWeights, order: Optional[np.ndarray]) -> BlockWeights:
    if order is None:
        return bw
    # lazy: torch loads on the engine's thread, never at import
    import torch

    idx = torch.from_numpy(order)
    return BlockWeights(
        bw.bits,
        bw.qweight[idx].contiguous(),
        bw.scales[idx].contiguous(),
        None if bw.mins is None else bw.mins[idx].contiguous(),
    )
