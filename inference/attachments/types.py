"""An attachment as the engine takes it: a document already read to text (its pages kept, for citations), or an
image's bytes. Both are named by their content (``sha256``): the store keeps one copy of each, and the prompt
placed from the same document is the same tokens, so the prefix cache reads it once."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import RedlineError


class AttachmentError(RedlineError):
    """A file that cannot be attached (encrypted, corrupt, too large, no text, an unknown image format): the
    message says what happened and the hint what to do; nothing else in the conversation changes."""


@dataclass(frozen=True)
class Page:
    """One page of a document (a PDF page; a whole DOCX or text file is page 1) and its text."""

    number: int  # 1-based, as a reader cites it
    text: str


@dataclass(frozen=True)
class Document:
    name: str  # the file's name as the user knows it ("report.pdf")
    kind: str  # "pdf", "docx", "markdown", "text", "code"
    sha256: str  # of the file's bytes
    pages: tuple[Page, ...]

    @property
    def text(self) -> str:
        return "\n\n".join(p.text for p in self.pages if p.text)

    @property
    def page_count(self) -> int:
        return len(self.pages)


@dataclass(frozen=True)
class Image:
    name: str
    mime: str  # "image/png", "image/jpeg", "image/webp", "image/gif", "image/bmp"
    sha256: str
    data: bytes
    width: int
    height: int
