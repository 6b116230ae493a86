"""Models with random weights, built where they run: no files to carry (an 8B checkpoint would not fit the
window) and no host copy.

``build`` makes the architecture on ``meta`` and gives each parameter memory on the device one at a time, drawn
from a generator seeded by the parameter's name (so the bf16, q4 and fp32 builds of one config hold the same
values: bf16-rounded draws, upcast for fp32). For q4 each linear layer is drawn in bf16 and packed at once
(``PackedLinear``, what the loader makes for q4 on CUDA), so the peak is the packed model plus one layer: an
8B-shaped q4 model builds under an 8 GB cap. Speed, memory, graph capture and the error against fp32 do not need
trained weights.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

BIG_CONFIG = Path(__file__).resolve().parents[3] / "tests" / "data" / "llama-3-8b-config.json"
INIT_STD = 0.02  # Llama's initializer_range


def big_config() -> dict:
    return json.loads(BIG_CONFIG.read_text())


def tiny_config() -> dict:
    """The 8B config's proportions (grouped KV heads 4:1, untied head, rope theta) at a size a CPU runs in
    moments: the same code path, none of the figures."""
    cfg = big_config()
    cfg.update(
        num_hidden_layers=2,
        hidden_size=64,
        intermediate_size=224,
        num_attention_heads=8,
        num_key_value_heads=2,
        vocab_size=512,
        max_position_embeddings=2048,
        bos_token_id=1,
        eos_token_id=2,
    )
    return cfg


def llama_config(config: dict):
    from transformers import LlamaConfig

    skip = ("architectures", "transformers_version", "torch_dtype", "dtype")
    return LlamaConfig(**{k: v for k, v in config.items() if k not in skip})


def word_tokenizer(vocab: int):
    """A tokenizer that can spell every id of a ``vocab``-row model (random weights emit any of them)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({f"t{i}": i for i in range(vocab)}, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="t2", pad_token="t2", unk_token="t0")
    fast.chat_template = "{% for m in messages %}{{ m['content'] }} {% endfor %}"
    return fast


def write_folder(folder: Path, config: dict):
    """config.json and a tokenizer (what ``resolve`` and the estimator read); returns the tokenizer."""
    folder.mkdir(parents=True, exist_ok=True)
    llama_config(config).save_pretrained(folder)
    tok = word_tokenizer(config["vocab_size"])
    tok.save_pretrained(folder)
    return tok


def _seeded(name: str, seed: int, device: str):
    import torch

    g = torch.Generator(device=device)
    # A stable per-name seed (Python's hash() is salted per process).
    g.manual_seed(seed * 1_000_003 + sum((i + 1) * ord(c) for i, c in enumerate(name)) % 1_000_003)
    return g


def _draw(name: str, shape, dtype, device: str, seed: int):
    """The parameter ``name``'s values: ones for a norm's weight, else N(0, 0.02) drawn in fp32 and rounded to
    bf16 (then stored in ``dtype``), so every precision's build holds the same numbers."""
    import torch

    if name.endswith("norm.weight"):
        return torch.ones(shape, dtype=dtype, device=device)
    t = torch.empty(shape, dtype=torch.float32, device=device)
    t.normal_(0.0, INIT_STD, generator=_seeded(name, seed, device))
    return t.to(torch.bfloat16).to(dtype)


def build(config: dict, precision: str, device: str, seed: int = 0):
    """The model of ``config`` on ``device`` in ``precision`` ("fp32", "bf16" or "q4"), eval mode, no grads."""
    import torch
    from transformers import LlamaForCausalLM

    from redline.inference.loading.weight_only import PackedLinear

    cfg = llama_config(config)
    with torch.device("meta"):
        model = LlamaForCausalLM(cfg)
    dtype = torch.float32 if precision == "fp32" else torch.bfloat16
    model.eval().requires_grad_(False)
    with torch.no_grad():
        for mod_name, module in list(model.named_modules()):
            for child_name, child in list(module.named_children()):
                if precision == "q4" and type(child) is torch.nn.Linear:
                    full = f"{mod_name}.{child_name}" if mod_name else child_name
                    lin = torch.nn.Linear(child.in_features, child.out_features, bias=False, device=device, dtype=dtype)
                    lin.weight.copy_(_draw(full + ".weight", lin.weight.shape, dtype, device, seed))
                    setattr(module, child_name, PackedLinear(lin, 4, torch.bfloat16, device=device))
                    del lin
        for mod_name, module in list(model.named_modules()):
            for pname, p in list(module.named_parameters(recurse=False)):
                if p.device.type != "meta":
                    continue
                full = f"{mod_name}.{pname}" if mod_name else pname
                value = _draw(full, p.shape, dtype, device, seed)
                setattr(module, pname, torch.nn.Parameter(value, requires_grad=False))
        if cfg.tie_word_embeddings:
            model.lm_head.weight = model.model.embed_tokens.weight
        # Buffers made on meta (the rotary frequencies) are computed again on the device.
        rot = model.model.rotary_emb
        model.model.rotary_emb = type(rot)(config=cfg).to(device)  # made on the host: a few floats
        left = [n for n, t in list(model.named_parameters()) + list(model.named_buffers()) if t.device.type == "meta"]
        if left:
            raise RuntimeError(f"still on meta after building: {left[:3]}")
    model.generation_config.eos_token_id = cfg.eos_token_id
    model.generation_config.pad_token_id = cfg.eos_token_id
    return model


def loaded_model(model, folder: Path, tokenizer, precision: str, device: str, seconds: float):
    """A LoadedModel (what the engine holds after a load) around a model built in memory."""
    import torch

    from redline.inference.backends.local import LoadedModel
    from redline.inference.precision import parse_precision
    from redline.inference.sources.resolve import resolve

    mem = int(torch.cuda.memory_allocated()) if device.startswith("cuda") else 0
    return LoadedModel(
        model, tokenizer, resolve(str(folder)), parse_precision(precision), device, folder, seconds, mem, mem
    )


def build_loaded(config: dict, precision: str, device: str, folder: Path, tokenizer, seed: int = 0):
    started = time.perf_counter()
    model = build(config, precision, device, seed)
    if device.startswith("cuda"):
        import torch

        torch.cuda.synchronize()
    return loaded_model(model, folder, tokenizer, precision, device, time.perf_counter() - started)


def free(device: str) -> None:
    import gc

    gc.collect()
    if device.startswith("cuda"):
        import torch

        torch.cuda.empty_cache()
