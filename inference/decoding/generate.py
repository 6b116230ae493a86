"""The one decode path: chat, the CLI and the speed lab all generate through ``generate()``.

Five strategies run on transformers' ``generate()`` (``hf.py``) so that sampling, stop
strings and end-of-sequence handling are the library's, not ours:

- ``naive``: ``use_cache=False``, so every step re-runs the whole sequence (the
  baseline without a KV cache; tests check that each forward pass sees the full history).
- ``kv``: the dynamic KV cache.
- ``static``: a static cache sized up front; the forward pass is compiled where
  that pays (CUDA by default; on CPU compiling takes minutes, so only on request).
- ``speculative``: a draft model proposes tokens the target verifies. Its knobs
  live on the *draft's* generation_config (passed to generate() they are ignored).
- ``prompt-lookup``: candidate tokens from n-grams already in the context.
- ``fast``: Redline's own decode loop for Llama-family models (``fast_loop.py`` over
  ``fastpath.py``), with the same sampling, stopping and streaming; other architectures
  fall back to ``kv`` and the result says so.

Timing follows gpt-fast's honesty: the clock is read after the device is
synchronised, time to first token (prefill included) is reported apart from
decode speed, and compile/warm-up time is reported apart from both.
"""

from __future__ import annotations

import time
import traceback
from typing import Optional, Sequence

from redline.inference.decoding import hf
from redline.inference.decoding.fast_loop import run_fast
from redline.inference.decoding.options import DecodeOptions, SamplingSettings, eos_token_ids
from redline.inference.decoding.textstream import DeltaDecoder
from redline.inference.decoding.timing import TokenCollector, fill_timing, sync
from redline.inference.errors import RedlineError, UnsupportedConfiguration
from redline.inference.events import EventFn, FinishedEvent, GenerationResult, TokenEvent
from redline.inference.loading.loader import LoadedModel, free_memory, is_oom
from redline.inference.memory.measured import PeakMemory
from redline.inference.progress import CancelFn


def new_tokens_allowed(prompt_tokens: int, limit: int, wanted: int, notes: list[str]) -> int:
    """How many new tokens fit after the prompt in a context of ``limit``; raises if none do."""
    if not prompt_tokens:
        raise UnsupportedConfiguration("The prompt is empty.", "Type a message first.")
    room = limit - prompt_tokens
    if room <= 0:
        raise UnsupportedConfiguration(
            f"The prompt has {prompt_tokens} tokens, which fills the context of {limit}.",
            "Shorten the prompt or raise the context length.",
        )
    allowed = min(wanted, room)
    if allowed < wanted:
        notes.append(f"max new tokens capped at {allowed} by the context length {limit}.")
    return allowed


def describe_failure(exc: BaseException, prompt_tokens: int, max_new: int, notes: list[str]) -> str:
    """The sentence a user reads when a generation fails at run time."""
    if is_oom(exc):
        return (
            f"Out of memory while generating ({prompt_tokens} prompt tokens, up to {max_new} new). "
            "Lower max new tokens or the context length, or load a smaller precision."
        )
    if isinstance(exc, RedlineError):
        return str(exc)
    notes.append(traceback.format_exc(limit=5))
    return f"Generation failed: {type(exc).__name__}: {exc}"


def finalize(
    result: GenerationResult,
    collector: TokenCollector,
    decoder: DeltaDecoder,
    cfg,
    cancelled: bool,
    total_s: float,
    on_event: Optional[EventFn],
) -> None:
    """What every generation does when its tokens are in: why it ended, its text (the last delta streamed), its
    token ids and timing."""
    new_ids = collector.ids
    if result.finish_reason != "error" and new_ids and new_ids[-1] in eos_token_ids(cfg) and not cancelled:
        result.finish_reason = "eos"
    text, last_delta = decoder.finish(new_ids)
    if decoder.stopped_at_string and result.finish_reason in ("length", "eos"):
        result.finish_reason = "stop"
    if last_delta and on_event is not None:
        on_event(TokenEvent(len(new_ids), -1, last_delta, total_s, False))
    result.text = text
    result.token_ids = new_ids
    result.new_tokens = len(new_ids)
    result.from_draft = collector.from_draft
    result.total_s = total_s
    fill_timing(result, collector.chunks)


def new_result(target: LoadedModel, prompt_tokens: int, options: DecodeOptions) -> GenerationResult:
    return GenerationResult(
        text="",
        token_ids=[],
        prompt_tokens=prompt_tokens,
        new_tokens=0,
        finish_reason="error",
        strategy=options.strategy,
        precision=target.precision.label(),
        device=target.device,
    )


def generate(
    target: LoadedModel,
    input_ids: Sequence[int],
    sampling: Optional[SamplingSettings] = None,
    options: Optional[DecodeOptions] = None,
    draft: Optional[LoadedModel] = None,
    on_event: Optional[EventFn] = None,
    should_cancel: Optional[CancelFn] = None,
    context_limit: Optional[int] = None,
    logits_processor=None,
) -> GenerationResult:
    """Generate from ``input_ids`` (one prompt). Never raises for run-time failures: an
    out-of-memory or other error ends the result with ``finish_reason="error"``. ``logits_processor``
    (transformers' interface) constrains this generation alone, e.g. a grammar."""
    import torch

    sampling = sampling or SamplingSettings()
    options = options or DecodeOptions()
    prompt = [int(t) for t in input_ids]
    result = new_result(target, len(prompt), options)
    max_new = new_tokens_allowed(
        len(prompt), context_limit or target.context_limit, sampling.max_new_tokens, result.notes
    )

    gen_kwargs, restore = {}, []
    stats = hf.DraftStats()
    speculative = options.strategy in ("speculative", "prompt-lookup")
    if options.strategy == "speculative":
        restore.append(hf.use_draft(target, draft, options, gen_kwargs, result.notes))
    if speculative:
        restore.append(hf.count_draft_tokens(target.model, stats))
    if logits_processor is not None:
        from transformers import LogitsProcessorList

        gen_kwargs["logits_processor"] = LogitsProcessorList([logits_processor])
    if sampling.stop:
        gen_kwargs["stop_strings"] = list(sampling.stop)
        gen_kwargs["tokenizer"] = target.tokenizer
    use_fast = options.strategy == "fast"
    if use_fast:
        from redline.inference.decoding.fastpath import supports

        reason = supports(target.model)
        if reason:
            use_fast = False
            result.notes.append(f"fast path unavailable ({reason}); used kv instead")
            result.strategy = "kv"

    cfg = hf.generation_config(target, sampling, options, max_new)
    cancel = hf.CancelCriteria(should_cancel)
    decoder = DeltaDecoder(target.tokenizer, sampling.stop)
    if sampling.seed is not None:
        torch.manual_seed(sampling.seed)
    sync(target.device)
    start = time.perf_counter()
    collector = TokenCollector(target.device, decoder, on_event, speculative, start)
    peak = None
    try:
        with PeakMemory(target.device) as peak, torch.inference_mode():
            if use_fast:
                run_fast(target, prompt, cfg, collector, cancel, max_new, options.compile, logits_processor)
            else:
                hf.run_generate(target, prompt, cfg, collector, cancel, gen_kwargs)
        sync(target.device)
        result.finish_reason = "cancelled" if cancel.cancelled else "length"
    except Exception as exc:  # the caller's conversation must survive any run-time failure
        free_memory(target.device)
        result.error = describe_failure(exc, len(prompt), max_new, result.notes)
        result.finish_reason = "error"
        peak = None
    finally:
        for undo in reversed(restore):
            undo()
    end = time.perf_counter()

    finalize(result, collector, decoder, cfg, cancel.cancelled, end - start, on_event)
    if speculative:
        result.draft_proposed = stats.proposed
        result.draft_accepted = stats.accepted
        result.acceptance_rate = (stats.accepted / stats.proposed) if stats.proposed else None
        result.mean_accepted_length = (stats.accepted / stats.steps) if stats.steps else None
    if peak is not None:
        result.peak_memory_bytes = peak.peak_bytes
        result.peak_allocated_bytes = peak.peak_allocated
        result.peak_reserved_bytes = peak.peak_reserved
    if on_event is not None:
        on_event(FinishedEvent(result))
    return result
