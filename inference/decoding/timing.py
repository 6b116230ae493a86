"""Honest timing, gpt-fast style: the clock is read after the device is synchronised; time to first token
(prefill included) is kept apart from decode speed.

``TokenCollector`` is the streamer every strategy hands its tokens to: it timestamps each chunk, turns
token ids into text deltas and emits Redline's events."""

from __future__ import annotations

import time
from typing import Optional

from ..events import EventFn, GenerationResult, StatsEvent, TokenEvent, TokenLogprob
from ..stats import decode_tokens_per_s, percentile, token_latencies_ms
from .logprobs import Pieces, pack, unpack
from .textstream import DeltaDecoder

STATS_INTERVAL_S = 0.5


def sync(device: str) -> None:
    """Wait for the device's queued work, so a clock read afterwards measures it."""
    if device.startswith("cuda"):
        # lazy: torch loads on the engine's thread, never at import
        import torch

        torch.cuda.synchronize()


class TokenCollector:
    """A transformers streamer (``put``/``end``) that timestamps every token and emits our events."""

    def __init__(
        self,
        device: str,
        decoder: DeltaDecoder,
        on_event: Optional[EventFn],
        speculative: bool,
        start: float,
        top_logprobs: Optional[int] = None,
    ):
        self.device = device
        self.decoder = decoder
        self.on_event = on_event
        self.speculative = speculative
        self.start = start
        self.ids: list[int] = []
        self.from_draft: list[bool] = []
        self.chunks: list[tuple[float, int]] = []  # (time since start, tokens in the chunk)
        self._seen_prompt = False
        self._last_stats = start
        # Log-probabilities (a request that asked; ``decoding/logprobs.py``): None, and none of this runs, otherwise.
        self.top_logprobs = top_logprobs
        self.logprobs: Optional[list[TokenLogprob]] = None
        if top_logprobs is not None:
            self.logprobs = []
            self.raw = None  # transformers' generate(): a RawLogits hook on the model, set by its runner
            self._pieces = Pieces(decoder.tokenizer)
            self._scored: list[list[float]] = []  # the fast path's packed scores, for the tokens it puts next
            self._waiting: list[tuple[int, TokenLogprob]] = []  # entries whose text is not streamed yet, its end
            self._shown = 0  # characters of the reply's text given to entries so far

    def begin(self, now: float) -> None:
        """The generation's own work starts now (its wait in the queue ends): every time from here on, the TTFT's
        included, counts from ``now``. The wait is the reply's ``queued_ms``, kept apart: TTFT is the prefill's."""
        self.start = self._last_stats = now

    def score(self, row: list[float]) -> None:
        """The fast path's scores for the token it puts next (``logprobs.pack``, read on the host)."""
        self._scored.append(row)

    def put(self, value) -> None:
        if not self._seen_prompt:  # generate() first hands the streamer the prompt
            self._seen_prompt = True
            return
        if isinstance(value, list):  # ids read on the host already (the fast path): that read waited for them
            new = [int(t) for t in value]
        else:  # a tensor (transformers' generate()): wait for the device, so the clock measures its work
            if self.logprobs is not None:
                self._score_raw(value)
            sync(self.device)
            new = [int(t) for t in value.reshape(-1).tolist()]
        now = time.perf_counter()
        self.chunks.append((now - self.start, len(new)))
        # In assisted generation a chunk is the accepted draft tokens plus one from the target.
        flags = [self.speculative and i < len(new) - 1 for i in range(len(new))]
        for tok, flag in zip(new, flags):
            self.ids.append(tok)
            self.from_draft.append(flag)
            delta = self.decoder.step(self.ids)
            shown = self._entry(tok) if self.logprobs is not None else None
            if self.on_event is not None:
                self.on_event(TokenEvent(len(self.ids) - 1, tok, delta, now - self.start, flag, shown))
        if self.on_event is not None and now - self._last_stats >= STATS_INTERVAL_S:
            self._last_stats = now
            self.on_event(self.stats(now))

    def _score_raw(self, value) -> None:
        """transformers' generate() put ``value`` (one token): score it against the logits its hook kept."""

        logprobs = self.raw.take() if self.raw is not None else None
        if logprobs is None or value.numel() != 1:
            raise RuntimeError("log-probabilities need one forward pass per token; this strategy made several")
        self._scored.append(pack(logprobs, value.reshape(-1), self.top_logprobs).tolist())

    def _entry(self, tok: int) -> list[TokenLogprob]:
        """Token ``tok``'s entry (its scores, the text it adds), and the entries whose text is now streamed."""

        _, logprob, top = unpack(self._scored.pop(0))
        shown = self.decoder.shown
        if len(shown) < self._shown:  # a stop string completed: the text it cut is no earlier token's any more
            self._trim(len(shown))
        text = shown[self._shown :]
        self._shown = max(self._shown, len(shown))
        entry = TokenLogprob(tok, text, logprob, [(i, self._pieces.text(i), v) for i, v in top])
        self.logprobs.append(entry)
        self._waiting.append((self._shown, entry))
        streamed = len(self.decoder.emitted)
        ready = [e for end, e in self._waiting if end <= streamed]
        if ready:
            self._waiting = self._waiting[len(ready) :]  # in order: the text is streamed from its start
        return ready

    def _trim(self, length: int) -> None:
        """The reply now shows ``length`` characters, fewer than the entries were given: take the rest off the last
        entries. They were not streamed yet: the text a stop string may still cut is held back (``DeltaDecoder``)."""
        excess = self._shown - length
        for entry in reversed(self.logprobs):
            if excess <= 0:
                break
            cut = min(excess, len(entry.text))
            entry.text = entry.text[: len(entry.text) - cut]
            excess -= cut
        self._shown = length
        self._waiting = [(min(end, length), e) for end, e in self._waiting]

    def settle(self, final: str) -> None:
        """The reply's final text (decoded whole): what it shows beyond the entries' text (a partial character at
        its very end, held while more bytes could come) goes to the last token, so the entries join to it."""
        if self.logprobs and len(final) < self._shown:
            self._trim(len(final))
        if self.logprobs and len(final) > self._shown:
            self.logprobs[-1].text += final[self._shown :]
            self._shown = len(final)

    def unstreamed(self) -> Optional[list[TokenLogprob]]:
        """The entries not given to an event yet (the reply's last delta carries them); None when not asked."""
        if self.logprobs is None:
            return None
        rest = [e for _, e in self._waiting]
        self._waiting = []
        return rest

    def stats(self, now: float) -> StatsEvent:
        window = [n for t, n in self.chunks if (now - self.start) - t <= 1.0]
        first = self.chunks[0][0] * 1000 if self.chunks else None
        span = min(1.0, now - self.start) or 1.0
        return StatsEvent(len(self.ids), now - self.start, sum(window) / span, first)

    def end(self) -> None:
        pass


def fill_timing(result: GenerationResult, chunks: list[tuple[float, int]]) -> None:
    """TTFT includes prefill. Decode tokens/s counts the tokens after the first chunk over their time."""
    if not chunks:
        return
    result.ttft_ms = chunks[0][0] * 1000
    arrivals = [t for t, n in chunks for _ in range(n)]
    per_token = token_latencies_ms(arrivals)
    result.per_token_ms = per_token
    result.p50_ms = percentile(per_token, 0.5)
    result.p95_ms = percentile(per_token, 0.95)
    result.tokens_per_s = decode_tokens_per_s(arrivals)
