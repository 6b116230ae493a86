"""Vision-language models seen from their config (Gemma 3, Qwen2.5-VL, Idefics3/SmolVLM, and the others transformers
loads as image-text-to-text): whether a model sees images, which of its modules are the vision tower (kept
unquantised, never read by a decode step), and how many prompt tokens an image becomes, worked out from the config
and the image processor's settings alone, before anything is loaded (the estimator's and the speed model's prefill)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Optional

# Idefics3's image processor never resizes beyond this (image_processing_idefics3.MAX_IMAGE_SIZE).
IDEFICS3_MAX_SIZE = 4096
# Qwen2-VL's image processor's defaults where a folder's settings leave them out.
QWEN_MIN_PIXELS = 56 * 56
QWEN_MAX_PIXELS = 28 * 28 * 1280


def _get(config: Any, name: str, default=None):
    if isinstance(config, dict):
        return config.get(name, default)
    return getattr(config, name, default)


def is_vision_config(config: Any) -> bool:
    """Whether ``config`` (a transformers config or its dict) is a model that sees images: its model type is one
    transformers loads with ``AutoModelForImageTextToText`` and it has a vision tower (``vision_config``). A text
    model of a family that also has vision variants (Gemma 3 1B: ``gemma3_text``) is not."""
    # lazy: transformers loads on the engine's thread, never at import
    from transformers.models.auto.modeling_auto import MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES

    if _get(config, "vision_config") is None:
        return False
    if _get(config, "model_type") not in MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES:
        return False
    architectures = _get(config, "architectures") or []
    return not any(str(a).endswith("ForCausalLM") for a in architectures)


def tower_modules(model) -> list[str]:
    """The full names of ``model``'s modules that are not its language model (the vision tower and the projector
    into the text's embeddings: ``model.vision_tower``, ``model.multi_modal_projector``; ``model.visual``;
    ``model.vision_model``, ``model.connector``), for bitsandbytes' skip list and the decode step's bytes."""
    inner = getattr(model, "model", None)
    get_decoder = getattr(model, "get_decoder", None)
    if inner is None or get_decoder is None:
        return []
    decoder = get_decoder()
    return [f"model.{name}" for name, child in inner.named_children() if child is not decoder]


def in_tower(name: str, towers) -> bool:
    """Whether the module or parameter ``name`` belongs to one of ``towers`` (``tower_modules``)."""
    return any(name == t or name.startswith(t + ".") for t in towers)


def image_settings(folder: Path) -> dict:
    """The image processor's settings of a model folder (``processor_config.json``'s ``image_processor``, or the
    older ``preprocessor_config.json``), with the processor's own numbers beside them (``image_seq_len``,
    ``image_seq_length``); empty where the folder has neither: each family's defaults then apply."""
    settings: dict = {}
    for name in ("preprocessor_config.json", "processor_config.json"):
        try:
            data = json.loads((Path(folder) / name).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if not isinstance(data, dict):
            continue
        inner = data.get("image_processor")
        settings.update({k: v for k, v in data.items() if k != "image_processor"})
        if isinstance(inner, dict):
            settings.update(inner)
    return settings


def _qwen_resize(height: int, width: int, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """Qwen2-VL's ``smart_resize``: both sides a multiple of ``factor``, the area within the bounds."""
    h = max(factor, round(height / factor) * factor)
    w = max(factor, round(width / factor) * factor)
    if h * w > max_pixels:
        beta = math.sqrt(height * width / max_pixels)
        h = max(factor, math.floor(height / beta / factor) * factor)
        w = max(factor, math.floor(width / beta / factor) * factor)
    elif h * w < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h = math.ceil(height * beta / factor) * factor
        w = math.ceil(width * beta / factor) * factor
    return h, w


def _idefics3_views(height: int, width: int, settings: dict) -> int:
    """How many views Idefics3's image processor makes of an image, step by step as it resizes: one, or its crops
    and a global view."""
    if not settings.get("do_image_splitting", True):
        return 1
    longest = int((settings.get("size") or {}).get("longest_edge", 4 * 364))
    crop = int((settings.get("max_image_size") or {}).get("longest_edge", 364))
    aspect = width / height
    if width >= height:  # the longest side to ``longest``, the other kept even
        width, height = longest, int(longest / aspect)
        height += height % 2
    else:
        height, width = longest, int(longest * aspect)
        width += width % 2
    height, width = max(height, 1), max(width, 1)
    aspect = width / height
    if width >= height and width > IDEFICS3_MAX_SIZE:
        width, height = IDEFICS3_MAX_SIZE, int(IDEFICS3_MAX_SIZE / aspect)
    elif height > width and height > IDEFICS3_MAX_SIZE:
        height, width = IDEFICS3_MAX_SIZE, int(IDEFICS3_MAX_SIZE * aspect)
    height, width = max(height, 1), max(width, 1)
    aspect = width / height  # then both sides up to whole crops
    if width >= height:
        width = math.ceil(width / crop) * crop
        height = math.ceil(int(width / aspect) / crop) * crop
    else:
        height = math.ceil(height / crop) * crop
        width = math.ceil(int(height * aspect) / crop) * crop
    if height > crop or width > crop:
        return (height // crop) * (width // crop) + 1
    return 1


def image_tokens(config: Any, settings: Optional[dict], width: int, height: int) -> int:
    """The image tokens an image of ``width`` × ``height`` px becomes in the prompt of a model of ``config``
    (a transformers config or its dict) whose image processor has ``settings`` (``image_settings``): the positions
    the vision tower's output fills, not counting the few marker tokens around them.

    - Gemma 3: always ``mm_tokens_per_image`` (256; the image is resized to the tower's square, no pan-and-scan);
    - Qwen2.5-VL (and Qwen2-VL): resized to multiples of 28 px (patch 14, merged 2×2) with its area between the
      processor's minimum and maximum pixels, then one token per merged 28-px cell;
    - Idefics3 (SmolVLM): ``image_seq_len`` per view, where an image larger than a crop is split into crops of
      ``max_image_size`` plus a global view.
    Raises ValueError for a family it does not know."""
    settings = settings or {}
    kind = _get(config, "model_type")
    width, height = max(1, int(width)), max(1, int(height))
    if kind == "gemma3":
        return int(_get(config, "mm_tokens_per_image", 256) or 256)
    if kind in ("qwen2_5_vl", "qwen2_vl"):
        vision = _get(config, "vision_config") or {}
        patch = int(settings.get("patch_size") or _get(vision, "patch_size", 14) or 14)
        merge = int(settings.get("merge_size") or _get(vision, "spatial_merge_size", 2) or 2)
        size = settings.get("size") or {}
        low = int(settings.get("min_pixels") or size.get("shortest_edge") or QWEN_MIN_PIXELS)
        high = int(settings.get("max_pixels") or size.get("longest_edge") or QWEN_MAX_PIXELS)
        h, w = _qwen_resize(height, width, patch * merge, low, high)
        return (h // patch) * (w // patch) // (merge * merge)
    if kind in ("idefics3", "smolvlm"):
        seq = settings.get("image_seq_len")
        if not seq:
            vision = _get(config, "vision_config") or {}
            side = int(_get(vision, "image_size", 364)) // int(_get(vision, "patch_size", 14))
            seq = int(side * side / int(_get(config, "scale_factor", 2) or 2) ** 2)
        return int(seq) * _idefics3_views(height, width, settings)
    raise ValueError(f"How many tokens an image becomes is not known for model type {kind!r}.")
