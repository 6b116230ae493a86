"""A document cut into chunks of about ``target_tokens`` for retrieval, each chunk on one page.

Cuts fall between paragraphs where they can, else between sentences, then lines, then words (and inside a
word only when one word is longer than a chunk). Each chunk after the first on a page starts with the last
sentence of the one before, so a fact that sits on a cut is whole in one of them."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from .types import Document


@dataclass(frozen=True)
class Chunk:
    index: int  # 0-based, in document order
    page: int  # the page it is on (1-based)
    text: str


def estimate_tokens(text: str) -> int:
    """About 4 characters a token: the count used when no tokenizer is given."""
    return len(text) // 4 + 1


# Each level cuts a piece too long for a chunk; the separator stays with the piece before it, so the pieces
# joined again are the text exactly.
_LEVELS = (
    re.compile(r"(?<=\n)\s*\n"),  # between paragraphs (a blank line)
    re.compile(r"(?<=[.!?])[\"')\]]*\s+"),  # between sentences
    re.compile(r"\n"),  # between lines
    re.compile(r"\s+"),  # between words
)
_OVERLAP_SHARE = 3  # the sentence carried into the next chunk is at most a third of a chunk


@dataclass
class _Piece:
    text: str
    tokens: int
    starts_paragraph: bool


def split(document: Document, target_tokens: int = 400, count: Callable[[str], int] | None = None) -> list[Chunk]:
    """``document``'s pages cut into chunks of at most about ``target_tokens`` by ``count`` (an estimate of 4
    characters a token when None). A chunk's size is the sum of its pieces' counts, which a real tokenizer
    matches to within a token or two a piece."""
    count = count or estimate_tokens
    target = max(8, target_tokens)
    chunks: list[Chunk] = []
    for page in document.pages:
        if not page.text.strip():
            continue
        for text in _page_chunks(page.text, target, count):
            chunks.append(Chunk(index=len(chunks), page=page.number, text=text))
    return chunks


def _page_chunks(text: str, target: int, count: Callable[[str], int]) -> list[str]:
    pieces = _pieces(text, target, count)
    out: list[str] = []
    current: list[_Piece] = []
    size = 0
    for i, piece in enumerate(pieces):
        if current and size + piece.tokens > target:
            out.append(_join(current))
            current, size = _overlap(current, piece, target)
        elif current and piece.starts_paragraph and size >= target // 2:
            # A paragraph that will not fit whole starts a chunk of its own rather than being cut.
            rest = _paragraph_tokens(pieces, i)
            if size + rest > target >= rest:
                out.append(_join(current))
                current, size = _overlap(current, piece, target)
        current.append(piece)
        size += piece.tokens
    if current:
        out.append(_join(current))
    return [t for t in out if t]


def _overlap(previous: list[_Piece], following: _Piece, target: int) -> tuple[list[_Piece], int]:
    """The start of the next chunk: the last sentence of ``previous`` when it is short, else nothing."""
    last = previous[-1]
    if len(previous) > 1 and last.tokens <= target // _OVERLAP_SHARE and last.tokens + following.tokens <= target:
        return [last], last.tokens
    return [], 0


def _paragraph_tokens(pieces: list[_Piece], start: int) -> int:
    total = pieces[start].tokens
    for piece in pieces[start + 1 :]:
        if piece.starts_paragraph:
            break
        total += piece.tokens
    return total


def _join(pieces: list[_Piece]) -> str:
    return "".join(p.text for p in pieces).strip()


def _pieces(text: str, target: int, count: Callable[[str], int]) -> list[_Piece]:
    """``text`` cut into sentences (a sentence longer than ``target`` further, by lines then words), marking
    the pieces that start a paragraph."""
    out: list[_Piece] = []
    for paragraph in _cut(text, _LEVELS[0]):
        first = True
        for sentence in _cut(paragraph, _LEVELS[1]):
            tokens = count(sentence)
            parts = [(sentence, tokens)] if tokens <= target else _fit(sentence, 2, target, count)
            for part, n in parts:
                out.append(_Piece(part, n, first))
                first = False
    return out


def _fit(text: str, level: int, target: int, count: Callable[[str], int]) -> list[tuple[str, int]]:
    """``text`` (longer than ``target``) cut at ``level`` (lines, then words) and packed back together into
    pieces within ``target``, each with its count."""
    if level >= len(_LEVELS):
        return [(part, count(part)) for part in _hard_cut(text, target, count)]
    parts: list[tuple[str, int]] = []
    for part in _cut(text, _LEVELS[level]):
        n = count(part)
        parts.extend([(part, n)] if n <= target else _fit(part, level + 1, target, count))
    packed: list[tuple[str, int]] = []
    for part, n in parts:
        if packed and packed[-1][1] + n <= target:
            packed[-1] = (packed[-1][0] + part, packed[-1][1] + n)
        else:
            packed.append((part, n))
    return packed


def _cut(text: str, pattern: re.Pattern) -> list[str]:
    parts, start = [], 0
    for m in pattern.finditer(text):
        if m.end() > start and text[start : m.start()].strip():
            parts.append(text[start : m.end()])
            start = m.end()
    if text[start:].strip() or not parts:
        parts.append(text[start:])
    elif parts:
        parts[-1] += text[start:]
    return parts


def _hard_cut(text: str, target: int, count: Callable[[str], int]) -> list[str]:
    """A single word longer than a chunk (a hash, a base64 blob), cut by characters."""
    step = max(1, len(text) * target // max(1, count(text)))
    while step > 1 and count(text[:step]) > target:
        step = step * 3 // 4
    return [text[i : i + step] for i in range(0, len(text), step)]
