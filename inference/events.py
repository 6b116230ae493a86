"""What a generation reports while it runs and when it ends."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Optional, Union

from .errors import RedlineError

FINISH_REASONS = ("eos", "length", "stop", "cancelled", "error")


@dataclass
class TokenLogprob:
    """One new token's log-probability (a request that asked for them: ``GenerationRequest.logprobs``): the
    natural log of its probability under the model's own distribution at that position (log-softmax of the raw
    logits, before temperature, top-k/top-p, penalties or a grammar: what vLLM and llama.cpp's server return by
    default), and the ``top`` most likely tokens there as (id, text, logprob), most likely first.

    ``text`` is what the reply's text shows for this token, so the texts of a reply's tokens join to its text (a
    character split over two tokens shows with the second; an end-of-sequence token shows nothing); an
    alternative's text is the token's own bytes (its name for a special token; a partial character as ``\\xNN``)."""

    token_id: int
    text: str
    logprob: float
    top: list[tuple[int, str, float]] = field(default_factory=list)


@dataclass
class TokenEvent:
    index: int  # position among the new tokens, from 0
    token_id: int
    text: str  # text delta; all deltas join to the final text exactly
    time_s: float  # seconds since the generation started
    from_draft: bool = False  # proposed by the draft (or prompt lookup) and accepted
    # A request that asked for log-probabilities: the tokens whose text this event's delta completes (a delta held
    # back, as the start of a possible stop string, carries its tokens when it is released); None otherwise.
    logprobs: Optional[list[TokenLogprob]] = None
    # A reasoning model's reply (``inference/reasoning/``): what this token added to the thinking, kept apart from
    # ``text``, which is only ever the answer's (so a reader that ignores this field shows the answer alone).
    reasoning: str = ""


@dataclass
class StatsEvent:
    new_tokens: int
    elapsed_s: float
    tokens_per_s_1s: float  # rolling over the last second
    ttft_ms: Optional[float]


@dataclass
class GenerationResult:
    text: str
    token_ids: list[int]
    prompt_tokens: int
    new_tokens: int
    finish_reason: str
    strategy: str
    precision: str
    cached_tokens: int = 0  # of the prompt's tokens, how many came from the KV cache (not read again)
    # Time to first token: from the start of the reply's own work (its wait over) to its first token, the prefill
    # (docs/speed-lab.md#metrics). The wait before it is ``queued_ms``: from the request's submission to that start
    # (behind another reply, the speed lab, a load). The two add up to what the user waited for the first word.
    ttft_ms: Optional[float] = None
    queued_ms: Optional[float] = None
    per_token_ms: list[float] = field(default_factory=list)
    p50_ms: Optional[float] = None
    p95_ms: Optional[float] = None
    tokens_per_s: Optional[float] = None  # decode: tokens after the first over their time
    total_s: float = 0.0  # from the request's submission to its end, the wait included
    draft_proposed: Optional[int] = None
    draft_accepted: Optional[int] = None
    acceptance_rate: Optional[float] = None
    mean_accepted_length: Optional[float] = None
    from_draft: list[bool] = field(default_factory=list)
    peak_memory_bytes: Optional[int] = None
    peak_allocated_bytes: Optional[int] = None
    peak_reserved_bytes: Optional[int] = None
    device: str = "cpu"
    # Memory estimator vs measurement (inference/estimate/calibration.py): predicted and measured peak
    # for this load + generation, and the prediction's error in % of the measurement.
    predicted_memory_bytes: Optional[int] = None
    measured_memory_bytes: Optional[int] = None
    memory_error_pct: Optional[float] = None
    # The speed model's prediction for this reply (speed/calibration.py), made before its measurement fed
    # this machine's speed correction: decode tokens/s and TTFT.
    predicted_tokens_per_s: Optional[float] = None
    predicted_ttft_ms: Optional[float] = None
    # How busy the machine was while the reply ran (``hardware/load.py``): the share of all its cores other
    # programs used (0-1; None where it cannot be read), and the 1-minute load average at its end. A reply measured
    # while others kept the cores busy does not teach the speed model as a quiet one does (speed/calibration.py).
    others_cpu_share: Optional[float] = None
    load_average: Optional[float] = None
    error: Optional[str] = None
    # A model on a server: the figures the server itself reported (usage; llama.cpp-style timings where
    # given), beside the TTFT and tokens/s measured here, on the client.
    server_timings: Optional[dict] = None
    dropped_messages: int = 0
    notes: list[str] = field(default_factory=list)
    # The excerpts of an attached document a reply was given to cite, numbered as in its prompt: each its document's
    # name, page, chunk and text (a document that fits the context goes in whole and has none).
    citations: list[dict] = field(default_factory=list)
    # A reply that is tool calls (a remote server's, OpenAI's shape: id, type, function {name, arguments}).
    tool_calls: list[dict] = field(default_factory=list)
    # Per new token, when the request asked for log-probabilities (None otherwise).
    logprobs: Optional[list[TokenLogprob]] = None
    # A reasoning model's reply (``inference/reasoning/``): ``text`` is its answer and ``reasoning`` its thinking, the
    # format they were split by ("think", "harmony", "magistral"; None for a model that does not reason), and the
    # figures apart: its thinking tokens (the rest of ``new_tokens`` are the answer's), the time from the work's start
    # to its first answer text (``ttfat_ms``, beside ``ttft_ms``) and to its last thinking token (``thinking_ms``),
    # and the thinking's and the answer's own tokens/s.
    reasoning: str = ""
    reasoning_format: Optional[str] = None
    reasoning_tokens: int = 0
    ttfat_ms: Optional[float] = None
    thinking_ms: Optional[float] = None
    thinking_tokens_per_s: Optional[float] = None
    answer_tokens_per_s: Optional[float] = None

    @property
    def answer_tokens(self) -> int:
        """The reply's tokens that are its answer (all of them for a model that does not reason)."""
        return self.new_tokens - self.reasoning_tokens

    def to_dict(self) -> dict:
        return asdict(self)

    @property
    def submitted_ttft_ms(self) -> Optional[float]:
        """From the request's submission to its first token: the wait and the prefill (a server's ``timings.ttft_ms``,
        a concurrency benchmark's latency to the first token); None without a first token."""
        if self.ttft_ms is None:
            return None
        return self.ttft_ms + (self.queued_ms or 0.0)


@dataclass
class PrefillProgress:
    """A long prompt being read: ``done`` of ``total`` tokens (read in chunks, the cancel checked between)."""

    done: int
    total: int


@dataclass
class Notice:
    """Something the user should know before the reply comes, e.g. that part of a long message was left out."""

    text: str


@dataclass
class FinishedEvent:
    result: GenerationResult


# -- a request's life in the engine service, around the generation's own events ------------------------------
@dataclass
class Queued:
    """The request waits: ``ahead`` requests before it, and why (e.g. "waiting for the speed lab")."""

    ahead: int
    reason: str = ""


@dataclass
class Started:
    """The engine took the request up."""

    time_s: float = field(default_factory=time.monotonic)
    batched: bool = False  # decoded together with other requests (continuous batching)
    note: str = ""
    cached_tokens: int = 0  # of its prompt, the tokens taken from the prefix cache (not read again)


@dataclass
class Progress:
    """Progress of a load or another job: a fraction and what happens now."""

    fraction: float
    phase: str


@dataclass
class Completed:
    """A load, unload or other job ended; ``value`` is what it returned."""

    value: Any = None


@dataclass
class Failed:
    """The request could not run or failed: ``error`` says why in a sentence a user can act on."""

    error: BaseException

    @property
    def message(self) -> str:

        return str(self.error) if isinstance(self.error, RedlineError) else f"{type(self.error).__name__}: {self.error}"


FINAL = (FinishedEvent, Completed, Failed)  # a request's last event: nothing comes after it
Event = Union[TokenEvent, StatsEvent, Notice, PrefillProgress, Queued, Started, FinishedEvent]
EventFn = Callable[[Event], None]
