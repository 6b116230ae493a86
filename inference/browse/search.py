"""Search the Hugging Face hub for text-generation models Redline can run.

``HfApi.list_models`` with ``pipeline_tag="text-generation"``, sorted by downloads or trending, asking for the
few properties a row shows (``expand``): downloads, likes, trending score, gated, tags, the licence (card
data), the parameter count (``safetensors.total`` or ``gguf.total``), the architecture (``config`` or
``gguf.architecture``). A result is kept when Redline can run it: a GGUF repository of an architecture
transformers' GGUF loader reads, or a safetensors repository whose architecture transformers builds as a
causal language model. Weights saved only as pickles (``pytorch_model.bin``) are left out: Redline downloads
safetensors.
"""

from __future__ import annotations

import functools
from dataclasses import asdict, dataclass, field
from typing import Optional

from .errors import check_online, check_reachable, explain

SORTS = {"downloads": "downloads", "trending": "trending_score", "likes": "likes"}
EXPAND = ["downloads", "likes", "trendingScore", "gated", "tags", "cardData", "safetensors", "gguf", "config"]


@dataclass
class HubModel:
    """One search result, as a row shows it."""

    repo_id: str
    kind: str  # "gguf" or "safetensors"
    architecture: str  # "llama", "LlamaForCausalLM", … ("" when the hub does not say)
    parameters: Optional[int]  # None when the hub does not say
    license: str  # "" when the hub does not say
    gated: bool
    downloads: int = 0
    likes: int = 0
    trending: float = 0.0
    tags: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


@functools.lru_cache(maxsize=1)
def causal_lm_names() -> tuple[frozenset, frozenset]:
    """(model types, architecture class names) transformers builds as causal language models."""
    # lazy: transformers loads on the engine's thread, never at import
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return frozenset(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES), frozenset(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values())


@functools.lru_cache(maxsize=1)
def gguf_architectures() -> frozenset:
    """The GGUF architectures transformers' GGUF loader (which Redline's conversion uses) reads."""
    # lazy: transformers loads on the engine's thread, never at import
    from transformers.integrations.ggml import GGUF_CONFIG_MAPPING

    names = set(GGUF_CONFIG_MAPPING) - {"general", "tokenizer", "t5", "umt5"}  # not causal LMs
    # llama.cpp spells some without the underscore transformers' key has (qwen2moe for qwen2_moe).
    return frozenset(names | {n.replace("_", "") for n in names})


def _license(info) -> str:
    card = getattr(info, "card_data", None)
    value = None
    if card is not None:
        value = card.get("license") if hasattr(card, "get") else getattr(card, "license", None)
    if not value:
        value = next((t.split(":", 1)[1] for t in (info.tags or []) if t.startswith("license:")), "")
    return value if isinstance(value, str) else ", ".join(map(str, value))


def runnable(info) -> Optional[HubModel]:
    """``info`` (a ``ModelInfo``) as a row, or None when Redline cannot run it."""
    tags = list(info.tags or [])
    gguf_meta = info.gguf if isinstance(info.gguf, dict) else None
    gated = bool(info.gated) and info.gated != "False"
    common = dict(
        license=_license(info),
        gated=gated,
        downloads=int(info.downloads or 0),
        likes=int(info.likes or 0),
        trending=float(info.trending_score or 0),
        tags=tags,
    )
    if gguf_meta is not None or "gguf" in tags:
        arch = str((gguf_meta or {}).get("architecture") or "")
        if arch and arch not in gguf_architectures():
            return None
        total = (gguf_meta or {}).get("total")
        return HubModel(info.id, "gguf", arch, int(total) if total else None, **common)
    safetensors = getattr(info, "safetensors", None)
    if safetensors is None and "safetensors" not in tags:
        return None
    config = info.config if isinstance(info.config, dict) else {}
    types, classes = causal_lm_names()
    archs = [a for a in config.get("architectures") or [] if isinstance(a, str)]
    model_type = config.get("model_type")
    if archs and not any(a in classes for a in archs) and model_type not in types:
        return None
    if not archs and model_type is not None and model_type not in types:
        return None
    total = getattr(safetensors, "total", None) if safetensors is not None else None
    return HubModel(info.id, "safetensors", archs[0] if archs else (model_type or ""), total or None, **common)


def search(query: str, sort: str = "downloads", limit: int = 20, kind: Optional[str] = None) -> list[HubModel]:
    """Text-generation models matching ``query`` that Redline can run, most downloaded (or trending) first.

    ``kind``: "gguf" or "safetensors" keeps only that kind. Asks the hub for a few more than ``limit`` so that
    what is filtered out does not leave the page short. Raises ``ModelSourceError`` (one sentence) offline or
    when the hub cannot be reached."""
    # lazy: the hub client loads only when the hub is used
    from huggingface_hub import HfApi

    if sort not in SORTS:
        raise ValueError(f"sort must be one of {', '.join(SORTS)}")
    check_online()
    check_reachable("searching the hub")
    try:
        infos = list(
            HfApi().list_models(
                search=query.strip() or None,
                pipeline_tag="text-generation",
                sort=SORTS[sort],
                limit=limit * 3,
                expand=EXPAND,
            )
        )
    except Exception as exc:
        raise explain("searching the hub", exc) from exc
    rows = []
    for info in infos:
        row = runnable(info)
        if row is not None and (kind is None or row.kind == kind):
            rows.append(row)
    key = {"downloads": lambda r: r.downloads, "trending": lambda r: r.trending, "likes": lambda r: r.likes}[sort]
    rows.sort(key=key, reverse=True)  # the hub sorts too; a stand-in or a mirror may not
    return rows[:limit]


def warm_up() -> None:
    """Import what searching and reading variants use (transformers' model tables, its GGUF reader, the meta
    model's code), so that a page can do it once, off the UI thread, before the user's first search: loading
    those modules holds Python's GIL in long stretches (unmarshalling large modules), the one thing that can
    stall a UI thread running beside it."""
    import gguf  # noqa: F401
    import transformers.modeling_gguf_pytorch_utils  # noqa: F401
    import transformers.models.llama.modeling_llama  # noqa: F401

    causal_lm_names()
    gguf_architectures()
    from ..estimate import model_shapes  # noqa: F401
    from ..sources import gguf as redline_gguf  # noqa: F401
