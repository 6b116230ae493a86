"""A reply of a reasoning model, split as it runs: between the token stream and the request's sink, each
``TokenEvent``'s text delta is parsed (``parser.py``) into its answer (``text``) and its reasoning (``reasoning``),
and the figures a reasoning reply is measured by are kept — its thinking and answer tokens (adding up to the reply's),
the time to its first answer token, its thinking time, its thinking and answer tokens/s.

The generation (``generation/lifecycle.py``) makes one per chat reply of a model that reasons (``for_reply``; None
for any other, which then runs exactly as before) and asks it for the thinking budget's logits processor."""

from __future__ import annotations

from typing import Any, Callable, Optional

from ..events import GenerationResult, TokenEvent
from .formats import ReasoningFormat, detect, kept_token_ids
from .parser import ReasoningStream, prompt_state
from .switch import ThinkingBudget


def _rate(count: int, first: Optional[float], last: Optional[float]) -> Optional[float]:
    """Tokens after the first over their time (the decode rate's definition), None without two of them."""
    if count < 2 or first is None or last is None or last <= first:
        return None
    return (count - 1) / (last - first)


class ReplySplit:
    def __init__(
        self, fmt: ReasoningFormat, thinking: bool, emit: Callable[[Any], None], kept: frozenset = frozenset()
    ):
        self.fmt = fmt
        self.stream = ReasoningStream(fmt, thinking)
        self.kept = kept  # special-token ids the text stream keeps for the parser (harmony's markers)
        self._emit = emit
        self.budget: Optional[ThinkingBudget] = None
        self.first_answer_s: Optional[float] = None  # the first answer text, from the work's start
        self._reasoning_span: list[Optional[float]] = [None, None]  # first and last thinking token's time
        self._answer_span: list[Optional[float]] = [None, None]

    @classmethod
    def for_reply(cls, tokenizer, request, prompt: list[int], emit) -> Optional["ReplySplit"]:
        """The split for a chat reply of a model that reasons; None for a prompt given as ids (the completions API:
        raw text in, raw text out) and for a model without a reasoning format."""
        if request.messages is None:
            return None
        fmt = detect(tokenizer)
        if fmt is None:
            return None
        tail = tokenizer.decode(list(prompt[-64:]), skip_special_tokens=False)
        split = cls(fmt, prompt_state(fmt, tail), emit, kept_token_ids(tokenizer, fmt))
        thinking = getattr(request, "thinking", None)
        if thinking is not None and thinking.budget is not None and fmt.force_close:
            close = tokenizer(fmt.force_close, add_special_tokens=False)["input_ids"]
            split.budget = ThinkingBudget(split.stream, thinking.budget, close, request.logits_processor)
        return split

    def processor(self, inner):
        """The logits processor the reply runs with: the budget's (wrapping ``inner``), or ``inner``."""
        return self.budget if self.budget is not None else inner

    # -- the stream ---------------------------------------------------------------------------------------
    def emit(self, event) -> None:
        """The sink's ``emit``, with each token's text split into its two parts."""
        if isinstance(event, TokenEvent):
            self._split(event, 1 if event.token_id >= 0 else 0)
        self._emit(event)

    def _split(self, event: TokenEvent, tokens: int) -> None:
        s = self.stream
        before = (s.reasoning_tokens, s.answer_tokens)
        part = s.feed(event.text, tokens)
        self._note(event.time_s, before, part.answer)
        event.text, event.reasoning = part.answer, part.reasoning

    def _note(self, t: float, before: tuple[int, int], answer: str) -> None:
        s = self.stream
        if s.reasoning_tokens > before[0]:
            self._reasoning_span[0] = t if self._reasoning_span[0] is None else self._reasoning_span[0]
            self._reasoning_span[1] = t
        if s.answer_tokens > before[1]:
            self._answer_span[0] = t if self._answer_span[0] is None else self._answer_span[0]
            self._answer_span[1] = t
        if answer and self.first_answer_s is None:
            self.first_answer_s = t

    def last(self, text: str, t: float) -> tuple[str, str]:
        """The reply's last delta and what the parser held back: (answer, reasoning) still to stream."""
        s = self.stream
        before = (s.reasoning_tokens, s.answer_tokens)
        a = s.feed(text, 0)
        b = s.finish()
        self._note(t, before, a.answer + b.answer)
        return a.answer + b.answer, a.reasoning + b.reasoning

    # -- the result ----------------------------------------------------------------------------------------
    def fill(self, result: GenerationResult) -> None:
        """The result's answer, reasoning and the figures apart. Tokens the parser never saw (an end-of-sequence
        token adds no text but is a token) are the part the reply was in."""
        s = self.stream
        result.text = s.answer
        result.reasoning = s.reasoning
        result.reasoning_format = self.fmt.name
        counted = s.reasoning_tokens + s.answer_tokens
        extra = max(0, result.new_tokens - counted)
        reasoning = s.reasoning_tokens + (extra if s.thinking else 0)
        result.reasoning_tokens = min(reasoning, result.new_tokens)
        if self.first_answer_s is not None:
            result.ttfat_ms = self.first_answer_s * 1000
        first, last = self._reasoning_span
        if first is not None and last is not None:
            result.thinking_ms = last * 1000
        result.thinking_tokens_per_s = _rate(s.reasoning_tokens, *self._reasoning_span)
        result.answer_tokens_per_s = _rate(s.answer_tokens, *self._answer_span)
        if self.budget is not None and self.budget.forced:
            result.notes.append(
                f"The thinking reached its budget of {self.budget.budget} tokens and was closed; the answer followed."
            )
