"""The speed lab and reasoning models: a row's thinking on or off (``BenchConfig.thinking``), its prompts rendered
for that setting, and its figures apart — the time to the first answer token beside the TTFT, the thinking tokens,
the thinking's and the answer's own tokens/s — from the replies the engine split (``inference/reasoning/split.py``).

Rows that differ only in their thinking compare thinking on against off the way rows that differ in their precision
compare precisions: same prompts, seed, greedy decoding and length. A model that does not reason is untouched (its
prompts stay the ids the lab renders itself, its rows have none of these figures)."""

from __future__ import annotations

import statistics
from typing import Optional, Sequence

from ..decoding.options import SamplingSettings
from ..events import GenerationResult
from ..generation.request import GenerationRequest, Prepared, prepare
from ..reasoning.formats import detect
from ..reasoning.switch import Thinking
from ..speed.thinking import reply_thinking
from ..stats import percentile
from .configs import BenchConfig
from .results import ConfigResult

THINKING_LABELS = {None: "default", True: "on", False: "off"}


def reasoning_prompts(target, spec, config: BenchConfig) -> Optional[list[tuple[list, Prepared, Optional[Thinking]]]]:
    """A reasoning model's prompts for ``config``'s thinking setting: each prompt's messages, its prompt made ready
    once (the template with thinking on or off, ``generation/request.prepare``) so every sample reads the same ids,
    and the setting, so the reply is split into thinking and answer as chat's is. None for a model that does not
    reason (``spec``: the run's ``BenchSpec``)."""
    if detect(target.tokenizer) is None:
        return None
    thinking = Thinking(enabled=config.thinking) if config.thinking is not None else None
    sampling = SamplingSettings(max_new_tokens=spec.new_tokens)
    # The same cap as the lab's own rendering: the prompt and the new tokens (the model's context otherwise).
    context = (spec.prompt_tokens + spec.new_tokens) if spec.prompt_tokens else None
    out = []
    for p in spec.prompts.prompts:
        request = GenerationRequest(messages=list(p.messages), sampling=sampling, context=context, thinking=thinking)
        out.append((list(p.messages), prepare(target.tokenizer, target.context_limit, request), thinking))
    return out


def aggregate_reasoning(row: ConfigResult, results: Sequence[GenerationResult]) -> None:
    """A reasoning model's figures apart: the time to the first answer token over the samples that reached their
    answer, the thinking tokens, the thinking's and the answer's tokens/s (medians over the samples)."""
    split = [r for r in results if r.reasoning_format is not None]
    if not split:
        return
    row.reasoning_format = split[0].reasoning_format
    answered = [r.ttfat_ms for r in split if r.ttfat_ms is not None]
    row.answered = len(answered)
    row.ttfat_ms = percentile(answered, 0.5) if answered else None
    row.thinking_tokens = statistics.median(r.reasoning_tokens for r in split)
    for name in ("thinking_tokens_per_s", "answer_tokens_per_s"):
        rates = [getattr(r, name) for r in split if getattr(r, name)]
        setattr(row, name, statistics.median(rates) if rates else None)
    if len(answered) < len(split):
        row.notes.append(
            f"{len(split) - len(answered)} of {len(split)} samples were still thinking when they reached their "
            f"{int(row.new_tokens or 0)} new tokens: the time to first answer is over the {len(answered)} that "
            "answered" + ("" if answered else " (none: give the row more new tokens, or turn thinking off)")
        )


def row_thinking(results: Sequence[GenerationResult]) -> Optional[dict]:
    """What a reasoning row teaches the speed model's thinking length (``speed/thinking.py``): its samples' median
    thinking tokens, a lower bound where any sample was cut off while still thinking (the cut ones' true lengths are
    longer, so the median can only rise); None where none thought."""
    thought = [t for t in (reply_thinking(r) for r in results) if t is not None]
    if not thought:
        return None
    return {
        "thinking_tokens": statistics.median(t["thinking_tokens"] for t in thought),
        "thinking_cut": any(t["thinking_cut"] for t in thought),
    }


def predicted_thinking(row: ConfigResult, config: BenchConfig) -> Optional[bool]:
    """Whether the speed model predicts the row with thinking: as the row asked, or (the model's default) as its
    samples did; None for a model that does not reason."""
    if row.reasoning_format is None:
        return None
    return config.thinking if config.thinking is not None else bool(row.thinking_tokens)
