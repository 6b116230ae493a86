"""Continuous batching on the fast decode path.

Sequences join and leave between decode steps: each ``step()`` reads one chunk of one new request's
prompt (so a long prompt never stalls the others for long, and its cancel is seen between chunks), then
runs one decode step for every sequence already generating — one batched product per projection,
attention per sequence over its own pages of the KV cache. A sequence that ends (end of sequence, a
stop string, its length, a cancel) leaves at once and its pages are freed; the next request takes its
place at the next step. Each sequence keeps its own sampling, stopping, seed and event stream, so its
output is what it would be alone.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Optional

from redline.inference.decoding import hf
from redline.inference.decoding.fast_loop import FastSequence
from redline.inference.decoding.generate import describe_failure, finalize, new_result, new_tokens_allowed
from redline.inference.decoding.prompt import build_prompt
from redline.inference.decoding.textstream import DeltaDecoder
from redline.inference.decoding.timing import TokenCollector
from redline.inference.events import GenerationResult, Notice
from redline.inference.loading.loader import LoadedModel, free_memory
from redline.inference.memory.measured import process_rss
from redline.inference.service.requests import GenerationRequest, PrefillProgress, Refused, RequestHandle, Started

PREFILL_CHUNK = 256  # prompt tokens read per scheduler step
KV_SHARE = 0.8  # of the memory free when the batch starts, what its KV cache may take (the rest stays headroom)


@dataclass
class Prepared:
    """A request made ready to join: its prompt, context and new-token cap, and the notes on what did not fit."""

    prompt: list[int]
    context: int
    max_new: int
    result: GenerationResult

    @property
    def tokens(self) -> int:
        """The most KV-cache positions it can take (its prompt and every new token it may make)."""
        return len(self.prompt) + self.max_new


@dataclass
class _Active:
    handle: RequestHandle
    request: GenerationRequest
    seq: FastSequence
    result: GenerationResult
    cfg: object
    collector: TokenCollector
    decoder: DeltaDecoder
    cancel: hf.CancelCriteria
    max_new: int
    failed: bool = False
    alone: bool = True  # decoded with no other reply beside it from start to end


def prepare_prompt(target: LoadedModel, request: GenerationRequest, result: GenerationResult) -> tuple[list[int], int]:
    """The prompt ids and the context a request runs in (the chat template for messages; what did not fit is
    noted on ``result``)."""
    context = min(request.context or target.context_limit, target.context_limit)
    if request.input_ids is not None:
        return [int(t) for t in request.input_ids], context
    notes = result.notes
    prompt = build_prompt(target.tokenizer, request.messages, context, request.sampling.max_new_tokens)
    result.dropped_messages = prompt.dropped_messages
    if prompt.dropped_messages:
        notes.append(
            f"{prompt.dropped_messages} earlier message(s) did not fit the context of {context} tokens and were "
            "left out of the prompt."
        )
    if prompt.truncated_last:
        notes.append(prompt.cut)
    if not prompt.used_template:
        notes.append("This model has no chat template; a plain 'User:/Assistant:' format was used.")
    return prompt.input_ids, context


class Batcher:
    def __init__(
        self,
        target: LoadedModel,
        max_active: int,
        kv_budget_tokens: Optional[int] = None,
        check_result: Optional[Callable[[GenerationResult, object], GenerationResult]] = None,
    ):
        from redline.inference.decoding.fastpath import get_decoder

        self.target = target
        self.max_active = max_active
        # A reply that ran alone is a fair sample of this machine's speed and memory: the engine's checks
        # (predicted vs measured, the per-machine corrections) see it as they see any other reply.
        self.check_result = check_result
        self.dec = get_decoder(target, 256)
        self.active: list[_Active] = []
        self.peak_rss = 0  # the process's peak while the current batch has run
        self.kv_budget_tokens = kv_budget_tokens or self._kv_budget()

    # -- admission: what the KV cache can hold ----------------------------------------------------------
    def kv_bytes_per_token(self) -> int:
        from redline.inference.memory.estimator import kv_cache_bytes

        kv = self.dec.kv
        return kv_cache_bytes(kv.layers, kv.kv_heads, kv.head_dim, 1, 1, kv.k.element_size())

    def _kv_budget(self) -> int:
        """Positions the KV cache may hold across requests: the estimator's KV bytes per token against the memory
        free now (``fit.detect_target``: free RAM, or the GPU's free memory), plus what the cache holds already;
        never more than ``max_active`` full contexts (more could never be used)."""
        from redline.inference.memory.fit import detect_target

        free = detect_target(device=self.target.device).available_bytes
        tokens = int(free * KV_SHARE) // self.kv_bytes_per_token() + self.dec.kv.pages * self.dec.kv.page
        return max(1, min(tokens, self.max_active * self.target.context_limit))

    def tokens_reserved(self) -> int:
        return sum(len(a.seq.prompt) + a.max_new for a in self.active)

    def prepare(self, request: GenerationRequest) -> Prepared:
        """The request's prompt and limits (raises, before anything runs, if it cannot be served)."""
        result = new_result(self.target, 0, request.options)
        prompt, context = prepare_prompt(self.target, request, result)
        result.prompt_tokens = len(prompt)
        max_new = new_tokens_allowed(len(prompt), context, request.sampling.max_new_tokens, result.notes)
        prepared = Prepared(prompt, context, max_new, result)
        if prepared.tokens > self.kv_budget_tokens:
            from redline.inference.units import format_bytes

            raise Refused(
                f"This request needs up to {prepared.tokens:,} tokens of KV cache "
                f"({format_bytes(prepared.tokens * self.kv_bytes_per_token())}); the memory free for it holds "
                f"{self.kv_budget_tokens:,} ({format_bytes(self.kv_budget_tokens * self.kv_bytes_per_token())}).",
                "Ask for fewer new tokens, shorten the prompt, or free memory.",
            )
        return prepared

    def fits(self, prepared: Prepared) -> bool:
        """Whether it can join now: room in the batch, and KV memory beside what the running requests may take."""
        return self.has_room() and self.tokens_reserved() + prepared.tokens <= self.kv_budget_tokens

    def __len__(self) -> int:
        return len(self.active)

    def has_room(self) -> bool:
        return len(self.active) < self.max_active

    def add(
        self, handle: RequestHandle, request: GenerationRequest, submitted: float, prepared: Optional[Prepared] = None
    ) -> None:
        """Start ``request``: its prompt, settings and stream. Raises (before anything runs) if it cannot."""
        import torch

        prepared = prepared or self.prepare(request)
        prompt, max_new, result = prepared.prompt, prepared.max_new, prepared.result
        for note in result.notes:  # what did not fit is said before the reply starts, not only after it
            handle.emit(Notice(note))
        cfg = hf.generation_config(self.target, request.sampling, request.options, max_new)
        decoder = DeltaDecoder(self.target.tokenizer, request.sampling.stop)
        # TTFT counts from the submission: what a user waits for includes the queue.
        collector = TokenCollector(self.target.device, decoder, handle.emit, False, submitted)
        cancel = hf.CancelCriteria(lambda: handle.cancelled)
        generator = None
        if request.sampling.seed is not None:
            generator = torch.Generator(device=self.dec.device)
            generator.manual_seed(request.sampling.seed)
        self.dec.ensure_context(len(prompt) + max_new)
        from redline.inference.decoding.fast_loop import wants_compile

        if wants_compile(request.options.compile, self.target.device):
            self.dec.compile_in_background(1)  # batch-1 steps (one reply at a time) use it once it is ready
        seq = FastSequence(
            self.dec, handle.id, prompt, cfg, collector, cancel, max_new, generator, request.logits_processor
        )
        result.queued_ms = (time.perf_counter() - submitted) * 1000
        self.active.append(_Active(handle, request, seq, result, cfg, collector, decoder, cancel, max_new))
        if len(self.active) > 1:
            for other in self.active:
                other.alone = False
        if not self.peak_rss:
            self.peak_rss = process_rss()
        handle.emit(Started(batched=True))

    def step(self) -> None:
        """One prompt chunk for the oldest request still reading its prompt, then one token for every
        request generating. Ended requests leave with their results."""
        import torch

        with torch.inference_mode():
            reading = next((a for a in self.active if a.seq.prefilling and not a.seq.done), None)
            if reading is not None:
                self._guarded([reading], lambda: self._prefill(reading))
            generating = [a for a in self.active if not a.seq.prefilling and not a.seq.done and not a.failed]
            if generating:
                self._guarded(generating, lambda: self._decode(generating))
        self.peak_rss = max(self.peak_rss, process_rss())
        for a in [a for a in self.active if a.seq.done or a.failed or (a.seq.prefilling and a.cancel.check())]:
            self._retire(a)

    def _prefill(self, a: _Active) -> None:
        if a.cancel.check():
            return
        a.seq.prefill(PREFILL_CHUNK)
        if len(a.seq.prompt) > PREFILL_CHUNK:
            a.handle.emit(PrefillProgress(a.seq.prefilled, len(a.seq.prompt)))

    def _decode(self, batch: list[_Active]) -> None:
        import torch

        tokens = torch.cat([a.seq.next_token.view(1) for a in batch])
        logits = self.dec.step(tokens, [a.seq.position for a in batch], [a.seq.seq for a in batch])
        for i, a in enumerate(batch):
            a.seq.accept(logits[i])

    def _guarded(self, batch: list[_Active], work) -> None:
        """Run ``work``; if it fails (out of memory mid-step, say), the requests of this step fail with the
        reason, the model stays loaded and the others go on."""
        try:
            work()
        except Exception as exc:
            free_memory(self.target.device)
            for a in batch:
                a.failed = True
                a.result.error = describe_failure(exc, len(a.seq.prompt), a.max_new, a.result.notes)

    def _retire(self, a: _Active) -> None:
        self.active.remove(a)
        self.dec.kv.release(a.seq.seq)
        r = a.result
        if a.failed:
            r.finish_reason = "error"
        else:
            r.finish_reason = "cancelled" if a.cancel.cancelled else "length"
        elapsed = time.perf_counter() - a.collector.start
        finalize(r, a.collector, a.decoder, a.cfg, a.cancel.cancelled, elapsed, a.handle.emit)
        r.peak_memory_bytes = self.peak_rss if self.target.device == "cpu" else None
        if not self.active:
            self.peak_rss = 0
        if a.alone and not a.failed and self.check_result is not None:
            try:
                r = self.check_result(r, a.request.options)
            except Exception:  # a report only: it never keeps a reply from ending
                pass
        a.handle.finish(r)

    def cancel_all(self, note: str) -> None:
        for a in self.active:
            a.result.notes.append(note)
            a.handle.cancel()
