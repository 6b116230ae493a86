"""Read a model's shape for the estimator from whatever the user names, without reading weights.

- a folder: its ``config.json`` (weight files are only sized, never opened);
- a hub id: ``config.json`` alone, from the local cache or downloaded;
- a ``.gguf`` file: its metadata, turned into a config by transformers;
- ``starter``: its folder once fetched, else the config embedded below.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Optional

from redline.inference.errors import ModelLoadError, ModelSourceError
from redline.inference.memory.estimator import ModelShape, cached_shape, shape_from_config
from redline.inference.paths import cache_dir
from redline.inference.sources.resolve import ModelSource, resolve

STARTER_SHAPE_FILE = Path(__file__).with_name("starter_shape.json")
# SmolLM2-135M-Instruct's config.json, so the starter can be estimated before its first fetch.
# The converted starter folder holds float32 safetensors (de-quantised from the GGUF).
STARTER_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "attention_bias": False,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": 2,
    "head_dim": 64,
    "hidden_act": "silu",
    "hidden_size": 576,
    "intermediate_size": 1536,
    "max_position_embeddings": 8192,
    "mlp_bias": False,
    "num_attention_heads": 9,
    "num_hidden_layers": 30,
    "num_key_value_heads": 3,
    "rms_norm_eps": 1e-05,
    "rope_theta": 100000.0,
    "tie_word_embeddings": True,
    "vocab_size": 49152,
    "dtype": "float32",
}

# Each group: the field the estimate needs, and the other names architectures use for it.
REQUIRED_FIELDS = (
    ("num_hidden_layers", "n_layer", "num_layers", "n_layers"),
    ("hidden_size", "n_embd", "d_model"),
    ("num_attention_heads", "n_head", "num_heads"),
    ("vocab_size",),
)


def shape_cache_file() -> Path:
    return cache_dir() / "estimator-shapes.json"


def check_fields(data: dict, path: str) -> None:
    """transformers fills missing fields with its defaults (a 32-layer Llama); refuse instead."""
    text = data.get("text_config") if isinstance(data.get("text_config"), dict) else data
    for names in REQUIRED_FIELDS:
        if not any(text.get(n) is not None or data.get(n) is not None for n in names):
            raise ModelLoadError(
                f"{path} has no {names[0]!r} field, so the memory cannot be estimated.",
                "Restore the file from the model's original download.",
            )


def _folder_shape(folder: Path, name: str, checkpoint_bytes: Optional[int]) -> ModelShape:
    from redline.inference.loading.loader import read_config

    data = read_config(folder)
    path = str(folder / "config.json")
    check_fields(data, path)

    def build() -> ModelShape:
        from redline.inference.loading.loader import load_config

        return shape_from_config(load_config(folder), name=name, source=path)

    shape = cached_shape(data, build, shape_cache_file())
    shape.name = name
    shape.checkpoint_bytes = checkpoint_bytes
    return shape


def _weights_size(folder: Path) -> Optional[int]:
    files = list(folder.glob("*.safetensors"))
    return sum(f.stat().st_size for f in files) if files else None


def shipped_starter_shape() -> ModelShape:
    """The starter's shape as the meta device gives it, shipped with Redline so that the first
    `redline estimate starter` needs no torch import (a test checks it against a fresh count)."""
    return ModelShape.from_dict(json.loads(STARTER_SHAPE_FILE.read_text(encoding="utf-8")))


def _starter_shape(source: ModelSource) -> ModelShape:
    folder = source.local_folder()
    shape = shipped_starter_shape()
    shape.name = source.name
    if folder is not None:
        shape.checkpoint_bytes = _weights_size(folder)
    return shape


def _hub_config_folder(repo_id: str) -> Path:
    from huggingface_hub import hf_hub_download

    try:
        return Path(hf_hub_download(repo_id, "config.json", local_files_only=True)).parent
    except Exception:
        pass
    if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes"):
        raise ModelSourceError(
            f"The config of {repo_id} is not in the local Hugging Face cache and HF_HUB_OFFLINE is set.",
            "Unset HF_HUB_OFFLINE, or pass a local folder.",
        )
    try:
        return Path(hf_hub_download(repo_id, "config.json", etag_timeout=5)).parent
    except Exception as exc:
        raise ModelSourceError(
            f"Could not fetch the config of {repo_id} ({type(exc).__name__}: {exc}).",
            "Check the id and your connection, or pass a local model folder.",
        ) from exc


def _gguf_shape(source: ModelSource) -> ModelShape:
    path = source.path
    st = path.stat()
    key = {"gguf": str(path), "size": st.st_size, "mtime": int(st.st_mtime)}

    def build() -> ModelShape:
        from transformers import AutoConfig

        try:
            cfg = AutoConfig.from_pretrained(str(path.parent), gguf_file=path.name)
        except Exception as exc:
            raise ModelLoadError(
                f"Could not read the metadata of {path} ({type(exc).__name__}: {exc}).",
                "The file may be truncated or of an architecture transformers cannot read.",
            ) from exc
        check_fields(cfg.to_dict(), str(path))
        return shape_from_config(cfg, name=source.name, source=str(path))

    shape = cached_shape(key, build, shape_cache_file())
    shape.name = source.name
    # Redline converts a GGUF once into float32 safetensors and loads those.
    shape.stored_dtype = "float32"
    shape.checkpoint_bytes = None
    return shape


def shape_for_folder(folder: Path, name: str) -> ModelShape:
    """The shape of a model folder already on disk (what the engine loaded)."""
    return _folder_shape(Path(folder), name, _weights_size(Path(folder)))


def read_shape(spec: str) -> ModelShape:
    """The shape of the model ``spec`` names (same forms as ``--model``), from its config alone."""
    source = resolve(spec)
    if source.kind == "starter":
        return _starter_shape(source)
    if source.kind == "folder":
        return _folder_shape(source.path, source.name, _weights_size(source.path))
    if source.kind == "gguf":
        return _gguf_shape(source)
    if source.kind == "hub":
        folder = _hub_config_folder(source.spec)
        return _folder_shape(folder, source.name, None)
    raise ModelSourceError(f"Cannot estimate {spec!r}.")
