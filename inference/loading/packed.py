"""Folders that keep quantised weights quantised: the manifest, and building the model from it.

A GGUF conversion (``inference/sources/gguf.py``) stores each linear layer it keeps quantised as three
safetensors tensors, ``<module>.weight.qweight``, ``.scales`` and (4-bit asymmetric) ``.mins``, in the
block layout of ``block_quant.BlockWeights``, and lists the modules in ``redline_quantization.json``:

    {"format": "redline-blocks", "version": 1, "block_size": 32, "source": "model.Q4_K_M.gguf",
     "modules": {"model.layers.0.self_attn.q_proj": {"bits": 4, "mins": true, "in_features": 576,
                 "out_features": 576, "from": "Q4_1", "how": "bytes copied"}, ...}}

Everything else (embeddings, norms, layers kept in a float dtype) is a normal tensor of the folder.

Loading such a folder builds the architecture with its parameters on the meta device (buffers such as
rotary frequencies are computed for real), creates each listed layer with ``PackedLinear.from_blocks``
one at a time, and assigns the remaining tensors from the files, so the unquantised model never exists
in memory. Precisions: ``gguf`` keeps every layer as stored (4 or 8 bits per module); ``q8``/``q4``
bring every layer to that many bits (re-quantising the others, and quantising float linears);
``fp32``/``fp16``/``bf16`` de-quantise. bitsandbytes precisions are refused (they quantise from a float
checkpoint).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..errors import ModelLoadError, UnsupportedConfiguration
from ..precision import torch_dtype
from ..progress import check_cancel
from ..sources.manifest import file_bits


def check_precision(manifest: dict, precision_name: str, folder: Path) -> None:
    if precision_name in ("int8", "nf4", "fp4"):
        raise UnsupportedConfiguration(
            f"{folder.name} keeps the GGUF's quantised weights ({file_bits(manifest)}); bitsandbytes {precision_name} "
            "quantises from a float checkpoint, which this folder does not hold.",
            "Choose gguf (as the file is), q8, q4 or bf16 for this model.",
        )


def _weight_files(folder: Path) -> list[Path]:
    return sorted(folder.glob("*.safetensors"))


def load_packed(folder: Path, config, manifest: dict, precision, device: str, progress, should_cancel) -> Any:
    """Build the model of a packed folder at ``precision`` (a PrecisionSpec: gguf, q8, q4, fp32, fp16, bf16)."""
    # lazy: torch loads on the engine's thread, never at import
    import torch

    # lazy: accelerate loads only when this runs
    from accelerate import init_empty_weights

    # lazy: safetensors loads only when this runs
    from safetensors import safe_open

    # lazy: transformers loads on the engine's thread, never at import
    from transformers import AutoModelForCausalLM, GenerationConfig

    # lazy: block_quant imports torch (torch loads on the engine's thread, never at import)
    from ..kernels.block_quant import BlockWeights, dequantize, quantize_q4, quantize_q8

    # lazy: weight_only imports torch (torch loads on the engine's thread, never at import)
    from .weight_only import PackedLinear, quantize_model

    name = precision.name
    check_precision(manifest, name, folder)
    packed_out = name in ("gguf", "q8", "q4")
    dtype = torch_dtype(precision.compute_dtype if packed_out else name)
    modules: dict[str, dict] = manifest["modules"]

    # Where each tensor lives.
    where: dict[str, Path] = {}
    for f in _weight_files(folder):
        with safe_open(str(f), framework="pt") as sf:
            for key in sf.keys():
                where[key] = f
    handles: dict[Path, Any] = {}

    def read(key: str) -> torch.Tensor:
        f = where.get(key)
        if f is None:
            raise ModelLoadError(
                f"{folder.name}: the weight {key} is missing from the safetensors files.",
                "The conversion may be incomplete; delete the folder and convert the GGUF again.",
            )
        if f not in handles:
            handles[f] = safe_open(str(f), framework="pt")
        return handles[f].get_tensor(key)

    with init_empty_weights(include_buffers=False):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.eval()
    # A head tied to the embedding is stored packed as well; packed precisions give it its own layer, float
    # ones tie it to the (de-quantised) embedding again, which holds the same values.
    tied = {n for n, m in modules.items() if m.get("tied_to")} if packed_out else set()
    skip = {n for n, m in modules.items() if m.get("tied_to")} - tied
    if tied:
        # The head gets its own (packed) tensor; the embedding table stays for lookups.
        model.config.tie_word_embeddings = False
        if hasattr(model.config, "get_text_config"):
            model.config.get_text_config().tie_word_embeddings = False
    try:
        total = max(1, len(modules))
        for i, (mod_name, info) in enumerate(sorted(modules.items())):
            check_cancel(should_cancel)
            if mod_name in skip:
                continue
            key = f"{mod_name}.weight"
            bw = BlockWeights(
                int(info["bits"]),
                read(f"{key}.qweight"),
                read(f"{key}.scales"),
                read(f"{key}.mins") if info.get("mins") else None,
            )
            bias = read(f"{mod_name}.bias") if f"{mod_name}.bias" in where else None
            parent_name, _, child = mod_name.rpartition(".")
            parent = model.get_submodule(parent_name) if parent_name else model
            if packed_out:
                want = bw.bits if name == "gguf" else (8 if name == "q8" else 4)
                if want != bw.bits:
                    bw = quantize_q8(dequantize(bw)) if want == 8 else quantize_q4(dequantize(bw))
                layer = PackedLinear.from_blocks(bw, bias, dtype, device=device)
            else:
                layer = torch.nn.Linear(bw.in_features, bw.out_features, bias=bias is not None, device="meta")
                layer.weight = torch.nn.Parameter(dequantize(bw, dtype).to(device), requires_grad=False)
                if bias is not None:
                    layer.bias = torch.nn.Parameter(bias.to(device=device, dtype=dtype), requires_grad=False)
            setattr(parent, child, layer)
            del bw
            progress(0.8 * (i + 1) / total, f"Loading packed weights: {i + 1} of {total} layers")
        # Everything else: embeddings, norms, biases, layers stored in a float dtype.
        tied_keys = set(getattr(model, "all_tied_weights_keys", None) or {}) if not tied else set()
        keep_fp32 = list(getattr(model, "_keep_in_fp32_modules", None) or [])
        state = model.state_dict(keep_vars=True)
        for key, current in state.items():
            if not current.is_meta or (key in tied_keys and key not in where):
                continue
            value = read(key)
            owner_name, _, attr = key.rpartition(".")
            owner = model.get_submodule(owner_name) if owner_name else model
            want = torch.float32 if any(k in key.split(".") for k in keep_fp32) else dtype
            value = value.to(device=device, dtype=want if value.is_floating_point() else value.dtype)
            if attr in owner._parameters:
                owner._parameters[attr] = torch.nn.Parameter(value, requires_grad=False)
            else:
                owner._buffers[attr] = value
        if tied_keys:
            model.tie_weights()
        check_cancel(should_cancel)
    finally:
        handles.clear()
    left = [n for n, p in list(model.named_parameters()) + list(model.named_buffers()) if p.is_meta]
    if left:
        raise ModelLoadError(
            f"{folder.name}: {len(left)} weights were not in the files (first: {left[0]}).",
            "Delete the folder and convert the GGUF again.",
        )
    if name in ("q8", "q4"):
        quantize_model(model, 8 if name == "q8" else 4, dtype, include_lm_head=not tied, device=device)
    model.to(device)
    if (folder / "generation_config.json").is_file():
        model.generation_config = GenerationConfig.from_pretrained(str(folder))
    model.config._name_or_path = str(folder)
    return model
