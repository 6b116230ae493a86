"""Messages → prompt token ids through the model's own chat template.

A model without a chat template gets a plain documented fallback:
``System: …`` / ``User: …`` / ``Assistant: …`` lines, ending with
``Assistant:``. A conversation longer than the context drops the oldest turns
(never the system prompt) and says how many were dropped. A single message
longer than the context keeps its start and its end and leaves out the middle,
with a marker in the text and a sentence for the user saying how much.

A model that sees images builds its prompt with its processor instead (the same rules): each message's text and
its Image attachments become the content list the processor's template takes (``{"type": "image"}`` items, then
the text), the processor expands each image into its image tokens, and the tensors it makes beside the ids
(``pixel_values``, ``image_grid_thw``, ``pixel_attention_mask``, ``token_type_ids``…) go with the prompt to
``generate()``. An image leaves with the message it came in when the oldest turns are dropped.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Any, Optional, Sequence

from ..attachments.types import Image
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
    # What a vision model's processor made beside the ids (``pixel_values``…, batch of one, per-token tensors as
    # long as ``input_ids``); None for a text model's prompt.
    inputs: Optional[dict] = None


def images_in(messages: Sequence[dict]) -> list[Image]:
    """The Image attachments of ``messages``, in order (other attachments, documents, are not images)."""
    return [a for m in messages for a in (m.get("attachments") or ()) if isinstance(a, Image)]


def decode_image(image: Image):
    """An attachment's bytes as the PIL image a processor takes (its first frame, in RGB)."""
    # lazy: PIL loads with the first image, on the engine's thread
    from PIL import Image as PILImage

    with PILImage.open(io.BytesIO(image.data)) as opened:
        return opened.convert("RGB")


def _vision_messages(messages: Sequence[dict], decoded: dict) -> list[dict]:
    """``messages`` in a processor's form: text content as a list of items, a message's images first."""
    out = []
    for message in messages:
        m = {k: v for k, v in message.items() if k != "attachments"}
        images = [a for a in (message.get("attachments") or ()) if isinstance(a, Image)]
        content = m.get("content")
        if isinstance(content, str) or (content is None and images):
            items: list[dict] = []
            for image in images:
                if image.sha256 not in decoded:
                    decoded[image.sha256] = decode_image(image)
                items.append({"type": "image", "image": decoded[image.sha256]})
            if content:
                items.append({"type": "text", "text": content})
            m["content"] = items
        out.append(m)
    return out


def _render_vision(processor, messages: Sequence[dict], extra: dict, extend, decoded: dict):
    """A vision model's prompt: the processor's template and its image tokens; (ids, the other inputs)."""
    out = processor.apply_chat_template(
        _vision_messages(messages, decoded),
        add_generation_prompt=True,
        tokenize=True,
        return_dict=True,
        return_tensors="pt",
        **extra,
    )
    inputs = {k: v for k, v in out.items() if k not in ("input_ids", "attention_mask")}
    ids = [int(t) for t in out["input_ids"][0]]
    if extend is not None:
        longer = extend(list(ids))
        for key, value in inputs.items():  # per-token inputs (token_type_ids) follow the ids, 0 for text
            if hasattr(value, "new_zeros") and value.dim() == 2 and value.shape[-1] == len(ids) != len(longer):
                inputs[key] = _pad_right(value, len(longer) - len(ids))
        ids = longer
    return ids, inputs


def _pad_right(value, count: int):
    # lazy: torch loads on the engine's thread, never at import
    import torch

    return torch.cat([value, value.new_zeros((value.shape[0], count))], dim=-1)


def _render(
    tokenizer,
    messages: Sequence[dict],
    tools=None,
    template_kwargs=None,
    extend=None,
    processor: Any = None,
    decoded: Optional[dict] = None,
) -> tuple[list[int], bool, Optional[dict]]:
    """``template_kwargs``: extra variables for the template (a reasoning model's ``enable_thinking`` or
    ``reasoning_effort``, a request's ``chat_template_kwargs``); ``extend``: a function given the rendered ids that
    returns them with what goes after the template's own prompt (a closed, empty thinking block: thinking off).
    ``processor``: a vision model's, which renders instead (``decoded``: the images decoded so far, by sha256).
    Returns the ids, whether a template made them, and a vision model's other inputs (None otherwise)."""
    extra = {"tools": list(tools)} if tools else {}  # the template's own tool support (transformers' tools=)
    extra.update(template_kwargs or {})
    if processor is not None:
        ids, inputs = _render_vision(processor, messages, extra, extend, {} if decoded is None else decoded)
        return ids, True, inputs
    if getattr(tokenizer, "chat_template", None):
        out = tokenizer.apply_chat_template(
            list(messages), add_generation_prompt=True, tokenize=True, return_dict=True, **extra
        )
        ids = list(out["input_ids"])
        return (extend(ids) if extend is not None else ids), True, None
    text = "".join(f"{FALLBACK_ROLES.get(m['role'], m['role'].title())}: {m['content']}\n" for m in messages)
    text += "Assistant:"
    ids = tokenizer(text, add_special_tokens=True)["input_ids"]
    return list(ids), False, None


def build_prompt(
    tokenizer,
    messages: Sequence[dict],
    context: int,
    reserve_new_tokens: int,
    strict: bool = False,
    tools=None,
    template_kwargs=None,
    extend=None,
    processor: Any = None,
) -> ChatPrompt:
    """Render ``messages`` to ids that leave ``reserve_new_tokens`` free within ``context``. ``strict``: a
    conversation that does not fit is refused (ContextExceeded) instead of shortened. ``tools`` (OpenAI function
    tools) go to the template as ``tools=`` (strict only: the server's requests); ``template_kwargs``, ``extend``
    and ``processor`` (a vision model's: its images and their tokens) as ``_render`` takes them, for every
    rendering."""
    frame = {"template_kwargs": template_kwargs, "extend": extend, "processor": processor, "decoded": {}}
    if not messages:
        raise UnsupportedConfiguration("There is no message to answer.", "Type a message first.")
    budget = context - max(1, reserve_new_tokens)
    if budget <= 0:
        raise UnsupportedConfiguration(
            f"Max new tokens ({reserve_new_tokens}) fills the whole context ({context}).",
            "Lower max new tokens or raise the context length.",
        )
    if strict:
        ids, templ, inputs = _render(tokenizer, messages, tools, **frame)
        if len(ids) > budget:
            raise ContextExceeded(
                f"The prompt has {len(ids)} tokens, which fills the model's context of {context}.",
                "Shorten it.",
                "prompt",
                len(ids),
                context,
                context - len(ids),
            )
        return ChatPrompt(ids, 0, templ, inputs=inputs)
    system = [m for m in messages if m["role"] == "system"][:1]
    turns = [m for m in messages if m["role"] != "system"]
    dropped = 0
    while True:
        ids, templ, inputs = _render(tokenizer, system + turns, **frame)
        if len(ids) <= budget:
            return ChatPrompt(ids, dropped, templ, inputs=inputs)
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
        ids, templ, inputs = _render(tokenizer, system + [last], **frame)
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
    return ChatPrompt(ids, dropped, templ, truncated_last=True, cut=cut, inputs=inputs)
