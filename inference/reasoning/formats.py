"""Which reasoning format a model writes, found from its chat template and its tokenizer, and how each family is
switched: a registry where a new family is one entry.

=========  ====================================================  ==========================================
family     what the model writes                                 how thinking is switched
=========  ====================================================  ==========================================
think      ``<think>…</think>`` then the answer (Qwen3, QwQ,      ``enable_thinking`` (a chat-template variable)
           DeepSeek-R1 and its distills, Phi-4-reasoning,        where the template reads it; otherwise off is
           SmolLM3); templates that pre-fill ``<think>`` leave   a closed, empty thinking block added after the
           only ``</think>`` in the output                       prompt (what the Qwen3 template itself renders)
harmony    ``<|channel|>analysis<|message|>…<|end|>``, then       effort: ``reasoning_effort`` (the template's
           ``<|start|>assistant<|channel|>final<|message|>…``    "Reasoning: high" line in the system message);
           (gpt-oss); a tool call is a ``commentary`` message    it always reasons: off is the low effort
           to ``functions.NAME``
magistral  ``[THINK]…[/THINK]`` then the answer (Magistral)      off: a closed, empty ``[THINK][/THINK]`` block
=========  ====================================================  ==========================================

A template that names none of these is a model without reasoning: nothing about its prompt or its reply changes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Callable, Optional

EFFORTS = ("low", "medium", "high")


@dataclass(frozen=True)
class ReasoningFormat:
    """One family's reasoning format: how to find it, how its reply is split, how it is switched.

    ``kind`` picks the parser's grammar: ``"tags"`` (an opening and a closing tag around the thinking) or
    ``"harmony"`` (messages on channels). ``markers``: the texts that are special tokens in such a model's
    vocabulary and must stay in the streamed text for the parser to see them (a decoder drops special tokens)."""

    name: str
    kind: str
    found: Callable[[str, set], bool]  # (chat template's text, the tokenizer's added tokens) -> is this family's
    open: str = ""  # tags: the opening tag
    close: str = ""  # tags: the closing tag
    # Texts that end the thinking when they appear inside it: a tool call the model opens before it closed its
    # thinking is a call, not a thought (Qwen3 sometimes does this).
    calls_end_thinking: tuple[str, ...] = ()
    # How the answer is forced after a thinking budget: the text put after the thinking so far.
    force_close: str = ""
    # The switch. ``toggle_kwarg``: the chat-template variable that turns thinking on and off (None: the template
    # has none; off adds ``off_prefill`` after the rendered prompt); ``effort_kwarg``: the variable that sets the
    # effort (None: the family has no effort levels).
    toggle_kwarg: Optional[str] = None
    off_prefill: str = ""
    effort_kwarg: Optional[str] = None
    can_turn_off: bool = True
    markers: tuple[str, ...] = field(default_factory=tuple)

    @property
    def has_effort(self) -> bool:
        return self.effort_kwarg is not None


def _think(template: str, added: set) -> bool:
    return "</think>" in template or ("<think>" in added and "</think>" in added and "think" in template)


def _harmony(template: str, added: set) -> bool:
    return "<|channel|>" in template and "<|message|>" in template


def _magistral(template: str, added: set) -> bool:
    return "[/THINK]" in template or ("[THINK]" in added and "[/THINK]" in added)


HARMONY_MARKERS = ("<|start|>", "<|channel|>", "<|message|>", "<|end|>", "<|return|>", "<|call|>", "<|constrain|>")

# The registry, searched in order (harmony first: its templates may mention other families' tags in examples).
FORMATS: tuple[ReasoningFormat, ...] = (
    ReasoningFormat(
        "harmony",
        "harmony",
        _harmony,
        force_close="<|end|><|start|>assistant<|channel|>final<|message|>",
        effort_kwarg="reasoning_effort",
        can_turn_off=False,
        markers=HARMONY_MARKERS,
    ),
    ReasoningFormat(
        "magistral",
        "tags",
        _magistral,
        open="[THINK]",
        close="[/THINK]",
        force_close="\n[/THINK]\n",
        off_prefill="[THINK][/THINK]",
        markers=("[THINK]", "[/THINK]"),
    ),
    ReasoningFormat(
        "think",
        "tags",
        _think,
        open="<think>",
        close="</think>",
        calls_end_thinking=("<tool_call>",),
        force_close="\n</think>\n\n",
        toggle_kwarg="enable_thinking",
        off_prefill="<think>\n\n</think>\n\n",
        markers=("<think>", "</think>"),
    ),
)


def template_text(tokenizer) -> str:
    """The chat template's text (of several named ones, the default)."""
    template = getattr(tokenizer, "chat_template", None) or ""
    if isinstance(template, dict):
        template = template.get("default") or next(iter(template.values()), "")
    return template if isinstance(template, str) else ""


def added_tokens(tokenizer) -> set:
    """The texts of the tokenizer's added tokens (where reasoning tags live as single tokens)."""
    try:
        return {t.content for t in tokenizer.added_tokens_decoder.values()}
    except AttributeError:
        return set()


def detect(tokenizer) -> Optional[ReasoningFormat]:
    """The reasoning format of the model whose tokenizer (and chat template) this is, or None for a model that does
    not reason. Kept on the tokenizer: found once per tokenizer."""
    template = template_text(tokenizer)
    key = hash(template)
    cached = getattr(tokenizer, "_redline_reasoning", None)
    if cached is not None and cached[0] == key:
        return cached[1]
    found = None
    if template:
        added = added_tokens(tokenizer)
        found = next((f for f in FORMATS if f.found(template, added)), None)
    try:
        tokenizer._redline_reasoning = (key, found)
    except AttributeError:  # a tokenizer that takes no attributes: found again next time
        pass
    return found


def by_name(name: str) -> ReasoningFormat:
    for f in FORMATS:
        if f.name == name:
            return f
    raise KeyError(name)


def toggle_in_template(fmt: ReasoningFormat, template: str) -> bool:
    """Whether the template reads the family's on/off variable (Qwen3's does; DeepSeek-R1's does not)."""
    return bool(fmt.toggle_kwarg) and re.search(rf"\b{re.escape(fmt.toggle_kwarg)}\b", template) is not None


def effort_in_template(fmt: ReasoningFormat, template: str) -> bool:
    return bool(fmt.effort_kwarg) and re.search(rf"\b{re.escape(fmt.effort_kwarg)}\b", template) is not None


def kept_token_ids(tokenizer, fmt: Optional[ReasoningFormat]) -> frozenset:
    """The ids of the format's markers that are special tokens: the text stream keeps them, so the parser sees
    them (a decoder that skips special tokens would drop ``<|channel|>``)."""
    if fmt is None:
        return frozenset()
    ids = set()
    vocab = tokenizer.get_vocab()
    for marker in fmt.markers:
        if marker in vocab:
            ids.add(vocab[marker])
    return frozenset(ids)
