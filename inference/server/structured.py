"""Structured output enforced while decoding: a JSON schema (or any JSON object) becomes a grammar
(llguidance) whose mask is applied to every step's logits through the request's logits processor, so
the model can only write tokens that keep the output valid. Nothing is checked after the fact.

``GrammarProcessor`` has transformers' logits-processor interface, ``(input_ids, scores) -> scores``: both
the fast path's loop (one sequence, ``input_ids`` its whole history) and transformers' ``generate()`` call
it once per step. On each call it first feeds the grammar the tokens chosen since the last call, then masks
``scores`` to the tokens the grammar allows next. Once the grammar is complete only end-of-sequence is
allowed, so the generation ends there.
"""

from __future__ import annotations

import json
import threading
from typing import Any, Optional

from ..errors import RedlineError


class SchemaError(RedlineError):
    """A response_format the grammar library cannot turn into a grammar."""


class GrammarTokenizers:
    """llguidance's view of a tokenizer, built once per tokenizer (about a second for a 50k vocabulary)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._cache: dict[int, tuple[Any, Any]] = {}

    def get(self, tokenizer, vocab_size: Optional[int] = None):
        key = id(tokenizer)
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None and hit[0] is tokenizer:
                return hit[1]
            # lazy: the grammar library loads only for structured output
            import llguidance.hf

            lltok = llguidance.hf.from_tokenizer(tokenizer, n_vocab=vocab_size)
            self._cache = {key: (tokenizer, lltok)}  # one model at a time: drop the previous one's
            return lltok


def grammar_for(response_format: dict) -> Optional[str]:
    """The llguidance grammar for an OpenAI ``response_format`` (None for plain text); raises SchemaError."""
    # lazy: the grammar library loads only for structured output
    import llguidance

    kind = response_format.get("type", "text")
    if kind == "text":
        return None
    if kind == "json_object":
        schema: Any = {"type": "object"}
    elif kind == "json_schema":
        spec = response_format.get("json_schema") or {}
        schema = spec.get("schema")
        if not isinstance(schema, dict):
            raise SchemaError(
                "response_format json_schema needs a 'schema' object.",
                'Send {"type": "json_schema", "json_schema": {"name": …, "schema": {…}}}.',
            )
    else:
        raise SchemaError(f"response_format type {kind!r} is not supported.", "Use text, json_object or json_schema.")
    # Compact JSON (", " and ": " between items, no other whitespace): a small model given free whitespace
    # can spend its whole budget on newlines.
    grammar = llguidance.LLMatcher.grammar_from_json_schema(
        json.dumps(schema), defaults={"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
    )
    ok, error, _warnings = _validate(grammar)
    if not ok:
        raise SchemaError(f"The JSON schema cannot be enforced: {error}.", "Fix the schema or simplify it.")
    return grammar


def _validate(grammar: str) -> tuple[bool, str, list]:
    # lazy: the grammar library loads only for structured output
    import llguidance

    validate = getattr(llguidance.LLMatcher, "validate_grammar_with_warnings", None)
    if validate is not None:
        error, warnings = validate(grammar)
    else:  # older llguidance
        error, warnings = llguidance.LLMatcher.validate_grammar(grammar), []
    return (not error), error, list(warnings or [])


class GrammarProcessor:
    """Masks each step's logits to what ``grammar`` allows; one instance per generation (it holds its state)."""

    def __init__(self, lltok, grammar: str):
        # lazy: the grammar library loads only for structured output
        import llguidance

        # lazy: the grammar library loads only for structured output
        import llguidance.torch

        self.matcher = llguidance.LLMatcher(lltok, grammar)
        self.vocab = lltok.vocab_size
        self.eos = lltok.eos_token
        self.bitmask = llguidance.torch.allocate_token_bitmask(1, self.vocab)
        self._fill = llguidance.torch.fill_next_token_bitmask
        self._apply = llguidance.torch.apply_token_bitmask_inplace
        self.seen: Optional[int] = None  # history length at the last call (the prompt, at the first)

    @property
    def error(self) -> str:
        return self.matcher.get_error() if self.matcher.is_error() else ""

    def __call__(self, input_ids, scores):
        # lazy: torch loads on the engine's thread, never at import
        import torch

        length = int(input_ids.shape[-1])
        if self.seen is not None and length > self.seen:
            new = [int(t) for t in input_ids[0, self.seen : length].tolist()]
            for tok in new:
                if self.matcher.is_stopped():
                    break
                self.matcher.consume_token(tok)
        self.seen = length
        if self.matcher.is_error() or self.matcher.is_stopped():
            allowed_eos = torch.full_like(scores, -float("inf"))
            allowed_eos[..., self.eos] = 0.0
            return scores + allowed_eos
        self._fill(self.matcher, self.bitmask, 0)
        device = scores.device
        bitmask = self.bitmask if device.type == "cpu" else self.bitmask.to(device)
        if scores.shape[-1] > self.vocab:  # the model's embedding is padded past the tokenizer's vocabulary
            scores[..., self.vocab :] = -float("inf")
        self._apply(scores[..., : self.vocab] if scores.shape[-1] > self.vocab else scores, bitmask)
        return scores


class Penalties:
    """OpenAI's ``frequency_penalty`` / ``presence_penalty`` (over the tokens written so far, not the prompt) and
    ``logit_bias`` (added to the named tokens' logits), as a logits processor: ``(input_ids, scores) -> scores``."""

    def __init__(self, frequency: float = 0.0, presence: float = 0.0, bias: Optional[dict[int, float]] = None):
        self.frequency, self.presence = frequency, presence
        self.bias = bias or {}
        self.prompt: Optional[int] = None
        self._bias = None

    def __call__(self, input_ids, scores):
        # lazy: torch loads on the engine's thread, never at import
        import torch

        if self.prompt is None:
            self.prompt = int(input_ids.shape[-1])
        if self.bias:
            if self._bias is None or self._bias.device != scores.device:
                self._bias = torch.zeros(scores.shape[-1], dtype=scores.dtype, device=scores.device)
                for token, value in self.bias.items():
                    self._bias[token] = value
            scores = scores + self._bias
        written = input_ids[0, self.prompt :]
        if (self.frequency or self.presence) and written.numel():
            counts = torch.bincount(written, minlength=scores.shape[-1])[: scores.shape[-1]].to(scores.dtype)
            scores = scores - self.frequency * counts - self.presence * (counts > 0).to(scores.dtype)
        return scores


class Chain:
    """Several logits processors, one after another (the penalties first, then a grammar's mask)."""

    def __init__(self, *processors):
        self.processors = [p for p in processors if p is not None]

    @property
    def error(self) -> str:
        return next((p.error for p in self.processors if getattr(p, "error", "")), "")

    def __call__(self, input_ids, scores):
        for processor in self.processors:
            scores = processor(input_ids, scores)
        return scores
