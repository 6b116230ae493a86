"""One generation from its start to its result: the lifecycle every strategy and every runner goes through.

A ``Generation`` holds what a reply is while it runs: its result (filled as it goes), its settings as
transformers' GenerationConfig, its cancel, its clock (two figures: ``queued_ms``, from the submission to the
start of its own work, what it waited for other replies, the speed lab or a load; then TTFT, from there to its
first token, its own prefill — only that teaches the speed model, and a user is shown both apart), the machine's
load while it ran (``hardware/load.py``: a reply measured while other programs kept the cores busy is not a fair
sample of this machine's speed), its seed (a generator of its own, so a seed repeats whatever runs beside it), its
text stream (``TokenCollector`` → ``TokenEvent``s and ``StatsEvent``s) and its end (``finish``: why it ended,
its text, its timing and its peak memory). The batcher (fast path) and ``solo.run_solo`` (transformers'
strategies) create one per request and call the same ``announce``, ``fail`` and ``finish``.
"""

from __future__ import annotations

import contextlib
import itertools
import time
import traceback
from typing import Any, Callable, Optional, Protocol

from ..decoding import hf
from ..decoding.options import eos_token_ids
from ..decoding.textstream import DeltaDecoder
from ..decoding.timing import TokenCollector, fill_timing
from ..errors import RedlineError
from ..events import EventFn, FinishedEvent, GenerationResult, Notice, TokenEvent
from ..hardware.load import CpuLoad
from ..memory.oom import free_memory, is_oom
from ..reasoning.split import ReplySplit
from .attached import citation_record
from .request import GenerationRequest, Prepared


class Sink(Protocol):
    """Where a running generation reports: a request's handle in the engine service, or a direct caller's
    callback (``DirectSink``)."""

    id: int

    def emit(self, event: Any) -> None: ...

    @property
    def cancelled(self) -> bool: ...

    def finish(self, result: GenerationResult) -> None: ...


class DirectSink:
    """A generation run outside the service (the speed lab's samples, scripts): events to a callback (ending, as a
    request's handle does, with the FinishedEvent), the cancel from a function, the result kept."""

    _ids = itertools.count(-1, -1)  # a sequence id of its own, apart from the service's request ids

    def __init__(self, on_event: Optional[EventFn] = None, should_cancel: Optional[Callable[[], bool]] = None):
        self.id = next(DirectSink._ids)
        self._on_event = on_event
        self._should_cancel = should_cancel
        self.result: Optional[GenerationResult] = None

    def emit(self, event: Any) -> None:
        if self._on_event is not None:
            self._on_event(event)

    @property
    def cancelled(self) -> bool:
        return bool(self._should_cancel is not None and self._should_cancel())

    def finish(self, result: GenerationResult) -> None:
        if self.result is None:
            self.result = result
            self.emit(FinishedEvent(result))


def describe_failure(exc: BaseException, prompt_tokens: int, max_new: int, notes: list[str]) -> str:
    """The sentence a user reads when a generation fails at run time (out of memory says so, with what to lower)."""

    if is_oom(exc):
        return (
            f"Out of memory while generating ({prompt_tokens} prompt tokens, up to {max_new} new). "
            "Lower max new tokens or the context length, or load a smaller precision."
        )
    if isinstance(exc, RedlineError):
        return str(exc)
    notes.append(traceback.format_exc(limit=5))
    return f"Generation failed: {type(exc).__name__}: {exc}"


def new_result(target, prompt_tokens: int, strategy: str) -> GenerationResult:
    return GenerationResult(
        text="",
        token_ids=[],
        prompt_tokens=prompt_tokens,
        new_tokens=0,
        finish_reason="error",
        strategy=strategy,
        precision=target.precision.label(),
        device=target.device,
    )


class Generation:
    def __init__(
        self,
        target,
        request: GenerationRequest,
        prepared: Prepared,
        sink: Sink,
        submitted: Optional[float] = None,
        speculative: bool = False,
    ):
        self.target, self.request, self.prepared, self.sink = target, request, prepared, sink
        self.max_new = prepared.max_new
        self.result = new_result(target, len(prepared.prompt), request.options.strategy)
        self.result.notes = list(prepared.notes)
        self.result.dropped_messages = prepared.dropped_messages
        self.result.citations = [citation_record(n, c) for n, c in enumerate(prepared.citations, 1)]
        self.cfg = hf.generation_config(target, request.sampling, request.options, prepared.max_new)
        # A reasoning model's chat reply is split into thinking and answer as it streams (None for any other).
        self.split = ReplySplit.for_reply(target.tokenizer, request, prepared.prompt, sink.emit)
        keep = self.split.kept if self.split is not None else frozenset()
        self.decoder = DeltaDecoder(target.tokenizer, request.sampling.stop, keep)
        self.cancel = hf.CancelCriteria(lambda: sink.cancelled)
        self.submitted = submitted if submitted is not None else time.perf_counter()
        emit = self.split.emit if self.split is not None else sink.emit
        self.collector = TokenCollector(
            target.device, self.decoder, emit, speculative, self.submitted, request.logprobs
        )
        # The request's own processor (a grammar, penalties), inside a thinking budget's where one is asked for.
        self.logits_processor = (
            self.split.processor(request.logits_processor) if self.split is not None else request.logits_processor
        )
        self.failed = False
        self.began: Optional[float] = None
        self.load: Optional[CpuLoad] = None  # the machine's load from ``announce`` on

    # -- its start ------------------------------------------------------------------------------------
    def announce(self) -> None:
        """Start the clock of the work itself (the queue ends here) and say, before the reply, what did not fit."""
        self.began = time.perf_counter()
        self.result.queued_ms = (self.began - self.submitted) * 1000
        self.collector.begin(self.began)  # TTFT and the tokens' times count from here, not from the submission
        self.load = CpuLoad()
        for note in self.result.notes:
            self.sink.emit(Notice(note))

    def generator(self, device):
        """This request's own random generator (None without a seed: the process's)."""
        seed = self.request.sampling.seed
        if seed is None:
            return None
        # lazy: torch loads on the engine's thread, never at import
        import torch

        gen = torch.Generator(device=device)
        gen.manual_seed(seed)
        return gen

    @contextlib.contextmanager
    def seeded(self):
        """For code that draws from torch's global generator (transformers' generate()): the request's seed
        for the duration, the process's generator as it was afterwards — the same stream ``generator`` gives."""
        seed = self.request.sampling.seed
        if seed is None:
            yield
            return
        # lazy: torch loads on the engine's thread, never at import
        import torch

        devices = [torch.cuda.current_device()] if self.target.device.startswith("cuda") else []
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(seed)
            yield

    # -- its end --------------------------------------------------------------------------------------
    def fail(self, exc: BaseException) -> None:
        """A run-time failure (out of memory mid-step, say): this generation ends with the reason; the model stays."""

        free_memory(self.target.device)
        self.failed = True
        self.result.error = describe_failure(exc, len(self.prepared.prompt), self.max_new, self.result.notes)

    def finish(self, peak=None) -> GenerationResult:
        """Why it ended, its text (the last delta streamed), its token ids, timing and peak memory (``peak``: the
        ``PeakMemory`` that watched it, read now)."""
        r = self.result
        cancelled = self.cancel.cancelled
        r.finish_reason = "error" if self.failed else "cancelled" if cancelled else "length"
        new_ids = self.collector.ids
        if not self.failed and new_ids and new_ids[-1] in eos_token_ids(self.cfg) and not cancelled:
            r.finish_reason = "eos"
        text, last_delta = self.decoder.finish(new_ids)
        if self.decoder.stopped_at_string and r.finish_reason in ("length", "eos"):
            r.finish_reason = "stop"
        now = time.perf_counter()
        total_s = now - self.submitted  # the whole of it, queue included (a benchmark's latency per request)
        self.collector.settle(text)
        rest = self.collector.unstreamed()
        thought = ""
        if self.split is not None:  # the last delta split too, with what the parser held back
            last_delta, thought = self.split.last(last_delta, now - self.collector.start)
        if last_delta or rest or thought:  # its time counts from the work's start, as every token's
            self.sink.emit(TokenEvent(len(new_ids), -1, last_delta, now - self.collector.start, False, rest, thought))
        r.text = text
        r.token_ids = new_ids
        r.new_tokens = len(new_ids)
        r.from_draft = self.collector.from_draft
        r.logprobs = self.collector.logprobs
        r.total_s = total_s
        fill_timing(r, self.collector.chunks)
        if self.split is not None:
            self.split.fill(r)
        if self.load is not None:
            r.others_cpu_share, r.load_average = self.load.read()
        if peak is not None and not self.failed:
            peak.read()
            r.peak_memory_bytes = peak.peak_bytes
            r.peak_allocated_bytes = peak.peak_allocated
            r.peak_reserved_bytes = peak.peak_reserved
        return r
