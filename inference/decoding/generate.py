"""The one decode path: chat, the CLI and the speed lab all generate through ``generate()``.

Five strategies, all on transformers' ``generate()`` so that sampling, stop
strings and end-of-sequence handling are the library's, not ours:

- ``naive``: ``use_cache=False``, so every step re-runs the whole sequence (the
  seed document's baseline; tests check that each forward pass sees the full history).
- ``kv``: the dynamic KV cache.
- ``static``: a static cache sized up front; the forward pass is compiled where
  that pays (CUDA by default; on CPU compiling takes minutes, so only on request).
- ``speculative``: a draft model proposes tokens the target verifies. Its knobs
  live on the *draft's* generation_config (passed to generate() they are ignored).
- ``prompt-lookup``: candidate tokens from n-grams already in the context.
- ``fast``: Redline's own decode loop for Llama-family models (``fastpath.py``),
  with the same sampling, stopping and streaming; other architectures fall back
  to ``kv`` and the result says so.

Timing follows gpt-fast's honesty: the clock is read after the device is
synchronised, time to first token (prefill included) is reported apart from
decode speed, and compile/warm-up time is reported apart from both.
"""

from __future__ import annotations

import copy
import time
import traceback
from dataclasses import asdict, dataclass
from typing import Callable, Optional, Sequence

from redline.inference.decoding.textstream import DeltaDecoder
from redline.inference.errors import IncompatibleDraft, RedlineError, UnsupportedConfiguration
from redline.inference.events import Event, FinishedEvent, GenerationResult, StatsEvent, TokenEvent
from redline.inference.loading.loader import LoadedModel, free_memory, is_oom
from redline.inference.memory.measured import PeakMemory
from redline.inference.progress import CancelFn

STRATEGIES = ("naive", "kv", "static", "speculative", "prompt-lookup", "fast")
STATS_INTERVAL_S = 0.5

EventFn = Callable[[Event], None]


@dataclass
class SamplingSettings:
    """User sampling settings, overlaid on the model's own generation_config.

    ``None`` keeps the model's default. ``temperature == 0`` means greedy.
    """

    max_new_tokens: int = 256
    temperature: Optional[float] = None
    top_p: Optional[float] = None
    top_k: Optional[int] = None
    repetition_penalty: Optional[float] = None
    seed: Optional[int] = None
    stop: tuple[str, ...] = ()
    min_new_tokens: Optional[int] = None  # the speed lab fixes the output length (end-of-sequence suppressed)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["stop"] = list(self.stop)
        return d


@dataclass
class DecodeOptions:
    strategy: str = "kv"
    num_draft_tokens: int = 5  # speculative: tokens the draft proposes per step
    draft_schedule: str = "constant"  # or "heuristic" (transformers grows/shrinks k by acceptance)
    lookup_tokens: int = 10  # prompt-lookup: tokens copied per match
    compile: Optional[bool] = None  # static: None = on for CUDA, off for CPU

    def __post_init__(self):
        if self.strategy not in STRATEGIES:
            raise UnsupportedConfiguration(
                f"Unknown strategy {self.strategy!r}.", f"Choose one of: {', '.join(STRATEGIES)}."
            )
        if self.draft_schedule not in ("constant", "heuristic"):
            raise UnsupportedConfiguration(
                f"Unknown draft schedule {self.draft_schedule!r}.", "Choose constant or heuristic."
            )
        if self.num_draft_tokens < 1 or self.lookup_tokens < 1:
            raise UnsupportedConfiguration("The number of draft tokens must be at least 1.")


@dataclass
class _DraftStats:
    proposed: int = 0
    accepted: int = 0
    steps: int = 0


def percentile(values: Sequence[float], q: float) -> Optional[float]:
    if not values:
        return None
    data = sorted(values)
    k = (len(data) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(data) - 1)
    return data[lo] + (data[hi] - data[lo]) * (k - lo)


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        import torch

        torch.cuda.synchronize()


class _Collector:
    """A transformers streamer that timestamps every token and emits our events."""

    def __init__(
        self, target: LoadedModel, decoder: DeltaDecoder, on_event: Optional[EventFn], speculative: bool, start: float
    ):
        self.target = target
        self.decoder = decoder
        self.on_event = on_event
        self.speculative = speculative
        self.start = start
        self.ids: list[int] = []
        self.from_draft: list[bool] = []
        self.chunks: list[tuple[float, int]] = []  # (time since start, tokens in the chunk)
        self._seen_prompt = False
        self._last_stats = start

    def put(self, value) -> None:
        if not self._seen_prompt:  # generate() first hands the streamer the prompt
            self._seen_prompt = True
            return
        _sync(self.target.device)
        now = time.perf_counter()
        new = [int(t) for t in value.reshape(-1).tolist()]
        self.chunks.append((now - self.start, len(new)))
        # In assisted generation a chunk is the accepted draft tokens plus one from the target.
        flags = [self.speculative and i < len(new) - 1 for i in range(len(new))]
        for tok, flag in zip(new, flags):
            self.ids.append(tok)
            self.from_draft.append(flag)
            delta = self.decoder.step(self.ids)
            if self.on_event is not None:
                self.on_event(TokenEvent(len(self.ids) - 1, tok, delta, now - self.start, flag))
        if self.on_event is not None and now - self._last_stats >= STATS_INTERVAL_S:
            self._last_stats = now
            self.on_event(self.stats(now))

    def stats(self, now: float) -> StatsEvent:
        window = [n for t, n in self.chunks if (now - self.start) - t <= 1.0]
        first = self.chunks[0][0] * 1000 if self.chunks else None
        span = min(1.0, now - self.start) or 1.0
        return StatsEvent(len(self.ids), now - self.start, sum(window) / span, first)

    def end(self) -> None:
        pass


class _CancelCriteria:
    """A stopping criterion that reads the cancel flag once per step."""

    def __init__(self, should_cancel: Optional[CancelFn]):
        self.should_cancel = should_cancel
        self.cancelled = False

    def __call__(self, input_ids, scores, **kwargs):
        import torch

        if self.should_cancel is not None and self.should_cancel():
            self.cancelled = True
        return torch.full((input_ids.shape[0],), self.cancelled, dtype=torch.bool, device=input_ids.device)


def _generation_config(target: LoadedModel, sampling: SamplingSettings, options: DecodeOptions, max_new_tokens: int):
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
    from redline.inference.decoding.draft_check import compare

    if draft.device != target.device:
        raise IncompatibleDraft(
            f"The draft runs on {draft.device} but the target on {target.device}.", "Load both on the same device."
        )
    return compare(target.name, target.model.config, target.tokenizer, draft.name, draft.model.config, draft.tokenizer)


def _wrap_candidate_generator(model, stats: _DraftStats):
    """Count proposed and accepted draft tokens without changing what generate() does."""
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


def generate(
    target: LoadedModel,
    input_ids: Sequence[int],
    sampling: SamplingSettings = SamplingSettings(),
    options: DecodeOptions = DecodeOptions(),
    draft: Optional[LoadedModel] = None,
    on_event: Optional[EventFn] = None,
    should_cancel: Optional[CancelFn] = None,
    context_limit: Optional[int] = None,
) -> GenerationResult:
    """Generate from ``input_ids`` (one prompt). Never raises for run-time failures: an
    out-of-memory or other error ends the result with ``finish_reason="error"``."""
    import torch
    from transformers import StoppingCriteriaList

    model, tok = target.model, target.tokenizer
    prompt = list(int(t) for t in input_ids)
    limit = context_limit or target.context_limit
    result = GenerationResult(
        text="",
        token_ids=[],
        prompt_tokens=len(prompt),
        new_tokens=0,
        finish_reason="error",
        strategy=options.strategy,
        precision=target.precision.label(),
        device=target.device,
    )
    if not prompt:
        raise UnsupportedConfiguration("The prompt is empty.", "Type a message first.")
    room = limit - len(prompt)
    if room <= 0:
        raise UnsupportedConfiguration(
            f"The prompt has {len(prompt)} tokens, which fills the context of {limit}.",
            "Shorten the prompt or raise the context length.",
        )
    max_new = min(sampling.max_new_tokens, room)
    if max_new < sampling.max_new_tokens:
        result.notes.append(f"max new tokens capped at {max_new} by the context length {limit}.")

    gen_kwargs = {}
    restore = []
    stats = _DraftStats()
    speculative = options.strategy in ("speculative", "prompt-lookup")
    if options.strategy == "speculative":
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
        restore.append(
            lambda: (
                setattr(dcfg, "num_assistant_tokens", saved[0]),
                setattr(dcfg, "num_assistant_tokens_schedule", saved[1]),
                setattr(dcfg, "assistant_confidence_threshold", saved[2]),
            )
        )
        gen_kwargs["assistant_model"] = draft.model
        if mode == "universal":
            gen_kwargs["tokenizer"] = tok
            gen_kwargs["assistant_tokenizer"] = draft.tokenizer
            result.notes.append("draft uses a different tokenizer: universal assisted decoding")
    if speculative:
        restore.append(_wrap_candidate_generator(model, stats))
    if sampling.stop:
        gen_kwargs["stop_strings"] = list(sampling.stop)
        gen_kwargs["tokenizer"] = tok

    cfg = _generation_config(target, sampling, options, max_new)
    cancel = _CancelCriteria(should_cancel)
    use_fast = options.strategy == "fast"
    if use_fast:
        from redline.inference.decoding.fastpath import supports

        reason = supports(model)
        if reason:
            use_fast = False
            result.notes.append(f"fast path unavailable ({reason}); used kv instead")
            result.strategy = "kv"
    decoder = DeltaDecoder(tok, sampling.stop)
    if sampling.seed is not None:
        torch.manual_seed(sampling.seed)
    ids = torch.tensor([prompt], dtype=torch.long, device=model.device)
    mask = torch.ones_like(ids)
    _sync(target.device)
    start = time.perf_counter()
    collector = _Collector(target, decoder, on_event, speculative, start)
    try:
        with PeakMemory(target.device) as peak:
            with torch.inference_mode():
                if use_fast:
                    _fast_loop(target, prompt, cfg, collector, cancel, max_new)
                else:
                    model.generate(
                        input_ids=ids,
                        attention_mask=mask,
                        generation_config=cfg,
                        streamer=collector,
                        stopping_criteria=StoppingCriteriaList([cancel]),
                        **gen_kwargs,
                    )
        _sync(target.device)
        result.finish_reason = "cancelled" if cancel.cancelled else "length"
    except Exception as exc:  # the caller's conversation must survive any run-time failure
        free_memory(target.device)
        if is_oom(exc):
            result.error = (
                f"Out of memory while generating ({len(prompt)} prompt tokens, up to {max_new} new). "
                "Lower max new tokens or the context length, or load a smaller precision."
            )
        elif isinstance(exc, RedlineError):
            result.error = str(exc)
        else:
            result.error = f"Generation failed: {type(exc).__name__}: {exc}"
            result.notes.append(traceback.format_exc(limit=5))
        result.finish_reason = "error"
        peak = None
    finally:
        for undo in reversed(restore):
            undo()
    end = time.perf_counter()

    new_ids = collector.ids
    eos = cfg.eos_token_id
    eos_set = set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
    if result.finish_reason != "error":
        if new_ids and new_ids[-1] in eos_set and not cancel.cancelled:
            result.finish_reason = "eos"
    text, last_delta = decoder.finish(new_ids)
    if decoder.stopped_at_string and result.finish_reason in ("length", "eos"):
        result.finish_reason = "stop"
    if last_delta and on_event is not None:
        on_event(TokenEvent(len(new_ids), -1, last_delta, end - start, False))

    result.text = text
    result.token_ids = new_ids
    result.new_tokens = len(new_ids)
    result.from_draft = collector.from_draft
    result.total_s = end - start
    _fill_timing(result, collector.chunks)
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


def _logits_processors(cfg):
    """The same sampling transformations generate() applies, from transformers' public classes."""
    from transformers import (
        LogitsProcessorList,
        RepetitionPenaltyLogitsProcessor,
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    procs = LogitsProcessorList()
    if cfg.repetition_penalty is not None and cfg.repetition_penalty != 1.0:
        procs.append(RepetitionPenaltyLogitsProcessor(cfg.repetition_penalty))
    if cfg.do_sample:
        if cfg.temperature is not None and cfg.temperature != 1.0:
            procs.append(TemperatureLogitsWarper(cfg.temperature))
        if cfg.top_k is not None and cfg.top_k != 0:
            procs.append(TopKLogitsWarper(cfg.top_k))
        if cfg.top_p is not None and cfg.top_p < 1.0:
            procs.append(TopPLogitsWarper(cfg.top_p))
    return procs


def _fast_loop(
    target: LoadedModel, prompt: list[int], cfg, collector: "_Collector", cancel: "_CancelCriteria", max_new: int
) -> None:
    """gpt-fast's shape: prefill once, then one token per step from a preallocated cache."""
    import torch

    from redline.inference.decoding.fastpath import get_decoder

    dec = get_decoder(target, len(prompt) + max_new)
    eos = cfg.eos_token_id
    eos_set = set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
    procs = _logits_processors(cfg)
    history = torch.tensor([prompt], dtype=torch.long)
    collector.put(history)  # generate() hands the streamer the prompt first; keep the same contract
    logits = dec.forward(torch.tensor(prompt, dtype=torch.long, device=dec.device), 0)
    pos = len(prompt)
    min_new = cfg.min_new_tokens or 0
    eos_ids = torch.tensor(sorted(eos_set), dtype=torch.long) if eos_set else None
    for step in range(max_new):
        scores = logits[None]
        if step < min_new and eos_ids is not None:  # as MinNewTokensLengthLogitsProcessor does in generate()
            scores = scores.clone()
            scores[:, eos_ids] = -float("inf")
        if procs:
            scores = procs(history, scores)
        if cfg.do_sample:
            tok = int(torch.multinomial(torch.softmax(scores, dim=-1), 1)[0, 0])
        else:
            tok = int(torch.argmax(scores, dim=-1)[0])
        collector.put(torch.tensor([tok]))
        if procs:
            history = torch.cat([history, torch.tensor([[tok]])], dim=1)
        if (tok in eos_set and step >= min_new) or collector.decoder.stopped_at_string or step == max_new - 1:
            return
        if cancel.should_cancel is not None and cancel.should_cancel():
            cancel.cancelled = True
            return
        logits = dec.forward(torch.tensor([tok], dtype=torch.long, device=dec.device), pos)
        pos += 1


def _fill_timing(result: GenerationResult, chunks: list[tuple[float, int]]) -> None:
    """TTFT includes prefill. Decode tokens/s counts the tokens after the first chunk over their time."""
    if not chunks:
        return
    result.ttft_ms = chunks[0][0] * 1000
    per_token = []
    prev = chunks[0][0]
    for t, n in chunks[1:]:
        per_token.extend([(t - prev) * 1000 / n] * n)
        prev = t
    result.per_token_ms = per_token
    result.p50_ms = percentile(per_token, 0.5)
    result.p95_ms = percentile(per_token, 0.95)
    after_first = sum(n for _, n in chunks[1:])
    span = chunks[-1][0] - chunks[0][0]
    result.tokens_per_s = after_first / span if span > 0 and after_first else None
