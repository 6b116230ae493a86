"""What a token costs in bytes and FLOPs: the one place that says how many bytes a model's weights hold and a
decode step reads at each layout (fp32/bf16 rows, GGUF blocks where Redline's CPU kernels run, torch's packed
layouts, bitsandbytes), how many bytes the KV cache holds per position at its dtype and window, and which models
the fast path runs. Used by the memory estimator, the speed model, the batcher's admission control, the
bandwidth roofline and the speed lab. Imports neither torch nor transformers (only the kernels' cheap
``will_run`` question, which builds nothing).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

from .errors import ModelLoadError
from .kernels.cpu.library import will_run
from .precision import AS_FILE, WEIGHT_ONLY, PrecisionSpec

if TYPE_CHECKING:
    from .estimate.estimator import ModelShape

DTYPE_BYTES = {
    "float32": 4,
    "float16": 2,
    "bfloat16": 2,
    "fp32": 4,
    "fp16": 2,
    "bf16": 2,
    "float64": 8,
    "int8": 1,
    "uint8": 1,
}
BNB_4BIT_BLOCK = 64  # bitsandbytes' default 4-bit block size
BNB_NESTED_BLOCK = 256  # double quantisation: absmax values per nested block

# Weights per block (kernels/block_quant.BLOCK, which imports torch; this module must not): GGUF's blocks and
# torch's int4 groups (loading/weight_only.INT4_GROUP) alike share a scale (and a zero or min) per 32 weights.
# tests/test_one_of_each.py holds the three equal.
BLOCK = 32
# The architectures Redline's fast decode path runs (decoding/fastpath.py reads this list; a model's modules are
# checked there too, once loaded).
FAST_TYPES = ("llama", "mistral", "qwen2", "qwen3", "smollm3")


def fast_path_refusal(model_type: str, bitsandbytes: bool, sliding_window: bool, hidden_act: str = "silu"):
    """None if the fast path runs a model of this kind, else why not: what the config alone tells (the speed
    model's prediction before loading, and ``fastpath.supports`` on a loaded model, ask the same)."""
    if model_type not in FAST_TYPES:
        return f"the fast path supports {', '.join(FAST_TYPES)}, not {model_type}"
    if bitsandbytes:
        return "bitsandbytes-quantised weights run through transformers (use the q8/q4 precisions)"
    if hidden_act != "silu":
        return f"activation {hidden_act} is not SiLU"
    if sliding_window:
        return "sliding-window attention"
    return None


def code_path(strategy: str, spec: PrecisionSpec, shape: ModelShape, device: str, compile: Optional[bool] = None):
    """Which code runs a strategy here: ("fast" | "hf" | "graph", a note or None)."""
    if strategy == "fast":
        reason = fast_path_refusal(shape.model_type, spec.quantised, any(shape.layer_windows))
        if reason:
            return "hf", f"{reason}; predicted as kv"
        return "fast", None
    if strategy == "static" and _kind(device) == "cuda" and compile is not False:
        return "graph", None
    return "hf", None


def _kind(device: str) -> str:
    return "cuda" if device.startswith("cuda") else "cpu"


# --------------------------------------------------------------------------- the KV cache
# The KV cache's forms (``--kv``): "bf16" keeps keys and values in the cache's float dtype, "q8" in 8-bit rows, each
# token's row of a head its int8 values and an fp16 scale (kernels/kv_quant.py, whose SCALE_BYTES this repeats: this
# module imports no torch).
KV_FORMS = ("bf16", "q8")
KV_Q8_SCALE_BYTES = 2


def kv_row_bytes(head_dim: int, dtype_bytes: int, form: str = "bf16") -> int:
    """Bytes of one token's keys (or values) of one KV head: head_dim × bytes, or head_dim + 2 in 8 bits."""
    if form not in KV_FORMS:
        raise ValueError(f"the KV cache is kept as {' or '.join(KV_FORMS)}, not {form!r}")
    return head_dim + KV_Q8_SCALE_BYTES if form == "q8" else head_dim * dtype_bytes


def kv_cache_bytes(
    layers: int,
    kv_heads: int,
    head_dim: int,
    tokens: int,
    batch: int,
    dtype_bytes: int,
    layer_windows: Optional[list[Optional[int]]] = None,
    form: str = "bf16",
) -> int:
    """2 (K and V) × layers × KV heads × head dim × tokens × batch × bytes (``form`` "q8": head dim + 2 bytes a
    row, whatever ``dtype_bytes``).

    A sliding-window layer keeps at most its window of tokens. (The seed's
    example, 32 layers × 32 KV heads × 128 × 2048 tokens × batch 4 × 2 bytes,
    is 4,294,967,296 bytes = 4 GiB.)
    """
    windows = layer_windows if layer_windows else [None] * layers
    per_token_layer = 2 * kv_heads * kv_row_bytes(head_dim, dtype_bytes, form) * batch
    return sum(per_token_layer * (min(tokens, w) if w else tokens) for w in windows[:layers])


# --------------------------------------------------------------------------- weights at their layouts
def should_convert(full_name: str, patterns: list[str]) -> bool:
    """transformers' ``quantizers_utils.should_convert_module``, copied so a cached estimate needs no
    transformers import (a test checks both agree): a pattern matches from the start up to a module
    boundary, as a regex with that boundary, or as a suffix."""
    boundary = r"(?:(?<=\.)|(?=\.|$))"
    return not any(re.match(rf"(?:{key}){boundary}", full_name) or full_name.endswith(key) for key in patterns)


@dataclass
class WeightBytes:
    quantised: int  # packed quantised weights
    constants: int  # quantisation scales (absmax, SCB)
    unquantised: int  # everything kept in a float dtype
    unquantised_dtype: str
    quantised_params: int

    @property
    def total(self) -> int:
        return self.quantised + self.constants + self.unquantised


def packed_layer_bytes(
    bits: int, fan_in: int, fan_out: int, dtype: str, blocks: bool = False, mins: bool = True
) -> int:
    """What one PackedLinear holds (``weight_only.PackedLinear``'s buffers). In GGUF's blocks (``blocks``, on a
    CPU with Redline's kernels): an fp16 scale per 32 weights, and for 4 bits an fp16 min too unless the blocks
    are symmetric (Q4_0). In torch's layouts: int8 rows with one scale per row in the compute dtype, or int4
    with a bf16 (scale, zero) pair per 32."""
    n = fan_in * fan_out
    groups = fan_out * (fan_in // BLOCK)
    if blocks and fan_in % BLOCK == 0:
        return (n if bits == 8 else n // 2) + groups * 2 * (2 if bits == 4 and mins else 1)
    if bits == 8:
        return n + fan_out * DTYPE_BYTES[dtype]
    return n // 2 + groups * 2 * 2


def compute_dtype(spec: PrecisionSpec, device: str) -> str:
    """The dtype activations and the KV cache are kept in, as the loader sets it up."""
    if spec.name in WEIGHT_ONLY or spec.name == AS_FILE:
        return _canonical(spec.compute_dtype)
    if not spec.quantised:
        return {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}[spec.name]
    if spec.name == "int8":
        # inference/precision.py: non-quantised parts in fp16 on GPUs, fp32 on CPU.
        return "float16" if device.startswith("cuda") else "float32"
    return {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}[spec.compute_dtype]


def weights_bytes(shape: ModelShape, spec: PrecisionSpec, device: str = "cpu") -> WeightBytes:
    dtype = compute_dtype(spec, device)
    if spec.name == AS_FILE:
        return _as_file_bytes(shape, dtype, device)
    if spec.name in WEIGHT_ONLY:
        return _weight_only_bytes(shape, spec, dtype, device)
    if not spec.quantised:
        return WeightBytes(0, 0, shape.parameters * DTYPE_BYTES[dtype], dtype, 0)
    # The same rule transformers applies (HfQuantizer.get_modules_to_not_convert):
    # user skip modules replace the default list; keep-in-fp32 modules add to it.
    not_convert = list(spec.skip_modules) if spec.skip_modules else list(shape.default_not_convert)
    not_convert += shape.keep_in_fp32 + vision_modules(shape)  # a vision tower stays unquantised (the loader's rule)
    q_params = q_blocks_bytes = scb = 0
    for name, fan_in, fan_out, _bias in shape.linears:
        if name in shape.tied_linears or not should_convert(name, not_convert):
            continue
        n = fan_in * fan_out
        q_params += n
        if spec.name == "int8":
            scb += fan_out * 4  # one fp32 scale per output row
        else:
            blocks = math.ceil(n / BNB_4BIT_BLOCK)
            if spec.double_quant:
                q_blocks_bytes += blocks + math.ceil(blocks / BNB_NESTED_BLOCK) * 4 + 4
            else:
                q_blocks_bytes += blocks * 4
    packed = q_params if spec.name == "int8" else (q_params + 1) // 2
    unquantised = (shape.parameters - q_params) * DTYPE_BYTES[dtype]
    return WeightBytes(packed, scb + q_blocks_bytes, unquantised, dtype, q_params)


def kernels_run(device: str) -> bool:
    """Whether Redline's CPU kernels will run a model on ``device`` (a CPU they are built for, shipped or buildable,
    not turned off): the question the loader asks, answered without building anything."""
    if device.startswith("cuda"):
        return False

    return will_run() is None


def q8_in_blocks(device: str) -> bool:
    """Where Redline's kernels will run (a CPU with a kernel build, shipped or buildable) q8 keeps GGUF's
    blocks (an fp16 scale per 32 weights); elsewhere torch's per-row int8 layout (weight_only.py). The same
    question the loader asks, so the estimate is of the layout that will really be loaded."""
    return kernels_run(device)


def _as_file_bytes(shape: ModelShape, dtype: str, device: str = "cpu") -> WeightBytes:
    """``gguf``: the layers the GGUF keeps quantised at their own bits, everything else in the compute dtype
    (a tied head the file keeps packed is a layer of its own, the embedding table stays for lookups)."""
    if not shape.packed:
        raise ModelLoadError(
            f"{shape.name} holds no quantised GGUF layers, so 'gguf' (as the file is) does not apply.",
            "Choose bf16, fp16, q8, q4, int8 or nf4.",
        )
    tied = set(shape.tied_linears)
    blocks = q8_in_blocks(device)  # the file's own blocks, kept as they are where Redline's kernels run
    q_params = packed = tied_extra = 0
    for name, fan_in, fan_out, bits, _mins in shape.packed:
        n = fan_in * fan_out
        if name in tied:
            tied_extra += n
        else:
            q_params += n
        packed += packed_layer_bytes(int(bits), fan_in, fan_out, dtype, blocks, bool(_mins))
    unquantised = (shape.parameters - q_params) * DTYPE_BYTES[dtype]
    return WeightBytes(packed, 0, unquantised, dtype, q_params + tied_extra)


def _weight_only_bytes(shape: ModelShape, spec: PrecisionSpec, dtype: str, device: str = "cpu") -> WeightBytes:
    """q8/q4 (``weight_only.quantize_model``): every nn.Linear, the output head included, is packed;
    a tied head gets its own packed copy while the embedding table stays for lookups. On a CPU the layers
    hold GGUF blocks of 32 weights (Q8_0: an fp16 scale per block; Q4_1: fp16 scale and minimum); on CUDA
    torch's layouts (int8: one scale per output row; int4: a bf16 scale and zero per group of 32)."""
    bits = 8 if spec.name == "q8" else 4
    blocks = q8_in_blocks(device)
    q_params = packed = scales = 0
    tied_extra = 0
    for name, fan_in, fan_out, _bias in shape.linears:
        if (bits == 4 and fan_in % BLOCK) or in_vision(name, shape):
            continue  # stays in the compute dtype
        n = fan_in * fan_out
        if name in shape.tied_linears:
            tied_extra += n  # a new packed tensor; the shared table is still counted as unquantised
        else:
            q_params += n
        packed += n if bits == 8 else n // 2
        scales += packed_layer_bytes(bits, fan_in, fan_out, dtype, blocks) - (n if bits == 8 else n // 2)
    unquantised = (shape.parameters - q_params) * DTYPE_BYTES[dtype]
    return WeightBytes(packed, scales, unquantised, dtype, q_params + tied_extra)


def _canonical(dtype: str) -> str:
    return {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}.get(dtype, dtype)


# --------------------------------------------------------------------------- what a decode step reads, and its FLOPs
def packed_linear_bytes(fan_in: int, fan_out: int, bits: int, device: str, compute_bytes: int) -> int:
    """A linear layer's weight bytes in q8/q4 as the loader packs them: the estimator's own count
    (``packed_layer_bytes``) — GGUF blocks of 32 where Redline's CPU kernels run (Q8_0: 1 + 2/32 bytes per
    weight; Q4_1: 0.5 + 4/32), torch's layouts elsewhere (int8 with one scale per row; int4 with a bf16
    scale and zero per group of 32)."""
    dtype = "float32" if compute_bytes == 4 else "bfloat16"
    return packed_layer_bytes(bits, fan_in, fan_out, dtype, q8_in_blocks(device))


def embedding_params(shape: ModelShape) -> int:
    return shape.vocab * shape.hidden


def vision_modules(shape: ModelShape) -> list[str]:
    """A vision model's tower and projector (``estimate/vision.tower_modules``); empty for a text model."""
    return list(getattr(shape, "vision_modules", None) or [])


def in_vision(name: str, shape: ModelShape) -> bool:
    """Whether the linear ``name`` belongs to the vision tower: read once per image, never by a decode step."""
    return any(name == t or name.startswith(t + ".") for t in vision_modules(shape))


def text_params(shape: ModelShape) -> int:
    """The parameters a decode step can read: all but a vision model's tower."""
    return shape.parameters - int(getattr(shape, "vision_parameters", 0) or 0)


def tied_head(shape: ModelShape) -> bool:
    return bool(shape.tied_linears)


def weights_read_bytes(shape: ModelShape, spec: PrecisionSpec, device: str = "cpu") -> int:
    """Weight bytes one decode step reads: every weight once, except the embedding table (one row), which a
    tied output head reads whole, and a vision model's tower (read once per image, in the prefill). Matches
    ``speed.arithmetic.weight_bytes_read`` on a loaded text model."""
    b = DTYPE_BYTES[compute_dtype(spec, device)]
    embed = embedding_params(shape)
    tied = tied_head(shape)
    if spec.name in WEIGHT_ONLY:
        bits = 8 if spec.name == "q8" else 4
        packed = covered = 0
        for name, fan_in, fan_out, _bias in shape.linears:
            if in_vision(name, shape):
                continue
            if bits == 4 and fan_in % BLOCK:
                packed += fan_in * fan_out * b  # stays in the compute dtype
            else:
                packed += packed_linear_bytes(fan_in, fan_out, bits, device, b)
            if name not in shape.tied_linears:
                covered += fan_in * fan_out
        others = max(0, text_params(shape) - covered - embed)  # norms, biases
        return packed + others * b + shape.hidden * b
    if not spec.quantised and spec.name != "gguf":
        return (text_params(shape) - embed) * b + (embed * b if tied else shape.hidden * b)
    wb = weights_bytes(shape, spec, device)  # the GGUF's own layers at their bits (gguf), or bitsandbytes
    ub = DTYPE_BYTES[wb.unquantised_dtype]
    # A tied head the GGUF keeps packed is a layer of its own (counted in the packed bytes): the table beside it
    # is only looked up, one row a step, like an untied model's. The 1B-shaped Q8_0 file was counted 201 MB (its
    # bf16 table) over what a step reads.
    head_packed = spec.name == AS_FILE and any(name in shape.tied_linears for name, *_ in shape.packed)
    total = wb.total - (shape.parameters - text_params(shape)) * ub  # the vision tower stays unquantised
    return total if tied and not head_packed else total - embed * ub + shape.hidden * ub


def weight_bytes_per_weight(shape: ModelShape, spec: PrecisionSpec, device: str = "cpu") -> float:
    """The average bytes per weight read (``weights_read_bytes`` over the weights a step multiplies by)."""
    return weights_read_bytes(shape, spec, device) / max(1, linear_params(shape))


def kv_dtype_bytes(shape: ModelShape, spec: PrecisionSpec, device: str, path: str) -> int:
    """Bytes per KV-cache element. The fast path on a CPU keeps the cache in bf16 (fp32 for an fp32 model);
    transformers keeps it in the compute dtype."""
    b = DTYPE_BYTES[compute_dtype(spec, device)]
    if path == "fast" and _kind(device) == "cpu":
        return 4 if b == 4 else 2
    return b


def kv_read_bytes(
    shape: ModelShape, spec: PrecisionSpec, device: str, path: str, context: int, kv: str = "bf16"
) -> int:
    """KV-cache bytes a decode step reads with ``context`` positions cached (sliding windows capped; ``kv`` "q8":
    the fast path's 8-bit rows, which only the fast path keeps)."""
    if context <= 0:
        return 0
    return kv_cache_bytes(
        shape.kv_layers or shape.layers,
        shape.kv_heads,
        shape.head_dim,
        context,
        1,
        kv_dtype_bytes(shape, spec, device, path),
        shape.layer_windows,
        form=kv if path == "fast" else "bf16",
    )


def linear_params(shape: ModelShape) -> int:
    """Weights a forward pass multiplies each token by (the output head included)."""
    if shape.linears:
        return sum(fan_in * fan_out for n, fan_in, fan_out, _b in shape.linears if not in_vision(n, shape))
    embed = embedding_params(shape)
    return text_params(shape) - embed + (embed if tied_head(shape) else 0)


def step_flops(shape: ModelShape, tokens: int, context_before: int) -> float:
    """FLOPs of one forward pass over ``tokens`` new tokens after ``context_before`` cached ones. The output
    head runs for the last token only (transformers' ``logits_to_keep``); attention is causal."""
    head = embedding_params(shape)
    body = max(0, linear_params(shape) - head)
    attended = tokens * context_before + tokens * (tokens + 1) / 2
    attention = 4.0 * (shape.kv_layers or shape.layers) * shape.heads * shape.head_dim * attended
    return 2.0 * body * tokens + 2.0 * head + attention
