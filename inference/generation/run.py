"""A generation on a model loaded here, start to end: made ready once (``request.prepare``), then on the fast
path's batcher (a reply alone is a batch of one; replies the engine service runs together join the same
batcher) or one at a time on transformers' generate() (``solo.run_solo``)."""

from __future__ import annotations

import dataclasses
from typing import Optional, Sequence

from ..decoding.options import DecodeOptions, SamplingSettings
from .lifecycle import DirectSink, Sink
from .request import GenerationRequest, prepare
from .solo import run_solo


def run_local(target, request: GenerationRequest, sink: Sink, submitted: Optional[float] = None):
    """``request`` on ``target`` (a LoadedModel); its GenerationResult, also handed to ``sink.finish``."""
    notes: tuple[str, ...] = ()
    if request.options.strategy == "fast":
        reason = target.fast_path_reason()
        if reason is None:
            batcher = target.batcher()
            prepared = request.prepared or batcher.prepare(request)
            return batcher.run_one(sink, request, submitted, prepared)
        notes = (f"fast path unavailable ({reason}); used kv instead",)
        request = dataclasses.replace(request, options=dataclasses.replace(request.options, strategy="kv"))
    processor = getattr(target, "processor", None)  # a vision model's: it builds the prompt with the images
    prepared = prepare(target.tokenizer, target.context_limit, request, processor=processor, model=target.name)
    result = run_solo(target, target.draft, request, prepared, sink, submitted, notes)
    if request.record and target.on_result is not None and result.finish_reason != "error":
        try:
            result = target.on_result(result, request.options)
        except Exception:  # a report only: it never keeps a reply from ending
            pass
    sink.finish(result)
    return result


def generate(
    target,
    input_ids: Sequence[int],
    sampling: Optional[SamplingSettings] = None,
    options: Optional[DecodeOptions] = None,
    draft=None,
    on_event=None,
    should_cancel=None,
    context_limit: Optional[int] = None,
    logits_processor=None,
    reuse_prefix: bool = False,
):
    """A generation from prompt ids, run directly on this thread (the speed lab's samples, tools, tests): the same
    path as every request, without feeding the per-machine corrections, and (unless ``reuse_prefix``) reading its
    whole prompt, as a measurement of a fresh prompt must. Never raises for run-time failures: an out-of-memory
    or other error ends the result with ``finish_reason="error"``."""
    options = dataclasses.replace(options or DecodeOptions(), reuse_prefix=reuse_prefix)
    request = GenerationRequest(
        input_ids=list(input_ids),
        sampling=sampling or SamplingSettings(),
        options=options,
        context=context_limit,
        logits_processor=logits_processor,
        record=False,
    )
    saved = target.draft
    if draft is not None:
        target.draft = draft
    try:
        return run_local(target, request, DirectSink(on_event, should_cancel))
    finally:
        target.draft = saved
