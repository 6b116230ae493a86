"""A message's attachments as an OpenAI-compatible server takes them, for a model on another server: images as
``image_url`` parts holding data URLs (the image goes to the server the user chose, and nowhere else), documents
placed in the text as the local prompt builder places them. The other server's tokenizer is not here, so a
document's room is counted at about four characters a token."""

from __future__ import annotations

import base64
from typing import Optional

from .compose import place
from .types import Document, Image

CHARS_PER_TOKEN = 4
REPLY_ROOM = 1024  # tokens left for the conversation's other turns and the reply when placing a document


def data_url(image: Image) -> str:
    return f"data:{image.mime};base64,{base64.b64encode(image.data).decode('ascii')}"


def content(message: dict, context: Optional[int]) -> str | list[dict]:
    """``message``'s content with its attachments: a string where it has only documents, else a list of parts
    (the text, then each image)."""
    attachments = message.get("attachments") or ()
    text = str(message.get("content") or "")
    documents = [a for a in attachments if isinstance(a, Document)]
    images = [a for a in attachments if isinstance(a, Image)]
    if documents:
        room = max(256, (context or 8192) - REPLY_ROOM)
        text = place(text, documents, room, lambda t: len(t) // CHARS_PER_TOKEN + 1).text
    if not images:
        return text
    return [{"type": "text", "text": text}] + [{"type": "image_url", "image_url": {"url": data_url(i)}} for i in images]
