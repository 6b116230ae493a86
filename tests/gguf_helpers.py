"""Write real GGUF files from a transformers Llama folder, the way llama.cpp's converter lays them out (tensor
names, the Q/K row permutation, a gpt2-style tokenizer in the metadata), quantised with the ``gguf`` package."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np


def llama_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's ``LlamaModel.permute`` (convert_hf_to_gguf.py) for attn_q (all heads) / attn_k (KV heads)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


GGUF_NAMES = {
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
}


def gguf_name(hf: str) -> str:
    if hf == "model.embed_tokens.weight":
        return "token_embd.weight"
    if hf == "model.norm.weight":
        return "output_norm.weight"
    if hf == "lm_head.weight":
        return "output.weight"
    parts = hf.split(".")  # model.layers.N.<module...>.weight
    return f"blk.{parts[2]}.{GGUF_NAMES['.'.join(parts[3:-1])]}.{parts[-1]}"


def write_llama_gguf(folder: Path, path: Path, types: dict[str, str], extra_tokens: int = 0) -> Path:
    """``folder``'s model as a GGUF at ``path``. ``types`` maps a substring of the GGUF tensor name (e.g.
    ``attn_q``, ``ffn_down``, ``token_embd``) to ``F16``/``F32``/``Q8_0``/``Q4_0``/``Q4_1``/``BF16``; 2-D tensors
    not matched are F16, 1-D ones F32."""
    import gguf
    from safetensors.numpy import load_file

    cfg = json.loads((folder / "config.json").read_text())
    tok = json.loads((folder / "tokenizer.json").read_text())
    state = {}
    for f in sorted(folder.glob("*.safetensors")):
        state.update(load_file(str(f)))
    heads, kv_heads = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name(folder.name)
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_rope_freq_base(cfg.get("rope_theta") or cfg.get("rope_parameters", {}).get("rope_theta", 10000.0))
    w.add_vocab_size(cfg["vocab_size"])
    w.add_rope_dimension_count(cfg["hidden_size"] // heads)
    # The tokenizer, as llama.cpp's gpt2-style converter writes it.
    vocab = tok["model"]["vocab"]
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    added = {a["id"]: a["content"] for a in tok.get("added_tokens", [])}
    types_list = [gguf.TokenType.CONTROL if i in added else gguf.TokenType.NORMAL for i in range(len(tokens))]
    for i in range(extra_tokens):
        tokens.append(f"<extra_{i}>")
        types_list.append(gguf.TokenType.CONTROL)
    merges = [m if isinstance(m, str) else " ".join(m) for m in tok["model"]["merges"]]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types(types_list)
    w.add_token_merges(merges)
    eos = cfg.get("eos_token_id")
    if eos is not None:
        w.add_eos_token_id(eos)
    if cfg.get("pad_token_id") is not None:
        w.add_pad_token_id(cfg["pad_token_id"])
    w.add_add_bos_token(False)
    tc = json.loads((folder / "tokenizer_config.json").read_text())
    template = tc.get("chat_template")
    if template is None and (folder / "chat_template.jinja").is_file():
        template = (folder / "chat_template.jinja").read_text()
    if template:
        w.add_chat_template(template)
    for hf, value in state.items():
        name = gguf_name(hf)
        arr = np.asarray(value, dtype=np.float32)
        if ".attn_q." in name:
            arr = llama_permute(arr, heads)
        elif ".attn_k." in name:
            arr = llama_permute(arr, kv_heads)
        kind = next((t for key, t in types.items() if key in name), "F16" if arr.ndim == 2 else "F32")
        if arr.ndim == 1:
            kind = "F32"
        if kind == "F32":
            w.add_tensor(name, arr)
        elif kind == "F16":
            w.add_tensor(name, arr.astype(np.float16))
        else:
            qtype = getattr(gguf.GGMLQuantizationType, kind)
            w.add_tensor(name, gguf.quants.quantize(arr, qtype), raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def random_kquant_blocks(qtype_name: str, rows: int, cols: int, seed: int = 0) -> np.ndarray:
    """Valid random blocks of a K-quant type (the ``gguf`` package de-quantises K-quants but cannot make them):
    random 6-bit (Q4_K/Q5_K) or 8-bit (Q6_K) sub-block scales, fp16 super-block scales of a realistic size
    (weights of RMS about 0.02), random quants. [rows, bytes per row] uint8, as a GGUF tensor's data."""
    import gguf

    qtype = getattr(gguf.GGMLQuantizationType, qtype_name)
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    nb = rows * cols // block
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, size=(nb, size), dtype=np.uint8)

    def f16(values):
        return np.frombuffer(values.astype(np.float16).tobytes(), dtype=np.uint8).reshape(nb, 2)

    if qtype_name in ("Q4_K", "Q5_K"):
        levels = 15 if qtype_name == "Q4_K" else 31
        raw[:, 0:2] = f16(rng.uniform(0.5, 1.5, nb) * 0.08 / levels / 63)  # d: sub-block steps of about 0.08/levels
        raw[:, 2:4] = f16(rng.uniform(0.5, 1.5, nb) * 0.04 / 63)  # dmin: sub-block mins of about -0.04
    elif qtype_name == "Q6_K":
        raw[:, 208:210] = f16(rng.uniform(0.5, 1.5, nb) * 0.08 / 32 / 127)
    return raw.reshape(rows, -1)
