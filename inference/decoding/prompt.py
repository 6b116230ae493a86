"""Messages → prompt token ids through the model's own chat template.

A model without a chat template gets a plain documented fallback:
``System: …`` / ``User: …`` / ``Assistant: …`` lines, ending with
``Assistant:``. A conversation longer than the context drops the oldest turns
(never the system prompt) and says how many were dropped. A single message
longer than the context keeps its start and its end and leaves out the middle,
with a marker in the text and a sentence for the user saying how much.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from ..errors import ContextExceeded, UnsupportedConfiguration

FALLBACK_ROLES = {"system": "System", "user": "User", "assistant": "Assistant"}
HEAD_TOKENS = 1024  # of an over-long message, at most this much of its start is kept (the rest of the room: its end)
MARKER_TOKENS = 24  # room for the "[… N tokens left out …]" marker


@dataclass
class ChatPrompt:
    input_ids: list[int]
    dropped_messages: int
    used_template: bool
    truncated_last: bool = False
    cut: str = ""  # how the last message was shortened, in a sentence for the user ("" when it was not)


def _render(
    tokenizer, messages: Sequence[dict], tools=None, template_kwargs=None, extend=None
) -> tuple[list[int], bool]:
    """``template_kwargs``: extra variables for the template (a reasoning model's ``enable_thinking`` or
    ``reasoning_effort``, a request's ``chat_template_kwargs``); ``extend``: a function given the rendered ids that
    returns them with what goes after the template's own prompt (a closed, empty thinking block: thinking off)."""
    if getattr(tokenizer, "chat_template", None):
        extra = {"tools": list(tools)} if tools else {}  # the template's own tool support (transformers' tools=)
        extra.update(template_kwargs or {})
        out = tokenizer.apply_chat_template(
            list(messages), add_generation_prompt=True, tokenize=True, return_dict=True, **extra
        )
        ids = list(out["input_ids"])
        return (extend(ids) if extend is not None else ids), True
    text = "".join(f"{FALLBACK_ROLES.get(m['role'], m['role'].title())}: {m['content']}\n" for m in messages)
    text += "Assistant:"
    ids = tokenizer(text, add_special_tokens=True)["input_ids"]
    return list(ids), False


def build_prompt(
    tokenizer,
    messages: Sequence[dict],
    context: int,
    reserve_new_tokens: int,
    strict: bool = False,
    tools=None,
    template_kwargs=None,
    extend=None,
) -> ChatPrompt:
    """Render ``messages`` to ids that leave ``reserve_new_tokens`` free within ``context``. ``strict``: a
    conversation that does not fit is refused (ContextExceeded) instead of shortened. ``tools`` (OpenAI function
    tools) go to the template as ``tools=`` (strict only: the server's requests); ``template_kwargs`` and
    ``extend`` as ``_render`` takes them, for every rendering."""
    frame = {"template_kwargs": template_kwargs, "extend": extend}
    if not messages:
        raise UnsupportedConfiguration("There is no message to answer.", "Type a message first.")
    budget = context - max(1, reserve_new_tokens)
    if budget <= 0:
        raise UnsupportedConfiguration(
            f"Max new tokens ({reserve_new_tokens}) fills the whole context ({context}).",
            "Lower max new tokens or raise the context length.",
        )
    if strict:
        ids, templ = _render(tokenizer, messages, tools, **frame)
        if len(ids) > budget:
            raise ContextExceeded(
                f"The prompt has {len(ids)} tokens, which fills the model's context of {context}.",
                "Shorten it.",
                "prompt",
                len(ids),
                context,
                context - len(ids),
            )
        return ChatPrompt(ids, 0, templ)
    system = [m for m in messages if m["role"] == "system"][:1]
    turns = [m for m in messages if m["role"] != "system"]
    dropped = 0
    while True:
        ids, templ = _render(tokenizer, system + turns, **frame)
        if len(ids) <= budget:
            return ChatPrompt(ids, dropped, templ)
        if len(turns) > 1:
            turns = turns[1:]
            dropped += 1
            # Keep the conversation starting with a user turn, as templates expect.
            while len(turns) > 1 and turns[0]["role"] != "user":
                turns = turns[1:]
                dropped += 1
            continue
        break
    # A single message is longer than the context. Its start usually says what to do ("Summarize this:") and its
    # end what is asked last, so both are kept and the middle is left out, with a marker the model can read.
    last = dict(turns[-1])
    content_ids = tokenizer(last["content"], add_special_tokens=False)["input_ids"]
    overhead = len(ids) - len(content_ids)
    keep = budget - overhead - MARKER_TOKENS
    if keep <= 1:
        raise UnsupportedConfiguration(
            f"The system prompt alone does not fit the context of {context} tokens.",
            "Shorten the system prompt or raise the context length.",
        )
    while True:
        head = min(keep // 3, HEAD_TOKENS)
        tail = keep - head
        left_out = len(content_ids) - head - tail
        last["content"] = (
            tokenizer.decode(content_ids[:head], skip_special_tokens=True)
            + f"\n\n[… {left_out:,} tokens of this message left out to fit the context …]\n\n"
            + tokenizer.decode(content_ids[-tail:], skip_special_tokens=True)
        )
        ids, templ = _render(tokenizer, system + [last], **frame)
        if len(ids) <= budget:
            break
        keep -= max(1, len(ids) - budget)  # re-tokenising can shift the count slightly
        if keep <= 2:
            raise UnsupportedConfiguration(
                f"The system prompt and the last message's frame alone do not fit the context of {context} tokens.",
                "Shorten the system prompt or raise the context length.",
            )
    cut = (
        f"The last message has {len(content_ids):,} tokens, more than the context of {context} leaves room for: "
        f"its first {head:,} and last {tail:,} tokens were sent, and the {left_out:,} between them were left out."
    )
    return ChatPrompt(ids, dropped, templ, truncated_last=True, cut=cut)
