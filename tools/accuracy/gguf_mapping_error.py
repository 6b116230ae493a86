"""Measure how far Redline's kept-quantised GGUF layers are from the ``gguf`` package's own de-quantisation.

    python tools/accuracy/gguf_mapping_error.py FILE.gguf [FILE.gguf ...]

For every quantised 2-D tensor of each file: the tensor as Redline keeps it (``gguf_tensors.to_blocks``, then
``block_quant.dequantize``) against ``gguf.quants.dequantize`` of the same bytes: max |error| and RMS error,
both relative to the tensor's RMS. For a file's float (F16/BF16/F32) 2-D tensors it also encodes Q4_K, Q5_K and
Q6_K blocks from the real weights (a plain encoder written here: per-sub-block min/max and 6- or 8-bit scales,
not llama.cpp's search-based quantiser; the gguf package de-quantises K-quants but cannot make them) and
measures the mapping of those, plus the bf16 alternative for Q5_K/Q6_K. Prints a Markdown table.
"""

from __future__ import annotations

import sys
from collections import defaultdict

import numpy as np

QK = 256


def _f16(x: np.ndarray) -> np.ndarray:
    return np.frombuffer(x.astype(np.float16).tobytes(), dtype=np.uint8).reshape(len(x), 2)


def _pack_scales(sc: np.ndarray, mn: np.ndarray) -> np.ndarray:
    """8 six-bit scales and mins per super-block → 12 bytes (the inverse of gguf's Q4_K.get_scale_min)."""
    out = np.zeros((sc.shape[0], 12), dtype=np.uint8)
    out[:, 0:4] = (sc[:, 0:4] & 63) | ((sc[:, 4:8] >> 4) << 6)
    out[:, 4:8] = (mn[:, 0:4] & 63) | ((mn[:, 4:8] >> 4) << 6)
    out[:, 8:12] = (sc[:, 4:8] & 0x0F) | ((mn[:, 4:8] & 0x0F) << 4)
    return out


def encode_k(x: np.ndarray, levels: int) -> tuple[np.ndarray, ...]:
    """Q4_K (levels 15) / Q5_K (31): value = d·sc·q − dmin·m per 32-value sub-block."""
    g = x.reshape(-1, 8, 32).astype(np.float32)
    lo = np.minimum(g.min(-1), 0)
    hi = g.max(-1)
    scale = (hi - lo) / levels
    mins = -lo
    d = (scale.max(-1) / 63).astype(np.float16).astype(np.float32)
    dmin = (mins.max(-1) / 63).astype(np.float16).astype(np.float32)
    sc = np.clip(np.round(scale / np.where(d > 0, d, 1)[:, None]), 0, 63).astype(np.uint8)
    m = np.clip(np.round(mins / np.where(dmin > 0, dmin, 1)[:, None]), 0, 63).astype(np.uint8)
    step = d[:, None] * sc
    q = np.round((g + (dmin[:, None] * m)[..., None]) / np.where(step > 0, step, 1)[..., None])
    return d, dmin, sc, m, np.clip(q, 0, levels).astype(np.uint8)


def q4_k(x: np.ndarray) -> np.ndarray:
    d, dmin, sc, m, q = encode_k(x, 15)
    qs = (q[:, 0::2] | (q[:, 1::2] << 4)).reshape(-1, 128)  # chunk i: sub-block 2i low, 2i + 1 high
    return np.concatenate([_f16(d), _f16(dmin), _pack_scales(sc, m), qs], axis=1)


def q5_k(x: np.ndarray) -> np.ndarray:
    d, dmin, sc, m, q = encode_k(x, 31)
    low, high = q & 0x0F, q >> 4
    qs = (low[:, 0::2] | (low[:, 1::2] << 4)).reshape(-1, 128)
    qh = np.zeros((q.shape[0], 32), dtype=np.uint8)
    for j in range(8):  # bit j of byte l: the high bit of element l of sub-block j
        qh |= (high[:, j, :] & 1) << j
    return np.concatenate([_f16(d), _f16(dmin), _pack_scales(sc, m), qh, qs], axis=1)


def q6_k(x: np.ndarray) -> np.ndarray:
    """value = d·sc·(q − 32), 16 sub-blocks of 16 with int8 scales, q in 0..63."""
    g = x.reshape(-1, 16, 16).astype(np.float32)
    amax = np.abs(g).max(-1)
    scale = amax / 31
    d = (np.abs(scale).max(-1) / 127).astype(np.float16).astype(np.float32)
    sc = np.clip(np.round(scale / np.where(d > 0, d, 1)[:, None]), -128, 127).astype(np.int8)
    step = d[:, None] * sc
    q = np.clip(np.round(g / np.where(step != 0, step, 1)[..., None]), -32, 31).astype(np.int16) + 32
    q = q.reshape(-1, 8, 32).astype(np.uint8)  # groups of 32 in value order
    low, high = q & 0x0F, q >> 4
    ql = np.zeros((q.shape[0], 128), dtype=np.uint8)
    qh = np.zeros((q.shape[0], 64), dtype=np.uint8)
    for g32 in range(8):  # the inverse of gguf's Q6_K.dequantize_blocks index arithmetic
        h, s, c0 = g32 // 4, (g32 % 4) // 2, (g32 % 2) * 32
        ql[:, h * 64 + c0 : h * 64 + c0 + 32] |= low[:, g32, :] << (4 * s)
        t = g32 % 4
        qh[:, h * 32 : h * 32 + 32] |= high[:, g32, :] << (2 * t)
    return np.concatenate([ql, qh, sc.view(np.uint8).reshape(-1, 16), _f16(d)], axis=1)


def errors(ours: np.ndarray, reference: np.ndarray) -> tuple[float, float]:
    rms = float(np.sqrt((reference.astype(np.float64) ** 2).mean()))
    diff = (ours.astype(np.float64) - reference).ravel()
    return float(np.abs(diff).max()) / rms, float(np.sqrt((diff**2).mean())) / rms


def main(paths: list[str]) -> None:
    import gguf
    import torch

    from redline.inference.kernels.block_quant import dequantize as blocks_to_float
    from redline.inference.sources.gguf_tensors import dequantize, kept_as, to_blocks

    T = gguf.GGMLQuantizationType
    rows_out: dict[tuple, list] = defaultdict(list)
    encoders = {"Q4_K": q4_k, "Q5_K": q5_k, "Q6_K": q6_k}
    for path in paths:
        reader = gguf.GGUFReader(path)
        name = path.rsplit("/", 1)[-1]
        for t in reader.tensors:
            if len(t.shape) != 2:
                continue
            rows, cols = int(t.shape[1]), int(t.shape[0])
            if t.tensor_type in (T.F16, T.BF16, T.F32):
                weights = dequantize(t.data, t.tensor_type).reshape(rows, cols)
                if cols % QK:
                    continue
                for kname, enc in encoders.items():
                    qtype = getattr(T, kname)
                    data = enc(weights.reshape(-1, QK)).reshape(rows, -1)
                    ref = dequantize(data, qtype).reshape(rows, cols)
                    own = errors(ref, weights)  # the K-quant's own error against the float weights (context)
                    kept = blocks_to_float(to_blocks(data, qtype, rows, cols)).numpy()
                    bits, how = kept_as(qtype)
                    rows_out[(f"{kname} (encoded from {name})", f"q{bits}: {how}")].append(errors(kept, ref) + own)
                    if kname != "Q4_K":
                        bf16 = torch.from_numpy(ref).to(torch.bfloat16).float().numpy()
                        rows_out[(f"{kname} (encoded from {name})", "bf16 instead")].append(errors(bf16, ref) + own)
            else:
                ref = dequantize(t.data, t.tensor_type).reshape(rows, cols)
                kept = blocks_to_float(to_blocks(t.data, t.tensor_type, rows, cols)).numpy()
                bits, how = kept_as(t.tensor_type)
                rows_out[(f"{t.tensor_type.name} ({name})", f"q{bits}: {how}")].append(errors(kept, ref) + (0, 0))
    print(
        "| GGUF type (source) | kept as | tensors | max abs error / RMS (worst tensor) | RMS error / RMS (mean) "
        "| the type's own RMS error / RMS (mean) |"
    )
    print("|---|---|---|---|---|---|")
    for (src, how), vals in rows_out.items():
        arr = np.array(vals)
        own = f"{arr[:, 3].mean():.2e}" if arr[:, 3].any() else "—"
        print(f"| {src} | {how} | {len(vals)} | {arr[:, 0].max():.2e} | {arr[:, 1].mean():.2e} | {own} |")


if __name__ == "__main__":
    main(sys.argv[1:])
