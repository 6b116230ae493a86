"""What an attachment adds to the next message, said before it is sent (the window's chip): its tokens as the
loaded model's tokenizer counts the text the prompt builder places, the KV memory they take, the seconds to first
token the speed model predicts here, and a warning when it would not fit or would push earlier turns out.

A job for the engine's thread (the tokenizer and the model's shape live there); the window submits it when a file
is attached and shows its answer on the chip."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from .attachments import Document, Image
from .attachments.compose import place
from .cost import kv_read_bytes
from .generation.attached import document_room
from .speed.calibration import predict_generation
from .units import format_bytes

REPLY_RESERVE = 256  # new tokens kept free for the reply when saying whether an attachment fits
CHARS_PER_TOKEN = 4  # a server's model: its tokenizer is not here, so tokens are estimated from the text


@dataclass
class AttachmentCost:
    tokens: int  # what the attachments add to the prompt
    kv_bytes: int  # the KV cache those tokens take (0 where it is not known: a server's model)
    ttft_s: Optional[float]  # predicted seconds to the first token of the reply that reads them (None: no prediction)
    fits: bool  # they go in whole, with the conversation so far and room for the reply
    text: str  # the chip's figures: "6,120 tokens · 138 MB KV · ≈ 3.4 s to first token"
    warning: str = ""  # a sentence when they do not fit or push the conversation's earlier turns out


def _document_tokens(target, documents: list[Document], count) -> tuple[int, bool]:
    """Tokens of the documents as the prompt builder places them before an empty question, and whether whole."""
    room = document_room(target.context_limit, REPLY_RESERVE)
    placement = place("", documents, room, count)
    return count(placement.text), placement.whole


def cost(target, attachments: list, history_tokens: int = 0) -> AttachmentCost:
    """The cost of ``attachments`` sent after a conversation of ``history_tokens`` on the model ``target``."""
    documents = [a for a in attachments if isinstance(a, Document)]
    images = [a for a in attachments if isinstance(a, Image)]
    tokenizer = target.text_tokenizer()
    if tokenizer is not None:

        def count(text: str) -> int:
            return len(tokenizer(text, add_special_tokens=False)["input_ids"])

    else:

        def count(text: str) -> int:
            return len(text) // CHARS_PER_TOKEN + 1

    tokens, whole = _document_tokens(target, documents, count) if documents else (0, True)
    tokens += sum(target.image_tokens(img.width, img.height) or 0 for img in images)
    context = target.context_limit
    shape = target.shape()
    kv_bytes = 0
    ttft_s: Optional[float] = None
    if shape is not None:
        strategy = target.resolve_strategy("auto")
        form = target.kv_form() or "bf16"
        prompt = history_tokens + tokens
        # As the engine predicts a reply on this model (with this machine's factors for it, learned under its name):
        # the prefix cache holds the conversation so far where the fast path runs, so only the attachment is read.
        pred, _, _ = predict_generation(target, strategy, prompt, 1, cached_tokens=history_tokens)
        ttft_s = pred.ttft_ms / 1000
        # The cost model's KV bytes for these tokens (the KV a decode step at that length reads is what they hold).
        path = "fast" if pred.path == "fast" else "hf"
        kv_bytes = kv_read_bytes(shape, target.precision, target.device, path, tokens, form)
    parts = [f"{tokens:,} tokens"]
    if kv_bytes:
        parts.append(f"{format_bytes(kv_bytes)} KV")
    if ttft_s is not None:
        parts.append(f"≈ {ttft_s:.1f} s to first token" if ttft_s >= 1 else f"≈ {ttft_s * 1000:.0f} ms to first token")
    warning = ""
    fits = whole and history_tokens + tokens + REPLY_RESERVE <= context
    blind = images and not target.capabilities.vision
    if blind:  # said before sending: the engine would refuse the message
        fits = False
        warning = (
            f"{target.name} cannot see images: it is a text-only model, so a message with this image would be "
            "refused. Load a vision model (Gemma 3, Qwen2.5-VL, SmolVLM) or remove the image."
        )
    elif not whole:
        warning = (
            f"Too long for the context of {context:,} tokens: only the excerpts that match each question will be "
            "sent, with their pages cited."
        )
    elif not fits:
        warning = (
            f"With the conversation so far ({history_tokens:,} tokens) this fills the context of {context:,}: the "
            "earliest turns will be left out. Start a new conversation to keep them."
        )
    if blind and not documents:  # nothing this model reads: no figures to give
        parts = ["not read by this model"]
    return AttachmentCost(tokens, kv_bytes, ttft_s, fits, " · ".join(parts), warning)


def attachment_cost_job(attachments: list, history_tokens: int = 0):
    """A job (``EngineService.call``): the ``AttachmentCost`` of ``attachments`` on the model loaded, or None when
    no model is loaded."""

    def job(engine, report):
        if engine.target is None:
            return None
        return cost(engine.target, attachments, history_tokens)

    return job
