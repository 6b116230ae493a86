"""How a message's documents go into the prompt: whole when they fit, else the excerpts that best match the
question, numbered so the answer can cite them.

The documents come before the question, laid out the same way every time (no timestamps, nothing taken from
the question), so a document followed by any question starts with the same tokens and a prefix cache reads
the document once."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from .chunks import Chunk, split
from .retrieval import Index
from .types import Document

INSTRUCTION = "Answer from the excerpts above and cite them by number, like [1]."
# No tokenizer gives fewer tokens than one per this many characters, so a longer text cannot fit and is not
# counted (counting 200 MB of text to learn it does not fit 32,000 tokens takes a while).
MAX_CHARS_PER_TOKEN = 32


@dataclass(frozen=True)
class Citation:
    name: str  # the document's name
    page: int
    chunk_index: int
    text: str  # the excerpt as it was sent


@dataclass(frozen=True)
class Placement:
    text: str  # the documents (or excerpts) then the question: the user turn's content
    whole: bool  # True when the documents went in whole
    cited: list[Citation] = field(default_factory=list)  # the excerpts sent, numbered [1], [2], ... in order
    notes: list[str] = field(default_factory=list)  # for the user: what did not fit and what was sent instead


def document_block(document: Document) -> str:
    """``document`` whole, as it goes in the prompt; a PDF of several pages marks each page with "[page n]"."""
    marked = document.kind == "pdf" and document.page_count > 1
    pages = "".join(f"[page {p.number}]\n{p.text}\n" if marked else f"{p.text}\n" for p in document.pages if p.text)
    pages_attr = f' pages="{document.page_count}"' if document.kind == "pdf" else ""
    return f'<document name="{_attr(document.name)}"{pages_attr}>\n{pages}</document>'


def place(question: str, documents: Sequence[Document], budget_tokens: int, count: Callable[[str], int]) -> Placement:
    """``question`` after ``documents``, within ``budget_tokens`` by ``count``: the documents whole when all of
    them fit, else the excerpts that best match the question, as many as fit (at least one)."""
    if not documents:
        return Placement(text=question, whole=True)
    # The question is said to be about the documents: measured on the starter with a 6,100-token PDF, a bare
    # question after the document was answered from nowhere ("by a team of engineers"), this one from its page 18.
    about = "the document above" if len(documents) == 1 else "the documents above"
    blocks = "\n\n".join(document_block(d) for d in documents)
    whole = f"{blocks}\n\nQuestion about {about}: {question}" if question.strip() else blocks
    if len(whole) <= budget_tokens * MAX_CHARS_PER_TOKEN and count(whole) <= budget_tokens:
        return Placement(text=whole, whole=True)
    return _excerpts(question, documents, budget_tokens, count)


def _excerpts(question: str, documents: Sequence[Document], budget: int, count: Callable[[str], int]) -> Placement:
    frame = count(_render(question, documents, {d: [] for d in range(len(documents))}))
    room = budget - frame
    # Chunks small enough that several fit, and never larger than the room: the best one always fits whole.
    target = max(8, min(400, max(64, budget // 8), room))
    chunks = [split(d, target_tokens=target, count=count) for d in documents]
    with Index() as index:
        for i, doc_chunks in enumerate(chunks):
            index.add(str(i), doc_chunks)
        hits = index.search(question, limit=sum(len(c) for c in chunks))
    # Best matches first, then the rest in document order, so a question that matches nothing still gets the
    # documents' beginnings.
    ranked = [(int(h.doc_key), h.chunk_index) for h in hits]
    seen = set(ranked)
    ranked += [(d, c.index) for d, doc_chunks in enumerate(chunks) for c in doc_chunks if (d, c.index) not in seen]
    if not ranked:
        return Placement(text=question, whole=False, notes=["The attached documents have no text to send."])

    chosen: list[tuple[int, Chunk]] = []
    used = 0
    for d, i in ranked:
        chunk = chunks[d][i]
        cost = count(_excerpt_line(99, documents[d], chunk))
        if not chosen or used + cost <= room:
            chosen.append((d, chunk))
            used += cost
        if used >= room:
            break

    text = _render(question, documents, _by_document(chosen))
    while count(text) > budget and len(chosen) > 1:  # the estimate was short: drop the weakest match
        chosen.pop()
        text = _render(question, documents, _by_document(chosen))
    if count(text) > budget:  # one excerpt longer than the room left: keep as much of its start as fits
        d, chunk = chosen[0]
        chosen[0] = (d, _trimmed(chunk, lambda c: count(_render(question, documents, {d: [c]})) <= budget))
        text = _render(question, documents, _by_document(chosen))

    by_doc = _by_document(chosen)
    cited = [Citation(documents[d].name, c.page, c.index, c.text) for d in sorted(by_doc) for c in by_doc[d]]
    notes = _notes(documents, by_doc, count)
    if count(text) > budget:
        notes.append(f"The question itself leaves no room in the {budget:,} tokens for the documents; shorten it.")
    return Placement(text=text, whole=False, cited=cited, notes=notes)


def _by_document(chosen: list[tuple[int, Chunk]]) -> dict[int, list[Chunk]]:
    out: dict[int, list[Chunk]] = {}
    for d, chunk in chosen:
        out.setdefault(d, []).append(chunk)
    return {d: sorted(out[d], key=lambda c: c.index) for d in sorted(out)}


def _render(question: str, documents: Sequence[Document], by_doc: dict[int, list[Chunk]]) -> str:
    blocks, n = [], 0
    for d in sorted(by_doc):
        lines = []
        for chunk in by_doc[d]:
            n += 1
            lines.append(_excerpt_line(n, documents[d], chunk))
        body = "".join(line + "\n" for line in lines)
        blocks.append(f'<excerpts from="{_attr(documents[d].name)}">\n{body}</excerpts>')
    return "\n\n".join([*blocks, INSTRUCTION, question])


def _excerpt_line(n: int, document: Document, chunk: Chunk) -> str:
    page = f"(page {chunk.page}) " if document.kind == "pdf" else ""
    return f"[{n}] {page}{chunk.text}"


def _trimmed(chunk: Chunk, fits: Callable[[Chunk], bool]) -> Chunk:
    """``chunk`` cut to the most of its first words that ``fits`` allows (one word at least)."""
    words = chunk.text.split(" ")
    low, high = 1, len(words)
    while low < high:
        mid = (low + high + 1) // 2
        if fits(Chunk(chunk.index, chunk.page, " ".join(words[:mid]) + " ...")):
            low = mid
        else:
            high = mid - 1
    return Chunk(chunk.index, chunk.page, " ".join(words[:low]) + " ...")


def _notes(documents: Sequence[Document], by_doc: dict[int, list[Chunk]], count: Callable[[str], int]) -> list[str]:
    """One sentence for the user: what did not fit, and which excerpts were sent instead."""
    sent = sum(len(c) for c in by_doc.values())
    what = f"{sent} excerpt{'s' if sent != 1 else ''} chosen for this question {'were' if sent != 1 else 'was'} sent"
    sizes = [f"{d.name} ({count(document_block(d)):,} tokens)" for d in documents]
    if len(documents) == 1:
        where = _pages(documents[0], by_doc.get(0, []))
        return [f"{sizes[0]} does not fit the context; {what}{f' ({where})' if where else ''}."]
    parts = []
    for d, document in enumerate(documents):
        pages = _pages(document, by_doc.get(d, []))
        parts.append(
            f"{document.name} {pages}" if pages else document.name if d in by_doc else f"none of {document.name}"
        )
    together = ", ".join(sizes[:-1]) + f" and {sizes[-1]}"
    return [f"{together} do not fit the context together; {what} ({'; '.join(parts)})."]


def _pages(document: Document, chunks: list[Chunk]) -> str:
    """ "pages 7, 31" for the excerpts of a PDF; "" for other documents (their one page says nothing)."""
    pages = sorted({c.page for c in chunks})
    if document.kind != "pdf" or not pages:
        return ""
    return f"page{'s' if len(pages) > 1 else ''} {', '.join(str(p) for p in pages)}"


def _attr(value: str) -> str:
    return value.replace("&", "&amp;").replace('"', "&quot;").replace("<", "&lt;").replace(">", "&gt;")
