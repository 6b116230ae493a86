"""Message rendering: Markdown, highlighted code, tinted draft tokens, no resource loading."""

from PySide6.QtGui import QTextCursor

from redline.ui.chat_view import MessageWidget, format_stats
from redline.ui.markdown import SafeDocument, code_blocks, render
from redline.ui.style import current_theme

REPLY = "Here is **code**:\n\n```python\ndef add(a, b):\n    return a + b\n```\n\nDone."


def _char_format_at(doc, pos):
    c = QTextCursor(doc)
    c.setPosition(pos + 1)  # the format of the character before the cursor
    return c.charFormat()


def test_markdown_code_is_highlighted_and_extracted(qapp):
    doc = SafeDocument()
    render(doc, REPLY)
    text = doc.toPlainText()
    assert "**" not in text and "```" not in text
    assert code_blocks(doc) == [("python", "def add(a, b):\n    return a + b")]
    keyword = _char_format_at(doc, text.index("def"))
    plain = _char_format_at(doc, text.index("Here"))
    assert keyword.foreground().color() != plain.foreground().color()


def test_remote_and_local_resources_are_never_loaded(qapp, tmp_path):
    doc = SafeDocument()
    image = tmp_path / "x.png"
    image.write_bytes(b"not an image")
    render(doc, f"![a](http://example.com/track.png) ![b](https://example.com/b.png) ![c](file://{image})")
    doc.adjustSize()  # layout would ask for images
    assert doc.blocked == []  # images became links: nothing is even requested
    assert "image: a" in doc.toPlainText()
    doc2 = SafeDocument()
    doc2.setHtml('<img src="http://example.com/direct.png">')  # even a document with an image never loads it
    doc2.adjustSize()
    assert any("example.com" in url for url in doc2.blocked)
    widget = MessageWidget(1, "assistant", "![a](https://example.com/pixel.png)")
    assert (
        widget.browser.loadResource(
            2, __import__("PySide6.QtCore", fromlist=["QUrl"]).QUrl("https://example.com/pixel.png")
        )
        is None
    )


def test_draft_tokens_are_tinted(qapp):
    doc = SafeDocument()
    raw = "The **capital** is Paris."
    start = raw.index("Paris")
    render(doc, raw, [[start, start + 5]])
    text = doc.toPlainText()
    tint = current_theme().color("draft")  # the theme's (light and dark have their own)
    assert _char_format_at(doc, text.index("Paris")).background().color() == tint
    assert _char_format_at(doc, text.index("capital")).background().color() != tint


def test_stats_line():
    line = format_stats(
        {
            "new_tokens": 12,
            "tokens_per_s": 33.33,
            "ttft_ms": 120.4,
            "strategy": "speculative",
            "precision": "bf16",
            "acceptance_rate": 0.5,
            "draft_accepted": 5,
            "draft_proposed": 10,
            "finish_reason": "cancelled",
        }
    )
    assert line == ("12 tokens · 33.3 tok/s · TTFT 120 ms · speculative · bf16 · draft accepted 50% (5/10) · stopped")
