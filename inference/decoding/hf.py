"""The strategies that run on transformers' own ``generate()``: naive, kv, static, speculative, prompt-lookup.

Sampling, stop strings and end-of-sequence handling are the library's, not ours. Speculative decoding's
knobs live on the *draft's* generation_config: passed to ``generate()`` they would be ignored.
"""

from __future__ import annotations

import copy
import inspect
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Optional

from ..errors import IncompatibleDraft
from ..events import PrefillProgress
from ..progress import CancelFn
from .draft_check import compare
from .options import DecodeOptions, SamplingSettings

if TYPE_CHECKING:  # a type only: the local backend sits above decoding
    from ..backends.local import LoadedModel


class CancelCriteria:
    """A stopping criterion that reads the cancel flag once per step."""

    def __init__(self, should_cancel: Optional[CancelFn]):
        self.should_cancel = should_cancel
        self.cancelled = False

    def check(self) -> bool:
        """Whether the request was cancelled; remembered once seen."""
        if not self.cancelled and self.should_cancel is not None and self.should_cancel():
            self.cancelled = True
        return self.cancelled

    def __call__(self, input_ids, scores, **kwargs):
        # lazy: torch loads on the engine's thread, never at import
        import torch

        return torch.full((input_ids.shape[0],), self.check(), dtype=torch.bool, device=input_ids.device)


def generation_config(target: LoadedModel, sampling: SamplingSettings, options: DecodeOptions, max_new_tokens: int):
    """The model's own generation_config with the user's settings on top."""
    # lazy: transformers loads on the engine's thread, never at import
    from transformers import GenerationConfig

    base = target.model.generation_config
    cfg = copy.deepcopy(base) if base is not None else GenerationConfig()
    cfg.max_new_tokens = max_new_tokens
    cfg.max_length = None
    cfg.min_new_tokens = min(sampling.min_new_tokens, max_new_tokens) if sampling.min_new_tokens else None
    if sampling.temperature is not None:
        if sampling.temperature <= 0:
            cfg.do_sample = False
        else:
            cfg.do_sample = True
            cfg.temperature = sampling.temperature
    if sampling.top_p is not None:
        cfg.top_p = sampling.top_p
    if sampling.top_k is not None:
        cfg.top_k = sampling.top_k
    if sampling.repetition_penalty is not None:
        cfg.repetition_penalty = sampling.repetition_penalty
    if not cfg.do_sample:  # greedy: the sampling knobs would only trigger warnings
        cfg.temperature, cfg.top_p, cfg.top_k = None, None, None
    if cfg.pad_token_id is None:
        eos = cfg.eos_token_id
        cfg.pad_token_id = eos[0] if isinstance(eos, list) else eos
    cfg.use_cache = options.strategy != "naive"
    if options.strategy == "static":
        cfg.cache_implementation = "static"
        use_compile = options.compile if options.compile is not None else target.device.startswith("cuda")
        if use_compile:
            # lazy: transformers loads on the engine's thread, never at import
            from transformers import CompileConfig

            cfg.compile_config = CompileConfig()
            cfg.compile_config._compile_all_devices = True
        cfg.disable_compile = not use_compile
    else:
        cfg.disable_compile = True
    if options.strategy == "prompt-lookup":
        cfg.prompt_lookup_num_tokens = options.lookup_tokens
    return cfg


def check_draft(target: LoadedModel, draft: LoadedModel) -> str:
    """Return how the pair works ("shared" vocabulary or "universal" assisted decoding) or raise why not."""

    if draft.device != target.device:
        raise IncompatibleDraft(
            f"The draft runs on {draft.device} but the target on {target.device}.", "Load both on the same device."
        )
    return compare(target.name, target.model.config, target.tokenizer, draft.name, draft.model.config, draft.tokenizer)


@dataclass
class DraftStats:
    proposed: int = 0
    accepted: int = 0
    steps: int = 0


def count_draft_tokens(model, stats: DraftStats) -> Callable[[], None]:
    """Count proposed and accepted draft tokens without changing what generate() does; returns the undo."""
    original = model._get_candidate_generator

    def wrapped(*args, **kwargs):
        gen = original(*args, **kwargs)
        get_candidates, update = gen.get_candidates, gen.update_candidate_strategy

        def counted_get_candidates(input_ids, *a, **k):
            cand, logits = get_candidates(input_ids, *a, **k)
            stats.proposed += int(cand.shape[1] - input_ids.shape[1])
            stats.steps += 1
            return cand, logits

        def counted_update(input_ids, scores, num_matches):
            stats.accepted += int(num_matches)
            return update(input_ids, scores, num_matches)

        gen.get_candidates = counted_get_candidates
        gen.update_candidate_strategy = counted_update
        return gen

    model._get_candidate_generator = wrapped
    return lambda: model.__dict__.pop("_get_candidate_generator", None)


def use_draft(
    target: LoadedModel, draft: Optional[LoadedModel], options: DecodeOptions, gen_kwargs: dict, notes: list[str]
) -> Callable[[], None]:
    """Set up speculative decoding with ``draft``: its knobs on its own generation_config, the pair's
    tokenizers when they differ. Returns the undo that puts the draft's settings back."""
    if draft is None:
        raise IncompatibleDraft(
            "The speculative strategy needs a draft model.",
            "Choose a draft model (a small model of the same family), or use prompt-lookup.",
        )
    mode = check_draft(target, draft)
    dcfg = draft.model.generation_config
    saved = (dcfg.num_assistant_tokens, dcfg.num_assistant_tokens_schedule, dcfg.assistant_confidence_threshold)
    # These knobs are read from the draft's generation_config only.
    dcfg.num_assistant_tokens = options.num_draft_tokens
    dcfg.num_assistant_tokens_schedule = options.draft_schedule
    dcfg.assistant_confidence_threshold = 0.0  # propose exactly k tokens: what the user set
    gen_kwargs["assistant_model"] = draft.model
    if mode == "universal":
        gen_kwargs["tokenizer"] = target.tokenizer
        gen_kwargs["assistant_tokenizer"] = draft.tokenizer
        notes.append("draft uses a different tokenizer: universal assisted decoding")

    def undo():
        dcfg.num_assistant_tokens, dcfg.num_assistant_tokens_schedule, dcfg.assistant_confidence_threshold = saved

    return undo


PREFILL_CHUNK = 256  # prompt tokens per forward pass when a long prompt is read ahead of generate()


def run_generate(
    target: LoadedModel,
    prompt: list[int],
    cfg,
    collector,
    cancel: CancelCriteria,
    gen_kwargs: dict,
    extra_inputs: Optional[dict] = None,
) -> None:
    """One call of transformers' generate(), streaming into ``collector``.

    With the dynamic KV cache (``kv``), a long prompt is read first in chunks, the cancel checked and progress
    reported between them, so Stop works within a chunk's time and the window can show how far reading got;
    generate() then goes on from that cache. Other strategies read the prompt in one pass, inside generate().
    ``extra_inputs``: a vision model's (``pixel_values``…, from its processor), passed to generate() with the
    prompt, which then reads it in one pass (the images are read with the tokens that stand for them)."""
    # lazy: torch loads on the engine's thread, never at import
    import torch

    # lazy: transformers loads on the engine's thread, never at import
    from transformers import StoppingCriteriaList

    model = target.model
    ids = torch.tensor([prompt], dtype=torch.long, device=model.device)
    kwargs = dict(gen_kwargs)
    for key, value in (extra_inputs or {}).items():  # on the model's device; pixels in its dtype
        if isinstance(value, torch.Tensor):
            value = value.to(model.device, dtype=model.dtype if value.is_floating_point() else None)
        kwargs[key] = value
    chunked = (
        not extra_inputs
        and len(prompt) > PREFILL_CHUNK
        and cfg.use_cache
        and getattr(cfg, "cache_implementation", None) in (None, "dynamic")
        and "assistant_model" not in kwargs
        and not getattr(cfg, "prompt_lookup_num_tokens", None)
    )
    if chunked:
        # lazy: transformers loads on the engine's thread, never at import
        from transformers import DynamicCache

        cache = DynamicCache(config=model.config)
        # transformers 5.24 renamed ``past_key_values`` to ``cache`` (the old name warns, and goes in 5.40).
        name = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
        read = len(prompt) - 1  # generate() reads the last prompt token itself and picks the first new one
        for start in range(0, read, PREFILL_CHUNK):
            end = min(read, start + PREFILL_CHUNK)
            model(input_ids=ids[:, start:end], use_cache=True, **{name: cache})
            if collector.on_event is not None:
                collector.on_event(PrefillProgress(end, len(prompt)))
            if cancel.check():
                return
        kwargs[name] = cache
    raw = getattr(collector, "raw", None)  # a request's log-probabilities (logprobs.RawLogits): generate()'s own only
    if raw is not None:
        raw.clear()
    model.generate(
        input_ids=ids,
        attention_mask=torch.ones_like(ids),
        generation_config=cfg,
        streamer=collector,
        stopping_criteria=StoppingCriteriaList([cancel]),
        **kwargs,
    )
