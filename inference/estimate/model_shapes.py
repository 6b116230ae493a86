"""Read a model's shape for the estimator from whatever the user names, without reading weights.

- a folder: its ``config.json`` (weight files are only sized, never opened);
- a hub id: ``config.json`` alone, from the local cache or downloaded;
- a ``.gguf`` file: its metadata, turned into a config by transformers, and its tensors' real types (from
  the reader's tensor table; no weights read), which say what the conversion keeps quantised;
- ``starter``: its folder once fetched, else the config embedded below.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Optional

from ..errors import ModelLoadError, ModelSourceError
from ..paths import cache_dir
from ..sources.config import load_config, read_config
from ..sources.gguf import plan_gguf
from ..sources.manifest import read_manifest
from ..sources.resolve import ModelSource, resolve
from .estimator import ModelShape, cached_shape, shape_from_config

STARTER_SHAPE_FILE = Path(__file__).with_name("starter_shape.json")
# SmolLM2-135M-Instruct's config.json, so the starter can be estimated before its first fetch.
# The converted starter folder holds bf16 safetensors (de-quantised from the GGUF; the hub's copy is bf16 too).
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
    "dtype": "bfloat16",
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

    data = read_config(folder)
    path = str(folder / "config.json")
    check_fields(data, path)

    def build() -> ModelShape:

        return shape_from_config(load_config(folder), name=name, source=path)

    shape = cached_shape(data, build, shape_cache_file())
    shape.name = name
    shape.checkpoint_bytes = checkpoint_bytes

    manifest = read_manifest(folder)
    if manifest is not None:
        shape.packed = [
            [n, int(m["in_features"]), int(m["out_features"]), int(m["bits"]), bool(m.get("mins"))]
            for n, m in sorted(manifest["modules"].items())
        ]
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
        try:
            stored = json.loads((folder / "config.json").read_text(encoding="utf-8")).get("dtype")
        except (OSError, ValueError):
            stored = None
        if isinstance(stored, str):
            shape.stored_dtype = stored.removeprefix("torch.")
    return shape


def _hub_config_folder(repo_id: str) -> Path:
    # lazy: the hub client loads only when the hub is used
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


GGUF_SHAPE_VERSION = 2  # 2: the tensors' types and what the conversion keeps quantised


def _gguf_shape(source: ModelSource) -> ModelShape:
    path = source.path
    st = path.stat()
    key = {"gguf": str(path), "size": st.st_size, "mtime": int(st.st_mtime), "v": GGUF_SHAPE_VERSION}

    def build() -> ModelShape:

        plan = plan_gguf(path)  # metadata and the tensor table only
        check_fields(plan.config.to_dict(), str(path))
        shape = shape_from_config(plan.config, name=source.name, source=str(path))
        shape.stored_dtype = plan.float_dtype
        shape.checkpoint_bytes = plan.output_bytes  # the converted folder's weights
        shape.file_bytes = st.st_size
        shape.file_types = plan.type_counts()
        shape.packed = [[t.packed_module, t.shape[1], t.shape[0], t.bits, t.mins] for t in plan.packed()]
        return shape

    shape = cached_shape(key, build, shape_cache_file())
    shape.name = source.name
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
