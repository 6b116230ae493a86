"""Thinking on or off, its effort, its budget: one setting, mapped to each family's own mechanism.

There are four ways in the wild to turn a model's thinking off (``enable_thinking``, ``/no_think``,
``reasoning_effort``, ``think: false``) and apps that use the wrong one for a model see their toggle do nothing. Here
the request says what it wants (``Thinking``) and the model's format (``formats.py``) says how:

- a chat-template variable, where the template reads it (Qwen3's ``enable_thinking``, gpt-oss's
  ``reasoning_effort``): passed to the template when the prompt is rendered;
- a template without that variable: thinking off is a closed, empty thinking block added after the rendered prompt
  (what Qwen3's own template renders for ``enable_thinking=False``; DeepSeek-R1's template has no switch), and an
  effort is the system message's ``Reasoning: high`` line (harmony's own way of saying it);
- a family that cannot stop reasoning (gpt-oss) runs at its lowest effort, and a note says so.

A request's ``chat_template_kwargs`` (the server's field) are passed as they are and win over what this maps.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

from .formats import EFFORTS, ReasoningFormat, effort_in_template, toggle_in_template
from .parser import prompt_state

# OpenAI's reasoning_effort values, as each family reads them: "none" is off, "minimal" the lowest level.
EFFORT_ALIASES = {"none": None, "minimal": "low", "low": "low", "medium": "medium", "high": "high"}


@dataclass
class Thinking:
    """What a conversation or a request asks of a reasoning model. ``enabled`` None: the model's default;
    ``effort`` one of ``EFFORTS`` (families with levels; None: the model's default); ``budget``: at most this many
    thinking tokens, after which the thinking is closed and the answer follows (None: no limit)."""

    enabled: Optional[bool] = None
    effort: Optional[str] = None
    budget: Optional[int] = None

    def __post_init__(self):
        if self.effort is not None and self.effort not in EFFORTS:
            raise ValueError(f"Unknown reasoning effort {self.effort!r}; choose one of {', '.join(EFFORTS)}.")
        if self.budget is not None and self.budget < 1:
            raise ValueError(f"A thinking budget is at least 1 token (got {self.budget}).")

    @classmethod
    def from_effort(cls, value: str, budget: Optional[int] = None) -> "Thinking":
        """OpenAI's ``reasoning_effort`` ("none", "minimal", "low", "medium", "high") as a setting."""
        if value not in EFFORT_ALIASES:
            raise ValueError(f"Unknown reasoning_effort {value!r}; use one of {', '.join(EFFORT_ALIASES)}.")
        effort = EFFORT_ALIASES[value]
        return cls(enabled=effort is not None, effort=effort, budget=budget)


@dataclass
class PromptPlan:
    """How a request's prompt is rendered for its thinking setting: the template's extra variables, a line for the
    system message, whether to close the thinking after the rendered prompt, and what the user should know."""

    template_kwargs: dict = field(default_factory=dict)
    system_line: str = ""
    close_thinking: bool = False
    notes: list[str] = field(default_factory=list)

    def messages(self, messages: Sequence[dict]) -> list[dict]:
        """``messages`` with the system line added (to the system message, or as one)."""
        out = [dict(m) for m in messages]
        if not self.system_line:
            return out
        if out and out[0].get("role") == "system":
            content = out[0].get("content") or ""
            out[0]["content"] = f"{content}\n{self.system_line}" if content else self.system_line
        else:
            out.insert(0, {"role": "system", "content": self.system_line})
        return out


def plan(
    fmt: Optional[ReasoningFormat], template: str, thinking: Optional[Thinking], explicit: Optional[dict] = None
) -> PromptPlan:
    """The prompt plan for ``thinking`` on a model of format ``fmt`` whose template text is ``template``."""
    out = PromptPlan()
    if fmt is not None and thinking is not None:
        effort = thinking.effort
        if thinking.enabled is False:
            if toggle_in_template(fmt, template):
                out.template_kwargs[fmt.toggle_kwarg] = False
            elif fmt.can_turn_off:
                out.close_thinking = True
            else:
                effort = "low"
                out.notes.append(
                    f"This model ({fmt.name} format) always reasons before it answers; "
                    "thinking off ran it at low effort."
                )
        elif thinking.enabled is True and toggle_in_template(fmt, template):
            out.template_kwargs[fmt.toggle_kwarg] = True
        if effort is not None and fmt.has_effort:
            if effort_in_template(fmt, template):
                out.template_kwargs[fmt.effort_kwarg] = effort
            else:
                out.system_line = f"Reasoning: {effort}"
    out.template_kwargs.update(explicit or {})
    return out


def closing_ids(tokenizer, fmt: ReasoningFormat, prompt_ids: Sequence[int]) -> list[int]:
    """The ids to add after a rendered prompt to turn thinking off: a closed, empty thinking block (or only its
    closing tag where the template pre-filled the opening one)."""

    tail = tokenizer.decode(list(prompt_ids[-64:]), skip_special_tokens=False)
    text = f"\n{fmt.close}\n\n" if prompt_state(fmt, tail) else fmt.off_prefill
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def extender(tokenizer, fmt: Optional[ReasoningFormat], plan_: PromptPlan) -> Optional[Callable[[list], list]]:
    """What the prompt builder calls on each rendered prompt's ids (None: nothing to add)."""
    if fmt is None or not plan_.close_thinking:
        return None
    return lambda ids: list(ids) + closing_ids(tokenizer, fmt, ids)


class ThinkingBudget:
    """A logits processor (transformers' interface) that forces the answer once the thinking has used its budget:
    while ``stream`` (the reply's ``ReasoningStream``) is thinking and has counted ``budget`` thinking tokens, the
    next tokens are ``close_ids`` (the format's closing text), one per step, whatever the model wanted; then the
    model goes on with its answer. ``inner``: the request's own processor (a grammar, penalties), applied first."""

    def __init__(self, stream, budget: int, close_ids: Sequence[int], inner=None):
        self.stream, self.budget, self.inner = stream, budget, inner
        self.close_ids = list(close_ids)
        self._forcing: Optional[list[int]] = None
        self.forced = False  # the budget ran out and the close was forced

    def __call__(self, input_ids, scores):
        if self.inner is not None:
            scores = self.inner(input_ids, scores)
        if self._forcing is None and self.stream.thinking and self.stream.reasoning_tokens >= self.budget:
            self._forcing = list(self.close_ids)
            self.forced = True
        if self._forcing:
            # lazy: torch loads on the engine's thread, never at import
            import torch

            token = self._forcing.pop(0)
            forced = torch.full_like(scores, -float("inf"))
            forced[..., token] = 0.0
            return forced
        return scores
