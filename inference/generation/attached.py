"""A conversation's attached documents placed in its messages, for the one prompt builder (``request.prepare``).

Each user message's documents go before its text: whole where they fit the room a document may take, else the
excerpts retrieved for that message's question (``attachments/compose.py``). The room depends only on the context
and the reply's reserve, never on the rest of the conversation, so the same document in the same place renders to
the same tokens on every turn, and the prefix cache (on disk, too) reads it once. Images stay in the message for a
model that can see (the processor places them)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from ..attachments import Document
from ..attachments.compose import place

TEMPLATE_ROOM = 64  # tokens the chat template's markers around a message take, kept out of a document's room


@dataclass
class Placed:
    """The messages with their documents placed; what the user should know (a document too large, so excerpts were
    sent); and what the last message's reply was given to cite (``Citation``s, in the order numbered)."""

    messages: list[dict]
    notes: list[str] = field(default_factory=list)
    citations: list = field(default_factory=list)


def has_documents(messages: Sequence[dict]) -> bool:
    return any(isinstance(a, Document) for m in messages for a in m.get("attachments") or ())


def document_room(context: int, reserve: int) -> int:
    """The tokens a message's documents and question may take: the context less the reply's reserve (at most an
    eighth of the context, at least 256) and the template's markers."""
    return context - min(reserve, max(256, context // 8)) - TEMPLATE_ROOM


def place_documents(tokenizer, messages: Sequence[dict], context: int, reserve: int) -> Placed:
    """``messages`` with each user message's documents placed in its content (other attachments kept)."""

    def count(text: str) -> int:
        return len(tokenizer(text, add_special_tokens=False)["input_ids"])

    room = document_room(context, reserve)
    out: list[dict] = []
    notes: list[str] = []
    citations: list = []
    last_user = max((i for i, m in enumerate(messages) if m.get("role") == "user"), default=-1)
    for i, m in enumerate(messages):
        docs = [a for a in m.get("attachments") or () if isinstance(a, Document)]
        if not docs:
            out.append(m)
            continue
        placement = place(str(m.get("content") or ""), docs, room, count)
        rest = [a for a in m["attachments"] if not isinstance(a, Document)]
        placed = {**m, "content": placement.text}
        if rest:
            placed["attachments"] = rest
        else:
            placed.pop("attachments", None)
        out.append(placed)
        if i == last_user:
            notes.extend(placement.notes)
            citations = list(placement.cited)
    return Placed(out, notes, citations)


def citation_record(number: int, citation) -> dict:
    """A citation as a reply's result keeps it (``GenerationResult.citations``): the number the prompt gave it,
    its document's name, its page, its chunk and its text."""
    return {
        "number": number,
        "name": citation.name,
        "page": citation.page,
        "chunk": citation.chunk_index,
        "text": citation.text,
    }
