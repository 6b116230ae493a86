"""Markdown rendering for chat messages: Qt's own Markdown importer, pygments for code.

Model output is untrusted text. ``SafeDocument`` never loads a resource, so an
image link in a reply cannot fetch anything (not from the network, not from
disk). Draft tokens (speculative decoding) are tinted by aligning the rendered
text back onto the raw reply: rendering only drops Markdown syntax, so the
rendered characters are a subsequence of the raw ones.
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Sequence

from pygments.lexers import TextLexer, get_lexer_by_name
from pygments.styles import get_style_by_name
from pygments.util import ClassNotFound
from PySide6.QtCore import QUrl
from PySide6.QtGui import QColor, QFont, QTextBlockFormat, QTextCharFormat, QTextCursor, QTextDocument, QTextFormat

from .style import current_theme

# Code blocks' background, their highlighting style and the draft tokens' tint are the theme's (ui/style.py).
_ALIGN_LOOKAHEAD = 64  # raw chars skipped at most to find the next rendered one (syntax, fences)


class SafeDocument(QTextDocument):
    """A document that loads no external resource of any kind."""

    blocked: list[str]

    def __init__(self, parent=None):
        super().__init__(parent)
        self.blocked = []

    def loadResource(self, kind: int, url: QUrl):  # noqa: N802 - Qt override
        self.blocked.append(url.toString())
        return None


_IMAGE = re.compile(r"!\[([^\]]*)\]\(([^)\s]+)[^)]*\)")
# Raw HTML in model output is shown as text, never rendered.
MARKDOWN_FEATURES = QTextDocument.MarkdownFeature.MarkdownDialectGitHub | QTextDocument.MarkdownFeature.MarkdownNoHTML


def images_as_links(text: str) -> str:
    """Markdown images in model output become plain links (shown, never loaded); code is left alone."""
    parts = text.split("```")
    for i in range(0, len(parts), 2):  # even parts are outside fenced code
        parts[i] = _IMAGE.sub(lambda m: f"[image: {m.group(1) or m.group(2)}]({m.group(2)})", parts[i])
    return "```".join(parts)


def append_reply(text: str, spans: list, delta: str, from_draft: bool) -> str:
    """``text + delta``; a drafted delta extends ``spans`` (merged with a span that ends where it starts)."""
    if from_draft and delta:
        start = len(text)
        if spans and spans[-1][1] == start:
            spans[-1][1] = start + len(delta)
        else:
            spans.append([start, start + len(delta)])
    return text + delta


def render(doc: QTextDocument, text: str, draft_spans: Sequence[Sequence[int]] = ()) -> None:
    """Render ``text`` as Markdown into ``doc``, highlight code blocks, tint draft spans."""
    doc.setMarkdown(images_as_links(text), MARKDOWN_FEATURES)
    _highlight_code(doc)
    if draft_spans:
        _tint(doc, text, draft_spans)


def hard_line_breaks(text: str) -> str:
    """What a person typed or pasted keeps its line breaks: in Markdown a single newline joins two lines into one
    paragraph, so outside fenced code every line break becomes a hard one."""
    out, fenced = [], False
    lines = text.split("\n")
    for i, line in enumerate(lines):
        fence = line.lstrip().startswith(("```", "~~~"))
        if fence:
            fenced = not fenced
        last = i == len(lines) - 1
        following = lines[i + 1].strip() if not last else ""
        keep = fence or fenced or last or not line.strip() or not following or following.startswith(("```", "~~~"))
        out.append(line if keep else line + "\\")
    return "\n".join(out)


def code_blocks(doc: QTextDocument) -> list[tuple[str, str]]:
    """(language, code) for each fenced or indented code block, in order."""
    blocks: list[tuple[str, list[str]]] = []
    previous_was_code = False
    b = doc.begin()
    while b.isValid():
        fmt = b.blockFormat()
        if _is_code(fmt):
            lang = fmt.property(QTextFormat.BlockCodeLanguage) or ""
            if previous_was_code and blocks[-1][0] == lang:
                blocks[-1][1].append(b.text())
            else:
                blocks.append((lang, [b.text()]))
            previous_was_code = True
        else:
            previous_was_code = False
        b = b.next()
    return [(lang, "\n".join(lines)) for lang, lines in blocks]


def _is_code(fmt: QTextBlockFormat) -> bool:
    return fmt.hasProperty(QTextFormat.BlockCodeFence) or fmt.hasProperty(QTextFormat.BlockCodeLanguage)


@lru_cache(maxsize=64)
def _lexer(lang: str):

    try:
        return get_lexer_by_name(lang) if lang else TextLexer()
    except ClassNotFound:
        return TextLexer()


@lru_cache(maxsize=1024)
def _format_for(ttype, pygments_style: str) -> QTextCharFormat | None:
    style = get_style_by_name(pygments_style).style_for_token(ttype)
    if not (style["color"] or style["bold"] or style["italic"]):
        return None
    fmt = QTextCharFormat()
    if style["color"]:
        fmt.setForeground(QColor("#" + style["color"]))
    if style["bold"]:
        fmt.setFontWeight(QFont.Bold)
    if style["italic"]:
        fmt.setFontItalic(True)
    return fmt


def _highlight_code(doc: QTextDocument) -> None:
    theme = current_theme()
    cursor = QTextCursor(doc)
    b = doc.begin()
    while b.isValid():
        if not _is_code(b.blockFormat()):
            b = b.next()
            continue
        lang = b.blockFormat().property(QTextFormat.BlockCodeLanguage) or ""
        start = b.position()
        lines = []
        while b.isValid() and _is_code(b.blockFormat()):
            bf = b.blockFormat()
            bf.setBackground(theme.color("code_bg"))
            cursor.setPosition(b.position())
            cursor.setBlockFormat(bf)
            lines.append(b.text())
            b = b.next()
        pos = start
        # Block separators are one position each, exactly like the "\n" we join with.
        for ttype, value in _lexer(lang).get_tokens("\n".join(lines)):
            fmt = _format_for(ttype, theme.pygments)
            if fmt is not None and value.strip():
                cursor.setPosition(pos)
                cursor.setPosition(pos + len(value), QTextCursor.KeepAnchor)
                cursor.mergeCharFormat(fmt)
            pos += len(value)


def _tint(doc: QTextDocument, raw: str, draft_spans: Sequence[Sequence[int]]) -> None:
    is_draft = bytearray(len(raw))
    for start, end in draft_spans:
        is_draft[max(0, start) : max(0, min(end, len(raw)))] = b"\x01" * max(0, min(end, len(raw)) - max(0, start))
    rendered = doc.toPlainText()
    runs: list[list[int]] = []
    j = 0
    for i, ch in enumerate(rendered):
        k = raw.find(ch, j, j + _ALIGN_LOOKAHEAD)
        if k < 0:
            continue  # a character rendering added (bullets, object markers): not from the model
        j = k + 1
        if is_draft[k]:
            if runs and runs[-1][1] == i:
                runs[-1][1] = i + 1
            else:
                runs.append([i, i + 1])
    if not runs:
        return
    fmt = QTextCharFormat()
    fmt.setBackground(current_theme().color("draft"))
    cursor = QTextCursor(doc)
    for start, end in runs:
        cursor.setPosition(start)
        cursor.setPosition(end, QTextCursor.KeepAnchor)
        cursor.mergeCharFormat(fmt)
