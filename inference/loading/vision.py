"""Loading a model that sees images: its processor (the image processor, the tokenizer and the chat template that
places image tokens, ``AutoProcessor``), and the vision tower kept out of bitsandbytes' and Redline's own
quantisation (its modules from ``estimate/vision.tower_modules``)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from ..errors import ModelLoadError
from ..estimate.vision import tower_modules


def _images_only(cls):
    """``cls`` (a processor class) without its video processor. Qwen2.5-VL's processor takes a video processor,
    which transformers builds only with torchvision installed; Redline sends images alone, so where that fails the
    processor is built from the image processor and the tokenizer (the same class name, the same prompts)."""

    def __init__(self, image_processor=None, tokenizer=None, chat_template=None, **kwargs):
        cls.__init__(self, image_processor=image_processor, tokenizer=tokenizer, chat_template=chat_template, **kwargs)

    return type(cls.__name__, (cls,), {"__init__": __init__, "__module__": cls.__module__})


def load_processor(folder: Path, config, trust_remote_code: bool = False):
    """The processor of the vision model in ``folder`` (``AutoProcessor``), with errors that say what to do."""
    # lazy: transformers loads on the engine's thread, never at import
    import transformers
    from transformers import AutoProcessor

    # lazy: transformers loads on the engine's thread, never at import
    from transformers.models.auto.processing_auto import PROCESSOR_MAPPING_NAMES

    try:
        return AutoProcessor.from_pretrained(str(folder), trust_remote_code=trust_remote_code)
    except Exception as exc:
        first = exc
    name = PROCESSOR_MAPPING_NAMES.get(getattr(config, "model_type", ""))
    cls = getattr(transformers, name, None) if isinstance(name, str) else None
    if cls is not None and "video_processor" in cls.get_attributes():
        try:
            return _images_only(cls).from_pretrained(str(folder), trust_remote_code=trust_remote_code)
        except Exception:
            pass  # the first failure says more
    raise ModelLoadError(
        f"Could not load the image processor of {Path(folder).name} ({type(first).__name__}: {first}).",
        "A vision model's folder needs its processor's files (processor_config.json or preprocessor_config.json, "
        "with the tokenizer's); download the model again.",
    ) from first


def meta_towers(config) -> list[str]:
    """The vision tower's module names of a model of ``config``, from the architecture on the meta device."""
    # lazy: torch loads on the engine's thread, never at import
    import torch

    # lazy: transformers loads on the engine's thread, never at import
    from transformers import AutoModelForImageTextToText

    with torch.device("meta"):
        return tower_modules(AutoModelForImageTextToText.from_config(config))


def keep_tower_unquantised(kwargs: dict, spec, shape, config) -> Optional[list[str]]:
    """For bitsandbytes (int8, nf4, fp4): add the vision tower to the modules left unquantised, beside what
    transformers leaves by default (the output head, tied weights) or the user's own list. Returns the tower's
    modules (also what Redline's q8/q4 leave unpacked)."""
    towers = list(getattr(shape, "vision_modules", None) or []) if shape is not None else []
    if not towers:
        towers = meta_towers(config)
    q = kwargs.get("quantization_config")
    if q is not None:
        default = list(getattr(shape, "default_not_convert", None) or []) if shape is not None else []
        if not default and not spec.skip_modules:
            default = ["lm_head"]
        q.llm_int8_skip_modules = sorted(set(list(spec.skip_modules) or default) | set(towers))
    return towers
