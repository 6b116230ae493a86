"""Predict the memory a model needs, from its config alone (no weights read).

total = weights + KV cache + activations + runtime overhead + draft + loading

- **weights**: exact parameter count from instantiating the architecture on the
  meta device (tied embeddings counted once), times the bytes of the precision.
  bitsandbytes precisions follow transformers' own rule for what stays
  unquantised (embeddings, ``lm_head``, norms, biases, skipped modules) and add
  the quantisation constants (int8: one fp32 scale per output row; 4-bit: one
  absmax per block of 64 weights, itself quantised to 8 bits under double
  quantisation).
- **KV cache**: 2 × layers × KV heads × head dim × tokens × batch × bytes, with
  sliding-window layers capped at their window.
- **activations**: the prefill working set for a prompt filling the context
  (hidden states, q/k/v, the MLP's intermediate tensors) plus the last-token
  logits in fp32; the decode step's working set is the same at one token.
- **overhead**: the runtime itself (CUDA context, cuBLAS workspace, allocator
  slack; on CPU the Python + torch + transformers baseline), plus a per-machine
  correction learned from measured loads (``memory_calibration``).
- **loading** (CPU): what the load phase holds beyond the running phase: the
  checkpoint is memory-mapped while weights are converted, so its pages count
  in the process's RSS until the conversion ends (and for as long as loaded
  tensors are views into it).

The figure predicted is the peak memory of the process over load and
generation: RSS on CPU; on CUDA the device memory this process uses.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Optional

from ..cost import (
    DTYPE_BYTES,
    WeightBytes,
    _canonical,
    compute_dtype,
    kv_cache_bytes,
    packed_layer_bytes,
    q8_in_blocks,
    weights_bytes,
)
from ..errors import ModelLoadError
from ..memory.policy import releases_pages
from ..precision import AS_FILE, WEIGHT_ONLY, PrecisionSpec
from ..units import GB, MB  # noqa: F401 - MB/GB are part of the estimator's vocabulary
from .vision import in_tower, is_vision_config, tower_modules

# Runtime overhead defaults, before the per-machine correction. CPU figures are
# RSS measured on Linux x86-64 (torch 2.13 CPU, transformers 5.2x) in the
# engine's own process: the interpreter with torch, transformers and a loaded
# tokenizer, and what importing bitsandbytes adds. CUDA figures (not yet
# checked against a measurement; the per-machine correction absorbs the
# difference): the context with lazy module loading (~0.3 GB, more for the
# kernels torch and bitsandbytes load on first use), cuBLAS workspace, and the
# caching allocator's slack. Weights are allocated in one block (transformers
# warms the allocator up with the model's size), so the slack is charged on
# the KV cache and activations, whose tensors come and go.
CPU_BASELINE_BYTES = 390 * MB
CPU_BITSANDBYTES_BYTES = 80 * MB
CUDA_CONTEXT_BYTES = 450 * MB
CUBLAS_WORKSPACE_BYTES = 32 * MB
CUDA_ALLOCATOR_SLACK = 0.10  # of KV cache + activations


# --------------------------------------------------------------------------- shape
@dataclass
class ModelShape:
    """What the estimate needs to know about an architecture, read from its config."""

    name: str
    model_type: str
    architecture: str
    parameters: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    hidden: int
    intermediate: int
    vocab: int
    max_positions: int
    stored_dtype: str  # dtype of the checkpoint on disk (config's dtype)
    layer_windows: list[Optional[int]] = field(default_factory=list)  # sliding window per layer; None = full
    kv_layers: int = 0  # layers that keep a KV cache (attention layers)
    # [name, in_features, out_features, bias] of every nn.Linear / Conv1D bitsandbytes may quantise
    linears: list[list] = field(default_factory=list)
    default_not_convert: list[str] = field(default_factory=list)  # transformers' default skip list
    keep_in_fp32: list[str] = field(default_factory=list)
    tied_linears: list[str] = field(default_factory=list)  # linears whose weight is tied to another
    checkpoint_bytes: Optional[int] = None  # size of the weight files when known, else derived
    # Layers a GGUF keeps quantised ([name, in_features, out_features, bits, has mins]): how the ``gguf``
    # precision (as the file is) loads them. Empty for ordinary models.
    packed: list[list] = field(default_factory=list)
    file_bytes: Optional[int] = None  # the .gguf file's size
    file_types: dict[str, int] = field(default_factory=dict)  # GGUF tensor types and how many of each
    # A model that sees images (``estimate/vision.py``): its vision tower's and projector's modules (kept
    # unquantised; a decode step never reads them) and their parameters, counted in ``parameters`` too.
    vision_modules: list[str] = field(default_factory=list)
    vision_parameters: int = 0

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "ModelShape":
        return cls(**data)

    def checkpoint_size(self) -> int:
        if self.checkpoint_bytes:
            return self.checkpoint_bytes
        return self.parameters * DTYPE_BYTES.get(self.stored_dtype, 4)


def _text_config(config):
    return config.get_text_config() if hasattr(config, "get_text_config") else config


def _require(cfg, source: str, *names: str):
    for n in names:
        value = getattr(cfg, n, None)
        if value is not None:
            return value
    raise ModelLoadError(
        f"{source}: field {names[0]!r} is missing, so the memory cannot be estimated.",
        "Restore the file from the model's original download.",
    )


def kv_geometry(config, source: str = "config.json") -> dict:
    """Layers, heads, KV heads and head dim, the way the attention modules read them."""
    cfg = _text_config(config)
    layers = int(_require(cfg, source, "num_hidden_layers", "n_layer", "num_layers"))
    hidden = int(_require(cfg, source, "hidden_size", "n_embd", "d_model"))
    heads = int(_require(cfg, source, "num_attention_heads", "n_head"))
    kv_heads = getattr(cfg, "num_key_value_heads", None)
    if kv_heads is None:
        # Falcon / GPT-BigCode spell multi-query attention as a flag.
        kv_heads = 1 if getattr(cfg, "multi_query", False) else heads
    head_dim = getattr(cfg, "head_dim", None) or hidden // heads
    layer_types = getattr(cfg, "layer_types", None)
    window = getattr(cfg, "sliding_window", None)
    if layer_types:
        windows = [int(window) if (t == "sliding_attention" and window) else None for t in layer_types]
        kv_layers = sum(1 for t in layer_types if "attention" in t)
    else:
        windows = [int(window) if window else None] * layers
        kv_layers = layers
    return {
        "layers": layers,
        "hidden": hidden,
        "heads": heads,
        "kv_heads": int(kv_heads),
        "head_dim": int(head_dim),
        "layer_windows": windows,
        "kv_layers": kv_layers,
    }


# The rope types whose ``factor`` stretches the positions a model was trained on (transformers'
# ``modeling_rope_utils``): linear and dynamic scale ``max_position_embeddings``; yarn, llama3 and longrope their
# ``original_max_position_embeddings``, which transformers fills in from ``max_position_embeddings`` when missing.
SCALED_ROPE = ("linear", "dynamic", "yarn", "llama3", "longrope")


def context_limit(config) -> int:
    """The longest context the model allows: ``max_position_embeddings`` (``n_positions``; 4,096 where neither is
    set), or, where its rope scaling stretches the positions further, the original length × the scaling factor, as
    transformers reads the rope parameters (``rope_parameters``, or the older ``rope_scaling``, also per layer
    type). Qwen2.5 with yarn ×4 over 32,768 positions: 131,072; Llama 3.1 (llama3 ×8 over 8,192, 131,072 set):
    131,072."""
    cfg = _text_config(config)
    base = int(getattr(cfg, "max_position_embeddings", None) or getattr(cfg, "n_positions", None) or 4096)
    rope = getattr(cfg, "rope_parameters", None) or getattr(cfg, "rope_scaling", None)
    if not isinstance(rope, dict):
        return base
    params = [rope] if ("rope_type" in rope or "type" in rope or "factor" in rope) else list(rope.values())
    limit = base
    for p in params:
        if not isinstance(p, dict) or (p.get("rope_type") or p.get("type")) not in SCALED_ROPE:
            continue
        factor = p.get("factor")
        if isinstance(factor, (int, float)) and factor > 1:
            limit = max(limit, int(float(factor) * int(p.get("original_max_position_embeddings") or base)))
    return limit


def shape_from_config(config, name: str = "", source: str = "config.json") -> ModelShape:
    """Instantiate the architecture on the meta device and read its exact shape."""
    # lazy: torch loads on the engine's thread, never at import
    import torch

    # lazy: transformers loads on the engine's thread, never at import
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    # lazy: transformers loads on the engine's thread, never at import
    from transformers.pytorch_utils import Conv1D

    # lazy: transformers loads on the engine's thread, never at import
    from transformers.quantizers.base import get_keys_to_not_convert

    geometry = kv_geometry(config, source)
    vision = is_vision_config(config)  # built as the loader builds it: the vision tower's weights counted
    try:
        with torch.device("meta"):
            model = (AutoModelForImageTextToText if vision else AutoModelForCausalLM).from_config(config)
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ModelLoadError(
            f"{source}: model_type {getattr(config, 'model_type', None)!r} cannot be built as a causal language "
            f"model by this version of transformers ({exc}).",
            "Choose a model of a supported architecture, or upgrade transformers.",
        ) from exc
    parameters = sum(p.numel() for p in model.parameters())  # tied parameters are yielded once
    towers = tower_modules(model) if vision else []
    tower_params = sum(p.numel() for n, p in model.named_parameters() if in_tower(n, towers))
    linears = []
    for mod_name, module in model.named_modules():
        if type(module) is torch.nn.Linear:
            linears.append([mod_name, module.in_features, module.out_features, module.bias is not None])
        elif isinstance(module, Conv1D):
            linears.append([mod_name, module.weight.shape[0], module.weight.shape[1], module.bias is not None])
    tied = sorted({k.removesuffix(".weight") for k in getattr(model, "all_tied_weights_keys", {}) or {}})
    cfg = _text_config(config)
    stored = getattr(config, "dtype", None) or getattr(cfg, "dtype", None) or "float32"
    stored = str(stored).removeprefix("torch.")
    return ModelShape(
        name=name or getattr(config, "_name_or_path", "") or config.model_type,
        model_type=config.model_type,
        architecture=type(model).__name__,
        parameters=int(parameters),
        layers=geometry["layers"],
        heads=geometry["heads"],
        kv_heads=geometry["kv_heads"],
        head_dim=geometry["head_dim"],
        hidden=geometry["hidden"],
        intermediate=int(
            getattr(cfg, "intermediate_size", None) or getattr(cfg, "n_inner", None) or 4 * geometry["hidden"]
        ),
        vocab=int(_require(cfg, source, "vocab_size")),
        max_positions=context_limit(config),
        stored_dtype=stored,
        layer_windows=geometry["layer_windows"],
        kv_layers=geometry["kv_layers"],
        linears=linears,
        default_not_convert=sorted(get_keys_to_not_convert(model)),
        keep_in_fp32=sorted(getattr(model, "_keep_in_fp32_modules", None) or []),
        tied_linears=tied,
        vision_modules=towers,
        vision_parameters=int(tower_params),
    )


# --------------------------------------------------------------------------- terms
def activation_bytes(shape: ModelShape, tokens: int, batch: int, dtype_bytes: int) -> int:
    """Peak working set of one forward pass over ``tokens`` new tokens.

    Live at once inside a decoder layer: the residual stream and its normed
    copy, q/k/v, and the MLP's gate, up and product tensors; after the last
    layer, the last token's logits in fp32 (transformers' generate keeps only
    the last position's logits) and the logits processors' copy of them.
    """
    kv_width = 2 * shape.kv_heads * shape.head_dim
    q_width = shape.heads * shape.head_dim
    per_token = (2 * shape.hidden + q_width + kv_width + 3 * shape.intermediate) * dtype_bytes
    logits = 2 * batch * shape.vocab * 4
    return batch * tokens * per_token + logits


def default_overhead_bytes(device: str, spec: PrecisionSpec, transient_bytes: int) -> int:
    if device.startswith("cuda"):
        return CUDA_CONTEXT_BYTES + CUBLAS_WORKSPACE_BYTES + int(CUDA_ALLOCATOR_SLACK * transient_bytes)
    return CPU_BASELINE_BYTES + (CPU_BITSANDBYTES_BYTES if spec.quantised else 0)


def loading_bytes(shape: ModelShape, spec: PrecisionSpec, device: str, weights: WeightBytes, running_extra: int) -> int:
    """What the CPU load phase holds beyond the running phase (0 on CUDA: weights stream to the device).

    While loading, the checkpoint is memory-mapped and its pages are resident.
    Weights whose loaded dtype equals the checkpoint's stay views into that
    mapping (no copy). bitsandbytes quantises each weight from a 16-bit copy
    (int8: ``Int8Params._quantize`` casts to fp16; 4-bit: the weight arrives in
    the compute dtype); those copies are freed, but on CPU the allocator keeps
    most of their pages (how much varies from run to run with the loader's
    threads; the full copy is the bound we predict). int8 on CPU keeps its fp32
    parts as views into the mapping, so the mapping stays resident while the
    model runs.
    """
    if device.startswith("cuda"):
        # q8/q4 load and pack in host memory, then move the packed weights: no device-side peak.
        return 0
    mapped = shape.checkpoint_size()
    views = weights.unquantised if weights.unquantised_dtype == _canonical(shape.stored_dtype) else 0
    if packed_views(shape, spec, device):
        # safetensors (0.8 measured) hands out tensors backed by the mapping itself, and a converted GGUF's
        # blocks and bf16 tensors are used as stored: the weights *are* the mapping's pages, counted once as
        # weights. The 1B-shaped Q8_0 file: 1,042 MB resident after its load on a 744 MB baseline (the pages
        # come in as the first reply reads them), where a copy of every tensor was predicted (+573 MB).
        return 0
    if shape.packed:
        views = 0  # de-quantised or re-packed: copies, and the pages of the mapping they were read from
    extra = max(0, mapped - views)
    if shape.packed and (spec.name in WEIGHT_ONLY or spec.name == AS_FILE):
        pass  # layers are built one at a time from their blocks; only the mapping's pages add up
    elif spec.name in WEIGHT_ONLY and weights.unquantised_dtype == _canonical(shape.stored_dtype):
        # q8/q4 load the model in the compute dtype first, then pack it layer by layer; in the file's own dtype
        # that model is the mapping itself (views), already counted above. The starter (bf16) at q8: predicted
        # 1,516 MB with a second copy counted, 1,379 MB measured.
        pass
    elif spec.name in ("nf4", "fp4") or spec.name in WEIGHT_ONLY:
        # q8/q4 load the whole model in the compute dtype first, then pack it layer by layer.
        extra += weights.quantised_params * DTYPE_BYTES[weights.unquantised_dtype]
    elif spec.name == "int8":
        extra += weights.quantised_params * 2
    if spec.name == "int8":
        return extra  # the mapping outlives the load
    return max(0, extra - running_extra)


def packed_views(shape: ModelShape, spec: PrecisionSpec, device: str) -> bool:
    """Whether a converted GGUF's layers load as views of its files (``loading/packed.py``): at ``gguf`` (as the
    file is) or at q8/q4 when every packed layer already has those bits, where Redline's kernels keep GGUF's
    blocks (elsewhere the blocks become torch's layouts: copies)."""

    if not shape.packed or device.startswith("cuda") or not q8_in_blocks(device):
        return False
    if spec.name == AS_FILE:
        return True
    if spec.name in WEIGHT_ONLY:
        want = 8 if spec.name == "q8" else 4
        return all(int(bits) == want for _n, _i, _o, bits, *_ in shape.packed)
    return False


FUSED = (".q_proj", ".k_proj", ".v_proj", ".gate_proj", ".up_proj")  # what the fast path concatenates


def fast_path_copy_bytes(
    shape: ModelShape, spec: PrecisionSpec, device: str, weights: WeightBytes, pages_released: Optional[bool] = None
) -> int:
    """What the fast path adds to a CPU model whose float weights are views into the checkpoint's mapping.

    The fast path concatenates q/k/v and gate/up into one weight each (``decoding/fastpath._fuse_linears``); the
    modules keep views of the fused copy, so a model whose weights were already copies (another dtype than the
    file's, or quantised) holds no more than before. But weights in the file's own dtype are views into the
    memory-mapped checkpoint, and the pages the concatenation read stay resident beside the fused copy: the
    starter at bf16 measured 120 MB more anonymous memory after a fast reply than after a kv one (its fused
    weights are 139 MB), and its mapping's pages were resident in both. A converted GGUF's blocks are views of
    its files the same way (``packed_views``): its fused layers are counted at their packed size.

    Where the fast path gives those pages back (``memory.policy.release_pages``, Linux; ``pages_released`` None
    asks), nothing stays: the starter's bf16 RSS after a fast reply went 1,393 → 1,253 MB, the 1B-shaped Q8_0
    GGUF's 2,898 → 2,144 MB."""
    if pages_released is None:
        pages_released = releases_pages()
    if device.startswith("cuda") or pages_released:
        return 0
    if shape.packed:
        if not packed_views(shape, spec, device):
            return 0

        return sum(
            packed_layer_bytes(int(bits), fan_in, fan_out, weights.unquantised_dtype, True, bool(mins))
            for name, fan_in, fan_out, bits, mins in shape.packed
            if name.endswith(FUSED)
        )
    if spec.quantised or spec.name in WEIGHT_ONLY:
        return 0
    if weights.unquantised_dtype != _canonical(shape.stored_dtype):
        return 0
    fused_rows = (shape.heads + 2 * shape.kv_heads) * shape.head_dim + 2 * shape.intermediate
    return shape.layers * fused_rows * shape.hidden * DTYPE_BYTES[weights.unquantised_dtype]


# --------------------------------------------------------------------------- estimate
@dataclass
class Estimate:
    precision: str
    context: int
    batch: int
    device: str
    weights_bytes: int
    kv_cache_bytes: int
    activation_bytes: int
    overhead_bytes: int
    draft_bytes: int
    loading_bytes: int
    total_bytes: int
    correction_bytes: int = 0  # part of overhead_bytes learned on this machine
    quantisation_constants_bytes: int = 0
    unquantised_bytes: int = 0
    decode_activation_bytes: int = 0
    fast_path_bytes: int = 0  # the fast path's fused copies beside a mapped checkpoint (fast_path_copy_bytes)
    available_bytes: Optional[int] = None
    fits: Optional[bool] = None
    margin_bytes: int = 0  # safety margin required on top of total_bytes to call it a fit

    def to_dict(self) -> dict:
        return asdict(self)


def accuracy_margin(total_bytes: int) -> int:
    """The error the estimate allows itself: 10 % or 300 MB, whichever is larger."""
    return max(int(0.10 * total_bytes), 300 * MB)


def estimate(
    shape: ModelShape,
    spec: PrecisionSpec,
    context: int,
    batch: int = 1,
    device: str = "cpu",
    draft: Optional[ModelShape] = None,
    draft_spec: Optional[PrecisionSpec] = None,
    correction_bytes: int = 0,
    prefill_tokens: Optional[int] = None,
    available_bytes: Optional[int] = None,
    baseline_bytes: Optional[int] = None,
    strategy: Optional[str] = None,
    kv: str = "bf16",
) -> Estimate:
    """Predicted peak memory for ``shape`` at ``spec`` with ``context`` tokens in the KV cache.

    ``prefill_tokens``: the prompt length at prefill (default: the prompt fills
    the context, the worst case). A static cache is sized to its full length up
    front, so pass that length as ``context``.

    ``baseline_bytes`` (CPU): the process's measured resident memory before the load, used
    instead of the default Python/torch baseline — a desktop window holds much more than the CLI.

    ``strategy``: "fast" counts the fast path's fused weights where they add to the model (a CPU model mapped
    from its checkpoint, ``fast_path_copy_bytes``); None or another strategy: the model as loaded.

    ``kv``: the KV cache's form (``cost.KV_FORMS``); "q8" counts 8-bit rows (head size + 2 bytes each: about half
    of bf16's), which the fast path keeps (``--kv q8``).
    """
    if context < 1 or batch < 1:
        raise ValueError("context and batch must be at least 1")
    wb = weights_bytes(shape, spec, device)
    act_dtype = DTYPE_BYTES[compute_dtype(spec, device)]
    tokens = context
    kv = kv_cache_bytes(
        shape.kv_layers or shape.layers,
        shape.kv_heads,
        shape.head_dim,
        tokens,
        batch,
        act_dtype,
        shape.layer_windows,
        form=kv,
    )
    act = activation_bytes(shape, min(prefill_tokens or context, context), batch, act_dtype)
    decode_act = activation_bytes(shape, 1, batch, act_dtype)
    draft_total = 0
    if draft is not None:
        dspec = draft_spec or spec
        dwb = weights_bytes(draft, dspec, device)
        ddtype = DTYPE_BYTES[compute_dtype(dspec, device)]
        draft_total = dwb.total + kv_cache_bytes(
            draft.kv_layers or draft.layers, draft.kv_heads, draft.head_dim, tokens, batch, ddtype, draft.layer_windows
        )
    default = default_overhead_bytes(device, spec, kv + act)
    # The learned correction is one figure for the machine, learned from whichever models ran; it may take back
    # this estimate's own overhead, never more: a 1B-shaped model served in q8 taught -1.06 GB, and the starter's
    # estimate then showed a negative overhead and a total of 0 MB. What is applied is recorded, so a check's
    # residual is still against the uncorrected prediction.
    correction_bytes = max(int(correction_bytes), -default)
    overhead = default + correction_bytes
    if baseline_bytes is not None and not device.startswith("cuda"):
        overhead += int(baseline_bytes) - CPU_BASELINE_BYTES
    load = loading_bytes(shape, spec, device, wb, kv + act)
    fast = fast_path_copy_bytes(shape, spec, device, wb) if strategy == "fast" else 0
    total = wb.total + kv + act + overhead + draft_total + load + fast
    est = Estimate(
        precision=spec.label(),
        context=context,
        batch=batch,
        device=device,
        weights_bytes=wb.total,
        kv_cache_bytes=kv,
        activation_bytes=act,
        overhead_bytes=overhead,
        draft_bytes=draft_total,
        loading_bytes=load,
        total_bytes=max(0, total),
        correction_bytes=correction_bytes,
        quantisation_constants_bytes=wb.constants,
        unquantised_bytes=wb.unquantised,
        decode_activation_bytes=decode_act,
        fast_path_bytes=fast,
        margin_bytes=accuracy_margin(max(0, total)),
    )
    if available_bytes is not None:
        est.available_bytes = int(available_bytes)
        est.fits = est.total_bytes + est.margin_bytes <= available_bytes
    return est


# --------------------------------------------------------------------------- shape cache
def config_fingerprint(config_dict: dict) -> str:
    # "shape 2": max_positions counts the rope scaling (``context_limit``); "shape 3": a vision model's tower
    # (``vision_modules``); shapes cached before are read afresh.
    text = json.dumps(config_dict, sort_keys=True, default=str) + "|" + importlib.metadata.version("transformers")
    text += "|shape 3"
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def cached_shape(config_dict: dict, build, cache_file: Optional[Path]) -> ModelShape:
    """Building the meta model needs torch; its result is cached per config so later estimates are instant."""
    key = config_fingerprint(config_dict)
    store: dict[str, Any] = {}
    if cache_file is not None and cache_file.is_file():
        try:
            store = json.loads(cache_file.read_text(encoding="utf-8"))
            if key in store:
                return ModelShape.from_dict(store[key])
        except (OSError, ValueError, TypeError):
            store = {}
    shape = build()
    if cache_file is not None:
        store[key] = shape.to_dict()
        try:
            cache_file.parent.mkdir(parents=True, exist_ok=True)
            tmp = cache_file.with_suffix(".tmp")
            tmp.write_text(json.dumps(dict(list(store.items())[-200:])), encoding="utf-8")
            tmp.replace(cache_file)
        except OSError:
            pass  # a cache that cannot be written only costs time
    return shape
