"""Generations that cannot be batched, one at a time: the strategies on transformers' ``generate()`` (naive, kv,
static, speculative, prompt lookup; ``decoding/hf.py``), through the same lifecycle as the batcher's."""

from __future__ import annotations

from typing import Optional

from ..decoding import hf
from ..decoding.logprobs import RawLogits
from ..decoding.timing import sync
from ..errors import UnsupportedConfiguration
from ..memory.measured import PeakMemory
from .lifecycle import Generation, Sink
from .request import GenerationRequest, Prepared

SPECULATIVE = ("speculative", "prompt-lookup")


def run_solo(
    target,
    draft,
    request: GenerationRequest,
    prepared: Prepared,
    sink: Sink,
    submitted: Optional[float] = None,
    notes: tuple[str, ...] = (),
):
    """Run ``request`` alone on transformers' generate(); returns its GenerationResult (a run-time failure, such as
    out of memory, ends it with ``finish_reason="error"``; a draft that cannot pair raises before anything runs)."""
    # lazy: torch loads on the engine's thread, never at import
    import torch

    options, sampling = request.options, request.sampling
    speculative = options.strategy in SPECULATIVE
    gen = Generation(target, request, prepared, sink, submitted, speculative)
    gen.result.notes.extend(notes)
    if prepared.extra_inputs and speculative:
        # A draft reads text alone: it would propose tokens without having seen the image.
        raise UnsupportedConfiguration(
            f"The {options.strategy} strategy does not take images.", "Use the kv, static or naive strategy."
        )
    if request.logprobs is not None and speculative:
        # A draft's tokens are verified several in one forward pass; the scores are kept per forward (RawLogits).
        raise UnsupportedConfiguration(
            f"Log-probabilities are not available with the {options.strategy} strategy.",
            "Use the fast, kv, static or naive strategy.",
        )
    gen_kwargs, restore = {}, []
    stats = hf.DraftStats()
    if options.strategy == "speculative":
        restore.append(hf.use_draft(target, draft, options, gen_kwargs, gen.result.notes))
    if request.logprobs is not None:
        gen.collector.raw = RawLogits(target.model)
        restore.append(gen.collector.raw.remove)
    gen.announce()
    if speculative:
        restore.append(hf.count_draft_tokens(target.model, stats))
    if gen.logits_processor is not None:  # the request's own, inside a thinking budget's where one is asked for
        # lazy: transformers loads on the engine's thread, never at import
        from transformers import LogitsProcessorList

        gen_kwargs["logits_processor"] = LogitsProcessorList([gen.logits_processor])
    if sampling.stop:
        gen_kwargs["stop_strings"] = list(sampling.stop)
        gen_kwargs["tokenizer"] = target.tokenizer
    peak = None
    try:
        sync(target.device)
        with PeakMemory(target.device) as peak, torch.inference_mode(), gen.seeded():
            hf.run_generate(
                target, prepared.prompt, gen.cfg, gen.collector, gen.cancel, gen_kwargs, prepared.extra_inputs
            )
        sync(target.device)
    except Exception as exc:  # the caller's conversation must survive any run-time failure
        gen.fail(exc)
    finally:
        for undo in reversed(restore):
            undo()
    result = gen.finish(peak)
    if speculative:
        result.draft_proposed = stats.proposed
        result.draft_accepted = stats.accepted
        result.acceptance_rate = (stats.accepted / stats.proposed) if stats.proposed else None
        result.mean_accepted_length = (stats.accepted / stats.steps) if stats.steps else None
    return result
